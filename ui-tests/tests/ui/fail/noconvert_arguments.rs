use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn f(#[noconvert(x)] x: TensorRef<'_, f32>) -> usize {
    x.len()
}

fn main() {}
