//! Functions for tests/python/test_copies_respect_borrows.py: routes by
//! which dlcast copies memory it did not allocate itself.

use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

/// Hands `x` back through `returns = jax`: a `dlcast.Array` in the result
/// goes to JAX, as an aligned copy where its memory may still be written
/// (an `ArrayBuffer`'s) or is not aligned and compact.
#[dlpack_fn(returns = jax)]
#[pyfunction]
fn cp_to_jax<'py>(x: &Bound<'py, PyAny>) -> Bound<'py, PyAny> {
    x.clone()
}

/// As [`cp_to_jax`], through `returns = mlx` (MLX's `from_dlpack`).
#[dlpack_fn(returns = mlx)]
#[pyfunction]
fn cp_to_mlx<'py>(x: &Bound<'py, PyAny>) -> Bound<'py, PyAny> {
    x.clone()
}

/// As [`cp_to_jax`], through `returns = tensorflow` (a legacy capsule to
/// TensorFlow's `from_dlpack`).
#[dlpack_fn(returns = tensorflow)]
#[pyfunction]
fn cp_to_tensorflow<'py>(x: &Bound<'py, PyAny>) -> Bound<'py, PyAny> {
    x.clone()
}

/// Registers the functions above.
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cp_to_jax, m)?)?;
    m.add_function(wrap_pyfunction!(cp_to_mlx, m)?)?;
    m.add_function(wrap_pyfunction!(cp_to_tensorflow, m)?)?;
    Ok(())
}
