use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn(returns = mxnet)]
#[pyfunction]
fn unknown_framework(x: TensorRef<'_, f32>) -> usize {
    x.len()
}

#[dlpack_fn(returns = like(y))]
#[pyfunction]
fn like_names_no_array(x: TensorRef<'_, f32>, y: usize) -> usize {
    x.len() + y
}

#[dlpack_fn(returns = numpy, returns = torch)]
#[pyfunction]
fn two_frameworks(x: TensorRef<'_, f32>) -> usize {
    x.len()
}

fn main() {}
