//! The DLPack C exchange API (`type(x).__dlpack_c_exchange_api__`, a
//! capsule named `"dlpack_exchange_api"`; PyTorch 2.11+), and what dlcast
//! knows of an argument's type, looked up once per type.
//!
//! Two uses:
//! - PyTorch's own table (checked to be PyTorch's C code: [`torch_table`])
//!   runs no Python code: phase 2 reads a (private, see the `torch` module)
//!   tensor through it with [`read_with`], filling a `DLTensor` on the
//!   stack.
//! - Any other type's table may be anything (a table written in Python
//!   through ctypes, say): phase 1 asks it for an owning tensor
//!   ([`owning`]), which phase 2 reads like a capsule.

use super::{from_dltensor, ImportError, ImportPath, Owner, RawTensor};
use crate::error::ImportFault;
use dlpack_rs::ffi::{
    DLDataTypeCode, DLManagedTensorVersioned, DLPackExchangeAPI, DLPackExchangeAPIHeader, DLTensor,
};
use pyo3::ffi;
use pyo3::prelude::*;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering};

/// Types seen, with their exchange API (or `NO_API`), their [`TypeFlags`]
/// and the type's version tag when they were computed. A strong reference
/// to each cached type is kept, so a cached address never names another
/// type.
const CACHE_SLOTS: usize = 8;
const NO_API: usize = 1;
static CACHE_TYPES: [AtomicUsize; CACHE_SLOTS] = [const { AtomicUsize::new(0) }; CACHE_SLOTS];
static CACHE_APIS: [AtomicUsize; CACHE_SLOTS] = [const { AtomicUsize::new(0) }; CACHE_SLOTS];
static CACHE_FLAGS: [AtomicU8; CACHE_SLOTS] = [const { AtomicU8::new(0) }; CACHE_SLOTS];
static CACHE_TAGS: [AtomicU64; CACHE_SLOTS] = [const { AtomicU64::new(0) }; CACHE_SLOTS];

/// The longest `prev_api` chain walked: a producer's chain that cycles (or
/// is absurdly long) is not followed further.
const MAX_CHAIN: usize = 16;

/// What dlcast needs to know of an argument's type beyond its exchange API,
/// looked up (Python attribute lookups) and cached with it.
#[derive(Clone, Copy, Default)]
pub(crate) struct TypeFlags(u8);

impl TypeFlags {
    /// The type's exchange API is PyTorch's own table (see [`torch_table`]).
    const TORCH_TABLE: u8 = 1;
    /// The type is, or derives from, a type of the `torch` package.
    const TORCH_TYPE: u8 = 2;
    /// A type of a framework whose arrays are immutable although their
    /// capsules do not say so (DLPack notes): the frameworks table's
    /// `read_only` column ([`arrays_immutable`]).
    const IMMUTABLE: u8 = 4;
    /// A `torch.Tensor` subclass with its own `__torch_dispatch__`, which
    /// PyTorch may call (Python code) even to read the tensor's sizes.
    const PY_DISPATCH: u8 = 8;
    /// A type of the `torch` package whose class, or one of its bases,
    /// publishes PyTorch's read-only exchange table
    /// (`torch._C._const_dlpack_exchange_api()`, what
    /// `torch.utils.dlpack.ReadOnlyTensorWrapper` sets): its tensors are
    /// declared read-only (see [`declares_read_only`]).
    const READ_ONLY: u8 = 16;

    /// See [`TypeFlags::TORCH_TYPE`].
    pub(crate) fn torch_type(self) -> bool {
        self.0 & Self::TORCH_TYPE != 0
    }

    /// See [`TypeFlags::IMMUTABLE`].
    pub(crate) fn immutable(self) -> bool {
        self.0 & Self::IMMUTABLE != 0
    }

    /// See [`TypeFlags::PY_DISPATCH`].
    pub(crate) fn py_dispatch(self) -> bool {
        self.0 & Self::PY_DISPATCH != 0
    }

    /// See [`TypeFlags::READ_ONLY`].
    pub(crate) fn declared_read_only(self) -> bool {
        self.0 & Self::READ_ONLY != 0
    }
}

/// The version tags of the type and of its metatype, which CPython changes
/// whenever the type (or metatype) or one of its bases is modified (an
/// attribute set or deleted); `0` when either has none, or (abi3) when they
/// cannot be read: then nothing that Python can change is trusted from the
/// cache.
fn version_tag(tp: *mut ffi::PyTypeObject) -> u64 {
    // The type's own tag and its metatype's: an attribute looked up on the
    // type may come from the metatype (a metaclass attribute or property),
    // whose changes leave the type's own tag alone.
    let (own, meta) = (tag_of(tp), tag_of(metatype(tp)));
    if own == 0 || meta == 0 {
        0
    } else {
        (u64::from(own) << 32) | u64::from(meta)
    }
}

/// `type(tp)`.
fn metatype(tp: *mut ffi::PyTypeObject) -> *mut ffi::PyTypeObject {
    // SAFETY: a type object is an object; its type pointer is valid while
    // `tp` is (the caller holds a reference to an instance of `tp`).
    unsafe { ffi::Py_TYPE(tp.cast()) }
}

/// One type's version tag; `0` when it has none or (abi3) cannot be read.
fn tag_of(tp: *mut ffi::PyTypeObject) -> u32 {
    #[cfg(not(Py_LIMITED_API))]
    {
        // SAFETY: `tp` is a live type object; the field is a plain integer.
        let t = unsafe { (*tp).tp_version_tag };
        // SAFETY: as above; the flag says whether the tag is current.
        let valid = unsafe { ffi::PyType_HasFeature(tp, ffi::Py_TPFLAGS_VALID_VERSION_TAG) } != 0;
        if valid {
            t
        } else {
            0
        }
    }
    #[cfg(Py_LIMITED_API)]
    {
        let _ = tp;
        0
    }
}

/// Whether `framework`'s arrays are immutable, so that a capsule of one is
/// read read-only whatever it says: its `read_only` column of
/// [`crate::facts::FRAMEWORKS`] (`ReadOnly::arrays_immutable`, matched in
/// full, so a new kind of read-only answer is decided there).
pub(crate) fn arrays_immutable(framework: crate::facts::Framework) -> bool {
    framework.facts().read_only.arrays_immutable()
}

/// The exchange API and [`TypeFlags`] of `obj`'s type: from the cache, or
/// looked up (Python attribute lookups: phase 1 only) and cached in a free
/// slot. A cached entry is trusted only while the type's version tag is
/// the one it was computed under: a class can gain or lose an exchange
/// table or a `__torch_dispatch__` after dlcast first saw it. Where the tag
/// cannot be read (abi3), the table and the `__torch_dispatch__` verdict
/// are looked up on every call (whether the type comes from `torch`, JAX or
/// TensorFlow cannot change).
pub(crate) fn type_info(obj: &Bound<'_, PyAny>) -> (Option<&'static DLPackExchangeAPI>, TypeFlags) {
    // SAFETY: `obj` is live.
    let tp = unsafe { ffi::Py_TYPE(obj.as_ptr()) };
    let tag = version_tag(tp);
    let slot = CACHE_TYPES
        .iter()
        .position(|t| t.load(Ordering::Relaxed) == tp as usize);
    if let Some(slot) = slot {
        if tag != 0 && tag == CACHE_TAGS[slot].load(Ordering::Relaxed) {
            let api = CACHE_APIS[slot].load(Ordering::Relaxed);
            let flags = TypeFlags(CACHE_FLAGS[slot].load(Ordering::Relaxed));
            // SAFETY: a cached API pointer came from the capsule of a type
            // we keep alive, looked up under the type's current version; the
            // header requires the table to live for the process.
            let api = (api != NO_API).then(|| unsafe { &*(api as *const DLPackExchangeAPI) });
            return (api, flags);
        }
        // The type may have changed: look up again what Python can change.
        let kept = CACHE_FLAGS[slot].load(Ordering::Relaxed)
            & (TypeFlags::TORCH_TYPE | TypeFlags::IMMUTABLE);
        let (api, flags) = lookup(obj, kept);
        store(slot, api, flags, tag, version_tag(tp));
        return (api, flags);
    }
    let mut kept = 0;
    if torch_in_mro(obj) {
        kept |= TypeFlags::TORCH_TYPE;
    }
    if crate::framework::Framework::of(obj).is_some_and(arrays_immutable) {
        kept |= TypeFlags::IMMUTABLE;
    }
    let (api, flags) = lookup(obj, kept);
    // Cache the answer in a free slot (under the GIL, so no race), keeping
    // the type alive; with no free slot, just answer.
    if let Some(slot) = CACHE_TYPES
        .iter()
        .position(|t| t.load(Ordering::Relaxed) == 0)
    {
        std::mem::forget(obj.get_type().unbind());
        store(slot, api, flags, tag, version_tag(tp));
        CACHE_TYPES[slot].store(tp as usize, Ordering::Relaxed);
    }
    (api, flags)
}

/// The exchange table of `obj`'s type and the flags that depend on it,
/// given the flags that do not (`kept`).
fn lookup(obj: &Bound<'_, PyAny>, kept: u8) -> (Option<&'static DLPackExchangeAPI>, TypeFlags) {
    let api = exchange_api_of_type(obj.get_type().as_any());
    let mut flags = kept;
    if flags & TypeFlags::TORCH_TYPE != 0 {
        if api.is_some_and(|a| torch_table(obj.py()).is_some_and(|t| std::ptr::eq(t, a))) {
            flags |= TypeFlags::TORCH_TABLE;
        }
        if has_own_torch_dispatch(obj) {
            flags |= TypeFlags::PY_DISPATCH;
        }
        if declares_read_only(obj, api) {
            flags |= TypeFlags::READ_ONLY;
        }
    }
    (api, TypeFlags(flags))
}

/// Writes a cache slot. `before` and `after` are the type's version tags
/// around the lookups: if the lookups themselves changed the type (a
/// descriptor's Python code), the entry is not trusted next time.
fn store(
    slot: usize,
    api: Option<&'static DLPackExchangeAPI>,
    flags: TypeFlags,
    before: u64,
    after: u64,
) {
    CACHE_APIS[slot].store(
        api.map_or(NO_API, |a| a as *const _ as usize),
        Ordering::Relaxed,
    );
    CACHE_FLAGS[slot].store(flags.0, Ordering::Relaxed);
    CACHE_TAGS[slot].store(if before == after { after } else { 0 }, Ordering::Relaxed);
}

/// Whether `obj`'s type is, or derives from, a type of the `torch` package:
/// a static type of the real MRO ([`crate::trust::mro`], read from C: a
/// metaclass can answer `__mro__` with a property that leaves PyTorch's
/// classes out, which would take a tensor past PyTorch's rules) whose C
/// name (`tp_name`, which Python code cannot change) is in `torch`
/// (`torch._C.TensorBase`, the base of every tensor), or any class of it
/// whose `__module__` says `torch`. Either can only add the flag.
fn torch_in_mro(obj: &Bound<'_, PyAny>) -> bool {
    let in_torch = |m: &str| m == "torch" || m.starts_with("torch.");
    let from_torch = |t: &Bound<'_, PyAny>| {
        if let Some(name) = crate::trust::static_type_name(t) {
            if in_torch(&name) {
                return true;
            }
        }
        t.cast::<pyo3::types::PyType>().is_ok_and(|t| {
            t.module()
                .is_ok_and(|m| m.to_cow().is_ok_and(|m| in_torch(&m)))
        })
    };
    let Some(mro) = crate::trust::mro(&obj.get_type()) else {
        return false;
    };
    mro.iter().any(|t| from_torch(&t))
}

/// Whether `obj`'s type has a `__torch_dispatch__` other than
/// `torch.Tensor`'s (a builtin function, found as the same object through
/// every subclass that does not define its own). `true` when it cannot tell.
pub(crate) fn has_own_torch_dispatch(obj: &Bound<'_, PyAny>) -> bool {
    let py = obj.py();
    let name = pyo3::intern!(py, "__torch_dispatch__");
    let Ok(base) = py
        .import("torch")
        .and_then(|t| t.getattr("Tensor"))
        .and_then(|t| t.getattr(name))
    else {
        return true;
    };
    obj.get_type()
        .getattr(name)
        .map_or(true, |own| !own.is(&base))
}

/// Whether `obj`'s type declares its tensors read-only through PyTorch's
/// read-only exchange table ([`torch_const_table`]): the table it publishes
/// (`api`) is that one, or any class of its MRO has that table in its own
/// `__dict__`. A subclass that publishes another table (PyTorch's writable
/// one, say) does not undo its base's declaration: declarations only ever
/// make a tensor more read-only. The table is recognised by its address,
/// taken from PyTorch's own C function, never by a class's name. The MRO
/// and each class's dictionary are CPython's own, read through C
/// ([`crate::trust::mro`], [`crate::trust::type_dict`]), not as
/// `type(obj).__mro__` and `class.__dict__` answer: a metaclass can answer
/// both, leaving a declaring base out. Where they cannot be read, the type
/// counts as declaring (a declaration is never missed). Python lookups
/// (phase 1, cached with the type's version tag).
fn declares_read_only(obj: &Bound<'_, PyAny>, api: Option<&'static DLPackExchangeAPI>) -> bool {
    let py = obj.py();
    let Some(read_only) = torch_const_table(py) else {
        return false;
    };
    if api.is_some_and(|a| std::ptr::eq(a, read_only)) {
        return true;
    }
    let name = pyo3::intern!(py, "__dlpack_c_exchange_api__");
    let Some(mro) = crate::trust::mro(&obj.get_type()) else {
        return true;
    };
    mro.iter().any(|class| {
        let Some(dict) = crate::trust::type_dict(&class) else {
            return true;
        };
        let Ok(entry) = dict.get_item(name) else {
            let _ = PyErr::take(py);
            return false;
        };
        table_of(&entry).is_some_and(|t| std::ptr::eq(t, read_only))
    })
}

/// PyTorch's read-only exchange table (`torch._C._const_dlpack_exchange_api`,
/// PyTorch 2.15+: its exports carry DLPack's `READ_ONLY` flag), once
/// checked as [`torch_table`] checks the writable one; `0` until then,
/// [`NO_API`] when there is none to trust. Used only to recognise a
/// declaration of read-only tensors, never called.
static TORCH_CONST_TABLE: AtomicUsize = AtomicUsize::new(0);

/// See [`TORCH_CONST_TABLE`]; `None` in a PyTorch without it.
pub(crate) fn torch_const_table(py: Python<'_>) -> Option<&'static DLPackExchangeAPI> {
    let mut known = TORCH_CONST_TABLE.load(Ordering::Acquire);
    if known == 0 {
        let base = crate::import::torch_handles::tensor_base(py).ok()?;
        known = find_table(py, base.bind(py), "_const_dlpack_exchange_api")
            .map_or(NO_API, |t| t as *const DLPackExchangeAPI as usize);
        TORCH_CONST_TABLE.store(known, Ordering::Release);
    }
    // SAFETY: a table checked by `find_table`, which the header requires to
    // live for the process.
    (known != NO_API).then(|| unsafe { &*(known as *const DLPackExchangeAPI) })
}

/// PyTorch's own exchange table, once checked (see [`torch_table`]); `0`
/// until then, [`NO_API`] when there is none to trust.
static TORCH_TABLE: AtomicUsize = AtomicUsize::new(0);
/// The class PyTorch's C code makes its tensors of (`torch.Tensor`), once
/// learnt by [`learn_torch_tensor`] (a strong reference is kept, so the
/// pointer stays valid for the process).
static TORCH_TENSOR: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());

/// PyTorch's own table, whose functions run no Python code for tensors
/// without Python dispatch, so phase 2 may call it. Trusted only as the
/// answer of `torch._C._dlpack_exchange_api` (a builtin that must be
/// PyTorch's own C function, see `crate::trust::is_builtin`), and only when
/// the table and every function dlcast calls in it lie in the image of
/// PyTorch's C extension (`torch._C.TensorBase`'s): a capsule set on
/// `torch.Tensor.__dlpack_c_exchange_api__`, or a table of ctypes callbacks,
/// is not PyTorch's. Looked up once (Python code, the first time: phase 1
/// only); `None` for a PyTorch without the exchange API, or where the table
/// cannot be trusted: tensors then take their `__dlpack__` in phase 1.
pub(crate) fn torch_table(py: Python<'_>) -> Option<&'static DLPackExchangeAPI> {
    let mut known = TORCH_TABLE.load(Ordering::Acquire);
    if known == 0 {
        // Until PyTorch's own attributes are found (see `crate::import::torch`),
        // nothing is trusted, and nothing is noted either.
        let base = crate::import::torch_handles::tensor_base(py).ok()?;
        known = find_table(py, base.bind(py), "_dlpack_exchange_api")
            .map_or(NO_API, |t| t as *const DLPackExchangeAPI as usize);
        TORCH_TABLE.store(known, Ordering::Release);
    }
    // SAFETY: a table checked by `find_table`, which the header
    // requires to live for the process.
    (known != NO_API).then(|| unsafe { &*(known as *const DLPackExchangeAPI) })
}

/// See [`torch_table`]: the table `torch._C.<name>()` answers, checked.
fn find_table(
    py: Python<'_>,
    base: &Bound<'_, PyAny>,
    name: &str,
) -> Option<&'static DLPackExchangeAPI> {
    let image = base.as_ptr().cast::<std::ffi::c_void>().cast_const();
    let f = py
        .import("torch")
        .ok()?
        .getattr("_C")
        .ok()?
        .getattr(name)
        .ok()?;
    if !crate::trust::is_builtin(&f, name, image) {
        return None;
    }
    let capsule = f.call0().ok()?;
    // SAFETY: GetPointer checks the object is a capsule of that exact name
    // (else NULL with an error, which we clear).
    let ptr =
        unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dlpack_exchange_api".as_ptr()) };
    if ptr.is_null() {
        let _ = PyErr::take(py);
        return None;
    }
    if !crate::trust::same_image(ptr, image) {
        return None;
    }
    // SAFETY: a capsule of that name holds a DLPackExchangeAPIHeader, valid
    // for the process (here: static data of PyTorch's image).
    let header = unsafe { &*ptr.cast::<DLPackExchangeAPIHeader>() };
    if header.version.major != 1 {
        return None;
    }
    // SAFETY: a major-1 header starts a DLPackExchangeAPI table.
    let table = unsafe { &*ptr.cast::<DLPackExchangeAPI>() };
    let code = [
        table
            .dltensor_from_py_object_no_sync
            .map(|f| f as *const std::ffi::c_void),
        table
            .managed_tensor_from_py_object_no_sync
            .map(|f| f as *const std::ffi::c_void),
        table
            .managed_tensor_to_py_object_no_sync
            .map(|f| f as *const std::ffi::c_void),
        table
            .current_work_stream
            .map(|f| f as *const std::ffi::c_void),
    ];
    code.iter()
        .flatten()
        .all(|&f| crate::trust::same_image(f, image))
        .then_some(table)
}

/// Notes the class of `alias`, a tensor that PyTorch's C code has just made
/// (`TensorBase.data`'s getter, Python dispatch off), as `torch.Tensor`: the
/// class PyTorch registered for its tensors, whatever the `torch.Tensor`
/// attribute now names. Once; later calls change nothing.
pub(crate) fn learn_torch_tensor(alias: &Bound<'_, PyAny>) {
    if !TORCH_TENSOR.load(Ordering::Acquire).is_null() {
        return;
    }
    let tensor = alias.get_type();
    // Keep the class alive for the process, then note it.
    TORCH_TENSOR.store(tensor.as_ptr().cast(), Ordering::Release);
    std::mem::forget(tensor.unbind());
}

/// The class learnt by [`learn_torch_tensor`] (`torch.Tensor`), once learnt.
pub(crate) fn torch_tensor_class(py: Python<'_>) -> Option<Bound<'_, pyo3::types::PyType>> {
    let tensor = TORCH_TENSOR.load(Ordering::Acquire);
    // SAFETY: a type object kept alive for the process (see
    // `learn_torch_tensor`); a new strong reference is taken.
    (!tensor.is_null()).then(|| unsafe {
        Bound::from_borrowed_ptr(py, tensor.cast::<ffi::PyObject>()).cast_into_unchecked()
    })
}

/// Whether `obj`'s type is exactly `torch.Tensor` (a pointer comparison);
/// `false` before [`learn_torch_tensor`] first learnt it.
pub(crate) fn is_exactly_torch_tensor(obj: &Bound<'_, PyAny>) -> bool {
    let tensor = TORCH_TENSOR.load(Ordering::Acquire);
    // SAFETY: `obj` is live; reading its type pointer.
    !tensor.is_null() && unsafe { ffi::Py_TYPE(obj.as_ptr()) } == tensor
}

/// The DLPack C exchange API a type publishes (`None` if it has none, or
/// none of major version 1 within [`MAX_CHAIN`] links of `prev_api`). The
/// table lives for the process (DLPack header).
pub(crate) fn exchange_api_of_type(tp: &Bound<'_, PyAny>) -> Option<&'static DLPackExchangeAPI> {
    let py = tp.py();
    let capsule = tp
        .getattr(pyo3::intern!(py, "__dlpack_c_exchange_api__"))
        .ok()?;
    table_of(&capsule)
}

/// The table of major version 1 an exchange API capsule (a capsule named
/// `"dlpack_exchange_api"`) holds; `None` for anything else.
pub(crate) fn table_of(capsule: &Bound<'_, PyAny>) -> Option<&'static DLPackExchangeAPI> {
    let py = capsule.py();
    // SAFETY: GetPointer checks the object is a capsule of that exact name
    // (else NULL with an error, which we clear).
    let ptr =
        unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dlpack_exchange_api".as_ptr()) };
    if ptr.is_null() {
        let _ = PyErr::take(py);
        return None;
    }
    // Walk to a table of major version 1; a chain that cycles ends at the
    // bound.
    let mut header = ptr.cast::<DLPackExchangeAPIHeader>();
    for _ in 0..MAX_CHAIN {
        if header.is_null() {
            return None;
        }
        // SAFETY: the capsule holds a DLPackExchangeAPIHeader, valid for
        // the process, whose `prev_api` links point to further headers.
        let h = unsafe { &*header };
        if h.version.major == 1 {
            // SAFETY: a major-1 header starts a DLPackExchangeAPI table.
            return Some(unsafe { &*header.cast::<DLPackExchangeAPI>() });
        }
        header = h.prev_api;
    }
    None
}

/// The error of a table function that returned failure.
fn table_error(py: Python<'_>, what: &'static str) -> ImportError {
    let err = PyErr::take(py).unwrap_or_else(|| ImportFault::Silent(what).into());
    ImportError::Producer(what, err)
}

/// Phase 2: reads `obj` through `api` (PyTorch's own table, which runs no
/// Python code), without taking ownership: the caller keeps `obj` alive
/// and unchanged (a private tensor, see the `torch` module).
pub(crate) fn read_with(
    obj: &Bound<'_, PyAny>,
    api: &'static DLPackExchangeAPI,
) -> Result<RawTensor, ImportError> {
    let Some(read) = api.dltensor_from_py_object_no_sync else {
        return Err(ImportError::Invalid(
            "the exchange API cannot describe a tensor".into(),
        ));
    };
    // SAFETY: DLTensor is plain data; all-zero is a valid value to overwrite.
    let mut t: DLTensor = unsafe { std::mem::zeroed() };
    // SAFETY: `obj` is of a type the table serves (a torch.Tensor); the
    // function fills `t` and returns 0, or returns -1 with an exception set.
    if unsafe { read(obj.as_ptr().cast(), &mut t) } != 0 {
        return Err(table_error(obj.py(), "__dlpack_c_exchange_api__"));
    }
    // SAFETY: `t` was filled by the producer; its shape and strides stay
    // valid while `obj` is alive and unchanged, which holds while we read
    // them here (GIL held, no Python code runs).
    unsafe { from_dltensor(&t, false, ImportPath::ExchangeApi) }
}

/// Phase 1: an owning tensor from `api` (any producer's table, which may run
/// Python code), read in phase 2 like a capsule.
pub(crate) fn owning(
    obj: &Bound<'_, PyAny>,
    api: &'static DLPackExchangeAPI,
) -> Result<Option<Owner>, ImportError> {
    let Some(export) = api.managed_tensor_from_py_object_no_sync else {
        return Ok(None);
    };
    let mut out: *mut DLManagedTensorVersioned = std::ptr::null_mut();
    // SAFETY: `obj` has the type the API came from; on success `out` is an
    // owning tensor whose deleter we must call once.
    if unsafe { export(obj.as_ptr().cast(), &mut out) } != 0 {
        return Err(table_error(obj.py(), "__dlpack_c_exchange_api__"));
    }
    match NonNull::new(out) {
        Some(m) => Ok(Some(Owner::Versioned(m))),
        None => Err(ImportError::Invalid(
            "the exchange API returned no tensor".into(),
        )),
    }
}

/// What phase 1 needs of a tensor's description: its device (to choose a
/// path for device memory) and whether its dtype is complex.
#[derive(Clone, Copy)]
pub(crate) struct Described {
    pub(crate) device: crate::device::Device,
    /// The dtype may be complex: its code is none of DLPack's real kinds
    /// (signed and unsigned integers, IEEE, bfloat and float8 floats,
    /// booleans).
    pub(crate) complex: bool,
}

/// The device and dtype kind of `obj` as `api` describes it (phase 1);
/// `None` when the table cannot say.
pub(crate) fn describe(
    obj: &Bound<'_, PyAny>,
    api: &'static DLPackExchangeAPI,
) -> Result<Option<Described>, ImportError> {
    let Some(read) = api.dltensor_from_py_object_no_sync else {
        return Ok(None);
    };
    // SAFETY: as in `read_with`.
    let mut t: DLTensor = unsafe { std::mem::zeroed() };
    // SAFETY: as in `read_with`.
    if unsafe { read(obj.as_ptr().cast(), &mut t) } != 0 {
        return Err(table_error(obj.py(), "__dlpack_c_exchange_api__"));
    }
    Ok(Some(Described {
        device: crate::device::Device {
            device_type: t.device.device_type as i32,
            device_id: t.device.device_id,
        },
        complex: ![
            DLDataTypeCode::kDLInt,
            DLDataTypeCode::kDLUInt,
            DLDataTypeCode::kDLFloat,
            DLDataTypeCode::kDLBfloat,
            DLDataTypeCode::kDLBool,
            DLDataTypeCode::kDLFloat8_e3m4,
            DLDataTypeCode::kDLFloat8_e4m3,
            DLDataTypeCode::kDLFloat8_e4m3b11fnuz,
            DLDataTypeCode::kDLFloat8_e4m3fn,
            DLDataTypeCode::kDLFloat8_e4m3fnuz,
            DLDataTypeCode::kDLFloat8_e5m2,
            DLDataTypeCode::kDLFloat8_e5m2fnuz,
            DLDataTypeCode::kDLFloat8_e8m0fnu,
        ]
        .contains(&u32::from(t.dtype.code)),
    }))
}

/// The device of `obj` as `api` describes it (phase 1, to choose a path
/// for device memory); `None` when the table cannot say.
pub(crate) fn device_of(
    obj: &Bound<'_, PyAny>,
    api: &'static DLPackExchangeAPI,
) -> Result<Option<crate::device::Device>, ImportError> {
    Ok(describe(obj, api)?.map(|d| d.device))
}

/// The producer's current work stream on `device`, from `api`
/// (`current_work_stream`); `None` when the table has no such function.
pub(crate) fn current_stream(
    py: Python<'_>,
    api: &'static DLPackExchangeAPI,
    device: crate::device::Device,
) -> Result<Option<u64>, ImportError> {
    let Some(current) = api.current_work_stream else {
        return Ok(None);
    };
    let mut handle: *mut std::ffi::c_void = std::ptr::null_mut();
    let Ok(device_type) = device.device_type.try_into() else {
        return Ok(None);
    };
    // SAFETY: a function of the producer's process-lifetime table; it writes
    // one pointer into `handle` and returns 0, or returns -1 with a Python
    // exception set.
    let rc = unsafe { current(device_type, device.device_id, &mut handle) };
    if rc != 0 {
        return Err(table_error(
            py,
            "__dlpack_c_exchange_api__.current_work_stream",
        ));
    }
    Ok(Some(handle as usize as u64))
}
