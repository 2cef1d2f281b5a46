use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn f<const N: usize>(x: TensorRef<'_, f32>) -> usize {
    x.len() + N
}

fn main() {}
