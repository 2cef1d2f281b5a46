//! Bodies that run Python code while they hold views, for
//! tests/python/test_lifetimes.py, test_releases.py, test_aliasing.py and the
//! PyTorch tests (test_torch_tensors.py, test_torch_modes.py).

use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

/// Calls `callback()` inside the body, then returns the view of `x` to
/// NumPy: the export must describe the memory the view was made of,
/// whatever the callback did to the caller's tensor.
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn view_after_call<'a>(
    x: TensorRef<'a, f64>,
    callback: &Bound<'_, PyAny>,
) -> PyResult<TensorRef<'a, f64>> {
    callback.call0()?;
    Ok(x)
}

/// Sums `x` (read-only, converted where needed), calls `callback()`, and
/// sums it again through the same view: `(before, after)`.
#[dlpack_fn]
#[pyfunction]
fn sum_around_call(x: TensorRef<'_, f64>, callback: &Bound<'_, PyAny>) -> PyResult<(f64, f64)> {
    let before = x.to_vec()?.iter().sum();
    callback.call0()?;
    Ok((before, x.to_vec()?.iter().sum()))
}

/// How `x` was read, then its sum, `callback()`, its sum again through the
/// same view (tests/python/test_torch_direct.py: PyTorch's direct read).
#[dlpack_fn]
#[pyfunction]
fn path_sum_around_call(
    x: TensorRef<'_, f64>,
    callback: &Bound<'_, PyAny>,
) -> PyResult<(&'static str, f64, f64)> {
    let before = x.to_vec()?.iter().sum();
    callback.call0()?;
    Ok((x.import_path().name(), before, x.to_vec()?.iter().sum()))
}

/// As [`path_sum_around_call`] through a slice (a view that borrows the
/// call's read): the sums only.
#[dlpack_fn]
#[pyfunction]
fn slice_sum_around_call(x: &[f64], callback: &Bound<'_, PyAny>) -> PyResult<(f64, f64)> {
    let before = x.iter().sum();
    callback.call0()?;
    Ok((before, x.iter().sum()))
}

/// Fills `x` with `value`, calls `callback()`, then fills it again through
/// the same view (writes to memory the call holds, whatever the callback
/// did to the caller's tensor).
#[dlpack_fn]
#[pyfunction]
fn fill_around_call(x: &mut [f64], value: f64, callback: &Bound<'_, PyAny>) -> PyResult<()> {
    x.fill(value);
    callback.call0()?;
    x.fill(value);
    Ok(())
}

/// Writes `value` into every element of `out` (first), then reads the
/// length of `other` (second argument, prepared after `out`).
#[dlpack_fn]
#[pyfunction]
fn fill_then_len(mut out: TensorMut<'_, f64>, other: TensorDyn<'_>, value: f64) -> PyResult<usize> {
    out.fill(value)?;
    Ok(other.len())
}

/// Whether this thread is inside a call's raw reads, where no Python code
/// may run: `None` in a release build (not tracked). The hostile stand-ins
/// of `test_replaced_attributes.py` ask it whenever dlcast calls them.
#[pyfunction]
fn raw_reads_in_progress() -> Option<bool> {
    dlcast_runtime::__private::raw_reads_in_progress()
}

/// Registers the functions above.
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(raw_reads_in_progress, m)?)?;
    m.add_function(wrap_pyfunction!(path_sum_around_call, m)?)?;
    m.add_function(wrap_pyfunction!(slice_sum_around_call, m)?)?;
    m.add_function(wrap_pyfunction!(fill_around_call, m)?)?;
    m.add_function(wrap_pyfunction!(view_after_call, m)?)?;
    m.add_function(wrap_pyfunction!(sum_around_call, m)?)?;
    m.add_function(wrap_pyfunction!(fill_then_len, m)?)?;
    Ok(())
}
