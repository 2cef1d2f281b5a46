//! What exports refuse: [`ShapeError`] (public: why a `Tensor` cannot be
//! built from its parts) and [`ExportError`] (an export's copy, the
//! `dlcast.Array` class and its protocols, the hand-off to a framework,
//! `ArrayBuffer`), each with its exception type in its `From` impl.

use crate::device::Device;
use crate::dtype::DType;
use pyo3::exceptions::{PyBufferError, PyIndexError, PyMemoryError, PyTypeError, PyValueError};
use pyo3::PyErr;

/// Why a [`Tensor`](crate::Tensor) cannot be built from the given parts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// The shape's element count differs from the data's length.
    #[error("shape {shape:?} holds {expected} elements, but the data has {got}")]
    Length {
        /// The requested shape.
        shape: Vec<usize>,
        /// Elements the shape holds.
        expected: usize,
        /// Elements given.
        got: usize,
    },
    /// Shape and strides have different lengths.
    #[error("shape has {0} dimensions but strides have {1}")]
    Rank(usize, usize),
    /// A tensor of another number of dimensions than the rank its type
    /// fixes (`Tensor::into_rank`). Converts to Python's `TypeError`.
    #[error(
        "into_rank(): expected a tensor of {expected} dimensions, got shape {shape:?} (return `Tensor<T>` for a rank known at run time)"
    )]
    Ndim {
        /// The rank of the tensor type.
        expected: usize,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// Some index would reach outside the data.
    #[error(
        "strides {strides:?} reach outside the {len} elements of the data for shape {shape:?}"
    )]
    OutOfBounds {
        /// The requested shape.
        shape: Vec<usize>,
        /// The requested strides (elements).
        strides: Vec<isize>,
        /// Elements given.
        len: usize,
    },
    /// The shape or strides cannot be described to a consumer: an extent
    /// beyond `i64::MAX`, or a byte stride beyond `isize`.
    #[error("shape {shape:?} with strides {strides:?} cannot be exported: {why}")]
    Unrepresentable {
        /// The requested shape.
        shape: Vec<usize>,
        /// The requested strides (elements).
        strides: Vec<isize>,
        /// What does not fit.
        why: &'static str,
    },
    /// The buffer could not be allocated: more bytes than the address space
    /// holds, or the allocator refused. Converts to Python's `MemoryError`.
    #[error("cannot allocate {bytes} bytes for shape {shape:?}")]
    OutOfMemory {
        /// The requested shape.
        shape: Vec<usize>,
        /// Bytes asked for (`usize::MAX` when the size itself overflows).
        bytes: usize,
    },
}

impl From<ShapeError> for PyErr {
    fn from(e: ShapeError) -> Self {
        match e {
            ShapeError::OutOfMemory { .. } => PyMemoryError::new_err(e.to_string()),
            ShapeError::Ndim { .. } => PyTypeError::new_err(e.to_string()),
            _ => PyValueError::new_err(e.to_string()),
        }
    }
}

/// What an export refuses; the exception type of each is in its
/// documentation (`BufferError` unless it says otherwise).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExportError {
    // ---- The copy an export makes (`alloc.rs`).
    /// `ValueError`: a span that overflows (`what` names the copy).
    #[error("{what}: the array's byte span overflows (shape {shape:?}, strides {strides:?})")]
    SpanOverflow {
        what: &'static str,
        shape: Vec<usize>,
        strides: Vec<isize>,
    },
    /// `MemoryError`: the borrow registry could not grow.
    #[error("{}", super::REGISTRY_FULL)]
    RegistryFull,
    /// The memory to copy is written by a call still running (`holder`).
    #[error(
        "{what}: cannot copy the array: its memory is in use by a call still running \
         ({holder}; a nested call, a callback or another thread), and a copy would read it \
         while it is written; copy it once that call returned"
    )]
    CopyInUse { what: &'static str, holder: String },
    /// `MemoryError`: no memory for a copy.
    #[error("cannot allocate {bytes} bytes for a copy of an array of shape {shape:?}")]
    CopyMemory { bytes: usize, shape: Vec<usize> },
    /// `ValueError`: an element offset overflows.
    #[error(
        "cannot copy an array of shape {shape:?} and strides {strides:?}: an element offset \
         overflows"
    )]
    OffsetOverflow {
        shape: Vec<usize>,
        strides: Vec<isize>,
    },
    /// `ValueError`: the copy's compact strides overflow.
    #[error("the compact strides overflow")]
    CompactStrides,
    /// `ValueError`: the copy cannot be described (why).
    #[error("cannot describe the copy: {0}")]
    CopyUndescribable(&'static str),

    // ---- Exporting a view (`tensor.rs`, `import/mod.rs`).
    /// A view over Rust data.
    #[error("a view of Rust data cannot be exported in place; return a Tensor")]
    RustData,
    /// A view that cannot be described (why).
    #[error(
        "cannot export a view of shape {shape:?} and strides {strides:?} (elements of \
         {dtype}): {why}"
    )]
    ViewUndescribable {
        shape: Vec<usize>,
        strides: Vec<isize>,
        dtype: DType,
        why: &'static str,
    },
    /// The exchange table has no owning export.
    #[error("the producer's exchange API cannot hand out an owning tensor")]
    NoOwningTensor,
    /// The exchange table's owning export failed.
    #[error("the exchange API returned no tensor")]
    ExchangeNoTensor,
    /// The owning tensor does not hold the view's memory.
    #[error(
        "the tensor no longer holds the memory of the view (its storage, dtype or layout \
         changed)"
    )]
    ViewMemoryChanged,

    // ---- The `dlcast.Array` class (`array.rs`); its buffer protocol where
    // the API level has one, its array interface below abi3-py311.
    /// The buffer protocol for memory the host cannot read.
    #[error("the array is on {0}; the buffer protocol needs host memory")]
    BufferHostOnly(Device),
    /// A dtype without a buffer-protocol format.
    #[error("{0} has no buffer-protocol format; use DLPack")]
    NoBufferFormat(DType),
    /// More bytes than `Py_ssize_t` holds.
    #[error(
        "the array of shape {shape:?} holds more than {} bytes (Py_ssize_t), which the buffer \
         protocol cannot describe; use DLPack",
        isize::MAX
    )]
    BufferTooLarge { shape: Vec<usize> },
    /// A consumer stream the device does not take (`why` adds the rule).
    #[error("stream={stream} is not supported for an array on {device}{why}")]
    Stream {
        stream: i64,
        device: Device,
        why: &'static str,
    },
    /// The consumer's stream cannot be made to wait for the array's.
    #[error(
        "stream={consumer}: cannot make it wait for stream {ready}, on which the array on \
         {device} is ready: {why}"
    )]
    StreamWait {
        consumer: i64,
        ready: i64,
        device: Device,
        why: String,
    },
    /// `TypeError`: `max_version` that is not a pair of integers (what it
    /// was, for the message).
    #[error(
        "__dlpack__(): max_version must be None or a tuple (major, minor) of two integers, got {0}"
    )]
    MaxVersion(String),
    /// `TypeError`: `stream` that is not an integer.
    #[error("__dlpack__(): stream must be None or an integer, got {0}")]
    StreamType(String),
    /// `TypeError`: `copy` that is not a bool.
    #[error("__dlpack__(): copy must be None, True or False, got {0}")]
    CopyType(String),
    /// An integer `stream` beyond 64 bits, which no device takes.
    #[error("stream={stream} is not supported for an array on {device} (not a 64-bit integer)")]
    StreamRange { stream: String, device: Device },
    /// `TypeError`: `dl_device` that is not a pair of integers.
    #[error(
        "__dlpack__(): dl_device must be None or a tuple (device_type, device_id) of two \
         integers, got {0}"
    )]
    DlDeviceType(String),
    /// `dl_device` other than the array's (the integers as given).
    #[error("cannot export an array on {device} to device ({device_type}, {device_id})")]
    OtherDevice {
        device: Device,
        device_type: String,
        device_id: String,
    },
    /// `copy=False` of memory that must never be written.
    #[error(
        "copy=False: the array is read-only memory that must never be written (static or \
         foreign data), and DLPack consumers may ignore READ_ONLY; call with copy=None or \
         copy=True for a copy, or read it with numpy.asarray / memoryview, which share it \
         read-only"
    )]
    NeverWritten,
    /// `copy=True` of device memory.
    #[error("copy=True is not supported for an array on {0}")]
    CopyOnDevice(Device),
    /// A read-only array asked for as a legacy capsule with `copy=False`.
    #[error(
        "the array is read-only; a legacy DLPack capsule cannot say so, so it would hold a \
         copy, which copy=False forbids. Ask for max_version=(1, 0) or later (no copy, \
         READ_ONLY set), or allow the copy (copy=None)"
    )]
    ReadOnlyLegacy,
    /// A read-only array in device memory asked for as a legacy capsule:
    /// no copy can be made here.
    #[error(
        "the array is read-only and on {0}; a legacy DLPack capsule cannot say so, and dlcast \
         copies only host memory. Ask for max_version=(1, 0) or later (READ_ONLY set); JAX's \
         and MLX's from_dlpack ask for legacy capsules only, so they cannot take it: \
         return a writable array to them, or a read-only one to a consumer that asks for \
         max_version (e.g. cupy.from_dlpack)"
    )]
    ReadOnlyLegacyOnDevice(Device),
    /// `TypeError`: `len()` of a 0-d array.
    #[error("len() of a 0-d array")]
    LenOfScalar,
    /// A writable buffer of a read-only array.
    #[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
    #[error("the array is read-only")]
    BufferReadOnly,
    /// A buffer without strides of an array that is not C-contiguous.
    #[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
    #[error("the array is not C-contiguous; request strides")]
    NeedsStrides,
    /// A C-contiguous buffer of an array that is not.
    #[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
    #[error("the array is not C-contiguous")]
    NotCContiguous,
    /// An F-contiguous buffer of an array that is not.
    #[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
    #[error("the array is not F-contiguous")]
    NotFContiguous,
    /// A contiguous buffer of an array that is neither C- nor F-contiguous.
    #[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
    #[error("the array is not contiguous")]
    NotContiguous,
    /// More dimensions than the buffer protocol counts.
    #[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
    #[error("the array has too many dimensions for the buffer protocol")]
    BufferDims,
    /// A dtype without an array-interface type.
    #[cfg(all(Py_LIMITED_API, not(Py_3_11)))]
    #[error("{0} has no NumPy array-interface type; use DLPack")]
    NoTypestr(DType),
    /// A rank or device type DLPack's fields cannot hold.
    #[error("an array of {ndim} dimensions on {device} cannot be described to DLPack")]
    DlpackUndescribable { ndim: usize, device: Device },

    // ---- The hand-off to a framework (`handoff.rs`).
    /// Memory the host cannot read, for a framework of host memory only.
    #[error(
        "returns = {option}: the array is on {device}, and {name} reads host memory only; \
         return it to a framework of that device (returns = torch, cupy, ...) or copy it to \
         the host first"
    )]
    HostOnly {
        option: &'static str,
        name: &'static str,
        device: Device,
    },
    /// A dtype the framework does not have (the dtype table's
    /// `absent_from` column).
    #[error(
        "returns = {option}: {name} has no {dtype}; return it to a framework that has it \
         (JAX has every dtype dlcast knows, PyTorch all but float8_e3m4, float8_e4m3 and \
         float8_e4m3b11fnuz) or as a dlcast.Array, or convert it in Rust"
    )]
    DtypeAbsent {
        option: &'static str,
        name: &'static str,
        dtype: DType,
    },
    /// Read-only device memory, for a framework without read-only arrays
    /// (read-only host memory goes to it as a copy).
    #[error(
        "returns = {option}: the array is read-only device memory, and {name} has no \
         read-only tensors: it ignores DLPack's READ_ONLY flag, so Python code could write \
         into memory that must not change, and dlcast copies only host memory. Return a \
         writable copy made on the device instead, or use returns = cupy or returns = \
         dlcast, which keep it read-only"
    )]
    ReadOnlyRefused {
        option: &'static str,
        name: &'static str,
    },
    /// A view of a PyTorch tensor that requires grad (exported read-only,
    /// since writes through it would bypass autograd), for a framework
    /// without read-only tensors.
    /// `how`: `returns = torch`, or the default return (which refuses
    /// this too, rather than hand back a read-only `dlcast.Array` whose
    /// first write fails far from here).
    #[error(
        "{how}: the array is a view of a tensor that requires grad \
         (x.requires_grad is True), and {name} has no read-only tensors: writes through the \
         returned view would bypass autograd. Pass x.detach() to return a view of its data, \
         or return a copy (e.g. Tensor::from_vec(view.to_vec()?, view.shape()))"
    )]
    RequiresGrad {
        how: &'static str,
        name: &'static str,
    },
    /// Read-only device memory, for a framework whose arrays are immutable
    /// (its importer takes only a legacy capsule, which cannot say
    /// read-only, and dlcast copies only host memory).
    #[error(
        "returns = {option}: the array is read-only and on {device}; {name} takes only a \
         legacy DLPack capsule, which cannot say read-only, and dlcast copies only host \
         memory, so a capsule of it as it is could be written by whatever code receives it. \
         Return a writable array (e.g. a copy made on the device in Rust), or return it as \
         a dlcast.Array (returns = dlcast) or with returns = cupy, which keep it read-only"
    )]
    ReadOnlyImmutableOnDevice {
        option: &'static str,
        name: &'static str,
        device: Device,
    },
    /// `BufferError`: a second `__dlpack__` call on the consumer through
    /// which a copy was handed to a framework's `from_dlpack`.
    #[error(
        "this copy was already handed over: the object that a returns = ... hand-over \
         gives to a framework's from_dlpack hands out its copy once, to that framework \
         (whose arrays are immutable); read the framework's array instead"
    )]
    HandedOnce,
    /// A negative stride, for a framework without them.
    #[error(
        "returns = {option}: the array has a negative stride ({stride}) in dimension {axis} \
         (strides {strides:?}), and {name} tensors cannot have negative strides; return a \
         copy (e.g. Tensor::from_vec(view.to_vec()?, view.shape())) or use returns = numpy"
    )]
    NegativeStride {
        option: &'static str,
        name: &'static str,
        stride: isize,
        axis: usize,
        strides: Vec<isize>,
    },
    /// PyTorch's exchange table failed without an exception.
    #[error("torch's exchange API returned no tensor")]
    TorchNoTensor,

    // ---- `ArrayBuffer` (`array_buffer.rs`).
    /// `ValueError`: an invalid element (C-order position) found before
    /// handing out the elements.
    #[error(
        "element {index} (C order) of the buffer holds a byte that is not a valid {dtype} (a \
         bool must be 0 or 1): written from Python through a view"
    )]
    InvalidElement { index: usize, dtype: DType },
    /// `ValueError`: an invalid element read by its index.
    #[error(
        "element {index:?} of the buffer holds a byte that is not a valid {dtype} (a bool \
         must be 0 or 1)"
    )]
    InvalidElementAt { index: Vec<usize>, dtype: DType },
    /// Arrays exported from the buffer are alive (`exports` of them).
    #[error(
        "cannot {what}: the buffer is in use by {exports} exported array{} still alive \
         (returned by a method of the object); delete them (`del a`) first, or return copies \
         instead of views",
        if *.exports == 1 { "" } else { "s" }
    )]
    Exported { what: &'static str, exports: usize },
    /// The buffer's storage is shared.
    #[error("the buffer is in use")]
    InUse,
    /// `IndexError`: an index with another number of entries than the
    /// buffer's dimensions.
    #[error(
        "index {index:?} has {} entr{}, the buffer {} dimensions (shape {shape:?})",
        .index.len(),
        if .index.len() == 1 { "y" } else { "ies" },
        .shape.len()
    )]
    IndexRank {
        index: Vec<usize>,
        shape: Vec<usize>,
    },
    /// `IndexError`: an index out of bounds.
    #[error("index {index:?} is out of bounds for a buffer of shape {shape:?}")]
    IndexBounds {
        index: Vec<usize>,
        shape: Vec<usize>,
    },
    /// A borrow in the registry holds the buffer's memory.
    #[error(
        "cannot {what}: the buffer's memory is in use by a {} borrow that is still live \
         (argument '{param}' of {func}())",
        if *.writable { "writable" } else { "read-only" }
    )]
    Borrowed {
        what: &'static str,
        writable: bool,
        param: &'static str,
        func: &'static str,
    },
    /// A rust-numpy borrow (in dlcast's registry) holds the buffer's memory.
    #[error(
        "cannot {what}: the buffer's memory is borrowed by a rust-numpy extension ({} \
         borrow of an array exported from the buffer, still live)",
        if *.writable { "a PyReadwriteArray" } else { "a PyReadonlyArray" }
    )]
    BorrowedByRustNumpy { what: &'static str, writable: bool },
    /// `ValueError`: the buffer's parts do not make a tensor.
    #[error("{0}")]
    Parts(ShapeError),
    /// Rust would write the buffer while arrays exported from it live and
    /// a rust-numpy extension keeps its own borrow registry, where dlcast
    /// cannot see whether it borrows them.
    #[error(
        "cannot {what}: {exports} array{} exported from the buffer {} still alive, and a \
         rust-numpy extension keeps its own borrow registry (it borrowed a NumPy array before \
         dlcast's first call in this process), where dlcast cannot see whether it borrows \
         them; delete them (`del a`) first, or import and call a dlcast function before any \
         rust-numpy extension borrows an array",
        if *.exports == 1 { "" } else { "s" },
        if *.exports == 1 { "is" } else { "are" }
    )]
    RustNumpyBlind { what: &'static str, exports: usize },
}

impl From<ExportError> for PyErr {
    #[cold]
    fn from(e: ExportError) -> PyErr {
        use ExportError as E;
        let msg = e.to_string();
        match e {
            E::RegistryFull | E::CopyMemory { .. } => PyMemoryError::new_err(msg),
            E::SpanOverflow { .. }
            | E::OffsetOverflow { .. }
            | E::CompactStrides
            | E::CopyUndescribable(_)
            | E::InvalidElement { .. }
            | E::InvalidElementAt { .. }
            | E::Parts(_) => PyValueError::new_err(msg),
            E::MaxVersion(_)
            | E::StreamType(_)
            | E::CopyType(_)
            | E::DlDeviceType(_)
            | E::LenOfScalar => PyTypeError::new_err(msg),
            E::IndexRank { .. } | E::IndexBounds { .. } => PyIndexError::new_err(msg),
            _ => PyBufferError::new_err(msg),
        }
    }
}
