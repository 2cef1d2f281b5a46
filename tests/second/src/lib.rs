//! A second extension module built with dlcast, loaded beside
//! `dlcast_testext` by tests/python/test_registry.py: its views must see the
//! other module's borrows (one registry per process), and the reverse.

use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

/// Writes `value` into every element.
#[dlpack_fn]
#[pyfunction]
fn fill(mut x: TensorMut<'_, f64>, value: f64) -> PyResult<()> {
    x.fill(value)?;
    Ok(())
}

/// Holds a read-only view while calling `callback()`; returns the first
/// element before and after.
#[dlpack_fn]
#[pyfunction]
fn hold_and_call(x: TensorRef<'_, f64>, callback: &Bound<'_, PyAny>) -> PyResult<(f64, f64)> {
    let first = || x.get(&[0]).unwrap_or(f64::NAN);
    let before = first();
    callback.call0()?;
    Ok((before, first()))
}

/// The number of live borrows in the process-wide registry.
#[pyfunction]
fn live_borrows(py: Python<'_>) -> PyResult<usize> {
    dlcast_runtime::borrow::live_borrows(py)
}

#[pymodule(gil_used = true)]
fn dlcast_second(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(fill, m)?)?;
    m.add_function(wrap_pyfunction!(hold_and_call, m)?)?;
    m.add_function(wrap_pyfunction!(live_borrows, m)?)?;
    Ok(())
}
