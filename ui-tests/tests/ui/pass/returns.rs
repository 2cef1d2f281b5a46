use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn owned(n: usize) -> Tensor<f32> {
    Tensor::from(vec![0.0; n])
}

#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn pair(x: TensorRef<'_, f64>) -> PyResult<(Tensor<f64>, TensorRef<'_, f64>)> {
    let copy = Tensor::from_vec(x.to_vec()?, x.shape())?;
    Ok((copy, x.t()))
}

#[dlpack_fn(returns = like(x))]
#[pyfunction]
fn same_framework(x: TensorMut<'_, u8>) -> Option<TensorMut<'_, u8>> {
    Some(x)
}

#[dlpack_fn(returns = torch)]
#[pyfunction]
fn rows(x: TensorDyn<'_>, n: usize) -> Result<TensorDyn<'_>, ViewError> {
    x.slice_axis(0, 0..n)
}

#[pymodule]
fn returns_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(owned, m)?)?;
    m.add_function(wrap_pyfunction!(pair, m)?)?;
    m.add_function(wrap_pyfunction!(same_framework, m)?)?;
    m.add_function(wrap_pyfunction!(rows, m)?)?;
    Ok(())
}

fn main() {}
