use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[pyfunction]
#[dlpack_fn]
fn f(#[shape(3)] x: TensorRef<'_, f32>) -> usize {
    x.len()
}

fn main() {}
