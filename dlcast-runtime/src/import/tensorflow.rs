//! TensorFlow tensors, which have no `__dlpack__`:
//! `tf.experimental.dlpack.to_dlpack(t)` gives a legacy capsule (phase 1).

use super::{producer_error, ImportError};
use pyo3::prelude::*;

/// `tf.experimental.dlpack.to_dlpack(obj)`.
pub(crate) fn tensorflow_to_dlpack<'py>(
    obj: &Bound<'py, PyAny>,
) -> Result<Bound<'py, PyAny>, ImportError> {
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
