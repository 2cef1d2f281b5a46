//! Every refusal dlcast raises, as typed values: one enum per area, each
//! variant carrying what its message names, its message in an
//! `#[error(..)]` attribute, and its Python exception type decided in one
//! `From<..> for PyErr` per enum. A message, or the exception type of a
//! refusal, changes here and nowhere else.
//!
//! Values are built only once something has failed (the success paths
//! build none), and turned into a `PyErr` where they are raised, at the
//! boundary to Python:
//!
//! - `call`: the refusals of a call ([`CallError`]: checks, the borrow
//!   registry, conversions, the import refusals with the function and the
//!   parameter added, [`ImportRefusal`]), and why a conversion could not
//!   be made ([`ConvertError`]);
//! - `import`: why an import failed before the call names it
//!   ([`ImportError`]), and what an import raises as it is
//!   ([`ImportFault`]);
//! - `view`: the public errors of view methods ([`ViewError`],
//!   [`ViewErrorKind`]), and what a Rust-native view (a slice, an
//!   `ndarray` view) refuses ([`NativeRefusal`]);
//! - `export`: [`ShapeError`] (public) and what an export, the
//!   `dlcast.Array` class, the hand-off to a framework and `ArrayBuffer`
//!   refuse ([`ExportError`]);
//! - `registry`: what the borrow registry's set-up refuses, and NumPy
//!   arrays while rust-numpy's borrows cannot be followed
//!   ([`RegistryError`]).
//!
//! This module sits low in the module graph: it uses the facts (`dtype`,
//! `device`, `spec`) and nothing that uses it.

mod call;
mod export;
mod import;
mod registry;
mod view;

pub(crate) use call::{
    CallError, ConvertError, ImportRefusal, NoCopy, NotInPlace, Unconvertible, WhyNot,
};
pub(crate) use export::ExportError;
pub use export::ShapeError;
pub(crate) use import::{ImportError, ImportFault};
pub(crate) use registry::RegistryError;
pub(crate) use view::{DirectExtraction, ErrorInner, Native, NativeRefusal};
pub use view::{ViewError, ViewErrorKind};

use pyo3::prelude::*;

/// The message of a borrow registry that could not grow (a call's view, a
/// copy, an `ArrayBuffer` access): `MemoryError`.
const REGISTRY_FULL: &str = "dlcast's borrow registry could not grow";

/// `err` with `cause` as its `__cause__`.
fn with_cause(err: PyErr, cause: PyErr) -> PyErr {
    // SAFETY: refusals are turned into a `PyErr` only where they are
    // raised, by code called from a Python call (a `#[dlpack_fn]`
    // function, a `#[pymethods]` method), where the GIL is held.
    let py = unsafe { Python::assume_attached() };
    err.set_cause(py, Some(cause));
    err
}
