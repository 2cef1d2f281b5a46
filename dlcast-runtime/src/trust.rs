//! Where a fact that decides safety may come from: checks of an object's
//! identity that Python code cannot fake.
//!
//! Python code can replace any module attribute (`torch._C.X = ...`), any
//! class attribute of a class written in Python, and any entry of
//! `sys.modules`; with `ctypes` it can also make a C function pointer that
//! runs Python code. What it cannot make is:
//!
//! - a **builtin function** (`builtin_function_or_method`, exactly) with a
//!   given C-level name whose C function lies in a given shared library:
//!   the name is the method table's `ml_name` and the function pointer the
//!   C code the call runs, both read from the object's C struct;
//! - a **static type** (types made by Python code are heap types, so a
//!   type without `Py_TPFLAGS_HEAPTYPE` was defined by C code) of a given
//!   C name (`tp_name`), nor one of its own C attributes (a
//!   `getset_descriptor` or `method_descriptor` whose owner, C name and C
//!   function are read from its struct). Python code *can* change what a
//!   static type's dictionary holds (through the garbage collector's
//!   referents of its read-only view), so the entries found there are
//!   checked one by one, never trusted for being there;
//! - **code or static data inside a loaded shared library's image**: a
//!   ctypes or cffi callback is a trampoline in memory `libffi` allocates
//!   (or in `libffi`'s own image, with static trampolines), never inside the
//!   library that defines the type it claims to belong to.
//!
//! So a table of C functions (PyTorch's DLPack exchange API, a borrow
//! registry published by another extension) is trusted to run no Python
//! code only when every function it holds lies in the image of the library
//! that defines a static type known to be the producer's (for PyTorch,
//! `torch._C.TensorBase`), and a Python-level builtin (`_weakref.
//! getweakrefcount`, `sys._is_gil_enabled`, `torch._C._increment_version`)
//! only when [`is_builtin`] holds for it with the library that must define
//! it. Where the platform cannot tell which image an address belongs to,
//! nothing is trusted ([`image_base`] is `None`) and callers take their
//! fallback: the slower path, or a refusal.

use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::c_void;

/// The base address of the loaded shared library (or executable) whose
/// image contains `addr`; `None` where `addr` lies in no image (heap,
/// anonymous mappings such as `libffi` trampolines) or the platform cannot
/// tell (`dladdr` on Unix, `GetModuleHandleExW` on Windows; elsewhere
/// always `None`).
pub(crate) fn image_base(addr: *const c_void) -> Option<usize> {
    #[cfg(unix)]
    {
        if addr.is_null() {
            return None;
        }
        // SAFETY: `Dl_info` is four pointers, for which all zeroes is valid.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: `dladdr` only reads the dynamic loader's tables; `info` is
        // a valid out pointer, written on success (a non-zero return).
        let found = unsafe { libc::dladdr(addr, &mut info) } != 0;
        (found && !info.dli_fbase.is_null()).then_some(info.dli_fbase as usize)
    }
    #[cfg(windows)]
    {
        // The module (DLL or executable) whose image contains `addr`; its
        // handle is its base address.
        #[link(name = "kernel32")]
        extern "system" {
            fn GetModuleHandleExW(flags: u32, name: *const u16, module: *mut *mut c_void) -> i32;
        }
        const FROM_ADDRESS: u32 = 0x4;
        const UNCHANGED_REFCOUNT: u32 = 0x2;
        if addr.is_null() {
            return None;
        }
        let mut module = std::ptr::null_mut();
        // SAFETY: with FROM_ADDRESS the name argument is an address, only
        // compared with the loaded modules' ranges; `module` is a valid out
        // pointer; UNCHANGED_REFCOUNT takes no reference to release.
        let found = unsafe {
            GetModuleHandleExW(FROM_ADDRESS | UNCHANGED_REFCOUNT, addr.cast(), &mut module)
        } != 0;
        (found && !module.is_null()).then_some(module as usize)
    }
    #[cfg(not(any(unix, windows)))]
    {
        let _ = addr;
        None
    }
}

/// Whether `a` and `b` lie in the image of one loaded shared library (both
/// known: `false` where either is not, see [`image_base`]).
pub(crate) fn same_image(a: *const c_void, b: *const c_void) -> bool {
    matches!((image_base(a), image_base(b)), (Some(x), Some(y)) if x == y)
}

/// The image of the Python interpreter's C API (`libpython`, or the
/// executable when it is linked in statically): where CPython's own
/// builtins (`sys`, `_weakref`) live.
pub(crate) fn python_image() -> *const c_void {
    ffi::Py_IncRef as *const c_void
}

// The objects below are identified by fields of their C structs, read
// directly, never by a Python attribute: attributes are found through a
// type's dictionary, and even a static type's dictionary can be changed by
// Python code (`gc.get_referents(T.__dict__)[0]` is the dictionary behind
// the read-only view). These layouts are CPython's for every version dlcast
// supports (3.9+), in the limited API too, where they are not declared.

/// `PyCFunctionObject`'s first fields.
#[repr(C)]
struct CFunction {
    ob_base: ffi::PyObject,
    m_ml: *const ffi::PyMethodDef,
    m_self: *mut ffi::PyObject,
}

/// `PyDescr_COMMON`.
#[repr(C)]
struct Descr {
    ob_base: ffi::PyObject,
    d_type: *mut ffi::PyTypeObject,
}

/// `PyGetSetDescrObject`.
#[repr(C)]
struct GetSetDescr {
    common: Descr,
    _d_name: *mut ffi::PyObject,
    _d_qualname: *mut ffi::PyObject,
    d_getset: *const ffi::PyGetSetDef,
}

/// `PyMethodDescrObject`'s first fields.
#[repr(C)]
struct MethodDescr {
    common: Descr,
    _d_name: *mut ffi::PyObject,
    _d_qualname: *mut ffi::PyObject,
    d_method: *const ffi::PyMethodDef,
}

/// `PyInstanceMethodObject` (pybind11 wraps its methods in one).
#[repr(C)]
struct InstanceMethod {
    ob_base: ffi::PyObject,
    func: *mut ffi::PyObject,
}

/// `PyTypeObject`'s first fields.
#[repr(C)]
struct TypeHead {
    ob_base: ffi::PyVarObject,
    tp_name: *const std::ffi::c_char,
}

extern "C" {
    /// CPython's `instancemethod` type (not in the limited API's headers,
    /// exported by every CPython 3).
    static PyInstanceMethod_Type: u8;
}

/// Whether a C string (NUL-terminated, or NULL) equals `name`.
///
/// # Safety
/// `s` is NULL or a valid C string.
unsafe fn c_name_is(s: *const std::ffi::c_char, name: &str) -> bool {
    // SAFETY: the caller's contract.
    !s.is_null() && unsafe { std::ffi::CStr::from_ptr(s) }.to_bytes() == name.as_bytes()
}

/// Whether `obj`'s type is exactly the static type at `tp` (a pointer
/// comparison).
fn type_is(obj: &Bound<'_, PyAny>, tp: *const c_void) -> bool {
    // SAFETY: `obj` is live; reading its type pointer.
    unsafe { ffi::Py_TYPE(obj.as_ptr()) }
        .cast::<c_void>()
        .cast_const()
        == tp
}

/// The method definition of `obj` if it is exactly a builtin function
/// (`builtin_function_or_method`, not a subclass, not a Python function).
fn builtin_def(obj: &Bound<'_, PyAny>) -> Option<&'static ffi::PyMethodDef> {
    if !type_is(obj, std::ptr::addr_of!(ffi::PyCFunction_Type).cast()) {
        return None;
    }
    // SAFETY: `obj` is exactly a `PyCFunctionObject`; its method definition
    // is static data of the module that made it, valid for the process.
    unsafe { (*obj.as_ptr().cast::<CFunction>()).m_ml.as_ref() }
}

/// Whether `obj` is exactly a builtin function whose C name (`ml_name`) is
/// `name` and whose C function lies in the same image as `image` (see the
/// module documentation). Reads C fields only: runs no Python code.
pub(crate) fn is_builtin(obj: &Bound<'_, PyAny>, name: &str, image: *const c_void) -> bool {
    builtin_def(obj).is_some_and(|def| {
        // SAFETY: a method definition's name is a static C string; `ml_meth`
        // is read as an address only.
        unsafe {
            c_name_is(def.ml_name, name)
                && same_image(def.ml_meth.PyCFunction as *const c_void, image)
        }
    })
}

/// The C signature text (`ml_doc`) of a builtin checked with
/// [`is_builtin`]; `None` without one.
pub(crate) fn builtin_doc(obj: &Bound<'_, PyAny>) -> Option<&'static std::ffi::CStr> {
    let def = builtin_def(obj)?;
    // SAFETY: `ml_doc` is NULL or a static C string.
    (!def.ml_doc.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(def.ml_doc) })
}

/// The function an `instancemethod` wraps, read from its C struct; `None`
/// unless `obj` is exactly an `instancemethod`.
pub(crate) fn instancemethod_function<'py>(obj: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    // Taking the address of CPython's static type object.
    let tp = std::ptr::addr_of!(PyInstanceMethod_Type);
    if !type_is(obj, tp.cast()) {
        return None;
    }
    // SAFETY: `obj` is exactly a `PyInstanceMethodObject`, whose `func` is a
    // live object it holds a reference to.
    let func = unsafe { (*obj.as_ptr().cast::<InstanceMethod>()).func };
    // SAFETY: as above: a new strong reference (an incref, no Python code).
    (!func.is_null()).then(|| unsafe { Bound::from_borrowed_ptr(obj.py(), func) })
}

/// Whether `obj` is exactly one of `owner`'s own C attributes named `name`
/// (a `getset_descriptor` or `method_descriptor` made for the type `owner`,
/// whose C name is `name` and whose getter or method lies in `owner`'s
/// image). An entry put into `owner`'s dictionary by Python code, or a
/// descriptor of another type or name, fails. Reads C fields only.
pub(crate) fn is_own_descriptor(
    obj: &Bound<'_, PyAny>,
    owner: &Bound<'_, PyAny>,
    name: &str,
) -> bool {
    let image = owner.as_ptr().cast::<c_void>().cast_const();
    let owner = owner.as_ptr().cast::<ffi::PyTypeObject>();
    // (owner type, C name, C function) of the descriptor, from its struct.
    let (d_type, c_name, function) =
        if type_is(obj, std::ptr::addr_of!(ffi::PyGetSetDescr_Type).cast()) {
            // SAFETY: `obj` is exactly a `PyGetSetDescrObject`, whose
            // definition is static data of the module that made it.
            let descr = unsafe { &*obj.as_ptr().cast::<GetSetDescr>() };
            // SAFETY: as above.
            let Some(def) = (unsafe { descr.d_getset.as_ref() }) else {
                return false;
            };
            let getter = def.get.map_or(std::ptr::null(), |g| g as *const c_void);
            (descr.common.d_type, def.name, getter)
        } else if type_is(obj, std::ptr::addr_of!(ffi::PyMethodDescr_Type).cast()) {
            // SAFETY: `obj` is exactly a `PyMethodDescrObject`.
            let descr = unsafe { &*obj.as_ptr().cast::<MethodDescr>() };
            // SAFETY: as above.
            let Some(def) = (unsafe { descr.d_method.as_ref() }) else {
                return false;
            };
            // SAFETY: every variant of the union is one function pointer,
            // read as an address only.
            let method = unsafe { def.ml_meth.PyCFunction } as *const c_void;
            (descr.common.d_type, def.ml_name, method)
        } else {
            return false;
        };
    // SAFETY: a definition's name is a static C string.
    d_type == owner && unsafe { c_name_is(c_name, name) } && same_image(function, image)
}

/// The getter definition of a `getset_descriptor` checked with
/// [`is_own_descriptor`], for code that calls the getter itself (phase 2:
/// no bound method or argument tuple is made); `None` for anything else.
pub(crate) fn getset_def(obj: &Bound<'_, PyAny>) -> Option<&'static ffi::PyGetSetDef> {
    if !type_is(obj, std::ptr::addr_of!(ffi::PyGetSetDescr_Type).cast()) {
        return None;
    }
    // SAFETY: `obj` is exactly a `PyGetSetDescrObject`, whose definition is
    // static data of the module that made it, valid for the process.
    unsafe { (*obj.as_ptr().cast::<GetSetDescr>()).d_getset.as_ref() }
}

/// The method definition of a `method_descriptor` checked with
/// [`is_own_descriptor`], for code that calls the method itself (see
/// [`getset_def`]); `None` for anything else.
pub(crate) fn method_def(obj: &Bound<'_, PyAny>) -> Option<&'static ffi::PyMethodDef> {
    if !type_is(obj, std::ptr::addr_of!(ffi::PyMethodDescr_Type).cast()) {
        return None;
    }
    // SAFETY: `obj` is exactly a `PyMethodDescrObject`, whose definition is
    // static data of the module that made it, valid for the process.
    unsafe { (*obj.as_ptr().cast::<MethodDescr>()).d_method.as_ref() }
}

/// Whether `obj` is a static type (defined by C code, not by Python code)
/// whose object lies in the same image as `image`, or, with `image` NULL,
/// in any image. Runs no Python code.
pub(crate) fn is_static_type(obj: &Bound<'_, PyAny>, image: *const c_void) -> bool {
    let ptr = obj.as_ptr();
    // SAFETY: `obj` is live; PyType_Check reads its type's flags.
    if unsafe { ffi::PyType_Check(ptr) } == 0 {
        return false;
    }
    // SAFETY: `ptr` is a type object (checked above).
    let flags = unsafe { ffi::PyType_GetFlags(ptr.cast()) };
    if flags & ffi::Py_TPFLAGS_HEAPTYPE != 0 {
        return false;
    }
    if image.is_null() {
        image_base(ptr.cast()).is_some()
    } else {
        same_image(ptr.cast(), image)
    }
}

/// The C name (`tp_name`, `module.qualname` for a static type) of a static
/// type, read from its C struct; `None` unless `obj` is one.
pub(crate) fn static_type_name(obj: &Bound<'_, PyAny>) -> Option<String> {
    if !is_static_type(obj, std::ptr::null()) {
        return None;
    }
    // SAFETY: `obj` is a type object; a static type's `tp_name` is a static
    // C string.
    let name = unsafe { (*obj.as_ptr().cast::<TypeHead>()).tp_name };
    if name.is_null() {
        return None;
    }
    // SAFETY: as above.
    let name = unsafe { std::ffi::CStr::from_ptr(name) };
    Some(name.to_string_lossy().into_owned())
}

/// `PyMemberDescrObject`.
#[cfg(Py_LIMITED_API)]
#[repr(C)]
struct MemberDescr {
    common: Descr,
    _d_name: *mut ffi::PyObject,
    _d_qualname: *mut ffi::PyObject,
    d_member: *const ffi::PyMemberDef,
}

/// Addresses of the definitions behind CPython's own descriptors of `type`
/// that [`mro`] and [`type_dict`] read through; `0` where the entry found
/// was not CPython's own.
struct TypeDescrs {
    /// `type.__dict__['__mro__']`'s `PyMemberDef` (limited API only).
    #[cfg(Py_LIMITED_API)]
    mro: usize,
    /// `type.__dict__['__dict__']`'s `PyGetSetDef`.
    dict: usize,
}

/// CPython's own descriptors of `type`, looked up once in `type`'s
/// dictionary and checked from their C structs: Python code can change
/// what even `type`'s dictionary holds (through the garbage collector), but
/// cannot make a member or getset descriptor whose owner is `type`, nor
/// change the static definitions a real one points to.
fn type_descrs(py: Python<'_>) -> &'static TypeDescrs {
    static DESCRS: pyo3::sync::PyOnceLock<TypeDescrs> = pyo3::sync::PyOnceLock::new();
    DESCRS.get_or_init(py, || {
        let tp = py.get_type::<pyo3::types::PyType>();
        let owner = tp.as_type_ptr();
        let entry = |name: &str| {
            let found = tp.getattr("__dict__").and_then(|d| d.get_item(name)).ok();
            if found.is_none() {
                let _ = PyErr::take(py);
            }
            found
        };
        let dict = entry("__dict__")
            .filter(|e| type_is(e, std::ptr::addr_of!(ffi::PyGetSetDescr_Type).cast()))
            .and_then(|e| {
                // SAFETY: `e` is exactly a `PyGetSetDescrObject` (checked).
                let descr = unsafe { &*e.as_ptr().cast::<GetSetDescr>() };
                // SAFETY: its definition is static data of CPython.
                let def = unsafe { descr.d_getset.as_ref() }?;
                let getter = def.get.map_or(std::ptr::null(), |g| g as *const c_void);
                // SAFETY: a definition's name is a static C string.
                (descr.common.d_type == owner
                    && unsafe { c_name_is(def.name, "__dict__") }
                    && same_image(getter, python_image()))
                .then_some(def as *const ffi::PyGetSetDef as usize)
            })
            .unwrap_or(0);
        #[cfg(Py_LIMITED_API)]
        let mro = entry("__mro__")
            .filter(|e| type_is(e, std::ptr::addr_of!(ffi::PyMemberDescr_Type).cast()))
            .and_then(|e| {
                // SAFETY: `e` is exactly a `PyMemberDescrObject` (checked).
                let descr = unsafe { &*e.as_ptr().cast::<MemberDescr>() };
                // SAFETY: its definition is static data of CPython.
                let def = unsafe { descr.d_member.as_ref() }?;
                // An object field, read-only (`tp_mro`): `{"__mro__",
                // T_OBJECT, offsetof(PyTypeObject, tp_mro), READONLY}`.
                #[allow(deprecated)]
                let object =
                    def.type_code == ffi::_Py_T_OBJECT || def.type_code == ffi::Py_T_OBJECT_EX;
                // SAFETY: a definition's name is a static C string.
                (descr.common.d_type == owner
                    && unsafe { c_name_is(def.name, "__mro__") }
                    && object
                    && def.flags & ffi::Py_READONLY != 0)
                    .then_some(def as *const ffi::PyMemberDef as usize)
            })
            .unwrap_or(0);
        TypeDescrs {
            #[cfg(Py_LIMITED_API)]
            mro,
            dict,
        }
    })
}

/// The method resolution order CPython itself uses for `tp` (`tp_mro`: the
/// classes whose dictionaries attribute look-ups and `isinstance` walk),
/// read from C, never as `tp.__mro__` answers it: a metaclass can answer
/// that look-up with a property. A type never readied (`tp_mro` NULL, as
/// some test types of CPython's are) is readied first, as an attribute
/// look-up would. `None` where it cannot be read (limited API: `type`'s own
/// `__mro__` descriptor was not CPython's). Phase 1 only (readying a type
/// may run Python code).
pub(crate) fn mro<'py>(
    tp: &Bound<'py, pyo3::types::PyType>,
) -> Option<Bound<'py, pyo3::types::PyTuple>> {
    let py = tp.py();
    let read = || read_mro(tp);
    let mro = match read() {
        Some(mro) => mro,
        None => {
            // SAFETY: `tp` is a live type object; readying one that is
            // ready already returns at once.
            if unsafe { ffi::PyType_Ready(tp.as_type_ptr()) } != 0 {
                let _ = PyErr::take(py);
                return None;
            }
            read()?
        }
    };
    // CPython makes `tp_mro` an exact tuple (a metaclass's `mro()` answer
    // is converted).
    mro.cast_into_exact::<pyo3::types::PyTuple>().ok()
}

/// `tp_mro` as [`mro`] reads it, without readying the type: `None` where
/// it is NULL or cannot be read. No Python code and no allocation (a new
/// reference to the tuple the type holds), so phase 2 may call it.
fn read_mro<'py>(tp: &Bound<'py, pyo3::types::PyType>) -> Option<Bound<'py, PyAny>> {
    let py = tp.py();
    #[cfg(not(Py_LIMITED_API))]
    {
        // SAFETY: `tp` is a live type object; `tp_mro` is NULL or a tuple
        // the type holds (a new strong reference is taken).
        let mro = unsafe { (*tp.as_type_ptr()).tp_mro };
        // SAFETY: as above.
        (!mro.is_null()).then(|| unsafe { Bound::from_borrowed_ptr(py, mro) })
    }
    #[cfg(Py_LIMITED_API)]
    {
        let def = type_descrs(py).mro as *mut ffi::PyMemberDef;
        if def.is_null() {
            return None;
        }
        // SAFETY: `def` is CPython's own definition of `type.__mro__`
        // (checked in `type_descrs`), whose offset is `tp_mro`'s in every
        // type object: `PyMember_GetOne` reads that field of `tp` (a live
        // type object) as the descriptor's getter does, and returns a new
        // reference (`None` for NULL) or NULL with an exception set.
        let got = unsafe {
            Bound::from_owned_ptr_or_err(py, ffi::PyMember_GetOne(tp.as_ptr().cast(), def))
        };
        got.map_err(|_| ()).ok().filter(|m| !m.is_none())
    }
}

/// The dictionary of `tp` as CPython holds it (a read-only view of it),
/// through `type`'s own `__dict__` getter called directly, never as
/// `tp.__dict__` answers it (a metaclass can answer that look-up). `None`
/// where it cannot be read (that getter was not CPython's).
pub(crate) fn type_dict<'py>(tp: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    let py = tp.py();
    // SAFETY: `tp` is live; PyType_Check reads its type's flags.
    if unsafe { ffi::PyType_Check(tp.as_ptr()) } == 0 {
        return None;
    }
    let def = type_descrs(py).dict as *const ffi::PyGetSetDef;
    // SAFETY: `def` is NULL or CPython's own static definition of
    // `type.__dict__` (checked in `type_descrs`).
    let def = unsafe { def.as_ref() }?;
    let get = def.get?;
    // SAFETY: the C getter of `type.__dict__`, called with a type object
    // (checked above) and its closure, as the descriptor calls it; it
    // returns a new reference or NULL with an exception set.
    let dict = unsafe { Bound::from_owned_ptr_or_err(py, get(tp.as_ptr(), def.closure)) };
    if dict.is_err() {
        let _ = PyErr::take(py);
    }
    dict.ok()
}

/// What an attribute look-up on an instance of `tp` finds for `name` in
/// its class (CPython's `_PyType_Lookup`): the entry of the first
/// dictionary along the real MRO ([`mro`], [`type_dict`]) that has it,
/// never what `tp.name` answers (a metaclass can answer that). `None` where
/// the MRO or a dictionary cannot be read; `Some(None)` where no class has
/// it.
pub(crate) fn class_lookup<'py>(
    tp: &Bound<'py, pyo3::types::PyType>,
    name: &Bound<'py, pyo3::types::PyString>,
) -> Option<Option<Bound<'py, PyAny>>> {
    for class in mro(tp)?.iter() {
        let dict = type_dict(&class)?;
        match dict.get_item(name) {
            Ok(entry) => return Some(Some(entry)),
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyKeyError>(tp.py()) => {}
            Err(_) => return None,
        }
    }
    Some(None)
}

/// What each class of a type's real MRO holds in its own dictionary under
/// some names, noted in phase 1 ([`ClassEntries::note`]) so that phase 2
/// can tell, with no Python code and no allocation, that nothing an
/// instance look-up of those names finds has changed since
/// ([`ClassEntries::unchanged`]): the object still has that type (no
/// `__class__` assignment), the type still has that MRO tuple (no
/// `__bases__` assignment), and each class's dictionary holds the same
/// objects under the names (none set or deleted). Strong references to the
/// type, the MRO and every entry are kept, so no address compared can be
/// another object's. The dictionaries are read as CPython holds them: the
/// type's `tp_dict` (a CPython builtin type of 3.12+ has none there, and
/// its dictionary cannot change), or under the limited API the read-only
/// views of [`type_dict`], taken in phase 1 and kept. A key of a class's
/// dictionary that collides with a name's hash could run its `__eq__`
/// during a look-up (Python code, which only a hostile class has): such a
/// look-up that fails counts as a change.
pub(crate) struct ClassEntries {
    tp: Py<pyo3::types::PyType>,
    mro: Py<PyAny>,
    // Inline up to a tensor subclass's MRO of 4 classes and two names, so
    // that a call allocates nothing on the heap (`test_fast_paths.py`).
    names: smallvec::SmallVec<[Py<pyo3::types::PyString>; 2]>,
    /// For each class of `mro` in order, its entry under each name.
    entries: smallvec::SmallVec<[Option<Py<PyAny>>; 8]>,
    /// The dictionary views, one per class of `mro`.
    #[cfg(Py_LIMITED_API)]
    dicts: smallvec::SmallVec<[Py<PyAny>; 4]>,
    /// The type's version tag when noted (0: none), which CPython changes
    /// whenever an attribute of the type or of a class of its MRO is set or
    /// deleted, or its bases assigned: where it is valid, phase 2 compares it
    /// instead of looking the names up (a look-up could run the `__eq__` of
    /// a key whose hash collides with a name's: Python code).
    #[cfg(not(Py_LIMITED_API))]
    tag: u32,
}

/// Whether every key of `class`'s dictionary `dict` (a view) is an exact
/// `str`; `true` for a static type, whose dictionary C code filled.
#[cfg(Py_LIMITED_API)]
fn str_keys_only(class: &Bound<'_, PyAny>, dict: &Bound<'_, PyAny>) -> bool {
    // SAFETY: `class` is a type object (an entry of a real MRO).
    let flags = unsafe { ffi::PyType_GetFlags(class.as_ptr().cast()) };
    if flags & ffi::Py_TPFLAGS_HEAPTYPE == 0 {
        return true;
    }
    let Ok(keys) = dict.try_iter() else {
        return false;
    };
    keys.into_iter()
        .all(|k| k.is_ok_and(|k| k.is_exact_instance_of::<pyo3::types::PyString>()))
}

/// `tp`'s version tag if CPython holds a valid one (0 otherwise). Reads a
/// field of the type object: no Python code, no allocation.
#[cfg(not(Py_LIMITED_API))]
pub(crate) fn version_tag(tp: &Bound<'_, pyo3::types::PyType>) -> u32 {
    type_version_tag(tp.as_ptr().cast())
}

/// [`version_tag`] of the type object `t`, which must be live.
#[cfg(not(Py_LIMITED_API))]
#[inline(always)]
pub(crate) fn type_version_tag(t: *mut ffi::PyTypeObject) -> u32 {
    // SAFETY: `t` is a live type object (the caller's contract); its tag is
    // read under the GIL, which every writer of it holds.
    let tag = unsafe { (*t).tp_version_tag };
    // Before 3.12 a tag counts only with its flag (3.12+: 0 means none).
    #[cfg(not(Py_3_12))]
    {
        const VALID_VERSION_TAG: std::ffi::c_ulong = 1 << 19;
        // SAFETY: as above (no free-threaded build before 3.13: a plain
        // field).
        if unsafe { (*t).tp_flags } & VALID_VERSION_TAG == 0 {
            return 0;
        }
    }
    tag
}

impl ClassEntries {
    /// Notes what `obj`'s type's classes hold under `names` (phase 1: the
    /// MRO may be readied, the views are allocated). `None` where the MRO
    /// or a dictionary cannot be read.
    pub(crate) fn note<'py>(
        obj: &Bound<'py, PyAny>,
        names: &[&Bound<'py, pyo3::types::PyString>],
    ) -> Option<Self> {
        let tp = obj.get_type();
        let mro = mro(&tp)?;
        // A look-up through the type has CPython give it a version tag (and
        // its bases), if it can (phase 1: may run a descriptor's code, whose
        // changes the tag then reflects); the tag is read before the entries.
        #[cfg(not(Py_LIMITED_API))]
        let tag = match version_tag(&tp) {
            0 => {
                let _ = tp.getattr(names.first()?);
                version_tag(&tp)
            }
            tag => tag,
        };
        let mut entries = smallvec::SmallVec::new();
        #[cfg(Py_LIMITED_API)]
        let mut dicts = smallvec::SmallVec::new();
        for class in mro.iter() {
            #[cfg(not(Py_LIMITED_API))]
            let dict = own_dict(&class)?;
            #[cfg(Py_LIMITED_API)]
            let dict = Some(type_dict(&class)?);
            // No version tags here: phase 2 looks the names up again, which
            // runs no Python code only if every key is an exact `str`
            // (compared in C); a heap type's keys are fixed when it is made
            // (`setattr` takes `str` names only), so they are checked here.
            #[cfg(Py_LIMITED_API)]
            if !str_keys_only(&class, dict.as_ref()?) {
                return None;
            }
            for name in names {
                entries.push(match &dict {
                    Some(d) => dict_entry(d, name)?.map(Bound::unbind),
                    None => None,
                });
            }
            #[cfg(Py_LIMITED_API)]
            dicts.push(dict?.unbind());
        }
        Some(ClassEntries {
            tp: tp.unbind(),
            mro: mro.into_any().unbind(),
            names: names.iter().map(|n| (*n).clone().unbind()).collect(),
            entries,
            #[cfg(Py_LIMITED_API)]
            dicts,
            #[cfg(not(Py_LIMITED_API))]
            tag,
        })
    }

    /// Whether `obj` still has the type noted, with the same MRO, whose
    /// classes hold the same entries. No Python code (but see the type's
    /// documentation on colliding keys) and no allocation: phase 2.
    pub(crate) fn unchanged(&self, obj: &Bound<'_, PyAny>) -> bool {
        let py = obj.py();
        // SAFETY: `obj` is live; reading its type pointer.
        if unsafe { ffi::Py_TYPE(obj.as_ptr()) } != self.tp.as_ptr().cast() {
            return false;
        }
        let Some(mro) = read_mro(self.tp.bind(py)) else {
            return false;
        };
        if !mro.is(&self.mro) {
            return false;
        }
        // A valid tag that has not moved: no attribute of the type or its
        // bases was set or deleted since (no look-up, so no key's `__eq__`).
        #[cfg(not(Py_LIMITED_API))]
        if self.tag != 0 {
            return version_tag(self.tp.bind(py)) == self.tag;
        }
        let Ok(mro) = mro.cast_into_exact::<pyo3::types::PyTuple>() else {
            return false;
        };
        let mut noted = self.entries.iter();
        for (i, class) in mro.iter().enumerate() {
            #[cfg(not(Py_LIMITED_API))]
            let Some(dict) = own_dict(&class) else {
                return false;
            };
            #[cfg(not(Py_LIMITED_API))]
            let _ = i;
            #[cfg(Py_LIMITED_API)]
            let dict = {
                let _ = class;
                match self.dicts.get(i) {
                    Some(d) => Some(d.bind(py).clone()),
                    None => return false,
                }
            };
            for name in &self.names {
                let now = match &dict {
                    Some(d) => match dict_entry(d, name.bind(py)) {
                        Some(e) => e,
                        None => return false,
                    },
                    None => None,
                };
                let Some(then) = noted.next() else {
                    return false;
                };
                let same = match (then, &now) {
                    (Some(a), Some(b)) => a.is(b),
                    (None, None) => true,
                    _ => false,
                };
                if !same {
                    return false;
                }
            }
        }
        noted.next().is_none()
    }
}

/// `class`'s own dictionary as CPython holds it (`tp_dict`): `Some(None)`
/// for a CPython builtin type of 3.12+, which keeps it elsewhere (and whose
/// dictionary Python code cannot change); `None` where `class` is not a
/// type. No allocation (a new reference to the dictionary).
#[cfg(not(Py_LIMITED_API))]
fn own_dict<'py>(class: &Bound<'py, PyAny>) -> Option<Option<Bound<'py, PyAny>>> {
    // SAFETY: `class` is live; PyType_Check reads its type's flags.
    if unsafe { ffi::PyType_Check(class.as_ptr()) } == 0 {
        return None;
    }
    // SAFETY: `class` is a type object (checked); `tp_dict` is NULL or a
    // dictionary it holds (a new strong reference is taken).
    let dict = unsafe { (*class.as_ptr().cast::<ffi::PyTypeObject>()).tp_dict };
    // SAFETY: as above.
    Some((!dict.is_null()).then(|| unsafe { Bound::from_borrowed_ptr(class.py(), dict) }))
}

/// The entry of `dict` (a class's dictionary, or under the limited API its
/// read-only view) under `name`: `Some(None)` where it has none, `None`
/// where the look-up failed (its error cleared). No allocation: a missing
/// key is asked with `PyDict_GetItemWithError` / `PySequence_Contains`,
/// which raise nothing for it.
fn dict_entry<'py>(
    dict: &Bound<'py, PyAny>,
    name: &Bound<'py, pyo3::types::PyString>,
) -> Option<Option<Bound<'py, PyAny>>> {
    let py = dict.py();
    #[cfg(not(Py_LIMITED_API))]
    {
        // SAFETY: `dict` is a type's `tp_dict`, an exact dictionary; the
        // look-up returns a borrowed reference, or NULL (with an error set
        // only where it failed).
        let got = unsafe { ffi::PyDict_GetItemWithError(dict.as_ptr(), name.as_ptr()) };
        if got.is_null() {
            // SAFETY: the GIL is held.
            if unsafe { ffi::PyErr_Occurred() }.is_null() {
                return Some(None);
            }
            // SAFETY: as above.
            unsafe { ffi::PyErr_Clear() };
            return None;
        }
        // SAFETY: `got` is a live borrowed reference; a new one is taken.
        Some(Some(unsafe { Bound::from_borrowed_ptr(py, got) }))
    }
    #[cfg(Py_LIMITED_API)]
    {
        // SAFETY: `dict` is a `mappingproxy` of a type's dictionary, whose
        // `__contains__` is the dictionary's (`PyDict_Contains`).
        match unsafe { ffi::PySequence_Contains(dict.as_ptr(), name.as_ptr()) } {
            0 => return Some(None),
            1 => {}
            _ => {
                // SAFETY: the GIL is held; an error is set.
                unsafe { ffi::PyErr_Clear() };
                return None;
            }
        }
        // SAFETY: as above; the key is there, so the look-up returns a new
        // reference (NULL with an error set only if the dictionary changed
        // in between, which only a colliding key's `__eq__` could do).
        let got = unsafe { ffi::PyObject_GetItem(dict.as_ptr(), name.as_ptr()) };
        if got.is_null() {
            // SAFETY: the GIL is held; an error is set.
            unsafe { ffi::PyErr_Clear() };
            return None;
        }
        // SAFETY: `got` is a new reference.
        Some(Some(unsafe { Bound::from_owned_ptr(py, got) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images() {
        // Code of this test binary and of libc lie in images; the heap does not.
        let here = images as *const c_void;
        assert!(image_base(here).is_some());
        let boxed = Box::new(0u64);
        assert!(image_base(&*boxed as *const u64 as *const c_void).is_none());
        assert!(same_image(here, tests_anchor as *const c_void));
        assert!(!same_image(here, std::ptr::null()));
    }

    fn tests_anchor() {}
}
