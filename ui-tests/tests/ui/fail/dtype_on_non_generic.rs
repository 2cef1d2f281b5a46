use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn f(#[dtype(f32)] x: TensorRef<'_, f32>) -> usize {
    x.len()
}

fn main() {}
