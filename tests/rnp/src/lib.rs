//! An extension module built with rust-numpy (the `numpy` crate), not
//! dlcast, loaded beside `dlcast_testext` by
//! tests/python/test_rust_numpy.py: rust-numpy's borrows and dlcast's views
//! of the same NumPy array must see each other (dlcast's `borrow::rnp`).

use numpy::{PyReadonlyArray1, PyReadwriteArray1};
use pyo3::prelude::*;

/// Writes 2 into every element through rust-numpy's writable borrow, and
/// calls `callback()` while holding it; returns the sum after.
#[pyfunction]
fn hold_mut_and_call(
    mut x: PyReadwriteArray1<'_, f64>,
    callback: &Bound<'_, PyAny>,
) -> PyResult<f64> {
    x.as_array_mut().fill(2.0);
    callback.call0()?;
    Ok(x.as_array().sum())
}

/// Reads the sum through rust-numpy's read-only borrow, calls `callback()`
/// while holding it, and reads the sum again.
#[pyfunction]
fn hold_ref_and_call(
    x: PyReadonlyArray1<'_, f64>,
    callback: &Bound<'_, PyAny>,
) -> PyResult<(f64, f64)> {
    let before = x.as_array().sum();
    callback.call0()?;
    Ok((before, x.as_array().sum()))
}

/// Holds rust-numpy's read-only borrow while calling `callback()`, reading
/// nothing (the callback may change the array's shape).
#[pyfunction]
fn borrow_and_call(x: PyReadonlyArray1<'_, f64>, callback: &Bound<'_, PyAny>) -> PyResult<()> {
    callback.call0()?;
    drop(x);
    Ok(())
}

#[pymodule(gil_used = true)]
fn dlcast_rnp(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(hold_mut_and_call, m)?)?;
    m.add_function(wrap_pyfunction!(hold_ref_and_call, m)?)?;
    m.add_function(wrap_pyfunction!(borrow_and_call, m)?)?;
    Ok(())
}
