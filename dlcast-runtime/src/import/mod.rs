//! Import: from a Python object to a validated [`RawTensor`], in the two
//! phases of a call (see the `call` module).
//!
//! **Phase 1, [`prepare`]**: every step that may run Python code, for one
//! argument: `__dlpack_device__()`, `__dlpack__()` (the capsule is taken),
//! `PyObject_GetBuffer`, another producer's exchange-API export,
//! TensorFlow's `to_dlpack`, type lookups. PyTorch tensors have their own
//! phase 1 in the [`torch`] module. The result is a [`Source`].
//!
//! **Phase 2, [`read`]**: the raw read of a [`Source`] (NumPy's fields, a
//! managed tensor's `DLTensor`, a held buffer, PyTorch's own exchange
//! table) and its validation, with no Python code; the owner stays with the
//! source until [`into_owner`] hands it to the view.
//!
//! Sources, one module each: NumPy's fields ([`numpy`]), the DLPack C
//! exchange API ([`exchange`]), capsules and `__dlpack__` ([`capsule`]),
//! the buffer protocol ([`buffer_protocol`]), TensorFlow
//! ([`tensorflow`]); PyTorch's own rules (its private alias, its exchange
//! table, its checks) in [`torch`].
//!
//! Whatever path is taken, the producer's deleter (or `PyBuffer_Release`)
//! runs exactly once: when the [`Owner`] drops, error paths included.

pub(crate) mod buffer_protocol;
pub(crate) mod capsule;
pub(crate) mod exchange;
pub(crate) mod fast_read;
pub(crate) mod numpy;
pub(crate) mod tensorflow;
pub(crate) mod torch;
pub(crate) mod torch_handles;

use crate::device::{device_type_name, Device};
use crate::dtype::DType;
pub(crate) use crate::error::ImportError;
use crate::error::{ExportError, ImportFault};
use crate::layout::{self, ByteExtent};
use crate::stream::{self, StreamKind, StreamRequest};
use dlpack_rs::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLPackExchangeAPI, DLTensor};
use pyo3::exceptions::{PyException, PyMemoryError};
use pyo3::prelude::*;
use pyo3::{ffi, intern};
use smallvec::SmallVec;
use std::ptr::NonNull;

/// Dimensions up to this many are stored inline in a view (no allocation).
pub const INLINE_DIMS: usize = 8;
pub(crate) type Dims<T> = SmallVec<[T; INLINE_DIMS]>;

/// The DLPack version dlcast asks producers for (`max_version`).
pub const MAX_VERSION: (u32, u32) = (1, 3);
/// `DLPACK_FLAG_BITMASK_READ_ONLY` from the DLPack header.
pub(crate) const FLAG_READ_ONLY: u64 = 1;

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
    /// A PyTorch tensor's C++ fields read directly (see `torch::direct`).
    Torch,
    /// Not imported: a view over Rust data (`TensorRef::from_slice`, ...).
    Rust,
}

impl ImportPath {
    /// A short name: `"numpy"`, `"exchange_api"`, `"capsule"`, `"dlpack"`,
    /// `"buffer"`, `"tensorflow"`, `"torch"`, `"rust"`.
    pub fn name(self) -> &'static str {
        match self {
            ImportPath::Numpy => "numpy",
            ImportPath::ExchangeApi => "exchange_api",
            ImportPath::Capsule => "capsule",
            ImportPath::Dlpack => "dlpack",
            ImportPath::Buffer => "buffer",
            ImportPath::Tensorflow => "tensorflow",
            ImportPath::Torch => "torch",
            ImportPath::Rust => "rust",
        }
    }
}

/// Who keeps the memory of a view alive; dropping it releases the memory
/// exactly once.
pub(crate) enum Owner {
    /// A legacy `DLManagedTensor` taken from a `"dltensor"` capsule.
    Legacy(NonNull<DLManagedTensor>),
    /// A `DLManagedTensorVersioned` from a `"dltensor_versioned"` capsule.
    Versioned(NonNull<DLManagedTensorVersioned>),
    /// A buffer-protocol view; boxed so its address stays fixed until release.
    Buffer(buffer_protocol::HeldBuffer),
    /// A strong reference to an object whose memory we read directly (an
    /// exact `numpy.ndarray`: holding it keeps its data alive and unresized).
    Object(#[allow(dead_code)] Py<PyAny>),
    /// A tensor read through PyTorch's own DLPack C exchange API table
    /// without taking ownership: `obj` is dlcast's private alias of the
    /// caller's tensor `original` (see the `torch` module); upgraded to an
    /// owning tensor when the view is exported, see
    /// [`RawTensor::prepare_export`].
    Exchange {
        obj: Py<PyAny>,
        api: NonNull<DLPackExchangeAPI>,
        original: Py<PyAny>,
    },
    /// A PyTorch tensor read directly (see `torch::direct`): its storage,
    /// held, and the caller's tensor it was read from.
    Storage {
        #[allow(dead_code)]
        storage: fast_read::Hold,
        original: Py<PyAny>,
    },
    /// Nothing yet: a tensor read in phase 2 of a call, whose owner stays
    /// with its [`Source`] until the view is made.
    None,
    /// Memory borrowed from Rust data (a view made by `TensorRef::from_slice`
    /// and friends): nothing to release, no Python object, no GIL needed;
    /// Rust's borrow checker keeps the memory alive. Such a view is never
    /// exported as is (its memory outlives no Python object): see
    /// [`RawTensor::is_rust_data`].
    Rust,
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
            // Released only here, with the GIL (see above).
            Owner::Buffer(view) => buffer_protocol::release(view),
            // The reference drops with the GIL held (see above).
            // The storage's reference is given back by its own drop, an
            // atomic step that needs no GIL.
            Owner::Object(_)
            | Owner::Exchange { .. }
            | Owner::Storage { .. }
            | Owner::None
            | Owner::Rust => {}
        }
    }
}

/// A validated description of an imported array and the owner of its memory.
#[doc(hidden)]
pub struct RawTensor {
    /// Address of element 0 (`data + byte_offset`); for a device whose
    /// `data` is an opaque handle ([`Device::data_is_handle`]) the handle
    /// itself, with the offset in `byte_offset`. Never dereferenced for
    /// memory the host cannot access, nor for empty arrays.
    pub(crate) data: *mut u8,
    /// The bytes from `data` to element 0 on a device whose `data` is an
    /// opaque handle; 0 everywhere else (the offset is in `data`).
    pub(crate) byte_offset: usize,
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
    /// For a view of a converted temporary (see [`crate::convert`]): the
    /// producer's own read-only mark of the temporary (the view itself is
    /// read-only in the body); `None` for a view of the argument.
    pub(crate) converted: Option<bool>,
    /// Read-only for one reason only: it came in a legacy capsule, which
    /// cannot say whether it may be written, from no producer known to
    /// export only writable memory that way (see
    /// [`crate::facts::FrameworkFacts::legacy_writable`]). A writable
    /// parameter's refusal says so, and what to pass instead.
    pub(crate) legacy: bool,
    pub(crate) owner: Owner,
}

impl RawTensor {
    /// A host (CPU) tensor from validated values (set `device` for others):
    /// `extent` is the span of `shape`/`strides` (elements) around `data`,
    /// checked to be addressable, or `None` for an empty array.
    #[inline(always)]
    pub(crate) fn new(
        data: *mut u8,
        shape: Dims<usize>,
        strides: Dims<isize>,
        dtype: DType,
        read_only: bool,
        extent: Option<ByteExtent>,
        path: ImportPath,
    ) -> RawTensor {
        RawTensor {
            data,
            byte_offset: 0,
            shape,
            strides,
            dtype,
            device: Device::CPU,
            read_only,
            extent,
            path,
            stream: None,
            borrow: None,
            converted: None,
            legacy: false,
            owner: Owner::None,
        }
    }

    /// The caller's PyTorch tensor this was read from (through its private
    /// alias), if any.
    pub(crate) fn torch_original(&self) -> Option<&Py<PyAny>> {
        match &self.owner {
            Owner::Exchange { original, .. } | Owner::Storage { original, .. } => Some(original),
            _ => None,
        }
    }

    /// Whether this describes Rust data borrowed by a view (see
    /// [`Owner::Rust`]): it must be copied, never exported in place.
    pub(crate) fn is_rust_data(&self) -> bool {
        matches!(self.owner, Owner::Rust)
    }

    /// Hands the view its owner (see [`into_owner`]).
    /// For a `bool` array in host memory: whether every element is a 0 or a
    /// 1 byte (the only valid `bool`s); `true` for other dtypes, device
    /// memory and empty arrays. Reads every element: called only for types
    /// that hand out `&bool`.
    pub(crate) fn holds_valid_bools(&self) -> bool {
        if self.dtype != crate::dtype::DType::BOOL
            || self.extent.is_none()
            || !self.device.is_host_accessible()
        {
            return true;
        }
        let mut ok = true;
        let walked = crate::layout::for_each_offset(&self.shape, &self.strides, |off| {
            // SAFETY: the import checked that every element offset lies in
            // the producer's memory, which is host-accessible (checked above);
            // one byte is read, as a `u8` (any bit pattern).
            ok &= unsafe { *self.data.cast_const().offset(off) } <= 1;
        });
        walked.is_some() && ok
    }

    pub(crate) fn set_owner(&mut self, owner: Owner) {
        self.owner = owner;
    }

    /// Whether dropping this read runs a producer's code (a deleter, a
    /// buffer release), which [`Drop`] holds back while a body runs (see
    /// [`BodyGuard`](crate::call::release::BodyGuard)). A NumPy array or PyTorch alias reference is never
    /// the last one while a call runs, and Rust data has nothing to release.
    #[inline(always)]
    pub(crate) fn defers_release(&self) -> bool {
        matches!(
            self.owner,
            Owner::Legacy(_) | Owner::Versioned(_) | Owner::Buffer(_)
        )
    }

    /// Before a view is exported (returned to Python): its borrow ends; a
    /// tensor read through PyTorch's exchange table takes ownership (`managed_tensor_from_py_object_no_sync`, on the
    /// private alias), checked against the view's dtype and memory, so that
    /// it may outlive the call.
    pub(crate) fn prepare_export(&mut self, py: Python<'_>) -> PyResult<()> {
        // Exported, the memory is Python's again: no Rust reference to it
        // remains, so the view's borrow ends here.
        self.borrow = None;
        let Owner::Exchange { obj, api, .. } = &self.owner else {
            return Ok(());
        };
        // SAFETY: `api` is the producer's process-lifetime table.
        let api = unsafe { api.as_ref() };
        let owned = match exchange::owning(obj.bind(py), api) {
            Ok(Some(o)) => o,
            Ok(None) => return Err(ExportError::NoOwningTensor.into()),
            Err(ImportError::Producer(_, e)) | Err(ImportError::Propagate(e)) => return Err(e),
            Err(_) => return Err(ExportError::ExchangeNoTensor.into()),
        };
        // The owning tensor must hold every byte the view reaches, with the
        // view's dtype (the alias is private, so this holds; never trust it).
        let fits = capsule::read(&owned, ImportPath::ExchangeApi)
            .is_ok_and(|whole| whole.dtype == self.dtype && self.within(&whole));
        if !fits {
            return Err(ExportError::ViewMemoryChanged.into());
        }
        self.owner = owned;
        Ok(())
    }

    /// Whether every byte this tensor reaches lies within `whole`'s bytes,
    /// on the same device.
    fn within(&self, whole: &RawTensor) -> bool {
        let span = |t: &RawTensor| {
            let base = t.data as usize;
            t.extent.and_then(|e| {
                Some((
                    base.checked_add_signed(e.lo)?,
                    base.checked_add_signed(e.hi)?,
                ))
            })
        };
        if self.device != whole.device {
            return false;
        }
        match (span(self), span(whole)) {
            (None, _) => true,
            (Some((lo, hi)), Some((wlo, whi))) => wlo <= lo && hi <= whi,
            (Some(_), None) => false,
        }
    }
}

pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
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

/// What phase 1 made of an argument: every step that may run Python code
/// is done, and what is left is a raw read ([`read`]).
pub(crate) enum Source {
    /// Not prepared, or already handed to a view.
    Empty,
    /// An exact `numpy.ndarray`, read from its fields.
    Numpy(Py<PyAny>),
    /// A PyTorch tensor read through PyTorch's own exchange table: `tensor`
    /// is dlcast's private alias of `original` (see the `torch` module).
    Torch {
        tensor: Py<PyAny>,
        api: &'static DLPackExchangeAPI,
        original: Py<PyAny>,
        stream: Option<i64>,
        /// The tensor's class declared it read-only (see
        /// `torch::declared_by_class`).
        read_only: bool,
        /// What that was decided from, checked at the read (see
        /// `torch::Declared`).
        declared: torch::Declared,
        /// For a writable parameter: what is checked again at the read.
        write: Option<torch::WriteCheck>,
    },
    /// A managed tensor dlcast owns (a capsule taken, or an exchange API's
    /// owning export).
    Managed {
        owner: Owner,
        path: ImportPath,
        /// The stream the producer was asked for (see [`RawTensor::stream`]).
        stream: Option<i64>,
        /// The producer's arrays are immutable (JAX, TensorFlow), whatever
        /// the capsule says.
        immutable: bool,
        /// A legacy capsule may be written: it came from the `__dlpack__`
        /// of a framework whose row says its legacy exports are writable
        /// memory ([`crate::facts::FrameworkFacts::legacy_writable`]).
        /// Otherwise a legacy capsule, which cannot say read-only, is read
        /// read-only (as NumPy reads one).
        legacy_writable: bool,
        /// The device `__dlpack_device__()` said, if asked.
        said: Option<Device>,
        /// An object that must still be referenced by dlcast alone when
        /// read (the private alias whose capsule this is).
        private: Option<Py<PyAny>>,
        /// For a PyTorch tensor: what its read-only declaration (in
        /// `immutable`) was decided from, checked at the read (see
        /// `torch::Declared`).
        declared: Option<torch::Declared>,
        /// For a PyTorch tensor taken by a writable parameter: what is
        /// checked again at the read (see `torch::check_write`).
        write: Option<torch::WriteCheck>,
    },
    /// A buffer held through the buffer protocol.
    Buffer(Owner),
}

/// Whether dlcast holds the only reference to `obj`, strong or weak (a
/// private alias, see the `torch` module): then no Python code can change it.
/// Runs no Python code.
pub(crate) fn is_private(obj: &Bound<'_, PyAny>) -> bool {
    // SAFETY: `obj` is live; reading its reference count.
    if unsafe { ffi::Py_REFCNT(obj.as_ptr()) } != 1 {
        return false;
    }
    no_weakrefs(obj)
}

#[cfg(not(Py_LIMITED_API))]
fn no_weakrefs(obj: &Bound<'_, PyAny>) -> bool {
    // SAFETY: `obj` is live, so is its type.
    let tp = unsafe { ffi::Py_TYPE(obj.as_ptr()) };
    // SAFETY: reading a type slot.
    let offset = unsafe { (*tp).tp_weaklistoffset };
    if offset == 0 {
        // The type takes no weak references.
        return true;
    }
    // SAFETY: a non-zero `tp_weaklistoffset` locates the object's list head,
    // a `PyObject *` that is NULL while no weak reference exists: inside the
    // object, or (negative: managed weak references, CPython 3.12+) in the
    // pre-header the interpreter allocates before it; CPython's own
    // `_PyObject_GET_WEAKREFS_LISTPTR` adds the offset the same way.
    unsafe {
        let head = obj
            .as_ptr()
            .cast::<u8>()
            .offset(offset)
            .cast::<*mut ffi::PyObject>();
        (*head).is_null()
    }
}

/// `_weakref.getweakrefcount`, once checked to be CPython's own builtin
/// (see [`ready_private_check`]): the object (kept alive) and its C
/// function, a `METH_O` function called directly in phase 2.
#[cfg(Py_LIMITED_API)]
struct WeakrefCount {
    builtin: Py<PyAny>,
    function: ffi::PyCFunction,
}

#[cfg(Py_LIMITED_API)]
static WEAKREF_COUNT: pyo3::sync::PyOnceLock<WeakrefCount> = pyo3::sync::PyOnceLock::new();

#[cfg(Py_LIMITED_API)]
fn no_weakrefs(obj: &Bound<'_, PyAny>) -> bool {
    // The limited API cannot read the list. `_weakref.getweakrefcount`,
    // checked in phase 1 to be CPython's own `METH_O` builtin, is called
    // through its C function: no argument tuple is made (a tuple is tracked
    // by the cyclic collector, whose run could call finalizers, Python
    // code); it allocates only an int, which the collector does not track.
    // Not checked yet: not private (nothing is looked up here, in phase 2).
    let py = obj.py();
    let Some(count) = WEAKREF_COUNT.get(py) else {
        return false;
    };
    // SAFETY: `function` is the `METH_O` C function of the builtin kept in
    // `count` (checked in `ready_private_check`): called as CPython calls
    // it, with the builtin's `self` (its module, borrowed from the builtin)
    // and one borrowed argument; it returns a new reference or NULL with an
    // exception set.
    let n = unsafe {
        let module = ffi::PyCFunction_GetSelf(count.builtin.as_ptr());
        (count.function)(module, obj.as_ptr())
    };
    if n.is_null() {
        drop(PyErr::take(py));
        return false;
    }
    // SAFETY: `n` is a new reference (an int); PyLong_AsSsize_t runs no
    // Python code on an exact int; the reference is released after.
    unsafe {
        let v = ffi::PyLong_AsSsize_t(n);
        ffi::Py_DecRef(n);
        if v == -1 {
            drop(PyErr::take(py));
        }
        v == 0
    }
}

/// Phase 1, before a source that [`is_private`] will check in phase 2: under
/// the limited API, finds `_weakref.getweakrefcount` and checks that it is
/// CPython's own C function of that name (`crate::trust::is_builtin`): a
/// function put in its place would run Python code between the raw reads
/// of phase 2. Refuses the argument otherwise. Nothing to do with the full
/// API, which reads the weak-reference list itself.
pub(crate) fn ready_private_check(py: Python<'_>) -> Result<(), ImportError> {
    #[cfg(Py_LIMITED_API)]
    {
        WEAKREF_COUNT
            .get_or_try_init(py, || {
                let f = py
                    .import("_weakref")
                    .and_then(|m| m.getattr("getweakrefcount"))
                    .map_err(|e| producer_error("_weakref.getweakrefcount", e, py))?;
                let image = crate::trust::python_image();
                let function = if crate::trust::is_builtin(&f, "getweakrefcount", image) {
                    // SAFETY: both calls: `f` is exactly a builtin
                    // (`is_builtin`), as the two functions require.
                    unsafe {
                        (ffi::PyCFunction_GetFlags(f.as_ptr()) == ffi::METH_O)
                            .then(|| ffi::PyCFunction_GetFunction(f.as_ptr()))
                            .flatten()
                    }
                } else {
                    None
                };
                if let Some(function) = function {
                    Ok(WeakrefCount {
                        builtin: f.unbind(),
                        function,
                    })
                } else {
                    Err(ImportError::Unreadable(
                        "_weakref.getweakrefcount is not CPython's own (it was replaced), so \
                         dlcast cannot check that its private alias of the tensor stays private; \
                         restore it to pass tensors"
                            .into(),
                    ))
                }
            })
            .map(|_| ())
    }
    #[cfg(not(Py_LIMITED_API))]
    {
        let _ = py;
        Ok(())
    }
}

/// Phase 1 for an argument that is not a PyTorch tensor (the `torch` module
/// prepares those): see the module documentation. `numpy_fields`: whether
/// an exact `numpy.ndarray` may be read from its fields (else it goes
/// through `__dlpack__`).
pub(crate) fn prepare(
    obj: &Bound<'_, PyAny>,
    sx: StreamCx,
    numpy_fields: bool,
) -> Result<Source, ImportError> {
    if numpy_fields && (numpy::is_ndarray(obj) || numpy::learn_ndarray(obj)) {
        return Ok(Source::Numpy(obj.clone().unbind()));
    }
    // SAFETY: `obj` is a live object; PyCapsule_CheckExact only reads its type.
    if unsafe { ffi::PyCapsule_CheckExact(obj.as_ptr()) } != 0 {
        return Ok(managed(capsule::take(obj)?, ImportPath::Capsule));
    }
    let (api, flags) = exchange::type_info(obj);
    // Another producer's exchange table: an owning tensor now, for host
    // memory, or for CUDA/ROCm memory on the producer's current stream.
    let mut device = None;
    if let Some(api) = api {
        let d = exchange::device_of(obj, api)?;
        // `Some(stream)` when the owning tensor may be taken now.
        let stream: Option<Option<i64>> = match d {
            Some(d)
                if stream::stream_kind(d.device_type) != StreamKind::None
                    && sx.request == StreamRequest::Producer =>
            {
                match exchange::current_stream(obj.py(), api, d)? {
                    Some(h) => {
                        Some(stream::resolve(d, sx.request, Some(h)).map_err(ImportError::Stream)?)
                    }
                    None => None,
                }
            }
            Some(d) if d.device_type == crate::device::kind::CPU => Some(None),
            _ => None,
        };
        if let Some(stream) = stream {
            if let Some(owner) = exchange::owning(obj, api)? {
                let mut m = managed(owner, ImportPath::ExchangeApi);
                if let Source::Managed {
                    stream: s,
                    immutable,
                    ..
                } = &mut m
                {
                    *s = stream;
                    *immutable = flags.immutable();
                }
                return Ok(m);
            }
        }
        device = d;
    }
    if let Some(source) = from_dlpack(obj, flags, sx, device)? {
        return Ok(source);
    }
    if let Some(owner) = buffer_protocol::try_acquire(obj)? {
        return Ok(Source::Buffer(owner));
    }
    // TensorFlow's tensors, by the modules and read-only columns of its row.
    let tensorflow = crate::facts::Framework::Tensorflow;
    if is_from_module(obj, tensorflow.facts().modules) {
        let cap = tensorflow::tensorflow_to_dlpack(obj)?;
        let mut m = managed(capsule::take(&cap)?, ImportPath::Tensorflow);
        if let Source::Managed { immutable, .. } = &mut m {
            *immutable = exchange::arrays_immutable(tensorflow);
        }
        return Ok(m);
    }
    Err(ImportError::NotAnArray(type_name(obj)))
}

/// [`prepare`]'s `__dlpack__()` step: the capsule the object hands over on
/// `device` (asked here where unknown and the parameter may take device
/// memory), taken; `None` where it has no `__dlpack__`.
fn from_dlpack(
    obj: &Bound<'_, PyAny>,
    flags: exchange::TypeFlags,
    sx: StreamCx,
    device: Option<Device>,
) -> Result<Option<Source>, ImportError> {
    // Only parameters that accept CUDA/ROCm memory ask the device: a
    // CPU-only parameter passes `None` and refuses device memory later.
    let device = match device {
        Some(d) => Some(d),
        None if sx.may_need => capsule::dlpack_device(obj)?,
        None => None,
    };
    let stream = match device {
        Some(d) => stream::resolve(d, sx.request, None).map_err(ImportError::Stream)?,
        None => None,
    };
    let Some(cap) = capsule::call_dlpack(obj, stream)? else {
        return Ok(None);
    };
    let owner = capsule::take(&cap)?;
    // Asked only of a legacy answer (the rare case): the producer's
    // framework, by its array type, as it is once `__dlpack__` ran, and
    // only of a static type (made by C code in a loaded library), whose
    // `__dlpack__` and module name Python code cannot replace: a class
    // Python code made can claim any package and forward any memory
    // (an immutable framework's, a read-only array's).
    let legacy_writable = matches!(owner, Owner::Legacy(_))
        && !flags.immutable()
        && crate::trust::is_static_type(obj.get_type().as_any(), std::ptr::null())
        && crate::framework::Framework::of(obj).is_some_and(|f| f.facts().legacy_writable);
    Ok(Some(Source::Managed {
        owner,
        path: ImportPath::Dlpack,
        stream,
        immutable: flags.immutable(),
        legacy_writable,
        said: device,
        private: None,
        declared: None,
        write: None,
    }))
}

/// A [`Source::Managed`] with nothing else known: a legacy capsule of it
/// is read read-only.
pub(crate) fn managed(owner: Owner, path: ImportPath) -> Source {
    Source::Managed {
        owner,
        path,
        stream: None,
        immutable: false,
        legacy_writable: false,
        said: None,
        private: None,
        declared: None,
        write: None,
    }
}

/// As [`read`], into `out` (which it replaces): a NumPy array's read is
/// built in place (see [`numpy::read_into`]), others are moved there.
///
/// # Errors
/// As [`read`]; `out` is then `None` or what it held before.
#[inline(always)]
pub(crate) fn read_into(
    py: Python<'_>,
    source: &Source,
    out: &mut Option<RawTensor>,
) -> Result<(), ImportError> {
    if let Source::Numpy(obj) = source {
        return if numpy::read_into(obj.bind(py), out) {
            Ok(())
        } else {
            Err(ImportError::NeedsDlpack)
        };
    }
    read_other_into(py, source, out)
}

/// [`read_into`] for the sources other than NumPy's fields (apart, so that
/// the NumPy read, inlined where it is called, does not share their frame).
#[inline(never)]
fn read_other_into(
    py: Python<'_>,
    source: &Source,
    out: &mut Option<RawTensor>,
) -> Result<(), ImportError> {
    *out = Some(read(py, source)?);
    Ok(())
}

/// Phase 2: the raw read of a prepared source and its validation. Runs no
/// Python code. The view's owner stays with `source` (see [`into_owner`]).
pub(crate) fn read(py: Python<'_>, source: &Source) -> Result<RawTensor, ImportError> {
    match source {
        Source::Numpy(obj) => {
            let mut out = None;
            numpy::read_into(obj.bind(py), &mut out);
            out.ok_or(ImportError::NeedsDlpack)
        }
        Source::Torch {
            tensor,
            api,
            stream,
            read_only,
            declared,
            write,
            ..
        } => read_torch(
            tensor.bind(py),
            api,
            *stream,
            *read_only,
            declared,
            write.as_ref(),
        ),
        Source::Managed {
            owner,
            path,
            stream,
            immutable,
            legacy_writable,
            said,
            private,
            declared,
            write,
        } => {
            if private.as_ref().is_some_and(|p| !is_private(p.bind(py))) {
                return Err(not_private());
            }
            if let Some(w) = write {
                torch::check_write(py, w)?;
            }
            let mut raw = capsule::read(owner, *path)?;
            // JAX arrays and TensorFlow tensors are immutable, but they
            // answer with capsules that do not say so (DLPack notes).
            raw.read_only |= *immutable;
            // As for `Source::Torch`.
            if declared.as_ref().is_some_and(|d| !d.holds(py)) {
                raw.read_only = true;
            }
            // A legacy capsule cannot say read-only: read-only unless its
            // producer is known to export only writable memory that way.
            if matches!(owner, Owner::Legacy(_)) && !*legacy_writable && !raw.read_only {
                raw.read_only = true;
                raw.legacy = true;
            }
            set_capsule_stream(&mut raw, *said, *stream)?;
            Ok(raw)
        }
        Source::Buffer(owner) => buffer_protocol::read(owner),
        Source::Empty => Err(ImportError::Invalid("the argument was not prepared".into())),
    }
}

/// [`read`] of a [`Source::Torch`]: PyTorch's private alias `tensor`,
/// through PyTorch's own exchange table `api`.
#[inline]
fn read_torch(
    tensor: &Bound<'_, PyAny>,
    api: &'static DLPackExchangeAPI,
    stream: Option<i64>,
    read_only: bool,
    declared: &torch::Declared,
    write: Option<&torch::WriteCheck>,
) -> Result<RawTensor, ImportError> {
    if !is_private(tensor) {
        return Err(not_private());
    }
    if let Some(w) = write {
        torch::check_write(tensor.py(), w)?;
    }
    let mut raw = exchange::read_with(tensor, api)?;
    // Every byte reached lies in the storage (one shrunk under the
    // tensor, `untyped_storage().resize_()`, is refused), where the
    // direct read's layout says where the storage keeps its size.
    if torch::direct::verified().is_some_and(|l| !l.within_storage(tensor, &raw)) {
        return Err(ImportError::Invalid(
            "the tensor reaches beyond its storage (the storage was resized under \
             it); pass a tensor whose storage holds it"
                .into(),
        ));
    }
    // A declaration that may have changed since it was decided is
    // taken as made (declarations only add the mark).
    raw.read_only |= read_only || !declared.holds(tensor.py());
    raw.stream = if stream::stream_kind(raw.device.device_type) == StreamKind::None {
        None
    } else {
        stream
    };
    Ok(raw)
}

/// The stream of a capsule's read: its memory's (`stream`) where the
/// device has streams; refused where the producer said (`said`) a device
/// without streams and then handed over CUDA/ROCm memory, which it never
/// synchronised for us.
#[inline]
fn set_capsule_stream(
    raw: &mut RawTensor,
    said: Option<Device>,
    stream: Option<i64>,
) -> Result<(), ImportError> {
    let has_streams = stream::stream_kind(raw.device.device_type) != StreamKind::None;
    if let (Some(said), true, None) = (said, has_streams, stream) {
        return Err(ImportError::Invalid(format!(
            "__dlpack_device__() said {said}, but the capsule describes memory on {}",
            raw.device
        )));
    }
    raw.stream = if has_streams { stream } else { None };
    Ok(())
}

#[cold]
fn not_private() -> ImportError {
    ImportError::Unreadable(
        "Python code kept a reference to dlcast's private alias of the tensor (a \
         __torch_function__ mode or override?), so the tensor could change under the view; \
         the call is refused"
            .into(),
    )
}

/// The owner of the memory a [`read`] of `source` describes, for the view
/// (`source` is left [`Source::Empty`]).
#[inline]
pub(crate) fn into_owner(source: &mut Source) -> Owner {
    match std::mem::replace(source, Source::Empty) {
        Source::Numpy(obj) => Owner::Object(obj),
        Source::Torch {
            tensor,
            api,
            original,
            ..
        } => Owner::Exchange {
            obj: tensor,
            api: NonNull::from(api),
            original,
        },
        Source::Managed { owner, .. } | Source::Buffer(owner) => owner,
        Source::Empty => Owner::None,
    }
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

/// Reads and validates a `DLTensor` (the caller keeps its owner).
///
/// # Safety
/// `t` must point to a valid `DLTensor`, with
/// `shape` (and `strides` unless NULL) readable for `ndim` values each, as
/// the DLPack header requires of producers.
pub(crate) unsafe fn from_dltensor(
    t: *const DLTensor,
    read_only: bool,
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
    let no_memory = || ImportError::from(ImportFault::NoMemoryForDims { ndim });
    let mut shape: Dims<usize> = numpy::try_zeros(ndim).ok_or_else(no_memory)?;
    for (i, out) in shape.iter_mut().enumerate() {
        // SAFETY: `shape` holds `ndim` values (caller's guarantee), non-NULL.
        let n = unsafe { *t.shape.add(i) };
        *out = usize::try_from(n)
            .map_err(|_| ImportError::Invalid(format!("extent {n} in dimension {i}")))?;
    }
    let mut strides: Dims<isize> = numpy::try_zeros(ndim).ok_or_else(no_memory)?;
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
    // An opaque handle keeps its byte offset apart (DLPack: adding it to
    // the handle gives no address).
    let handle = device.data_is_handle();
    // Never dereferenced unless the checks above passed for it.
    let mut raw = RawTensor::new(
        if handle {
            data
        } else {
            data.wrapping_add(offset)
        },
        shape,
        strides,
        dtype,
        read_only,
        extent,
        path,
    );
    if handle {
        raw.byte_offset = offset;
    }
    raw.device = device;
    Ok(raw)
}
