// `returns = ..` on a return type that holds no dlcast array is an error:
// PyO3 would make a list or a number of it, and the option would do nothing.
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn head(x: &[f32], n: usize) -> &[f32] {
    &x[..n.min(x.len())]
}

#[dlcast::pyfunction(returns = like(x))]
fn total(x: TensorRef<'_, f32>) -> PyResult<f32> {
    Ok(x.to_vec()?.iter().sum())
}

#[dlcast::pyfunction(returns = torch)]
fn fill(mut x: TensorMut<'_, f32>) {
    let _ = x.fill(0.0);
}

fn main() {}
