//! The refusals of a call ([`CallError`]): one refusal kind per variant,
//! carrying what its message names (the function, the parameter, what was
//! expected and what was got). Each variant's `Display` is its message, and
//! [`From<CallError> for PyErr`](CallError#impl-From<CallError>-for-PyErr)
//! picks its Python exception type.
//!
//! Where they are raised:
//!
//! - `call/checks.rs` (`CallIdentity`): the checks of phase 2 (device, shape and
//!   named extents, dtype, order, alignment, writability), the borrow
//!   registry's and rust-numpy's refusals, the conversions, and the import
//!   errors with the function and parameter added;
//! - the driver (`call/mod.rs`): the stream parameter, a converted copy that
//!   still does not fit, invalid `bool` bytes, arguments that keep changing,
//!   and a call context driven out of order.
//!
//! Also here: why a conversion could not be made ([`ConvertError`], from
//! `convert.rs`), which the checks turn into a [`CallError`].

use super::with_cause;
use crate::device::{Device, DeviceSpec};
use crate::dtype::DType;
use crate::spec::{Dim, ShapeDisplay, TupleDisplay};
use pyo3::exceptions::{PyBufferError, PyMemoryError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::fmt;

/// Why an argument is refused (or a call cannot go on); see the module
/// documentation. The exception type of each is in its documentation.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// `TypeError`: the stream parameter is not a stream handle.
    #[error(
        "{func}(): argument '{param}': expected a stream handle (an integer >= 0, \
         or -1 for no synchronisation), got {got}"
    )]
    StreamHandle {
        func: String,
        param: String,
        got: i128,
    },
    /// `TypeError`: the array is on a device the parameter does not accept.
    #[error("{func}(): argument '{param}': expected device {}, got {got}", OrList(.want))]
    Device {
        func: &'static str,
        param: &'static str,
        want: &'static [DeviceSpec],
        got: Device,
    },
    /// `TypeError`: the shape does not match the parameter's.
    #[error(
        "{func}(): argument '{param}': expected shape {}, got {}",
        shape_display(.dims, .names),
        TupleDisplay(.got)
    )]
    Shape {
        func: &'static str,
        param: &'static str,
        dims: &'static [Dim],
        names: &'static [&'static str],
        got: Vec<usize>,
    },
    /// `TypeError`: a named extent differs between two parameters.
    #[error("{func}(): dimension '{dim}' is {first} in '{first_param}' but {second} in '{param}'")]
    Extent {
        func: &'static str,
        dim: &'static str,
        first: usize,
        first_param: &'static str,
        second: usize,
        param: &'static str,
    },
    /// `TypeError`: two parameters of one dtype type parameter got
    /// different dtypes.
    #[error(
        "{func}(): arguments '{decided_by}' and '{param}' must have the same dtype \
         (both are `{type_param}`), got {want} and {got}"
    )]
    SharedDType {
        func: &'static str,
        decided_by: &'static str,
        param: &'static str,
        type_param: &'static str,
        want: DType,
        got: DType,
    },
    /// `TypeError`: raw bytes (a buffer of unsigned bytes: `bytes`,
    /// `bytearray`, ...) for a parameter of another element type. Bytes
    /// are never converted: whether they hold numbers of `want` or byte
    /// values to convert is the caller's to say (`converts`: whether the
    /// parameter would convert a typed uint8 array, the second way).
    #[error(
        "{func}(): argument '{param}': expected dtype {want}, got raw bytes (a buffer of \
         unsigned bytes: bytes, bytearray, mmap, array('B'), a memoryview of one), which \
         dlcast never converts: pass numpy.frombuffer(b, dtype=\"{want}\") to read them as \
         {want} values{}",
        if *converts {
            ", or numpy.frombuffer(b, dtype=\"uint8\") to convert each byte's value"
        } else {
            ""
        }
    )]
    RawBytes {
        func: &'static str,
        param: &'static str,
        want: DType,
        converts: bool,
    },
    /// `TypeError`: a dtype, order or alignment that does not fit (`what`),
    /// where no conversion applies (`why_not`).
    #[error("{func}(): argument '{param}': {what}{why_not}")]
    Misfit {
        func: &'static str,
        param: &'static str,
        what: String,
        why_not: WhyNot,
    },
    /// `TypeError`: a dtype-generic parameter got a dtype its `#[dtype(..)]`
    /// does not list.
    #[error("{func}(): argument '{param}': expected dtype {}, got {got}", DTypeList(.want))]
    UnlistedDType {
        func: &'static str,
        param: &'static str,
        want: &'static [DType],
        got: DType,
    },
    /// `TypeError` (its `__cause__` the error): a converted copy that could
    /// not be read.
    #[error(
        "{func}(): argument '{param}': {what}, and its converted copy could not be read: {cause}"
    )]
    CopyUnreadable {
        func: &'static str,
        param: &'static str,
        what: String,
        cause: PyErr,
    },
    /// `TypeError`: a read-only array for a writable parameter.
    #[error("{func}(): argument '{param}': the array is read-only, but the parameter is writable")]
    ReadOnly {
        func: &'static str,
        param: &'static str,
    },
    /// `TypeError`: an array in a legacy capsule (`how` it came), which
    /// cannot say whether it may be written, for a writable parameter.
    #[error(
        "{func}(): argument '{param}': the array was {how} (\"dltensor\"), which cannot say \
         whether it may be written, so dlcast reads it as read-only, but the parameter is \
         writable; pass the array itself (NumPy, PyTorch, CuPy, PaddlePaddle arrays are \
         writable) or a versioned capsule (x.__dlpack__(max_version=(1, 0)))"
    )]
    ReadOnlyLegacy {
        func: &'static str,
        param: &'static str,
        how: &'static str,
    },
    /// `TypeError` (its `__cause__` the producer's refusal): an array NumPy
    /// reads but dlcast cannot read in place (`why`), for a parameter that
    /// does not convert it (`because`: a writable one never does).
    #[error("{func}(): argument '{param}': {why}; {because}: {}", why.fix(*because))]
    NotInPlace {
        func: &'static str,
        param: &'static str,
        why: NotInPlace,
        because: NoCopy,
        cause: PyErr,
    },
    /// `TypeError`: a writable array whose strides may reach one element
    /// from two indices.
    #[error(
        "{func}(): argument '{param}': a writable array must not reach one element from two \
         indices, and dlcast cannot rule that out for shape {} with strides {} (its test is \
         conservative for interleaved strides); pass a compact copy, e.g. \
         numpy.ascontiguousarray(x)",
        TupleDisplay(.shape),
        TupleDisplay(.strides)
    )]
    SelfOverlap {
        func: &'static str,
        param: &'static str,
        shape: Vec<usize>,
        strides: Vec<isize>,
    },
    /// `TypeError`: two arguments of one call share memory, one writable
    /// (`writable`, named first).
    #[error(
        "{func}(): arguments '{writable}' and '{other}' share memory, and '{writable}' is writable"
    )]
    SharedMemory {
        func: &'static str,
        writable: &'static str,
        other: &'static str,
    },
    /// `BufferError`: a view of another call still running holds the memory.
    #[error(
        "{func}(): argument '{param}': the array's memory is in use by another call still \
         running (argument '{other_param}' of {other_func}(), a {theirs} view; a nested call, \
         a callback or another thread), and this {mine} view may not share it"
    )]
    InUse {
        func: &'static str,
        param: &'static str,
        other_param: &'static str,
        other_func: &'static str,
        theirs: &'static str,
        mine: &'static str,
    },
    /// `BufferError`: rust-numpy's registry holds the array.
    #[error(
        "{func}(): argument '{param}': the array is borrowed by a rust-numpy extension still \
         running ({theirs}), and this {mine} view may not share it"
    )]
    RustNumpy {
        func: &'static str,
        param: &'static str,
        theirs: &'static str,
        mine: &'static str,
    },
    /// `MemoryError`: the borrow registry could not grow.
    #[error("{}", super::REGISTRY_FULL)]
    RegistryFull,
    /// `RecursionError`: producers' code called dlcast functions nested
    /// deeper than the driver's bound (see `call::depth`).
    #[error(
        "{func}(): dlcast calls nested more than {limit} deep through the Python code of \
         their arguments (a producer's __dlpack__ that calls back into a dlcast function?)"
    )]
    TooDeep { func: &'static str, limit: u32 },
    /// `MemoryError`: no memory to note a version counter to bump.
    #[error("dlcast: no memory for the call's version counters")]
    VersionMemory,
    /// `TypeError`: `numpy.asarray` gave something whose bytes dlcast
    /// cannot tell.
    #[error(
        "{func}(): argument '{param}': dlcast cannot tell which bytes converting it would \
         read: numpy.asarray gave a {got}, not a numpy.ndarray"
    )]
    UnknownBytes {
        func: &'static str,
        param: &'static str,
        got: String,
    },
    /// `TypeError`: no conversion applies (`why`) to an argument that does
    /// not fit (`what`).
    #[error("{func}(): argument '{param}': {what}, and it cannot be converted: {why}")]
    Unconvertible {
        func: &'static str,
        param: &'static str,
        what: String,
        why: Unconvertible,
    },
    /// `TypeError` (its `__cause__` the framework's exception): the
    /// framework's conversion raised.
    #[error(
        "{func}(): argument '{param}': {what}, and converting it with {call}() raised {cause}"
    )]
    ConvertRaised {
        func: &'static str,
        param: &'static str,
        what: String,
        call: &'static str,
        cause: PyErr,
    },
    /// `TypeError`: a conversion changed the shape.
    #[error(
        "{func}(): argument '{param}': converting it gave shape {}, not {}",
        TupleDisplay(.got),
        TupleDisplay(.want)
    )]
    ConvertedShape {
        func: &'static str,
        param: &'static str,
        got: Vec<usize>,
        want: Vec<usize>,
    },
    /// `TypeError`: a converted copy that still does not fit.
    #[error(
        "{func}(): argument '{param}': {what}; its converted copy has dtype {dtype} with \
         strides {}, which still does not fit",
        TupleDisplay(.strides)
    )]
    StillMisfits {
        func: &'static str,
        param: &'static str,
        what: String,
        dtype: DType,
        strides: Vec<isize>,
    },
    /// `TypeError`: a NumPy array dlcast cannot read in place, whose dtype
    /// does not cast to the parameter's.
    #[error(
        "{func}(): argument '{param}': expected dtype {want}, got {got} (which dlcast cannot \
         read in place), and it does not convert to {want} implicitly (only same-kind casts do)"
    )]
    NotCastable {
        func: &'static str,
        param: &'static str,
        want: DType,
        got: String,
    },
    /// `ValueError`: `bool` elements that are neither 0 nor 1.
    #[error(
        "{func}(): argument '{param}': the array holds bytes that are not valid bool values \
         (a bool must be 0 or 1)"
    )]
    InvalidBool {
        func: &'static str,
        param: &'static str,
    },
    /// `BufferError`: the reads never settled.
    #[error("{func}(): the arguments kept changing while they were read")]
    KeptChanging { func: &'static str },
    /// `BufferError`: the call context's methods called out of order.
    #[error(
        "dlcast: the call context was driven out of order (prepare, finish, take per \
         parameter with the same view type, then body)"
    )]
    Misuse,
    /// `RuntimeError`: a free-threaded interpreter with the GIL off (the
    /// extension's module did not ask for it, or `PYTHON_GIL=0` overrode
    /// that): the message says how to turn it on.
    #[cfg(Py_GIL_DISABLED)]
    #[error(
        "dlcast functions do not run on free-threaded CPython while the GIL is disabled: \
         declare the extension's module with #[pymodule(gil_used = true)] (CPython then \
         enables the GIL when it imports the module), or run Python with PYTHON_GIL=1 \
         (or -X gil=1)"
    )]
    FreeThreaded,
    /// An import refused the argument: see [`ImportRefusal`].
    #[error("{func}(): argument '{param}': {why}")]
    Import {
        func: &'static str,
        param: &'static str,
        why: ImportRefusal,
    },
}

/// Why an import refused an argument (the message after the function and
/// parameter). `BufferError`, except the `TypeError`s of `NotAnArray`,
/// `DType`, `Device` and `Text`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ImportRefusal {
    /// Not an array at all.
    #[error(
        "expected an array (an object with __dlpack__, a DLPack capsule or a buffer), got {0}"
    )]
    NotAnArray(String),
    /// The producer raised (the first line of its message; `more` marks
    /// the rest); its exception is the `__cause__`.
    #[error("the producer's {what}() raised {first}{more}")]
    Producer {
        what: &'static str,
        first: String,
        more: &'static str,
        cause: PyErr,
    },
    /// `__dlpack__()` returned something other than a capsule.
    #[error("__dlpack__() returned {0}, not a DLPack capsule")]
    NotACapsule(String),
    /// A capsule already consumed.
    #[error("the DLPack capsule was already consumed (a capsule can be used once)")]
    UsedCapsule,
    /// A capsule whose name is not a DLPack name.
    #[error(
        "a capsule named {0:?} is not a DLPack capsule (expected \"dltensor\" or \
         \"dltensor_versioned\")"
    )]
    CapsuleName(String),
    /// A DLPack major version other than 1.
    #[error("unsupported DLPack version {0}.{1} (dlcast reads major version 1)")]
    Version(u32, u32),
    /// Memory that does not hold the array's values; the text says why.
    #[error("{0}")]
    Unreadable(String),
    /// The producer described an impossible array.
    #[error("the producer described an invalid array: {0}")]
    Invalid(String),
    /// A data type dlcast cannot hold.
    #[error("unsupported dtype (code={}, bits={}, lanes={})", .0.code, .0.bits, .0.lanes)]
    DType(DType),
    /// A device type code DLPack does not define.
    #[error(
        "unsupported device (device_type={}, device_id={})",
        .0.device_type,
        .0.device_id
    )]
    Device(Device),
    /// The argument does not fit (a stream request, a parameter); the text
    /// says why.
    #[error("{0}")]
    Text(String),
    /// A NumPy array neither its fields nor `__dlpack__()` describe.
    #[error("NumPy's fields do not describe the array, and neither did __dlpack__()")]
    NeedsDlpack,
    /// The buffer protocol refused; its exception is the `__cause__`.
    #[error("the buffer protocol refused: {0}")]
    Buffer(PyErr),
}

/// Why dlcast cannot read an array in place that NumPy reads (the text
/// after the parameter), for [`CallError::NotInPlace`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotInPlace {
    /// Byte-swapped data (NumPy's dtype string, e.g. `>f8`).
    #[error("the array's byte order is not the machine's (dtype {0}), which dlcast cannot read in place")]
    ByteOrder(String),
    /// A dtype DLPack has no code for (NumPy's dtype string).
    #[error("the array's dtype {0} has no DLPack type code, so dlcast cannot read it in place")]
    DType(String),
    /// Byte strides that are not whole elements.
    #[error(
        "the array's strides {} (bytes) are not whole elements of {itemsize} bytes, which \
         DLPack cannot describe",
        TupleDisplay(.strides)
    )]
    Strides {
        strides: Vec<isize>,
        itemsize: usize,
    },
}

impl NotInPlace {
    /// What the caller can pass instead (a writable parameter: and copy
    /// back; one that does not convert: or let it convert).
    fn fix(&self, because: NoCopy) -> String {
        let pass = match self {
            NotInPlace::ByteOrder(_) => {
                "pass an array in native byte order, e.g. y = x.astype(x.dtype.newbyteorder(\"=\"))"
            }
            NotInPlace::DType(_) => return "pass an array of the parameter's dtype".to_owned(),
            NotInPlace::Strides { .. } => {
                "pass a compact copy, e.g. y = numpy.ascontiguousarray(x)"
            }
        };
        match because {
            NoCopy::Writable => format!("{pass}, then copy y back into x"),
            NoCopy::NoConvert => format!("{pass}, or remove noconvert so that it converts"),
            NoCopy::Untyped => pass.to_owned(),
        }
    }
}

/// Why a parameter reads an argument only in place (for
/// [`CallError::NotInPlace`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum NoCopy {
    /// Writable: writes into a converted copy would be lost.
    Writable,
    /// Read-only, typed, but `#[noconvert]` (on it or its function).
    NoConvert,
    /// Untyped or dtype-generic: no element type to convert to.
    Untyped,
}

impl fmt::Display for NoCopy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NoCopy::Writable => {
                "a writable parameter never converts (writes into a converted copy would be lost)"
            }
            NoCopy::NoConvert => "the parameter does not convert (noconvert)",
            NoCopy::Untyped => {
                "an untyped or dtype-generic parameter reads arrays only in place (it has no \
                 element type to convert to)"
            }
        })
    }
}

/// Why a dtype, order or alignment that does not fit is not converted.
#[derive(Debug)]
pub(crate) enum WhyNot {
    /// The parameter does not convert: nothing to add.
    NoConvert,
    /// A writable parameter (a dtype or order mismatch).
    Writable,
    /// A writable parameter (misaligned data).
    WritableAligned,
    /// A cast that is not same-kind.
    Kind { from: DType, to: DType },
}

impl fmt::Display for WhyNot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WhyNot::NoConvert => Ok(()),
            WhyNot::Writable => f.write_str(
                "; a writable parameter never converts (writes into a converted copy would be \
                 lost)",
            ),
            WhyNot::WritableAligned => f.write_str(
                "; a writable parameter never converts (writes into an aligned copy would be \
                 lost): pass an aligned array, e.g. numpy.require(x, requirements=\"A\")",
            ),
            WhyNot::Kind { from, to } => write!(
                f,
                "; {from} does not convert to {to} implicitly (only same-kind casts do, as \
                 NumPy's can_cast(..., casting=\"same_kind\"))"
            ),
        }
    }
}

/// The parameter's shape, with its named extents.
fn shape_display<'a>(dims: &'a [Dim], names: &'a [&'a str]) -> ShapeDisplay<'a> {
    ShapeDisplay { dims, names }
}

/// Items joined with ", ", the last with " or ".
struct DTypeList<'a>(&'a [DType]);

impl fmt::Display for DTypeList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        for (i, d) in self.0.iter().enumerate() {
            if i + 1 == n && i > 0 {
                f.write_str(" or ")?;
            } else if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

/// Devices joined with " or ".
struct OrList<'a>(&'a [DeviceSpec]);

impl fmt::Display for OrList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" or ")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl From<CallError> for PyErr {
    #[cold]
    fn from(e: CallError) -> PyErr {
        let msg = e.to_string();
        match e {
            CallError::RegistryFull | CallError::VersionMemory => PyMemoryError::new_err(msg),
            #[cfg(Py_GIL_DISABLED)]
            CallError::FreeThreaded => pyo3::exceptions::PyRuntimeError::new_err(msg),
            CallError::InvalidBool { .. } => PyValueError::new_err(msg),
            CallError::TooDeep { .. } => pyo3::exceptions::PyRecursionError::new_err(msg),
            CallError::InUse { .. }
            | CallError::RustNumpy { .. }
            | CallError::KeptChanging { .. }
            | CallError::Misuse => PyBufferError::new_err(msg),
            CallError::ConvertRaised { cause, .. }
            | CallError::CopyUnreadable { cause, .. }
            | CallError::NotInPlace { cause, .. } => with_cause(PyTypeError::new_err(msg), cause),
            CallError::Import { why, .. } => match why {
                ImportRefusal::NotAnArray(_)
                | ImportRefusal::DType(_)
                | ImportRefusal::Device(_)
                | ImportRefusal::Text(_) => PyTypeError::new_err(msg),
                ImportRefusal::Producer { cause, .. } | ImportRefusal::Buffer(cause) => {
                    with_cause(PyBufferError::new_err(msg), cause)
                }
                _ => PyBufferError::new_err(msg),
            },
            _ => PyTypeError::new_err(msg),
        }
    }
}

/// Why a conversion could not be attempted or failed (`convert.rs`); the
/// checks turn it into [`CallError::Unconvertible`] or
/// [`CallError::ConvertRaised`].
pub(crate) enum ConvertError {
    /// No framework method applies.
    Unsupported(Unconvertible),
    /// The framework raised (the call named, its exception).
    Raised(&'static str, PyErr),
}

/// Why no conversion applies to an argument (the text after "it cannot be
/// converted: ").
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unconvertible {
    /// A dtype dlcast has no name to convert to.
    #[error("dlcast does not convert to {0}")]
    Target(DType),
    /// A capsule, which its first read consumed.
    #[error("a DLPack capsule can be read only once")]
    Capsule,
    /// bfloat16 or a float8 type for NumPy or CuPy.
    #[error("NumPy has no {0} that DLPack can export")]
    NumpyLacks(DType),
    /// Device memory of a framework dlcast has no conversion for.
    #[error("its framework has no conversion dlcast knows for device memory")]
    Device,
    /// Host memory of a producer dlcast converts through NumPy, in a
    /// dtype NumPy has no type for (or with NumPy's C API unavailable).
    #[error("NumPy, which converts it, cannot view its memory (its dtype or dimensions)")]
    NotViewable,
}
