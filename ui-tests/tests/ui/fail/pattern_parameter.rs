use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn f(_: TensorRef<'_, f32>, (b): TensorRef<'_, f32>) -> usize {
    b.len()
}

fn main() {}
