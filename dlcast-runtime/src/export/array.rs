//! The `dlcast.Array` class ([`Array`]): `__dlpack__` and its capsules
//! (managed tensors and their deleters), the buffer protocol (or NumPy's
//! `__array_interface__` where the limited API has none), streams.

use crate::dtype::DType;
use crate::error::ExportError;
use crate::layout;
use dlpack_rs::ffi::{
    DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;
// `c_int` only in the buffer protocol, which abi3 builds below 3.11 lack.
use super::alloc::{Exported, CAPSULES_CREATED, CAPSULE_DELETERS, EXPORT_INLINE_DIMS, FINALIZING};
#[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
use std::ffi::c_int;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// `DLPACK_FLAG_BITMASK_READ_ONLY` and `..._IS_COPIED` (DLPack header).
const FLAG_READ_ONLY: u64 = 1;
const FLAG_IS_COPIED: u64 = 2;
/// The version written into versioned capsules.
const EXPORT_VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 3 };
const NAME_LEGACY: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";

/// `dlcast.Array`: an array exported by a dlcast function.
///
/// Follows the array API standard's DLPack protocol: `__dlpack__(*,
/// stream=None, max_version=None, dl_device=None, copy=None)` and
/// `__dlpack_device__()`; offers the buffer protocol for host memory
/// (refusing writable requests on read-only data); has `shape`, `dtype`,
/// `ndim`, `__len__` and a readable `__repr__`. Pass it to any framework's
/// `from_dlpack`, or to `numpy.asarray`.
#[pyclass(module = "dlcast", name = "Array", frozen)]
pub struct Array {
    pub(super) inner: Exported,
}

fn register_atexit(py: Python<'_>) {
    static REGISTERED: PyOnceLock<()> = PyOnceLock::new();
    REGISTERED.get_or_init(py, || {
        #[pyfunction]
        fn dlcast_mark_finalizing() {
            FINALIZING.store(true, Ordering::SeqCst);
        }
        let hook = wrap_pyfunction!(dlcast_mark_finalizing, py);
        if let (Ok(atexit), Ok(hook)) = (py.import("atexit"), hook) {
            // Failing to register only means deleters keep their normal path.
            let _ = atexit.call_method1("register", (hook,));
        }
    });
}

impl Array {
    pub(super) fn new(py: Python<'_>, mut inner: Exported) -> PyResult<Bound<'_, Array>> {
        register_atexit(py);
        // Read-only host memory that must never be written (static data,
        // read-only foreign memory) goes out as one aligned copy, made here
        // (for static data, the one copy every export of it shares):
        // every route to a consumer (NumPy's or JAX's re-export, a legacy
        // capsule for TensorFlow, the buffer protocol) may end at PyTorch,
        // which ignores READ_ONLY and writes. The copy stays read-only, and
        // `__dlpack__` still copies it again for each DLPack consumer.
        if inner.never_written && inner.device.is_host_accessible() {
            // Static data: the one copy every export of it shares.
            let mut copy = if inner.static_data {
                inner.interned()?
            } else {
                inner.aligned_copy(py, "exporting read-only data")?
            };
            copy.read_only = true;
            copy.never_written = true;
            inner = copy;
        }
        let untracked = inner.py_owner.is_none();
        let array = Bound::new(py, Array { inner })?;
        if untracked {
            // An array that refers to no Python object (`__traverse__`
            // reports nothing, and a frozen class never gains one) can be
            // in no reference cycle: off the garbage collector's lists, as
            // CPython does with tuples and dicts of atomic values, so that
            // returning arrays triggers no collections.
            // SAFETY: `array` is a live object of a GC type, just created;
            // untracking is allowed at any time, and PyO3's deallocation
            // untracks again only if it is tracked.
            unsafe { pyo3::ffi::PyObject_GC_UnTrack(array.as_ptr().cast()) };
        }
        Ok(array)
    }
}

/// What the manager context of an exported capsule holds.
struct CapsuleCtx {
    /// The exported object (keeps the memory alive), or `None` for a copy.
    owner: Option<Py<Array>>,
    /// The copy, when `copy=True` (boxed: rare, and large).
    _copy: Option<Box<Exported>>,
    /// What the tensor's `shape` and `strides` point to (inline up to
    /// [`EXPORT_INLINE_DIMS`] dimensions, inside the allocation).
    shape: smallvec::SmallVec<[i64; EXPORT_INLINE_DIMS]>,
    strides: smallvec::SmallVec<[i64; EXPORT_INLINE_DIMS]>,
    /// Set when the deleter runs, for a caller that must know whether a
    /// consumer that failed freed the tensor (see [`torch_from_array`]).
    deleted: Option<Arc<AtomicBool>>,
}

impl Drop for CapsuleCtx {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            release_array(owner);
        }
        if let Some(flag) = &self.deleted {
            flag.store(true, Ordering::SeqCst);
        }
        CAPSULE_DELETERS.fetch_add(1, Ordering::SeqCst);
    }
}

/// A managed tensor (`DLManagedTensorVersioned` or `DLManagedTensor`) and
/// its context in one allocation. The tensor comes first (`repr(C)`), so the
/// pointer handed to consumers is the allocation's own, and the deleter
/// frees both at once; the tensor's `manager_ctx` points at `ctx`.
#[repr(C)]
struct Managed<M> {
    tensor: M,
    ctx: CapsuleCtx,
}

/// Drops a reference to an exported array from a DLPack deleter, which a
/// consumer may call on any thread, with or without the GIL, and even from
/// inside a call of ours after it released the GIL itself (JAX does). PyO3's
/// own bookkeeping can then believe the GIL is held when it is not, so this
/// takes the GIL through `PyGILState_Ensure`, which asks CPython. Once the
/// interpreter is shutting down the reference is leaked instead.
fn release_array(owner: Py<Array>) {
    let ptr = owner.into_ptr();
    if FINALIZING.load(Ordering::SeqCst) {
        return;
    }
    // SAFETY: the interpreter is running (not finalizing: checked above), so
    // PyGILState_Ensure may be called from any thread, GIL held or not;
    // `ptr` is a strong reference we own, released exactly once, with the
    // GIL held.
    unsafe {
        let state = ffi::PyGILState_Ensure();
        ffi::Py_DECREF(ptr);
        ffi::PyGILState_Release(state);
    }
}

pub(super) unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    if m.is_null() {
        return;
    }
    // SAFETY: `m` is the first field of a `Managed` made by `Box::into_raw`
    // in `make_managed` (this deleter is set only there, on versioned
    // tensors), so it is the allocation's address; the DLPack protocol has
    // the deleter called once.
    drop(unsafe { Box::from_raw(m.cast::<Managed<DLManagedTensorVersioned>>()) });
}

unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: as in `delete_versioned`, for legacy tensors.
    drop(unsafe { Box::from_raw(m.cast::<Managed<DLManagedTensor>>()) });
}

/// Destructor of our capsules: frees the tensor if no consumer took it.
unsafe extern "C" fn capsule_destructor(cap: *mut ffi::PyObject) {
    // SAFETY: CPython calls this with the dying capsule and the GIL held; a
    // consumer that took the capsule renamed it, so the names below match
    // only untaken capsules, whose pointer is ours.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, NAME_VERSIONED.as_ptr()) != 0 {
            let m = ffi::PyCapsule_GetPointer(cap, NAME_VERSIONED.as_ptr());
            delete_versioned(m.cast());
        } else if ffi::PyCapsule_IsValid(cap, NAME_LEGACY.as_ptr()) != 0 {
            let m = ffi::PyCapsule_GetPointer(cap, NAME_LEGACY.as_ptr());
            delete_legacy(m.cast());
        }
    }
}

/// The struct format character of a dtype (PEP 3118), for the buffer
/// protocol; `None` where `struct` has none (bfloat16).
fn buffer_format(dtype: DType) -> Option<&'static CStr> {
    dtype.facts()?.format
}

/// What the buffer protocol (and, below Python 3.11 in abi3 builds,
/// NumPy's array interface) needs of an exported array whatever the
/// request: host memory, a dtype with a struct format, and a byte length
/// that fits `Py_ssize_t`. Gives the format and that length.
fn host_buffer(this: &Exported) -> PyResult<(&'static CStr, isize)> {
    if !this.device.is_host_accessible() {
        return Err(ExportError::BufferHostOnly(this.device).into());
    }
    let format = buffer_format(this.dtype).ok_or(ExportError::NoBufferFormat(this.dtype))?;
    let shape = this.shape_usize();
    let item = this.dtype.itemsize().unwrap_or(1);
    // `len` is the product of the extents times the itemsize, which
    // CPython trusts (memoryview.tobytes() copies `len` bytes): a
    // broadcast array can describe more bytes than `Py_ssize_t` holds.
    let len = layout::element_count(&shape)
        .and_then(|n| layout::checked_bytes(n, item))
        .and_then(|b| isize::try_from(b).ok())
        .ok_or_else(|| ExportError::BufferTooLarge {
            shape: shape.to_vec(),
        })?;
    Ok((format, len))
}

/// Whether exported [`Array`]s offer the buffer protocol (`memoryview(a)`)
/// and buffer-protocol inputs are read through `PyObject_GetBuffer`: true
/// except in abi3 builds for Python 3.9 and 3.10 (PyO3's `abi3-py39` and
/// `abi3-py310` features), whose limited API has no buffer protocol. There,
/// an `Array` offers NumPy's `__array_interface__` instead (so
/// `numpy.asarray(a)` still shares its memory), and inputs other than
/// `bytes` and `bytearray` are read through a `memoryview` and NumPy.
///
/// ```
/// if !dlcast_runtime::export::BUFFER_PROTOCOL {
///     // memoryview(a) raises TypeError; use numpy.asarray(a) or DLPack.
/// }
/// ```
pub const BUFFER_PROTOCOL: bool = cfg!(any(Py_3_11, not(Py_LIMITED_API)));

/// NumPy's array-interface `typestr` of a dtype (`"<f4"`, `"|b1"`, ...),
/// for the dtypes that have a buffer-protocol format.
#[cfg(all(Py_LIMITED_API, not(Py_3_11)))]
fn array_typestr(dtype: DType) -> Option<String> {
    buffer_format(dtype)?;
    let facts = dtype.facts()?;
    let typestr = facts.typestr?;
    let order = match (dtype.itemsize()?, cfg!(target_endian = "little")) {
        (1, _) => '|',
        (_, true) => '<',
        (_, false) => '>',
    };
    Some(format!("{order}{typestr}"))
}

/// Checks a consumer's `stream` against the array API standard's rules for
/// the array's device and makes that stream wait for the array's own
/// (see [`crate::stream`]).
fn consumer_stream(this: &Exported, stream: Option<i64>) -> PyResult<()> {
    use crate::stream::StreamKind;
    let device = this.device;
    let refuse = |stream: i64, why: &'static str| {
        Err(ExportError::Stream {
            stream,
            device,
            why,
        }
        .into())
    };
    let consumer = match (crate::stream::stream_kind(device.device_type), stream) {
        (StreamKind::None, None | Some(-1)) => return Ok(()),
        (StreamKind::None, Some(s)) => return refuse(s, "; pass None"),
        (StreamKind::Cuda, None) => 1,
        (StreamKind::Cuda, Some(s @ (0 | i64::MIN..=-2))) => {
            return refuse(
                s,
                " (CUDA streams: -1, 1, 2 or a cudaStream_t; 0 is ambiguous)",
            )
        }
        (StreamKind::Rocm, None) => 0,
        (StreamKind::Rocm, Some(s @ (1 | 2 | i64::MIN..=-2))) => {
            return refuse(s, " (ROCm streams: -1, 0 or a hipStream_t)")
        }
        (_, Some(s)) => s,
    };
    let ready = match this.stream {
        None | Some(-1) => return Ok(()),
        Some(r) => r,
    };
    let cuda = crate::stream::stream_kind(device.device_type) == StreamKind::Cuda;
    // CUDA's legacy default stream and the per-thread default stream
    // synchronise with each other implicitly.
    if consumer == -1 || consumer == ready || (cuda && matches!((ready, consumer), (1, 2) | (2, 1)))
    {
        return Ok(());
    }
    crate::stream::wait_for(device, ready, consumer).map_err(|why| {
        ExportError::StreamWait {
            consumer,
            ready,
            device,
            why,
        }
        .into()
    })
}

/// Reads `stream`: `None`, or an integer (anything `__index__` takes; else
/// `TypeError`, an incorrect argument). An integer beyond `i64` is no
/// stream of any device: the `BufferError` of a stream the device does not
/// take.
fn parse_stream(this: &Exported, stream: Option<&Bound<'_, PyAny>>) -> PyResult<Option<i64>> {
    let Some(s) = stream.filter(|s| !s.is_none()) else {
        return Ok(None);
    };
    match int_arg(s, || ExportError::StreamType(described(s)).into())? {
        Ok(v) => Ok(Some(v)),
        Err(_) => Err(ExportError::StreamRange {
            stream: s.to_string(),
            device: this.device,
        }
        .into()),
    }
}

/// An integer argument of `__dlpack__`, read through its `__index__` once
/// (as `operator.index` does): `Ok(n)` within `i64`, `Err(positive)` for
/// an integer beyond it (its sign, from an exact `int`: no Python code);
/// `wrong()` (the argument's `TypeError`) for anything that is not an
/// integer. What `__index__` raises that is no fault of the argument
/// (`KeyboardInterrupt`, `SystemExit`, `MemoryError`) propagates unchanged.
fn int_arg(v: &Bound<'_, PyAny>, wrong: impl FnOnce() -> PyErr) -> PyResult<Result<i64, bool>> {
    let py = v.py();
    // SAFETY: `v` is a live object and the GIL is held; `PyNumber_Index`
    // returns a new reference, or NULL with an exception set.
    let index = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyNumber_Index(v.as_ptr())) };
    let index = match index {
        Ok(i) => i,
        Err(e)
            if !e.is_instance_of::<pyo3::exceptions::PyException>(py)
                || e.is_instance_of::<pyo3::exceptions::PyMemoryError>(py) =>
        {
            return Err(e)
        }
        Err(_) => return Err(wrong()),
    };
    match index.extract::<i64>() {
        Ok(n) => Ok(Ok(n)),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) => {
            Ok(Err(index.gt(0)?))
        }
        Err(e) => Err(e),
    }
}

/// Checks `dl_device`: a tuple of two integers (else `TypeError`, an
/// incorrect argument), which must be the array's own device (else
/// `BufferError`, whatever the integers, those beyond `i32` included).
fn parse_dl_device(this: &Exported, d: &Bound<'_, PyAny>) -> PyResult<()> {
    let wrong = || PyErr::from(ExportError::DlDeviceType(described(d)));
    let (t, id) = d
        .extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>()
        .map_err(|_| wrong())?;
    // Each an `i32`, `None` for an integer beyond it; not an integer:
    // `TypeError`.
    let int = |v: &Bound<'_, PyAny>| {
        int_arg(v, wrong).map(|n| n.ok().and_then(|n| i32::try_from(n).ok()))
    };
    let own = (this.device.device_type, this.device.device_id);
    match (int(&t)?, int(&id)?) {
        (Some(t), Some(id)) if (t, id) == own => Ok(()),
        _ => Err(ExportError::OtherDevice {
            device: this.device,
            device_type: t.to_string(),
            device_id: id.to_string(),
        }
        .into()),
    }
}

/// Reads `copy`: `None`, `True` or `False` (what PyO3 takes for a `bool`:
/// NumPy's `bool_` too); anything else is a `TypeError` naming `copy`.
fn parse_copy(c: Option<&Bound<'_, PyAny>>) -> PyResult<Option<bool>> {
    match c.filter(|c| !c.is_none()) {
        None => Ok(None),
        Some(c) => c
            .extract::<bool>()
            .map(Some)
            .map_err(|_| ExportError::CopyType(described(c)).into()),
    }
}

/// A wrong argument of `__dlpack__`, for its `TypeError`: its type's name,
/// and for a tuple the names of its items' types (`a tuple of (str,
/// str)`). Reads type names only: no `__repr__` of the caller's runs.
fn described(v: &Bound<'_, PyAny>) -> String {
    let name = |v: &Bound<'_, PyAny>| {
        v.get_type()
            .name()
            .map_or_else(|_| "?".to_owned(), |n| n.to_string())
    };
    match v.cast::<PyTuple>() {
        Ok(t) => {
            let items: Vec<String> = t.iter().map(|i| name(&i)).collect();
            format!("a tuple of ({})", items.join(", "))
        }
        Err(_) => name(v),
    }
}

/// Reads `max_version` as the standard defines it: a `(major, minor)` tuple.
/// Whether it asks for a versioned capsule (a major of at least 1, however
/// large; the minor, any integer, says nothing more here).
fn parse_version(v: &Bound<'_, PyAny>) -> PyResult<bool> {
    let wrong = || PyErr::from(ExportError::MaxVersion(described(v)));
    let (major, minor) = v
        .extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>()
        .map_err(|_| wrong())?;
    let major = int_arg(&major, wrong)?;
    // The minor: any integer (only its type is checked).
    let _ = int_arg(&minor, wrong)?;
    Ok(match major {
        Ok(n) => n >= 1,
        Err(positive) => positive,
    })
}

#[pymethods]
impl Array {
    /// Exports the array as a DLPack capsule (array API standard).
    ///
    /// - `max_version`: `None` or major `< 1` gives a legacy `"dltensor"`
    ///   capsule; `(1, x)` a `"dltensor_versioned"` one, with `READ_ONLY`
    ///   set for read-only data. A legacy capsule cannot say read-only:
    ///   for read-only data it holds a fresh copy (the consumer's alone).
    /// - `copy`: `True` copies (setting `IS_COPIED`); `False` never copies
    ///   (so read-only data asked for a legacy capsule raises).
    /// - `dl_device`: `None` or the array's own device.
    /// - `stream`: `None` or `-1` for memory without streams. For CUDA
    ///   memory `None` means `1` (legacy default stream), `0` is refused;
    ///   for ROCm `None` means `0`, `1` and `2` are refused. The consumer's
    ///   stream is made to wait for the work pending on the array's own
    ///   stream (nothing to do when they are the same, or for `-1`).
    ///
    /// Raises `BufferError` for what cannot be honoured (a stream or device
    /// the array cannot be exported for, a copy that cannot be had or
    /// avoided), as the array API standard asks; `TypeError` for an
    /// argument of the wrong type (a `stream` that is not an integer, a
    /// `max_version` or `dl_device` that is not a pair of integers, a
    /// `copy` that is not a bool) and for positional or unknown arguments.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        slf: &Bound<'_, Self>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<&Bound<'_, PyAny>>,
        dl_device: Option<&Bound<'_, PyAny>>,
        copy: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let this = &slf.get().inner;
        let stream = parse_stream(this, stream)?;
        let copy = parse_copy(copy)?;
        if let Some(d) = dl_device.filter(|d| !d.is_none()) {
            parse_dl_device(this, d)?;
        }
        let versioned = match max_version.filter(|v| !v.is_none()) {
            None => false,
            Some(v) => parse_version(v)?,
        };
        // Device memory cannot be copied here: it goes with READ_ONLY only
        // (see `Tensor::from_raw_parts`).
        let never_written = this.never_written && this.device.is_host_accessible();
        if never_written && copy == Some(false) {
            return Err(ExportError::NeverWritten.into());
        }
        // A legacy capsule cannot say read-only, so read-only data asked
        // for one (JAX's and MLX's `from_dlpack` ask for nothing else) goes
        // as a copy, the consumer's alone: a consumer that writes it (as
        // PyTorch writes what it is given) changes nothing of the
        // original, and the standard's `copy=None` allows the copy.
        let legacy_read_only = this.read_only && !versioned;
        if legacy_read_only && copy == Some(false) {
            return Err(ExportError::ReadOnlyLegacy.into());
        }
        let copied = copy == Some(true) || never_written || legacy_read_only;
        if copied && !this.device.is_host_accessible() {
            return Err(if copy == Some(true) {
                ExportError::CopyOnDevice(this.device)
            } else {
                ExportError::ReadOnlyLegacyOnDevice(this.device)
            }
            .into());
        }
        // Last, once everything else is known to be fine: it may enqueue a
        // wait on the consumer's stream.
        consumer_stream(this, stream)?;
        let copied = copied.then_some(if copy == Some(true) {
            "__dlpack__(copy=True)"
        } else if never_written {
            "__dlpack__ (read-only data goes as a copy)"
        } else {
            "__dlpack__ (read-only data asked for a legacy capsule goes as a copy)"
        });
        make_capsule(py, slf, versioned, copied)
    }

    /// `(device_type, device_id)` as DLPack numbers them (array API standard).
    fn __dlpack_device__(&self) -> (i32, i32) {
        (self.inner.device.device_type, self.inner.device.device_id)
    }

    /// Extents, as a tuple.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.shape.iter())
    }

    /// Strides in elements, as a tuple.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.strides.iter())
    }

    /// The dtype's name (`"float32"`, ...).
    #[getter]
    fn dtype(&self) -> String {
        self.inner.dtype.to_string()
    }

    /// Number of dimensions.
    #[getter]
    fn ndim(&self) -> usize {
        self.inner.shape.len()
    }

    /// Whether the data is read-only.
    #[getter]
    fn read_only(&self) -> bool {
        self.inner.read_only
    }

    /// Reports the object whose buffer the array views (if any) to the
    /// garbage collector, so that a cycle through it is collected. There is
    /// no `__clear__`: the array's memory belongs to that object, so the
    /// reference is dropped only with the array (the cycle is broken at the
    /// object's own `__clear__`).
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        if let Some(owner) = &self.inner.py_owner {
            visit.call(owner)?;
        }
        Ok(())
    }

    fn __len__(&self) -> PyResult<usize> {
        self.inner
            .shape
            .first()
            .map(|&n| n.unsigned_abs())
            .ok_or_else(|| ExportError::LenOfScalar.into())
    }

    fn __repr__(&self) -> String {
        let dims: Vec<String> = self.inner.shape.iter().map(isize::to_string).collect();
        let shape = match dims.len() {
            1 => format!("({},)", dims[0]),
            _ => format!("({})", dims.join(", ")),
        };
        format!(
            "dlcast.Array(shape={shape}, dtype={}, device={}{})",
            self.inner.dtype,
            self.inner.device,
            if self.inner.read_only {
                ", read_only=True"
            } else {
                ""
            }
        )
    }

    // The buffer protocol: in the limited API from Python 3.11 (for
    // Python 3.9/3.10 abi3 builds, `__array_interface__` below instead).
    #[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = &slf.get().inner;
        let (format, len) = host_buffer(this)?;
        if flags & ffi::PyBUF_WRITABLE != 0 && this.read_only {
            return Err(ExportError::BufferReadOnly.into());
        }
        let strided = flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES;
        if !strided && !this.is_c_contiguous() {
            return Err(ExportError::NeedsStrides.into());
        }
        let c_req = flags & ffi::PyBUF_C_CONTIGUOUS == ffi::PyBUF_C_CONTIGUOUS;
        if c_req && !this.is_c_contiguous() {
            return Err(ExportError::NotCContiguous.into());
        }
        let shape = this.shape_usize();
        let strides = this.strides_isize();
        let f_req = flags & ffi::PyBUF_F_CONTIGUOUS == ffi::PyBUF_F_CONTIGUOUS;
        if f_req && !layout::is_f_contiguous(&shape, strides) {
            return Err(ExportError::NotFContiguous.into());
        }
        let any_req = flags & ffi::PyBUF_ANY_CONTIGUOUS == ffi::PyBUF_ANY_CONTIGUOUS;
        if any_req && !this.is_c_contiguous() && !layout::is_f_contiguous(&shape, strides) {
            return Err(ExportError::NotContiguous.into());
        }
        let item = this.dtype.itemsize().unwrap_or(1);
        let (Ok(itemsize), Ok(ndim)) = (isize::try_from(item), c_int::try_from(this.shape.len()))
        else {
            return Err(ExportError::BufferDims.into());
        };
        // SAFETY: CPython passes a writable Py_buffer. The pointers stored
        // (data, shape, strides, format) stay valid while `obj` (a new
        // reference to this frozen object) lives, i.e. until release.
        unsafe {
            (*view).buf = this.data.cast();
            (*view).obj = slf.clone().into_any().into_ptr();
            (*view).len = len;
            (*view).readonly = c_int::from(this.read_only);
            (*view).itemsize = itemsize;
            (*view).format = if flags & ffi::PyBUF_FORMAT != 0 {
                format.as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = ndim;
            (*view).shape = if flags & ffi::PyBUF_ND != 0 {
                this.shape.as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if strided {
                this.byte_strides.as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }

    #[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        // Nothing to free: the view's arrays live in the object itself.
    }

    /// NumPy's array interface (version 3), offered only by abi3 builds for
    /// Python 3.9/3.10, whose limited API cannot offer the buffer protocol:
    /// `numpy.asarray(a)` still takes the host memory without a copy.
    /// NumPy keeps a reference to the `Array` as the new array's `base`,
    /// which keeps the memory alive, and honours the read-only flag.
    /// Raises `BufferError` where the buffer protocol would refuse (memory
    /// the host cannot read, dtypes without a format such as bfloat16).
    #[cfg(all(Py_LIMITED_API, not(Py_3_11)))]
    #[getter]
    fn __array_interface__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let py = slf.py();
        let this = &slf.get().inner;
        // The same refusals as the buffer protocol's, in the same words.
        host_buffer(this)?;
        let typestr = array_typestr(this.dtype).ok_or(ExportError::NoTypestr(this.dtype))?;
        let d = pyo3::types::PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("typestr", typestr)?;
        d.set_item("shape", PyTuple::new(py, this.shape.iter())?)?;
        d.set_item("strides", PyTuple::new(py, this.byte_strides.iter())?)?;
        d.set_item("data", (this.data as usize, this.read_only))?;
        Ok(d)
    }
}

/// A managed tensor describing `slf` (or, when `copied` names the copy, a
/// copy of it), owned by the caller: a `DLManagedTensorVersioned` if
/// `versioned`, else a legacy `DLManagedTensor`; its deleter releases what
/// it holds, and sets `deleted` (when given) as it does.
///
/// # Errors
/// `MemoryError` when the copy cannot be allocated; `BufferError` for a
/// description DLPack cannot carry, or a copy of memory a writable dlcast
/// view holds. Nothing is left allocated then.
pub(super) fn make_managed(
    slf: &Bound<'_, Array>,
    versioned: bool,
    copied: Option<&'static str>,
    deleted: Option<Arc<AtomicBool>>,
) -> PyResult<*mut c_void> {
    let this = &slf.get().inner;
    let (ndim, device_type) = dlpack_ints(this)?;
    let (ctx, data) = capsule_ctx(slf, copied, deleted)?;
    let tensor = dl_tensor(this, data, ndim, device_type);
    let ptr = if versioned {
        let mut flags = 0;
        if copied.is_some() {
            flags |= FLAG_IS_COPIED;
        } else if this.read_only {
            flags |= FLAG_READ_ONLY;
        }
        versioned_managed(tensor, ctx, flags)
    } else {
        legacy_managed(tensor, ctx)
    };
    CAPSULES_CREATED.fetch_add(1, Ordering::SeqCst);
    Ok(ptr)
}

/// The rank and device type of `this` as DLPack's `DLTensor` holds them
/// (`int32_t`, `DLDeviceType`), or the `BufferError` that DLPack cannot
/// carry them.
#[inline]
fn dlpack_ints(this: &Exported) -> PyResult<(i32, u32)> {
    let (Ok(ndim), Ok(device_type)) = (
        i32::try_from(this.shape.len()),
        u32::try_from(this.device.device_type),
    ) else {
        return Err(ExportError::DlpackUndescribable {
            ndim: this.shape.len(),
            device: this.device,
        }
        .into());
    };
    Ok((ndim, device_type))
}

/// The manager context of a capsule of `slf` (a copy of it when `copied`
/// names the copy) and the data pointer its tensor describes.
#[inline]
fn capsule_ctx(
    slf: &Bound<'_, Array>,
    copied: Option<&'static str>,
    deleted: Option<Arc<AtomicBool>>,
) -> PyResult<(CapsuleCtx, *mut c_void)> {
    let this = &slf.get().inner;
    // A copy is the same aligned C-order copy `returns = jax` uses, owned
    // by the capsule; otherwise the capsule keeps `slf` alive.
    let (copy, owner) = if let Some(what) = copied {
        (Some(Box::new(this.aligned_copy(slf.py(), what)?)), None)
    } else {
        (None, Some(slf.clone().unbind()))
    };
    let described = copy.as_deref().unwrap_or(this);
    let (data, strides) = (
        described.data.cast::<c_void>(),
        described.strides_i64().collect(),
    );
    let ctx = CapsuleCtx {
        owner,
        _copy: copy,
        shape: this.shape_i64().collect(),
        strides,
        deleted,
    };
    Ok((ctx, data))
}

/// The `DLTensor` of `this` over `data`; its `shape` and `strides` are set
/// once the context has its final place (see [`wire_header`]).
#[inline]
fn dl_tensor(this: &Exported, data: *mut c_void, ndim: i32, device_type: u32) -> DLTensor {
    DLTensor {
        data,
        device: DLDevice {
            device_type,
            device_id: this.device.device_id,
        },
        ndim,
        dtype: DLDataType {
            code: this.dtype.code,
            bits: this.dtype.bits,
            lanes: this.dtype.lanes,
        },
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: this.byte_offset,
    }
}

/// A `DLManagedTensorVersioned` of `tensor` with `flags`, and `ctx`, in one
/// allocation the caller owns (freed by [`delete_versioned`]).
#[inline]
fn versioned_managed(tensor: DLTensor, ctx: CapsuleCtx, flags: u64) -> *mut c_void {
    let m = Box::into_raw(Box::new(Managed {
        tensor: DLManagedTensorVersioned {
            version: EXPORT_VERSION,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_versioned),
            flags,
            dl_tensor: tensor,
        },
        ctx,
    }));
    // SAFETY: `m` is a fresh allocation only this function knows, never
    // moved (freed in place by the deleter); the three pointers are
    // its own fields.
    unsafe {
        wire_header(
            &raw mut (*m).ctx,
            &raw mut (*m).tensor.manager_ctx,
            &raw mut (*m).tensor.dl_tensor,
        );
    }
    m.cast()
}

/// A legacy `DLManagedTensor` of `tensor`, and `ctx`, in one allocation the
/// caller owns (freed by [`delete_legacy`]).
#[inline]
fn legacy_managed(tensor: DLTensor, ctx: CapsuleCtx) -> *mut c_void {
    let m = Box::into_raw(Box::new(Managed {
        tensor: DLManagedTensor {
            dl_tensor: tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_legacy),
        },
        ctx,
    }));
    // SAFETY: `m` is a fresh allocation only this function knows, never
    // moved (freed in place by the deleter); the three pointers are
    // its own fields.
    unsafe {
        wire_header(
            &raw mut (*m).ctx,
            &raw mut (*m).tensor.manager_ctx,
            &raw mut (*m).tensor.dl_tensor,
        );
    }
    m.cast()
}

/// Points a managed tensor's header (legacy or versioned) at its context:
/// `manager_ctx` at the context, the `DLTensor`'s shape and strides into it.
///
/// # Safety
/// The three pointers are fields of one live `Managed` allocation that is
/// never moved while the header is in use.
unsafe fn wire_header(
    ctx: *mut CapsuleCtx,
    manager_ctx: *mut *mut c_void,
    dl_tensor: *mut DLTensor,
) {
    // SAFETY: the caller's contract. The context pointer first: the shape
    // and strides pointers taken into it afterwards stay the latest.
    unsafe {
        *manager_ctx = ctx.cast();
        (*dl_tensor).shape = (*ctx).shape.as_mut_ptr();
        (*dl_tensor).strides = (*ctx).strides.as_mut_ptr();
    }
}

/// A DLPack capsule over `slf` (legacy or versioned, or over a copy when
/// `copied` names one, see [`make_managed`]).
pub(super) fn make_capsule(
    py: Python<'_>,
    slf: &Bound<'_, Array>,
    versioned: bool,
    copied: Option<&'static str>,
) -> PyResult<Py<PyAny>> {
    let ptr = make_managed(slf, versioned, copied, None)?;
    let name = if versioned {
        NAME_VERSIONED
    } else {
        NAME_LEGACY
    };
    // SAFETY: `ptr` is a non-NULL managed tensor; the name is 'static; the
    // destructor frees the tensor only if no consumer renamed the capsule.
    let cap = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(capsule_destructor)) };
    if cap.is_null() {
        // SAFETY: the capsule was not made, so nobody else owns `ptr`.
        unsafe {
            if versioned {
                delete_versioned(ptr.cast());
            } else {
                delete_legacy(ptr.cast());
            }
        }
        return Err(PyErr::fetch(py));
    }
    // SAFETY: PyCapsule_New returned a new, non-NULL reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) }.unbind())
}
