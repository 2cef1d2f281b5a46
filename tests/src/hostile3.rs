//! A third hostile review: results that Python code built (a callback's
//! value, returned by the body), under `returns = numpy`. For
//! tests/python/test_returns.py.

use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

/// Returns what `f()` returns, with `returns = numpy`: the exported arrays
/// in it go to NumPy.
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn h3_callback_result_numpy(x: TensorRef<'_, f64>, f: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    drop(x);
    Ok(f.call0()?.unbind())
}

/// Registers this file's functions.
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(h3_callback_result_numpy, m)?)?;
    Ok(())
}
