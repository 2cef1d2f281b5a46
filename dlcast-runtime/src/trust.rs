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
//!   the name is the method table's `ml_name`, read through the builtin
//!   type's own (immutable) `__name__` getter, and the function pointer is
//!   the C code the call runs;
//! - a **static type**: types made by Python code are heap types, so a
//!   type without `Py_TPFLAGS_HEAPTYPE` was defined by C code, and its
//!   attributes cannot be set from Python (CPython 3.10+ marks every static
//!   type immutable; earlier ones refuse `setattr` on any non-heap type);
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

/// Whether `obj` is exactly a builtin function (`builtin_function_or_method`,
/// not a subclass, not a Python function) whose C name is `name` and whose
/// C function lies in the same image as `image` (see the module
/// documentation). Runs no Python code.
pub(crate) fn is_builtin(obj: &Bound<'_, PyAny>, name: &str, image: *const c_void) -> bool {
    let ptr = obj.as_ptr();
    // SAFETY: `obj` is live; comparing its type pointer with the address of
    // CPython's static `PyCFunction_Type` reads nothing else.
    let exact = unsafe { ffi::Py_TYPE(ptr) == std::ptr::addr_of_mut!(ffi::PyCFunction_Type) };
    if !exact {
        return false;
    }
    // SAFETY: `obj` is exactly a `PyCFunction`, which the call requires.
    let Some(function) = (unsafe { ffi::PyCFunction_GetFunction(ptr) }) else {
        return false;
    };
    if !same_image(function as *const c_void, image) {
        return false;
    }
    // `__name__` of an exact builtin is the type's own getter of `ml_name`
    // (the type is static and immutable; its instances have no `__dict__`).
    obj.getattr(pyo3::intern!(obj.py(), "__name__"))
        .ok()
        .and_then(|n| n.extract::<pyo3::pybacked::PyBackedStr>().ok())
        .is_some_and(|n| &*n == name)
}

/// Whether `obj` is a static type (defined by C code, not by Python code)
/// whose object lies in the same image as `image`, or, with `image` NULL,
/// in any image. Its `__dict__` then cannot be changed from Python. Runs
/// no Python code.
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

/// The C name (`tp_name`) of a static type, as `module.qualname`: the
/// type's own `__module__` and `__qualname__`, which for a static type CPython
/// derives from `tp_name` through the getters of `type` (immutable).
/// `None` unless both `obj` and its metatype are static types (a heap
/// metatype's attribute lookup could run Python code).
pub(crate) fn static_type_name(obj: &Bound<'_, PyAny>) -> Option<String> {
    if !is_static_type(obj, std::ptr::null()) {
        return None;
    }
    let meta = obj.get_type();
    if !is_static_type(meta.as_any(), std::ptr::null()) {
        return None;
    }
    let py = obj.py();
    let part = |attr| {
        obj.getattr(attr)
            .ok()?
            .extract::<pyo3::pybacked::PyBackedStr>()
            .ok()
    };
    let module = part(pyo3::intern!(py, "__module__"))?;
    let qualname = part(pyo3::intern!(py, "__qualname__"))?;
    Some(format!("{}.{}", &*module, &*qualname))
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
