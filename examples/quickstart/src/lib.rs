use dlcast_runtime::ndarray::{ArrayView2, Axis};
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

/// The sum of each row of a 2-d float32 array, as an array of the caller's
/// framework.
#[dlcast::pyfunction]
fn row_sums(#[shape(rows, _)] x: ArrayView2<'_, f32>) -> Tensor<f32> {
    Tensor::from(x.sum_axis(Axis(1)))
}

/// Multiplies a 1-d float32 array in place.
#[dlcast::pyfunction]
fn scale(x: &mut [f32], factor: f32) {
    x.iter_mut().for_each(|v| *v *= factor);
}

#[pymodule(gil_used = true)]
fn quickstart(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(row_sums, m)?)?;
    m.add_function(wrap_pyfunction!(scale, m)?)
}
