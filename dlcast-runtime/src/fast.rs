//! Fast import paths, tried before the generic `__dlpack__` call:
//!
//! 1. **NumPy**: after an exact type check against `numpy.ndarray`, read the
//!    array object's own fields (data, ndim, shape, strides, dtype, flags,
//!    byte order). No capsule, no Python call, no allocation. The fields
//!    read sit at the same offsets in NumPy 1.x and 2.x.
//! 2. **The DLPack C exchange API** (`type(x).__dlpack_c_exchange_api__`, a
//!    capsule named `"dlpack_exchange_api"`; PyTorch 2.11+): cached per
//!    type, header major version checked (walking `prev_api`), then the
//!    non-owning `dltensor_from_py_object_no_sync` fills a `DLTensor` on the
//!    stack. A view that is returned to Python is upgraded to an owning
//!    `managed_tensor_from_py_object_no_sync` tensor (see
//!    [`RawTensor::prepare_export`]). CUDA/ROCm memory is taken the same way
//!    with the producer's `current_work_stream` recorded as the view's
//!    stream (see [`crate::stream`]).
//!
//! Each returns `Ok(None)` when it does not apply, so the caller falls back
//! to the generic path, which also produces the producer's own error for
//! inputs a fast path declines (byte-swapped data, exotic dtypes).

use crate::device::{kind, Device};
use crate::dtype::{code, DType};
use crate::import::{self, Dims, ImportError, Owner, RawTensor};
use crate::layout::ByteExtent;
use crate::stream::{self, StreamKind, StreamRequest};
use dlpack_rs::ffi::{DLPackExchangeAPI, DLPackExchangeAPIHeader, DLTensor};
use pyo3::ffi;
use pyo3::prelude::*;
use smallvec::SmallVec;
use std::ffi::{c_char, c_int};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};

/// How a view was imported (for tests and debugging).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImportPath {
    /// NumPy's fields read directly.
    Numpy,
    /// The DLPack C exchange API.
    ExchangeApi,
    /// A capsule passed directly.
    Capsule,
    /// `__dlpack__()` called.
    Dlpack,
    /// The buffer protocol.
    Buffer,
    /// `tf.experimental.dlpack.to_dlpack`.
    Tensorflow,
}

impl ImportPath {
    /// A short name: `"numpy"`, `"exchange_api"`, `"capsule"`, `"dlpack"`,
    /// `"buffer"`, `"tensorflow"`.
    pub fn name(self) -> &'static str {
        match self {
            ImportPath::Numpy => "numpy",
            ImportPath::ExchangeApi => "exchange_api",
            ImportPath::Capsule => "capsule",
            ImportPath::Dlpack => "dlpack",
            ImportPath::Buffer => "buffer",
            ImportPath::Tensorflow => "tensorflow",
        }
    }
}

// ---------------------------------------------------------------------------
// NumPy

/// The leading fields of NumPy's `PyArrayObject_fields` (1.x and 2.x).
#[repr(C)]
struct NpArray {
    ob_base: ffi::PyObject,
    data: *mut u8,
    nd: c_int,
    dimensions: *const isize,
    strides: *const isize,
    base: *mut ffi::PyObject,
    descr: *const NpDescr,
    flags: c_int,
}

/// The leading fields of NumPy's `PyArray_Descr` (1.x and 2.x: the fourth
/// char is `flags` in 1.x and `_former_flags` in 2.x; `type_num` follows).
#[repr(C)]
struct NpDescr {
    ob_base: ffi::PyObject,
    typeobj: *mut ffi::PyTypeObject,
    kind: c_char,
    type_char: c_char,
    byteorder: c_char,
    former_flags: c_char,
    type_num: c_int,
}

/// `NPY_ARRAY_WRITEABLE`.
const NPY_WRITEABLE: c_int = 0x0400;

/// `numpy.ndarray`, once seen (a strong reference is kept, so the pointer
/// stays valid for the process).
static NDARRAY: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());

/// Whether `obj`'s type is exactly `numpy.ndarray` (subclasses take the
/// generic path: they may override `__dlpack__`).
#[inline(always)]
fn is_ndarray(obj: &Bound<'_, PyAny>) -> bool {
    // SAFETY: `obj` is a live object; its type pointer is valid.
    let tp = unsafe { ffi::Py_TYPE(obj.as_ptr()) };
    // Until `numpy.ndarray` is known, every object takes the generic path,
    // which learns the type (`learn_ndarray`), running Python code only there.
    tp == NDARRAY.load(Ordering::Relaxed)
}

/// Whether `obj` is exactly a `numpy.ndarray`, learning the type the first
/// time one is seen (which may run Python code: `numpy.ndarray` is looked
/// up). Called on the generic path, so that [`numpy`] never runs Python.
pub(crate) fn learn_ndarray(obj: &Bound<'_, PyAny>) -> bool {
    // SAFETY: `obj` is a live object; its type pointer is valid.
    let tp = unsafe { ffi::Py_TYPE(obj.as_ptr()) };
    let known = NDARRAY.load(Ordering::Relaxed);
    if !known.is_null() {
        return tp == known;
    }
    if !type_named_ndarray(obj, tp) {
        return false;
    }
    // Confirm against the real `numpy.ndarray` (numpy is imported, since an
    // object of a type of that name exists).
    let py = obj.py();
    let Ok(ndarray) = py.import("numpy").and_then(|m| m.getattr("ndarray")) else {
        return false;
    };
    if ndarray.as_ptr().cast() != tp {
        return false;
    }
    // Keep the type alive for the process, then cache its address.
    std::mem::forget(ndarray.unbind());
    NDARRAY.store(tp, Ordering::Relaxed);
    true
}

/// Whether the type's name is `numpy.ndarray` (a cheap filter before the
/// exact check against NumPy's type).
#[cfg(not(Py_LIMITED_API))]
fn type_named_ndarray(_obj: &Bound<'_, PyAny>, tp: *mut ffi::PyTypeObject) -> bool {
    // SAFETY: `tp` is a live type object; `tp_name` is a C string.
    unsafe { std::ffi::CStr::from_ptr((*tp).tp_name) == c"numpy.ndarray" }
}

/// The same for abi3 builds, where type objects are opaque: the name is
/// asked through the API (only until `numpy.ndarray` is first seen).
#[cfg(Py_LIMITED_API)]
fn type_named_ndarray(obj: &Bound<'_, PyAny>, _tp: *mut ffi::PyTypeObject) -> bool {
    obj.get_type()
        .fully_qualified_name()
        .is_ok_and(|n| n.to_str().is_ok_and(|n| n == "numpy.ndarray"))
}

/// DLPack type of a NumPy `type_num`, for the types DLPack can describe.
fn numpy_dtype(type_num: c_int) -> Option<DType> {
    let long_bits = (std::mem::size_of::<std::ffi::c_long>() * 8) as u8;
    Some(match type_num {
        0 => DType::BOOL,
        1 => DType::INT8,
        2 => DType::UINT8,
        3 => DType::INT16,
        4 => DType::UINT16,
        5 => DType::INT32,
        6 => DType::UINT32,
        7 => DType::new(code::INT, long_bits, 1),
        8 => DType::new(code::UINT, long_bits, 1),
        9 => DType::INT64,
        10 => DType::UINT64,
        11 => DType::FLOAT32,
        12 => DType::FLOAT64,
        14 => DType::COMPLEX64,
        15 => DType::COMPLEX128,
        23 => DType::FLOAT16,
        _ => return None,
    })
}

/// Imports an exact `numpy.ndarray` from its fields, in one pass over its
/// dimensions: shape, strides (bytes to elements), element count and byte
/// extent together, with the checks of [`import::make_raw`]. `None` for
/// other objects and for arrays this path does not take: dtypes DLPack
/// cannot describe, byte-swapped data, byte strides that are not whole
/// elements, sizes or spans that overflow. Those go the generic way, which
/// gives NumPy's own `BufferError` or dlcast's error for the layout.
#[inline(always)]
pub(crate) fn numpy(obj: &Bound<'_, PyAny>) -> Option<RawTensor> {
    if !is_ndarray(obj) {
        return None;
    }
    // SAFETY: `obj` is exactly a `numpy.ndarray`, whose object starts with
    // the fields of `NpArray`; we hold the GIL and a reference to `obj`, so
    // the fields and the descr they point to stay valid while we read.
    let arr = unsafe { &*obj.as_ptr().cast::<NpArray>() };
    // SAFETY: every array has a descr.
    let descr = unsafe { &*arr.descr };
    let dtype = numpy_dtype(descr.type_num)?;
    let native = if cfg!(target_endian = "little") {
        b'<'
    } else {
        b'>'
    };
    let order = descr.byteorder as u8;
    if order != b'=' && order != b'|' && order != native {
        return None;
    }
    let ndim = usize::try_from(arr.nd).ok()?;
    // Every dtype of `numpy_dtype` has a power-of-two size.
    let item = dtype.itemsize()? as isize;
    // A 0-d array's `dimensions` and `strides` may be NULL, which no slice
    // may point at, even an empty one.
    let (dims, byte_strides): (&[isize], &[isize]) = if ndim == 0 {
        (&[], &[])
    } else {
        // SAFETY: `dimensions` and `strides` of an array with `nd` > 0 are
        // non-NULL, aligned and hold `nd` values each, valid while we hold
        // `obj` and the GIL (no Python code runs here).
        unsafe {
            (
                std::slice::from_raw_parts(arr.dimensions, ndim),
                std::slice::from_raw_parts(arr.strides, ndim),
            )
        }
    };
    // First pass, reading only: the element count and the bytes reached
    // either side of element 0 (NumPy's strides are in bytes already). An
    // overflow matters only for a non-empty array; either way the generic
    // path decides.
    let (mut count, mut lo, mut hi) = (1usize, 0isize, 0isize);
    let (mut empty, mut overflow) = (false, false);
    for (&n, &s) in dims.iter().zip(byte_strides) {
        if n < 0 || s & (item - 1) != 0 {
            // Byte strides that are not whole elements: NumPy's __dlpack__
            // refuses them with its own message.
            return None;
        }
        empty |= n == 0;
        let (c, o1) = count.overflowing_mul(n as usize);
        let (step, o2) = (n - 1).overflowing_mul(s);
        let o3 = if step < 0 {
            let (v, o) = lo.overflowing_add(step);
            lo = v;
            o
        } else {
            let (v, o) = hi.overflowing_add(step);
            hi = v;
            o
        };
        count = c;
        overflow |= o1 | o2 | o3;
    }
    let extent = if empty {
        None
    } else {
        let hi = hi.checked_add(item)?;
        // The whole span must be addressable, as `make_raw` checks.
        let base = arr.data as usize;
        match (base.checked_add_signed(lo), base.checked_add_signed(hi)) {
            (Some(l), Some(h)) if !overflow && !arr.data.is_null() && l != 0 => {
                if h - l > isize::MAX as usize {
                    return None;
                }
            }
            _ => return None,
        }
        Some(ByteExtent { lo, hi })
    };
    // Built where it is returned, then filled: no copy of its inline dims.
    let mut raw = RawTensor::new(
        arr.data,
        zeros(ndim),
        zeros(ndim),
        dtype,
        arr.flags & NPY_WRITEABLE == 0,
        extent,
        Owner::Object(obj.clone().unbind()),
        ImportPath::Numpy,
    );
    let shift = item.trailing_zeros();
    for (i, (&n, &s)) in dims.iter().zip(byte_strides).enumerate() {
        raw.shape[i] = n as usize;
        raw.strides[i] = s >> shift;
    }
    Some(raw)
}

/// `ndim` zeros (inline up to [`import::INLINE_DIMS`]: a fixed-size fill,
/// no `memset` call of variable length).
#[inline(always)]
pub(crate) fn zeros<T: Copy + Default>(ndim: usize) -> Dims<T> {
    if ndim <= import::INLINE_DIMS {
        SmallVec::from_buf_and_len([T::default(); import::INLINE_DIMS], ndim)
    } else {
        smallvec::smallvec![T::default(); ndim]
    }
}

// ---------------------------------------------------------------------------
// The DLPack C exchange API

/// Types seen, with their exchange API (or `NO_API`) and their
/// [`TypeFlags`]. A strong reference to each cached type is kept, so a
/// cached address never names another type.
const CACHE_SLOTS: usize = 8;
const NO_API: usize = 1;
static CACHE_TYPES: [AtomicUsize; CACHE_SLOTS] = [const { AtomicUsize::new(0) }; CACHE_SLOTS];
static CACHE_APIS: [AtomicUsize; CACHE_SLOTS] = [const { AtomicUsize::new(0) }; CACHE_SLOTS];
static CACHE_FLAGS: [AtomicU8; CACHE_SLOTS] = [const { AtomicU8::new(0) }; CACHE_SLOTS];

/// What dlcast needs to know of an argument's type beyond its exchange API,
/// looked up once per type (Python attribute lookups) and cached with it.
#[derive(Clone, Copy, Default)]
pub(crate) struct TypeFlags(u8);

impl TypeFlags {
    /// The type's exchange API is PyTorch's own table (see [`is_torch_table`]).
    const TORCH_TABLE: u8 = 1;
    /// The type is, or derives from, a type of the `torch` package.
    const TORCH_TYPE: u8 = 2;
    /// A type of JAX or TensorFlow, whose arrays are immutable although
    /// their capsules do not say so (DLPack notes).
    const IMMUTABLE: u8 = 4;
    /// A `torch.Tensor` subclass with its own `__torch_dispatch__`, which
    /// PyTorch may call (Python code) even to read the tensor's sizes.
    const PY_DISPATCH: u8 = 8;

    /// See [`TypeFlags::TORCH_TABLE`].
    pub(crate) fn torch_table(self) -> bool {
        self.0 & Self::TORCH_TABLE != 0
    }

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
}

/// Refuses a PyTorch tensor whose type has its own `__torch_dispatch__`
/// (see [`TypeFlags::PY_DISPATCH`]): reading its sizes, strides or data
/// can run its Python code, so no read of it, nor of the call's other
/// tensors, could be trusted to stay true until the body runs.
pub(crate) fn refuse_py_dispatch(flags: TypeFlags) -> Result<(), ImportError> {
    if flags.py_dispatch() {
        return Err(ImportError::Unreadable(
            "the tensor's type defines __torch_dispatch__, which PyTorch may run (Python code) \
             whenever the tensor's layout is read, so dlcast cannot check that its memory \
             stays put; pass a plain tensor"
                .into(),
        ));
    }
    Ok(())
}

/// The [`TypeFlags`] of `obj`'s type (cached per type).
pub(crate) fn type_flags(obj: &Bound<'_, PyAny>) -> TypeFlags {
    type_info(obj).1
}

/// Whether `obj`'s type is, or derives from, a type of the `torch` package
/// (a subclass of `torch.Tensor` inherits its exchange API). Cached per type.
pub(crate) fn is_torch_type(obj: &Bound<'_, PyAny>) -> bool {
    type_info(obj).1.torch_type()
}

/// [`is_torch_type`], looked up: the `__module__` of each type of the MRO.
fn torch_in_mro(obj: &Bound<'_, PyAny>) -> bool {
    let from_torch = |t: &Bound<'_, pyo3::types::PyType>| {
        t.module().is_ok_and(|m| {
            m.to_str()
                .is_ok_and(|m| m == "torch" || m.starts_with("torch."))
        })
    };
    obj.get_type()
        .mro()
        .iter()
        .any(|t| t.cast::<pyo3::types::PyType>().is_ok_and(from_torch))
}

/// PyTorch's lazy conjugation and negation: a tensor with its conjugate or
/// negative bit set describes memory whose values are conjugated / negated
/// on read. The exchange API hands out the raw memory, and so does
/// `__dlpack__` for the negative bit (it refuses only the conjugate bit), so
/// dlcast refuses such tensors on every path. Only complex tensors can have
/// the conjugate bit; any tensor can have the negative bit
/// (`z.conj().imag`). Each check is a Python method call (about 150 ns of
/// PyTorch's argument parsing), the price of reading PyTorch tensors
/// correctly.
pub(crate) fn torch_flags(obj: &Bound<'_, PyAny>, complex: bool) -> Result<(), ImportError> {
    torch_bit(obj, TorchBit::Negative)?;
    if complex {
        torch_bit(obj, TorchBit::Conjugate)?;
    }
    Ok(())
}

/// The lazy bits of [`torch_flags`].
#[derive(Clone, Copy)]
pub(crate) enum TorchBit {
    /// `is_neg()`.
    Negative,
    /// `is_conj()`.
    Conjugate,
}

/// Refuses `obj` if the tensor has `bit` set (see [`torch_flags`]).
pub(crate) fn torch_bit(obj: &Bound<'_, PyAny>, bit: TorchBit) -> Result<(), ImportError> {
    let py = obj.py();
    let (method, what) = match bit {
        TorchBit::Negative => (pyo3::intern!(py, "is_neg"), "negative"),
        TorchBit::Conjugate => (pyo3::intern!(py, "is_conj"), "conjugate"),
    };
    let set = obj
        .call_method0(method)
        .and_then(|v| v.is_truthy())
        .map_err(|e| import::producer_error("is_conj/is_neg", e, py))?;
    if set {
        return Err(ImportError::Unreadable(format!(
            "the tensor has its {what} bit set (PyTorch's lazy {what}), so its memory \
             does not hold its values; pass x.resolve_conj().resolve_neg()"
        )));
    }
    Ok(())
}

/// The exchange API and [`TypeFlags`] of `obj`'s type: from the cache, or
/// looked up (Python attribute lookups) and cached in a free slot.
fn type_info(obj: &Bound<'_, PyAny>) -> (Option<&'static DLPackExchangeAPI>, TypeFlags) {
    // SAFETY: `obj` is live.
    let tp = unsafe { ffi::Py_TYPE(obj.as_ptr()) } as usize;
    for (slot, t) in CACHE_TYPES.iter().enumerate() {
        match t.load(Ordering::Relaxed) {
            0 => break,
            x if x == tp => {
                let api = CACHE_APIS[slot].load(Ordering::Relaxed);
                let flags = TypeFlags(CACHE_FLAGS[slot].load(Ordering::Relaxed));
                // SAFETY: a cached API pointer came from a live capsule of a
                // type we keep alive; the header requires the table to live
                // for the process.
                let api = (api != NO_API).then(|| unsafe { &*(api as *const DLPackExchangeAPI) });
                return (api, flags);
            }
            _ => {}
        }
    }
    let api = lookup_exchange_api(obj);
    let torch_type = torch_in_mro(obj);
    let mut flags = 0;
    if torch_type {
        flags |= TypeFlags::TORCH_TYPE;
        if api.is_some_and(|a| is_torch_table(obj.py(), a)) {
            flags |= TypeFlags::TORCH_TABLE;
        }
        if has_own_torch_dispatch(obj) {
            flags |= TypeFlags::PY_DISPATCH;
        }
    }
    if import::is_from_module(obj, &["jax", "jaxlib", "tensorflow"]) {
        flags |= TypeFlags::IMMUTABLE;
    }
    // Cache the answer in a free slot (under the GIL, so no race), keeping
    // the type alive; with no free slot, just answer.
    if let Some(slot) = CACHE_TYPES
        .iter()
        .position(|t| t.load(Ordering::Relaxed) == 0)
    {
        std::mem::forget(obj.get_type().unbind());
        CACHE_APIS[slot].store(
            api.map_or(NO_API, |a| a as *const _ as usize),
            Ordering::Relaxed,
        );
        CACHE_FLAGS[slot].store(flags, Ordering::Relaxed);
        CACHE_TYPES[slot].store(tp, Ordering::Relaxed);
    }
    (api, TypeFlags(flags))
}

/// PyTorch's own exchange API table (`torch.Tensor`'s), once looked up.
static TORCH_TABLE: AtomicPtr<DLPackExchangeAPI> = AtomicPtr::new(std::ptr::null_mut());
/// `torch.Tensor`, once looked up with [`TORCH_TABLE`] (a strong reference
/// is kept, so the pointer stays valid for the process).
static TORCH_TENSOR: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());

/// Whether `obj`'s type has a `__torch_dispatch__` other than
/// `torch.Tensor`'s (a builtin function, found as the same object through
/// every subclass that does not define its own; Python attribute lookups,
/// once per type). `true` when it cannot tell.
fn has_own_torch_dispatch(obj: &Bound<'_, PyAny>) -> bool {
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

/// Whether `api` is PyTorch's own table: its functions run no Python code
/// (a `torch.Tensor` subclass may publish another table, even one written
/// in Python), so a tensor can be read through it again in
/// [`still_describes`] without letting Python code run in between.
fn is_torch_table(py: Python<'_>, api: &'static DLPackExchangeAPI) -> bool {
    let mut known = TORCH_TABLE.load(Ordering::Relaxed);
    if known.is_null() {
        let Ok(tensor) = py.import("torch").and_then(|t| t.getattr("Tensor")) else {
            return false;
        };
        let Some(table) = exchange_api_of_type(&tensor) else {
            return false;
        };
        // Keep `torch.Tensor` alive for the process, then note both.
        TORCH_TENSOR.store(tensor.as_ptr().cast(), Ordering::Relaxed);
        std::mem::forget(tensor.unbind());
        known = (table as *const DLPackExchangeAPI).cast_mut();
        TORCH_TABLE.store(known, Ordering::Relaxed);
    }
    std::ptr::eq(known, api)
}

/// Whether `api` is PyTorch's own table (see [`is_torch_table`]), as
/// learnt by an earlier import.
pub(crate) fn is_known_torch_table(api: NonNull<DLPackExchangeAPI>) -> bool {
    std::ptr::eq(TORCH_TABLE.load(Ordering::Relaxed), api.as_ptr())
}

fn lookup_exchange_api(obj: &Bound<'_, PyAny>) -> Option<&'static DLPackExchangeAPI> {
    exchange_api_of_type(obj.get_type().as_any())
}

/// The DLPack C exchange API a type publishes (`None` if it has none, or
/// none of major version 1). The table lives for the process (DLPack header).
pub(crate) fn exchange_api_of_type(tp: &Bound<'_, PyAny>) -> Option<&'static DLPackExchangeAPI> {
    let py = tp.py();
    let capsule = tp
        .getattr(pyo3::intern!(py, "__dlpack_c_exchange_api__"))
        .ok()?;
    // SAFETY: GetPointer checks the object is a capsule of that exact name
    // (else NULL with an error, which we clear).
    let ptr =
        unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dlpack_exchange_api".as_ptr()) };
    if ptr.is_null() {
        let _ = PyErr::take(py);
        return None;
    }
    // Walk to a table of major version 1.
    let mut header = ptr.cast::<DLPackExchangeAPIHeader>();
    while !header.is_null() {
        // SAFETY: the capsule holds a DLPackExchangeAPIHeader, valid for
        // the process, whose `prev_api` chain is NULL-terminated.
        let h = unsafe { &*header };
        if h.version.major == 1 {
            // SAFETY: a major-1 header starts a DLPackExchangeAPI table.
            let api = unsafe { &*header.cast::<DLPackExchangeAPI>() };
            return Some(api);
        }
        header = h.prev_api;
    }
    None
}

/// What the exchange API path made of an object.
// Moved once per argument; boxing `Done` would allocate on PyTorch's fast path.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Exchange {
    /// Imported.
    Done(RawTensor),
    /// The type has no usable exchange API.
    NotApplicable,
    /// Memory on this device that must go through `__dlpack__` (which
    /// synchronises with the stream the caller passes): pinned memory and
    /// other devices, or CUDA/ROCm memory when the function names its own
    /// stream or the producer cannot say its current work stream.
    Declined(Device),
}

/// Imports `obj` through its type's DLPack C exchange API: host memory as
/// it is; CUDA/ROCm memory, when `request` is the default, with the
/// producer's current work stream (`current_work_stream`) recorded, which
/// needs no synchronisation as long as the function works on that stream
/// (the exchange API's intended use, and what keeps CUDA-graph capture
/// intact).
pub(crate) fn exchange(
    obj: &Bound<'_, PyAny>,
    request: StreamRequest,
) -> Result<Exchange, ImportError> {
    let (Some(api), flags) = type_info(obj) else {
        return Ok(Exchange::NotApplicable);
    };
    let is_torch = flags.torch_table();
    let py = obj.py();
    let Some(from_obj) = api.dltensor_from_py_object_no_sync else {
        return Ok(Exchange::NotApplicable);
    };
    // Before the read: `is_neg` may run Python code (a subclass's), which
    // may change the tensor. Nothing after the read runs Python code but
    // `is_conj` for complex tensors; `CallCx` checks the tensor again when
    // Python code ran after its read (see `still_describes`).
    if is_torch {
        refuse_py_dispatch(flags)?;
        torch_bit(obj, TorchBit::Negative)?;
    }
    // SAFETY: DLTensor is plain data; all-zero is a valid value to overwrite.
    let mut t: DLTensor = unsafe { std::mem::zeroed() };
    // SAFETY: `obj` has the type the API came from; the function fills `t`
    // and returns 0, or returns -1 with a Python exception set.
    if unsafe { from_obj(obj.as_ptr().cast(), &mut t) } != 0 {
        let err = PyErr::take(py).unwrap_or_else(|| {
            pyo3::exceptions::PyBufferError::new_err("the exchange API failed without an error")
        });
        return Err(ImportError::Producer("__dlpack_c_exchange_api__", err));
    }
    let device = Device {
        device_type: t.device.device_type as i32,
        device_id: t.device.device_id,
    };
    let stream = match stream::stream_kind(device.device_type) {
        StreamKind::None if device.device_type == kind::CPU => None,
        StreamKind::None => return Ok(Exchange::Declined(device)),
        _ if request != StreamRequest::Producer => return Ok(Exchange::Declined(device)),
        _ => {
            let Some(current) = api.current_work_stream else {
                return Ok(Exchange::Declined(device));
            };
            let mut handle: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: a function of the producer's process-lifetime table;
            // it writes one pointer into `handle` and returns 0, or
            // returns -1 with a Python exception set.
            let rc = unsafe { current(t.device.device_type, device.device_id, &mut handle) };
            if rc != 0 {
                let err = PyErr::take(py).unwrap_or_else(|| {
                    pyo3::exceptions::PyBufferError::new_err(
                        "current_work_stream failed without an error",
                    )
                });
                return Err(ImportError::Producer(
                    "__dlpack_c_exchange_api__.current_work_stream",
                    err,
                ));
            }
            stream::resolve(device, request, Some(handle as usize as u64))
                .map_err(ImportError::Stream)?
        }
    };
    let owner = Owner::Exchange {
        obj: obj.clone().unbind(),
        api: NonNull::from(api),
        origin: (t.data as usize).wrapping_add(t.byte_offset as usize),
    };
    // SAFETY: `t` was filled by the producer; its shape and strides stay
    // valid while `obj` is alive and unchanged, which holds while we read
    // them here (GIL held, no Python code runs); `owner` keeps `obj` alive.
    let mut raw = unsafe { import::from_dltensor(&t, false, owner, ImportPath::ExchangeApi) }?;
    raw.stream = stream;
    if is_torch && raw.dtype.code == crate::dtype::code::COMPLEX {
        torch_bit(obj, TorchBit::Conjugate)?;
    }
    Ok(Exchange::Done(raw))
}

/// Whether `obj` (a PyTorch tensor) still describes the memory a view was
/// made of: element 0 at `data`, `shape`, `strides` (in elements). Asked
/// once every argument of a call is imported, for tensors after whose read
/// Python code may have run (another argument's `__dlpack__`, a conversion,
/// a subclass's `is_conj` or `requires_grad`): PyTorch tensors are mutable
/// containers, and `x.set_(...)`, `x.resize_(...)` free or move the memory
/// even while a DLPack export of it is alive.
///
/// The tensor is read through PyTorch's own exchange API table, after a
/// C-level subtype check against `torch.Tensor`: no attribute lookup, and
/// (subclasses with their own `__torch_dispatch__` being refused at import)
/// no Python code runs, so one re-read cannot change a tensor re-read
/// before it. `true` where PyTorch has no such table (nothing to ask).
pub(crate) fn still_describes(
    obj: &Bound<'_, PyAny>,
    data: *mut u8,
    shape: &[usize],
    strides: &[isize],
) -> bool {
    let (table, tensor) = (
        TORCH_TABLE.load(Ordering::Relaxed),
        TORCH_TENSOR.load(Ordering::Relaxed),
    );
    if table.is_null() || tensor.is_null() {
        return true;
    }
    // SAFETY: `obj` is live and `tensor` is the type object of
    // `torch.Tensor`, kept alive for the process; the subtype check walks
    // the type's MRO tuple in C.
    if unsafe { ffi::PyType_IsSubtype(ffi::Py_TYPE(obj.as_ptr()), tensor) } == 0 {
        return true;
    }
    // SAFETY: a table learnt from `torch.Tensor`'s capsule, which the header
    // requires to live for the process.
    let api = unsafe { &*table };
    let Some(read) = api.dltensor_from_py_object_no_sync else {
        return true;
    };
    // SAFETY: DLTensor is plain data; all-zero is a valid value to overwrite.
    let mut t: DLTensor = unsafe { std::mem::zeroed() };
    // SAFETY: `obj` has the type the API came from; the function fills `t`
    // (pointers valid while `obj` is unchanged: no Python code runs here)
    // and returns 0, or returns -1 with a Python exception set.
    if unsafe { read(obj.as_ptr().cast(), &mut t) } != 0 {
        let _ = PyErr::take(obj.py());
        return false;
    }
    let ndim = usize::try_from(t.ndim).unwrap_or(usize::MAX);
    if (t.data as usize).wrapping_add(t.byte_offset as usize) != data as usize
        || ndim != shape.len()
    {
        return false;
    }
    let mut compact: Dims<isize> = smallvec::smallvec![0; ndim];
    if t.strides.is_null() && crate::layout::fill_c_strides(shape, &mut compact).is_none() {
        return false;
    }
    (0..ndim).all(|i| {
        // SAFETY: `shape` (and `strides`, when non-NULL) hold `ndim` values.
        let (n, s) = unsafe {
            (
                *t.shape.add(i),
                if t.strides.is_null() {
                    compact[i] as i64
                } else {
                    *t.strides.add(i)
                },
            )
        };
        n as u64 == shape[i] as u64 && s == strides[i] as i64
    })
}
