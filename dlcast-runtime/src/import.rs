//! Import: from a Python object to an owned, validated [`RawTensor`].
//!
//! Paths, tried in order (faster paths go in front of [`import`] without
//! touching the macro):
//! 1. a DLPack capsule passed directly;
//! 2. `x.__dlpack__(max_version=(1, 3))`, retried without keywords when the
//!    producer raises `TypeError` (it predates the keyword);
//! 3. the buffer protocol (`bytes`, `bytearray`, `memoryview`, `array.array`);
//! 4. TensorFlow tensors through `tf.experimental.dlpack.to_dlpack`.
//!
//! Whatever path is taken, the producer's deleter (or `PyBuffer_Release`)
//! runs exactly once: when the [`Owner`] drops, error paths included.

use crate::device::{device_type_name, Device};
use crate::dtype::{code, DType};
use crate::fast::{self, ImportPath};
use crate::layout::{self, ByteExtent};
use crate::stream::{self, StreamKind, StreamRequest};
use dlpack_rs::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLPackExchangeAPI, DLTensor};
use pyo3::exceptions::{PyAttributeError, PyException, PyMemoryError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;
use pyo3::{ffi, intern};
use smallvec::SmallVec;
use std::ffi::CStr;
use std::ptr::NonNull;

/// Dimensions up to this many are stored inline in a view (no allocation).
pub const INLINE_DIMS: usize = 8;
pub(crate) type Dims<T> = SmallVec<[T; INLINE_DIMS]>;

/// The DLPack version dlcast asks producers for (`max_version`).
pub const MAX_VERSION: (u32, u32) = (1, 3);
/// `DLPACK_FLAG_BITMASK_READ_ONLY` from the DLPack header.
const FLAG_READ_ONLY: u64 = 1;

const NAME_LEGACY: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";
const NAME_USED_LEGACY: &CStr = c"used_dltensor";
const NAME_USED_VERSIONED: &CStr = c"used_dltensor_versioned";

/// Who keeps the memory of a view alive; dropping it releases the memory
/// exactly once.
pub(crate) enum Owner {
    /// A legacy `DLManagedTensor` taken from a `"dltensor"` capsule.
    Legacy(NonNull<DLManagedTensor>),
    /// A `DLManagedTensorVersioned` from a `"dltensor_versioned"` capsule.
    Versioned(NonNull<DLManagedTensorVersioned>),
    /// A buffer-protocol view; boxed so its address stays fixed until release.
    Buffer(Box<ffi::Py_buffer>),
    /// A strong reference to an object whose memory we read directly (an
    /// exact `numpy.ndarray`: holding it keeps its data alive and unresized).
    Object(#[allow(dead_code)] Py<PyAny>),
    /// An object read through its type's DLPack C exchange API without
    /// taking ownership; valid for the call only, see
    /// [`RawTensor::prepare_export`].
    Exchange {
        obj: Py<PyAny>,
        api: NonNull<DLPackExchangeAPI>,
        /// Element 0 as the producer described it (before any transform).
        origin: usize,
    },
}

impl Drop for Owner {
    fn drop(&mut self) {
        // Owners are `!Send` (raw pointers) and live only inside a call of a
        // `#[dlpack_fn]` function, which holds the GIL, so the producer's
        // deleter and `PyBuffer_Release` run with the GIL held.
        match self {
            Owner::Legacy(m) => {
                // SAFETY: `m` came from a capsule we renamed to "used_*", so
                // nobody else calls its deleter; this drop runs once. The
                // header allows a NULL deleter.
                unsafe {
                    if let Some(deleter) = (*m.as_ptr()).deleter {
                        deleter(m.as_ptr());
                    }
                }
            }
            Owner::Versioned(m) => {
                // SAFETY: as for `Legacy`; `version`, `manager_ctx` and
                // `deleter` sit before `flags` in every major version, so
                // reading `deleter` is valid even for an unsupported major.
                unsafe {
                    if let Some(deleter) = (*m.as_ptr()).deleter {
                        deleter(m.as_ptr());
                    }
                }
            }
            Owner::Buffer(view) => {
                // SAFETY: `view` was filled by a successful
                // `PyObject_GetBuffer` and is released only here, with the GIL.
                unsafe { ffi::PyBuffer_Release(&mut **view) }
            }
            // The reference drops with the GIL held (see above).
            Owner::Object(_) | Owner::Exchange { .. } => {}
        }
    }
}

/// A validated description of an imported array and the owner of its memory.
#[doc(hidden)]
pub struct RawTensor {
    /// Address of element 0 (`data + byte_offset`). Never dereferenced for
    /// memory the host cannot access, nor for empty arrays.
    pub(crate) data: *mut u8,
    pub(crate) shape: Dims<usize>,
    /// Strides in elements, never absent.
    pub(crate) strides: Dims<isize>,
    pub(crate) dtype: DType,
    pub(crate) device: Device,
    pub(crate) read_only: bool,
    /// The bytes the elements span relative to `data`; `None` if empty.
    pub(crate) extent: Option<ByteExtent>,
    /// How the input was imported.
    pub(crate) path: ImportPath,
    /// The `stream` the producer was asked to make the data ready on (the
    /// array API standard's integer), or the producer's current work stream
    /// from the exchange API; `None` for memory without streams, raw
    /// capsules, and producers that could not say their device.
    pub(crate) stream: Option<i64>,
    /// The view's entry in the borrow registry (see [`crate::borrow`]),
    /// released when the view drops or is exported.
    pub(crate) borrow: Option<crate::borrow::Borrow>,
    owner: Owner,
}

impl RawTensor {
    /// A host (CPU) tensor from values a fast path has validated: `extent`
    /// is the span of `shape`/`strides` (elements) around `data`, checked to
    /// be addressable, or `None` for an empty array.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn new(
        data: *mut u8,
        shape: Dims<usize>,
        strides: Dims<isize>,
        dtype: DType,
        read_only: bool,
        extent: Option<ByteExtent>,
        owner: Owner,
        path: ImportPath,
    ) -> RawTensor {
        RawTensor {
            data,
            shape,
            strides,
            dtype,
            device: Device::CPU,
            read_only,
            extent,
            path,
            stream: None,
            borrow: None,
            owner,
        }
    }

    /// Whether this was read through PyTorch's own exchange API table (a
    /// tensor whose storage Python code may swap, see
    /// [`crate::fast::still_describes`]).
    pub(crate) fn read_through_torch_table(&self) -> bool {
        matches!(self.owner, Owner::Exchange { api, .. } if crate::fast::is_known_torch_table(api))
    }

    /// Before a view is exported (returned to Python): a view of a PyTorch
    /// tensor that requires grad becomes read-only (writes through it would
    /// bypass autograd, which PyTorch's own `.numpy()` and `__dlpack__`
    /// refuse), and an exchange-API import takes ownership
    /// (`managed_tensor_from_py_object_no_sync`), so that it may outlive
    /// the call.
    pub(crate) fn prepare_export(&mut self, py: Python<'_>) -> PyResult<()> {
        // Exported, the memory is Python's again: no Rust reference to it
        // remains, so the view's borrow ends here.
        self.borrow = None;
        let Owner::Exchange { obj, api, origin } = &self.owner else {
            return Ok(());
        };
        let bound = obj.bind(py);
        if crate::fast::is_torch_type(bound)
            && bound
                .getattr(pyo3::intern!(py, "requires_grad"))?
                .is_truthy()?
        {
            self.read_only = true;
        }
        // SAFETY: `api` is the producer's process-lifetime table.
        let api = unsafe { api.as_ref() };
        let Some(from_obj) = api.managed_tensor_from_py_object_no_sync else {
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "the producer's exchange API cannot hand out an owning tensor",
            ));
        };
        let mut out: *mut DLManagedTensorVersioned = std::ptr::null_mut();
        // SAFETY: `obj` has the type the API came from; on success `out`
        // is an owning tensor whose deleter we must call once.
        if unsafe { from_obj(obj.as_ptr().cast(), &mut out) } != 0 || out.is_null() {
            return Err(PyErr::take(py).unwrap_or_else(|| {
                pyo3::exceptions::PyBufferError::new_err("the exchange API returned no tensor")
            }));
        }
        // SAFETY: `out` is non-NULL and owned by us from here on.
        let owner = Owner::Versioned(unsafe { NonNull::new_unchecked(out) });
        // SAFETY: a valid managed tensor's DLTensor.
        let t = unsafe { &(*out).dl_tensor };
        let data = (t.data as usize).wrapping_add(t.byte_offset as usize);
        if data != *origin {
            // The object changed between the two calls (it cannot while we
            // hold the GIL, but never trust it): keep the old owner.
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "the producer's owning tensor does not match the view",
            ));
        }
        self.owner = owner;
        Ok(())
    }
}

/// Why an import failed, before the call context adds the function and the
/// parameter to the message.
pub(crate) enum ImportError {
    /// Not an array at all: no `__dlpack__`, no buffer protocol.
    NotAnArray(String),
    /// The producer's `__dlpack__()` (or `to_dlpack`) raised.
    Producer(&'static str, PyErr),
    /// An exception that must propagate untouched (`KeyboardInterrupt`,
    /// `MemoryError`, ...).
    Propagate(PyErr),
    /// `__dlpack__()` returned something other than a capsule.
    NotACapsule(String),
    /// A capsule already consumed (`"used_dltensor"`...).
    UsedCapsule,
    /// A capsule whose name is not a DLPack name.
    CapsuleName(String),
    /// A versioned capsule of a major version other than 1.
    Version(u32, u32),
    /// The producer described an impossible array.
    Invalid(String),
    /// A data type dlcast cannot hold (vector lanes, unknown code, sub-byte).
    DType(DType),
    /// A device type code the DLPack header does not define.
    Device(Device),
    /// The function's stream request cannot apply to the array's device
    /// (e.g. CUDA's per-thread stream for ROCm memory).
    Stream(String),
    /// The buffer protocol refused.
    Buffer(PyErr),
    /// The producer's memory does not hold the array's values (PyTorch's
    /// conjugate / negative bits); the text says what to do.
    Unreadable(String),
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// What the import needs to know about streams: the function's request and
/// whether the parameter accepts memory with streams at all (only then is a
/// producer asked `__dlpack_device__()` before `__dlpack__`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StreamCx {
    pub(crate) request: StreamRequest,
    pub(crate) may_need: bool,
}

/// Imports `obj` by the first path that applies (see the module docs) but
/// NumPy's fields, which [`crate::fast::numpy`] reads before this.
pub(crate) fn import_generic(
    obj: &Bound<'_, PyAny>,
    sx: StreamCx,
) -> Result<RawTensor, ImportError> {
    // The first `numpy.ndarray` comes here (the type is learnt), and so do
    // arrays the NumPy path declined (it declines them again, cheaply).
    if fast::learn_ndarray(obj) {
        if let Some(raw) = fast::numpy(obj) {
            return Ok(raw);
        }
    }
    // SAFETY: `obj` is a live object; PyCapsule_CheckExact only reads its type.
    if unsafe { ffi::PyCapsule_CheckExact(obj.as_ptr()) } != 0 {
        return take_capsule(obj, ImportPath::Capsule);
    }
    // The device, when a path already told it (the exchange API declines
    // device memory it cannot hand over without `__dlpack__`).
    let device = match fast::exchange(obj, sx.request)? {
        fast::Exchange::Done(raw) => return Ok(raw),
        fast::Exchange::Declined(device) => Some(device),
        fast::Exchange::NotApplicable => None,
    };
    // Only parameters that accept CUDA/ROCm memory ask the device: a
    // CPU-only parameter passes `None` and refuses device memory later.
    let device = match device {
        Some(d) => Some(d),
        None if sx.may_need => dlpack_device(obj)?,
        None => None,
    };
    let stream = match device {
        Some(d) => stream::resolve(d, sx.request, None).map_err(ImportError::Stream)?,
        None => None,
    };
    match call_dlpack(obj, stream)? {
        Some(capsule) => {
            let mut raw = take_capsule(&capsule, ImportPath::Dlpack)?;
            // PyTorch's `__dlpack__` refuses the conjugate bit but hands
            // out lazily negated tensors as they are.
            let flags = fast::type_flags(obj);
            if flags.torch_type() {
                fast::refuse_py_dispatch(flags)?;
                fast::torch_flags(obj, raw.dtype.code == code::COMPLEX)?;
            }
            // JAX arrays and TensorFlow tensors are immutable, but they answer
            // with capsules that do not say so (DLPack notes): mark them
            // read-only here.
            if !raw.read_only && flags.immutable() {
                raw.read_only = true;
            }
            let has_streams = stream::stream_kind(raw.device.device_type) != StreamKind::None;
            if let (Some(said), true, None) = (device, has_streams, stream) {
                // The producer said "no streams here" and then handed over
                // CUDA/ROCm memory, which it never synchronised for us.
                return Err(ImportError::Invalid(format!(
                    "__dlpack_device__() said {said}, but the capsule describes memory on {}",
                    raw.device
                )));
            }
            raw.stream = if has_streams { stream } else { None };
            Ok(raw)
        }
        None => {
            // SAFETY: `obj` is a live object.
            if unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } != 0 {
                return import_buffer(obj);
            }
            if is_from_module(obj, &["tensorflow"]) {
                let capsule = tensorflow_to_dlpack(obj)?;
                return take_capsule(&capsule, ImportPath::Tensorflow);
            }
            Err(ImportError::NotAnArray(type_name(obj)))
        }
    }
}

/// `obj.__dlpack_device__()` as a [`Device`]; `Ok(None)` when `obj` has no
/// such method (a producer older than the standard: it gets `stream=None`).
fn dlpack_device(obj: &Bound<'_, PyAny>) -> Result<Option<Device>, ImportError> {
    let py = obj.py();
    let name = intern!(py, "__dlpack_device__");
    let answer = match obj.call_method0(name) {
        Ok(a) => a,
        Err(e)
            if e.is_instance_of::<PyAttributeError>(py) && !obj.hasattr(name).unwrap_or(true) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(producer_error("__dlpack_device__", e, py)),
    };
    // Device types are IntEnums in some producers: `extract` takes them.
    let (device_type, device_id) = answer.extract::<(i32, i32)>().map_err(|_| {
        ImportError::Invalid(format!(
            "__dlpack_device__() returned {}, not a (device_type, device_id) pair of integers",
            answer
                .repr()
                .map(|r| r.to_string())
                .unwrap_or_else(|_| type_name(&answer))
        ))
    })?;
    Ok(Some(Device {
        device_type,
        device_id,
    }))
}

/// Sorts a producer's exception: interrupts and memory errors propagate as
/// they are; everything else is wrapped with the parameter's name.
pub(crate) fn producer_error(what: &'static str, e: PyErr, py: Python<'_>) -> ImportError {
    // Not an `Exception` (KeyboardInterrupt, SystemExit, GeneratorExit), or
    // out of memory: not the producer's answer about this array.
    if !e.is_instance_of::<PyException>(py) || e.is_instance_of::<PyMemoryError>(py) {
        ImportError::Propagate(e)
    } else {
        ImportError::Producer(what, e)
    }
}

/// Calls `obj.__dlpack__(max_version=(1, 3))` (with `stream=` first when
/// `stream` is `Some`) through vectorcall with interned names (no per-call
/// dict), retrying without `max_version` when the producer raises
/// `TypeError` (case C9; `stream` is older than `max_version` in the
/// standard, so it is kept). `Ok(None)` when `obj` has no `__dlpack__`.
fn call_dlpack<'py>(
    obj: &Bound<'py, PyAny>,
    stream: Option<i64>,
) -> Result<Option<Bound<'py, PyAny>>, ImportError> {
    static KW_VERSION: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    static KW_STREAM_VERSION: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    static KW_STREAM: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    static VERSION: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    let py = obj.py();
    let name = intern!(py, "__dlpack__");
    let kwnames = |cell: &'static PyOnceLock<Py<PyTuple>>, names: &'static [&'static str]| {
        cell.get_or_try_init(py, || PyTuple::new(py, names).map(Bound::unbind))
            .map(|t| t.as_ptr())
            .map_err(ImportError::Propagate)
    };
    let version = VERSION
        .get_or_try_init(py, || {
            PyTuple::new(py, [MAX_VERSION.0, MAX_VERSION.1]).map(Bound::unbind)
        })
        .map_err(ImportError::Propagate)?;
    let stream_obj = match stream {
        Some(s) => Some(
            s.into_pyobject(py)
                .map_err(|e| ImportError::Propagate(e.into()))?,
        ),
        None => None,
    };
    // (keyword values, their names) with and without `max_version`.
    let (first, kws): ([*mut ffi::PyObject; 3], [*mut ffi::PyObject; 2]) = match &stream_obj {
        Some(s) => (
            [obj.as_ptr(), s.as_ptr(), version.as_ptr()],
            [
                kwnames(&KW_STREAM_VERSION, &["stream", "max_version"])?,
                kwnames(&KW_STREAM, &["stream"])?,
            ],
        ),
        None => (
            [obj.as_ptr(), version.as_ptr(), std::ptr::null_mut()],
            [
                kwnames(&KW_VERSION, &["max_version"])?,
                std::ptr::null_mut(),
            ],
        ),
    };
    let call = |with_version: bool| {
        let kw = if with_version { kws[0] } else { kws[1] };
        // SAFETY: `first` holds `self` followed by one value per name in
        // `kw` (a tuple of 2, 1 or 0 names, or NULL for none), taken from
        // the front: `(stream, max_version)` and `(stream,)` both start
        // with `stream`; `(max_version,)` starts the other array after
        // `self`. All are live; the result is a new reference or NULL with
        // an exception set.
        unsafe {
            let r = ffi::PyObject_VectorcallMethod(name.as_ptr(), first.as_ptr(), 1, kw);
            Bound::from_owned_ptr_or_err(py, r)
        }
    };
    match call(true) {
        Ok(capsule) => Ok(Some(capsule)),
        Err(e) if e.is_instance_of::<PyAttributeError>(py) && !has_dlpack(obj) => Ok(None),
        Err(e) if e.is_instance_of::<PyTypeError>(py) => call(false)
            .map(Some)
            .map_err(|e| producer_error("__dlpack__", e, py)),
        Err(e) => Err(producer_error("__dlpack__", e, py)),
    }
}

/// Whether `obj` has a `__dlpack__` attribute (asked only after a call
/// failed with `AttributeError`, to tell "none" from "it raised").
fn has_dlpack(obj: &Bound<'_, PyAny>) -> bool {
    obj.hasattr(intern!(obj.py(), "__dlpack__"))
        .unwrap_or(false)
}

/// Whether `type(obj).__module__` is one of `packages` or a submodule.
pub(crate) fn is_from_module(obj: &Bound<'_, PyAny>, packages: &[&str]) -> bool {
    let py = obj.py();
    obj.get_type()
        .getattr(intern!(py, "__module__"))
        .and_then(|m| m.extract::<String>())
        .is_ok_and(|m| {
            packages.iter().any(|p| {
                m.strip_prefix(p)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
            })
        })
}

fn tensorflow_to_dlpack<'py>(obj: &Bound<'py, PyAny>) -> Result<Bound<'py, PyAny>, ImportError> {
    let py = obj.py();
    let to_dlpack = py
        .import("tensorflow")
        .and_then(|tf| tf.getattr("experimental"))
        .and_then(|m| m.getattr("dlpack"))
        .and_then(|m| m.getattr("to_dlpack"))
        .map_err(|e| producer_error("tf.experimental.dlpack.to_dlpack", e, py))?;
    to_dlpack
        .call1((obj,))
        .map_err(|e| producer_error("tf.experimental.dlpack.to_dlpack", e, py))
}

/// Takes ownership of the managed tensor in a DLPack capsule: the name
/// decides the struct, and the capsule is renamed `used_*` so that neither
/// its destructor nor a second consumer touches it again (case C7).
fn take_capsule(capsule: &Bound<'_, PyAny>, path: ImportPath) -> Result<RawTensor, ImportError> {
    let py = capsule.py();
    let cap = capsule.as_ptr();
    // SAFETY: `cap` is a live object; the check reads only its type.
    if unsafe { ffi::PyCapsule_CheckExact(cap) } == 0 {
        return Err(ImportError::NotACapsule(type_name(capsule)));
    }
    // SAFETY: `cap` is a capsule; the name pointer (maybe NULL) stays valid
    // while the capsule lives and its name is not changed.
    let name_ptr = unsafe { ffi::PyCapsule_GetName(cap) };
    if name_ptr.is_null() {
        // SAFETY: a capsule's name may be NULL without error; clear any
        // error state defensively.
        if let Some(e) = PyErr::take(py) {
            return Err(ImportError::Propagate(e));
        }
        return Err(ImportError::CapsuleName("NULL".into()));
    }
    // SAFETY: non-NULL capsule names are NUL-terminated C strings.
    let name = unsafe { CStr::from_ptr(name_ptr) };
    let (versioned, used_name) = if name == NAME_VERSIONED {
        (true, NAME_USED_VERSIONED)
    } else if name == NAME_LEGACY {
        (false, NAME_USED_LEGACY)
    } else if name == NAME_USED_LEGACY || name == NAME_USED_VERSIONED {
        return Err(ImportError::UsedCapsule);
    } else {
        return Err(ImportError::CapsuleName(
            name.to_string_lossy().into_owned(),
        ));
    };
    // SAFETY: `name_ptr` is this capsule's current name, so GetPointer
    // succeeds unless the stored pointer is NULL.
    let ptr = unsafe { ffi::PyCapsule_GetPointer(cap, name_ptr) };
    let Some(ptr) = NonNull::new(ptr) else {
        let err = PyErr::take(py);
        return Err(err.map_or_else(
            || ImportError::Invalid("the capsule holds a NULL pointer".into()),
            ImportError::Propagate,
        ));
    };
    // SAFETY: `used_name` is a 'static C string, as SetName requires.
    if unsafe { ffi::PyCapsule_SetName(cap, used_name.as_ptr()) } != 0 {
        return Err(ImportError::Propagate(PyErr::fetch(py)));
    }
    if versioned {
        let m = ptr.cast::<DLManagedTensorVersioned>();
        let owner = Owner::Versioned(m);
        // SAFETY: the producer handed us a DLManagedTensorVersioned; its
        // `version` field is at the same place in every major version.
        let version = unsafe { (*m.as_ptr()).version };
        if version.major != 1 {
            // Case C11: read nothing else; dropping `owner` calls the deleter.
            drop(owner);
            return Err(ImportError::Version(version.major, version.minor));
        }
        // SAFETY: major version 1, so the struct has the v1 layout; the
        // tensor lives until `owner` runs the deleter.
        let (tensor, flags) = unsafe { (&raw const (*m.as_ptr()).dl_tensor, (*m.as_ptr()).flags) };
        // SAFETY: `tensor` points into the managed tensor owned by `owner`.
        unsafe { from_dltensor(tensor, flags & FLAG_READ_ONLY != 0, owner, path) }
    } else {
        let m = ptr.cast::<DLManagedTensor>();
        let owner = Owner::Legacy(m);
        // SAFETY: a legacy capsule holds a DLManagedTensor owned by `owner`.
        let tensor = unsafe { &raw const (*m.as_ptr()).dl_tensor };
        // SAFETY: as above.
        unsafe { from_dltensor(tensor, false, owner, path) }
    }
}

/// Reads and validates a `DLTensor` whose memory `owner` keeps alive.
///
/// # Safety
/// `t` must point to a `DLTensor` that stays valid while `owner` lives, with
/// `shape` (and `strides` unless NULL) readable for `ndim` values each, as
/// the DLPack header requires of producers.
pub(crate) unsafe fn from_dltensor(
    t: *const DLTensor,
    read_only: bool,
    owner: Owner,
    path: ImportPath,
) -> Result<RawTensor, ImportError> {
    // SAFETY: the caller guarantees `t` is a valid DLTensor.
    let t = unsafe { &*t };
    let dtype = DType::new(t.dtype.code, t.dtype.bits, t.dtype.lanes);
    let device = Device {
        device_type: t.device.device_type as i32,
        device_id: t.device.device_id,
    };
    if device_type_name(device.device_type).is_none() {
        return Err(ImportError::Device(device));
    }
    if dtype.itemsize().is_none() {
        return Err(ImportError::DType(dtype));
    }
    let ndim =
        usize::try_from(t.ndim).map_err(|_| ImportError::Invalid(format!("ndim is {}", t.ndim)))?;
    if ndim > 0 && t.shape.is_null() {
        return Err(ImportError::Invalid(format!(
            "shape is NULL with ndim {ndim}"
        )));
    }
    let mut shape: Dims<usize> = fast::zeros(ndim);
    for (i, out) in shape.iter_mut().enumerate() {
        // SAFETY: `shape` holds `ndim` values (caller's guarantee), non-NULL.
        let n = unsafe { *t.shape.add(i) };
        *out = usize::try_from(n)
            .map_err(|_| ImportError::Invalid(format!("extent {n} in dimension {i}")))?;
    }
    let mut strides: Dims<isize> = fast::zeros(ndim);
    if t.strides.is_null() || ndim == 0 {
        // Case C5: NULL strides (allowed before DLPack 1.2) mean compact
        // row-major.
        layout::fill_c_strides(&shape, &mut strides)
            .ok_or_else(|| ImportError::Invalid("the shape overflows".into()))?;
    } else {
        for (i, s) in strides.iter_mut().enumerate() {
            // SAFETY: non-NULL `strides` hold `ndim` values.
            let v = unsafe { *t.strides.add(i) };
            *s = isize::try_from(v)
                .map_err(|_| ImportError::Invalid(format!("stride {v} in dimension {i}")))?;
        }
    }
    make_raw(
        t.data.cast(),
        t.byte_offset,
        shape,
        strides,
        dtype,
        device,
        read_only,
        owner,
        path,
    )
}

/// Final checks shared by every path: sizes, extent and address arithmetic.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn make_raw(
    data: *mut u8,
    byte_offset: u64,
    shape: Dims<usize>,
    strides: Dims<isize>,
    dtype: DType,
    device: Device,
    read_only: bool,
    owner: Owner,
    path: ImportPath,
) -> Result<RawTensor, ImportError> {
    let Some(itemsize) = dtype.itemsize() else {
        return Err(ImportError::DType(dtype));
    };
    let invalid = |what: &str| ImportError::Invalid(what.to_string());
    layout::element_count(&shape).ok_or_else(|| invalid("the element count overflows"))?;
    let extent = layout::byte_extent(&shape, &strides, itemsize)
        .ok_or_else(|| invalid("the strides reach beyond the address space"))?;
    let offset = usize::try_from(byte_offset).map_err(|_| invalid("byte_offset overflows"))?;
    if let (Some(e), true) = (extent, device.is_host_accessible()) {
        // Memory the host will read: the whole span must be addressable.
        if data.is_null() {
            return Err(invalid("data is NULL for a non-empty array"));
        }
        let first = (data as usize)
            .checked_add(offset)
            .ok_or_else(|| invalid("data + byte_offset overflows"))?;
        let lo = first.checked_add_signed(e.lo);
        let hi = first.checked_add_signed(e.hi);
        match (lo, hi) {
            (Some(lo), Some(hi)) if lo != 0 && hi - lo <= isize::MAX as usize => {}
            _ => return Err(invalid("the array's memory wraps around the address space")),
        }
    }
    Ok(RawTensor {
        // Never dereferenced unless the checks above passed for it.
        data: data.wrapping_add(offset),
        shape,
        strides,
        dtype,
        device,
        read_only,
        extent,
        path,
        stream: None,
        borrow: None,
        owner,
    })
}

/// The element type of a buffer-protocol format string (PEP 3118 / `struct`).
fn buffer_dtype(format: &CStr, itemsize: usize) -> Option<DType> {
    let bytes = format.to_bytes();
    let (order, rest) = match bytes.first() {
        Some(c @ (b'@' | b'=' | b'<' | b'>' | b'!')) => (*c, &bytes[1..]),
        _ => (b'@', bytes),
    };
    let native_little = cfg!(target_endian = "little");
    let swapped = match order {
        b'<' => !native_little,
        b'>' | b'!' => native_little,
        _ => false,
    };
    if swapped {
        return None;
    }
    let bits = u8::try_from(itemsize.checked_mul(8)?).ok()?;
    let dtype = match rest {
        b"?" => DType::new(code::BOOL, bits, 1),
        [b'b' | b'h' | b'i' | b'l' | b'q' | b'n'] => DType::new(code::INT, bits, 1),
        [b'B' | b'H' | b'I' | b'L' | b'Q' | b'N'] => DType::new(code::UINT, bits, 1),
        [b'e' | b'f' | b'd'] => DType::new(code::FLOAT, bits, 1),
        [b'Z', b'f' | b'd'] => DType::new(code::COMPLEX, bits, 1),
        _ => return None,
    };
    // The sizes must be ones dlcast knows (e.g. `long double` is refused).
    (dtype.itemsize() == Some(itemsize)).then_some(dtype)
}

fn import_buffer(obj: &Bound<'_, PyAny>) -> Result<RawTensor, ImportError> {
    let py = obj.py();
    // SAFETY: Py_buffer is a plain C struct; all-zero is a valid "empty"
    // value that PyObject_GetBuffer overwrites.
    let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: `obj` is live and `view` is a writable Py_buffer.
    if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, ffi::PyBUF_RECORDS_RO) } != 0 {
        return Err(ImportError::Buffer(PyErr::fetch(py)));
    }
    // From here on `owner` releases the buffer on every path.
    let v: &ffi::Py_buffer = &view;
    let (data, ndim, itemsize, readonly) = (v.buf, v.ndim, v.itemsize, v.readonly != 0);
    let (fmt_ptr, shape_ptr, strides_ptr, sub) = (v.format, v.shape, v.strides, v.suboffsets);
    let owner = Owner::Buffer(view);
    if !sub.is_null() {
        return Err(ImportError::Invalid(
            "the buffer uses suboffsets (an indirect array)".into(),
        ));
    }
    let itemsize = usize::try_from(itemsize)
        .map_err(|_| ImportError::Invalid(format!("buffer itemsize {itemsize}")))?;
    let format = if fmt_ptr.is_null() {
        c"B"
    } else {
        // SAFETY: the exporter's format is a NUL-terminated string valid
        // until the buffer is released.
        unsafe { CStr::from_ptr(fmt_ptr) }
    };
    let dtype = buffer_dtype(format, itemsize).ok_or_else(|| {
        ImportError::Invalid(format!(
            "unsupported buffer format {:?} (itemsize {itemsize})",
            format.to_string_lossy()
        ))
    })?;
    let ndim =
        usize::try_from(ndim).map_err(|_| ImportError::Invalid(format!("buffer ndim {ndim}")))?;
    let mut shape: Dims<usize> = SmallVec::with_capacity(ndim);
    let mut strides: Dims<isize> = smallvec::smallvec![0; ndim];
    if ndim > 0 && shape_ptr.is_null() {
        return Err(ImportError::Invalid("buffer shape is NULL".into()));
    }
    for i in 0..ndim {
        // SAFETY: with PyBUF_ND requested, `shape` holds `ndim` values.
        let n = unsafe { *shape_ptr.add(i) };
        shape.push(
            usize::try_from(n).map_err(|_| ImportError::Invalid(format!("buffer extent {n}")))?,
        );
    }
    if strides_ptr.is_null() {
        layout::fill_c_strides(&shape, &mut strides)
            .ok_or_else(|| ImportError::Invalid("the shape overflows".into()))?;
    } else {
        for (i, s) in strides.iter_mut().enumerate() {
            // SAFETY: with PyBUF_STRIDES requested, `strides` holds `ndim`
            // values (in bytes).
            let b = unsafe { *strides_ptr.add(i) };
            // Byte strides that are not whole elements cannot be expressed in
            // DLPack's element strides: refuse, never divide.
            if b % itemsize as isize != 0 {
                return Err(ImportError::Invalid(format!(
                    "buffer stride of {b} bytes is not a multiple of the item size {itemsize}"
                )));
            }
            *s = b / itemsize as isize;
        }
    }
    make_raw(
        data.cast(),
        0,
        shape,
        strides,
        dtype,
        Device::CPU,
        readonly,
        owner,
        ImportPath::Buffer,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_formats() {
        assert_eq!(buffer_dtype(c"d", 8), Some(DType::FLOAT64));
        assert_eq!(buffer_dtype(c"<f", 4), Some(DType::FLOAT32));
        assert_eq!(buffer_dtype(c"l", 8), Some(DType::INT64));
        assert_eq!(buffer_dtype(c"=l", 4), Some(DType::INT32));
        assert_eq!(buffer_dtype(c"B", 1), Some(DType::UINT8));
        assert_eq!(buffer_dtype(c"?", 1), Some(DType::BOOL));
        assert_eq!(buffer_dtype(c"Zd", 16), Some(DType::COMPLEX128));
        assert_eq!(buffer_dtype(c">d", 8), None);
        assert_eq!(buffer_dtype(c"g", 16), None);
        assert_eq!(buffer_dtype(c"d", 16), None);
        assert_eq!(buffer_dtype(c"T{d:x:}", 8), None);
    }
}
