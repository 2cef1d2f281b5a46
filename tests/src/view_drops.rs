//! Bodies that drop one view while they hold another's slice, for
//! tests/python/test_registry.py, test_releases.py and test_torch_modes.py.

use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

/// Fills `b` with 1.0 through a `&mut [f64]`, drops the view `a` while the
/// slice is live, and returns the sum through the same slice: `len(b)`
/// unless something wrote `b`'s memory under the live `&mut`.
#[dlpack_fn]
#[pyfunction]
fn drop_a_then_sum_b(a: TensorDyn<'_>, #[order(c)] mut b: TensorMut<'_, f64>) -> PyResult<f64> {
    let s = b
        .as_slice_mut()
        .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("not a slice"))?;
    s.fill(1.0);
    drop(a);
    Ok(s.iter().sum())
}

/// Registers the functions above.
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(drop_a_then_sum_b, m)?)?;
    Ok(())
}
