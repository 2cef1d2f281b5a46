//! What the borrow registry refuses when it is set up, and when rust-numpy's
//! borrows of NumPy arrays cannot be followed: `RuntimeError`s (nothing the
//! caller passed is wrong; the process is in a state dlcast cannot run in).

use pyo3::exceptions::PyRuntimeError;
use pyo3::PyErr;

/// A refusal of the registry's set-up (the `borrow` module).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegistryError {
    /// `PyInterpreterState_GetDict` gave nothing (and no exception).
    #[error("dlcast: the interpreter has no state dictionary to keep the borrow registry in")]
    NoStateDict,
    /// Publishing the capsule failed without an exception.
    #[error("dlcast: the borrow registry could not be published")]
    NotPublished,
    /// The interpreter's entry is not a registry of this layout.
    #[error(
        "dlcast: the interpreter's {key:?} entry is not a borrow registry of this dlcast \
         layout (a capsule named {capsule:?} whose table starts with {magic:?} and whose \
         table and functions lie in one loaded library; an extension built with a dlcast of \
         another registry layout publishes another magic); dlcast refuses to run rather than \
         start a second registry"
    )]
    NotARegistry {
        key: &'static str,
        capsule: &'static std::ffi::CStr,
        magic: &'static [u8],
    },
    /// rust-numpy's table cannot be followed (the text says why): NumPy
    /// arrays are refused.
    #[error(
        "dlcast cannot see rust-numpy's borrows of NumPy arrays: {0}; NumPy arrays are \
         refused until it can"
    )]
    RustNumpyUnseen(String),
}

impl From<RegistryError> for PyErr {
    fn from(e: RegistryError) -> PyErr {
        PyRuntimeError::new_err(e.to_string())
    }
}
