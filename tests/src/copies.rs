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

/// Registers the functions above.
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cp_to_jax, m)?)?;
    Ok(())
}
