//! Why an import failed ([`ImportError`], before the call context adds
//! the function and the parameter: `call/checks.rs` turns it into a
//! [`super::CallError::Import`]), and what an import raises as it is
//! ([`ImportFault`]).

use crate::device::Device;
use crate::dtype::DType;
use pyo3::exceptions::{PyBufferError, PyMemoryError, PyRuntimeError, PyTypeError};
use pyo3::PyErr;

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
    /// conjugate / negative bits), or dlcast cannot keep it fixed; the text
    /// says what to do.
    Unreadable(String),
    /// A NumPy array that its fields alone cannot describe (a dtype DLPack
    /// has no code for, byte-swapped data, ...): it goes through
    /// `__dlpack__`, which gives NumPy's own answer (phase 1 again).
    NeedsDlpack,
    /// The argument does not fit the parameter (a `TypeError`); the text
    /// says why.
    Param(String),
}

/// What an import raises as it is (no function or parameter to add: out of
/// memory, or an error of the producer's own).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ImportFault {
    /// `MemoryError`: no memory for a shape and strides.
    #[error("no memory for the shape and strides of {ndim} dimensions")]
    NoMemoryForDims { ndim: usize },
    /// `BufferError`: an exchange-table function failed without setting
    /// an exception.
    #[error("{0} failed without an error")]
    Silent(&'static str),
    /// `TypeError`: PyTorch answered something other than `True` or
    /// `False` (the answer's type name).
    #[error("PyTorch answered {0}, not a bool")]
    NotABool(String),
    /// `RuntimeError`: a piece of PyTorch dlcast relies on is missing.
    #[error("{0} is missing")]
    TorchMissing(&'static str),
}

impl From<ImportFault> for PyErr {
    #[cold]
    fn from(e: ImportFault) -> PyErr {
        let msg = e.to_string();
        match e {
            ImportFault::NoMemoryForDims { .. } => PyMemoryError::new_err(msg),
            ImportFault::Silent(_) => PyBufferError::new_err(msg),
            ImportFault::NotABool(_) => PyTypeError::new_err(msg),
            ImportFault::TorchMissing(_) => PyRuntimeError::new_err(msg),
        }
    }
}

impl From<ImportFault> for ImportError {
    /// An error that propagates as it is.
    #[cold]
    fn from(e: ImportFault) -> ImportError {
        ImportError::Propagate(e.into())
    }
}
