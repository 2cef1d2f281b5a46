use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

/// The sum of each row of a 2-d float32 array, as an array of the caller's
/// framework.
#[dlpack_fn(returns = like(x))]
#[pyfunction]
fn row_sums(#[shape(rows, _)] x: TensorRef<'_, f32>) -> PyResult<Tensor<f32>> {
    let (rows, cols) = (x.shape()[0], x.shape()[1]);
    let sums = (0..rows)
        .map(|i| (0..cols).filter_map(|j| x.get(&[i, j])).sum())
        .collect();
    Ok(Tensor::from_vec(sums, &[rows])?)
}

/// Multiplies a float32 array of any shape in place.
#[dlpack_fn]
#[pyfunction]
fn scale(mut x: TensorMut<'_, f32>, factor: f32) -> PyResult<()> {
    for v in x.as_ndarray_mut()?.iter_mut() {
        *v *= factor;
    }
    Ok(())
}

#[pymodule]
fn quickstart(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(row_sums, m)?)?;
    m.add_function(wrap_pyfunction!(scale, m)?)
}
