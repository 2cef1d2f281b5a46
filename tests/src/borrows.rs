//! Functions for the borrow-registry tests (tests/python/test_registry.py):
//! bodies that hold a slice while Python code runs (a callback) or while
//! other threads run (`py.detach`).

use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

/// Writes 1.0 everywhere through a `&mut [f64]`, calls `callback()` while
/// holding it, then returns the sum read through the same slice. A nested
/// call that could write (or read) the array under the live `&mut` must be
/// refused, so the sum is `len` whatever the callback tried.
#[dlpack_fn]
#[pyfunction]
fn hold_mut_and_call(
    #[order(c)] mut x: TensorMut<'_, f64>,
    callback: &Bound<'_, PyAny>,
) -> PyResult<f64> {
    let s = x
        .as_slice_mut()
        .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("not a slice"))?;
    s.fill(1.0);
    callback.call0()?;
    Ok(s.iter().sum())
}

/// Reads the sum through a `&[f64]`, calls `callback()` while holding it,
/// and reads the sum again: `(before, after)` must agree.
#[dlpack_fn]
#[pyfunction]
fn hold_ref_and_call(
    #[order(c)] x: TensorRef<'_, f64>,
    callback: &Bound<'_, PyAny>,
) -> PyResult<(f64, f64)> {
    let s = x
        .as_slice()
        .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("not a slice"))?;
    let before = s.iter().sum();
    callback.call0()?;
    Ok((before, s.iter().sum()))
}

/// Adds 1 to every element with the GIL released, one read-modify-write at
/// a time with a pause between them: two such bodies on one array at once
/// would lose updates.
#[dlpack_fn]
#[pyfunction]
fn increment_detached(py: Python<'_>, #[order(c)] mut x: TensorMut<'_, i64>) -> PyResult<()> {
    let s = x
        .as_slice_mut()
        .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("not a slice"))?;
    py.detach(move || {
        for v in s.iter_mut() {
            let old = *v;
            std::thread::yield_now();
            *v = old + 1;
        }
    });
    Ok(())
}

/// Sums the elements with the GIL released, pausing between reads.
#[dlpack_fn]
#[pyfunction]
fn sum_detached_slowly(py: Python<'_>, #[order(c)] x: TensorRef<'_, i64>) -> PyResult<i64> {
    let s = x
        .as_slice()
        .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("not a slice"))?;
    Ok(py.detach(move || {
        s.iter()
            .map(|&v| {
                std::thread::yield_now();
                v
            })
            .sum()
    }))
}

/// Two arguments, the first writable: `a[::2]`/`a[1::2]` pairs are accepted.
#[dlpack_fn]
#[pyfunction]
fn copy_strided(mut dst: TensorMut<'_, f64>, #[shape(n)] src: TensorRef<'_, f64>) -> PyResult<()> {
    for (i, v) in src.to_vec()?.into_iter().enumerate() {
        dst.set(&[i], v)?;
    }
    Ok(())
}

/// The sum of `x` and the length of `y` (two arguments, for the tests
/// where preparing the second one runs Python code that changes the first).
#[dlpack_fn]
#[pyfunction]
fn sum_f64_and_len(x: TensorRef<'_, f64>, y: TensorRef<'_, f64>) -> PyResult<(f64, usize)> {
    Ok((x.to_vec()?.iter().sum(), y.len()))
}

/// `hold_mut_and_call` with a second array argument, prepared after `x`
/// (for the tests where preparing it runs Python code: its `__dlpack__`).
#[dlpack_fn]
#[pyfunction]
fn hold_mut_with_and_call(
    #[order(c)] mut x: TensorMut<'_, f64>,
    other: TensorDyn<'_>,
    callback: &Bound<'_, PyAny>,
) -> PyResult<(f64, usize)> {
    let s = x
        .as_slice_mut()
        .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("not a slice"))?;
    s.fill(1.0);
    callback.call0()?;
    Ok((s.iter().sum(), other.len()))
}

/// The number of live borrows in the process-wide registry.
#[pyfunction]
fn live_borrows(py: Python<'_>) -> PyResult<usize> {
    dlcast_runtime::borrow::live_borrows(py)
}

/// Registers the functions above.
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(hold_mut_and_call, m)?)?;
    m.add_function(wrap_pyfunction!(hold_ref_and_call, m)?)?;
    m.add_function(wrap_pyfunction!(increment_detached, m)?)?;
    m.add_function(wrap_pyfunction!(sum_detached_slowly, m)?)?;
    m.add_function(wrap_pyfunction!(copy_strided, m)?)?;
    m.add_function(wrap_pyfunction!(live_borrows, m)?)?;
    m.add_function(wrap_pyfunction!(sum_f64_and_len, m)?)?;
    m.add_function(wrap_pyfunction!(hold_mut_with_and_call, m)?)?;
    Ok(())
}
