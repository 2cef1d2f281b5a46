use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

trait Float: Element {}
impl Float for f32 {}

#[dlpack_fn]
#[pyfunction]
fn f<T: Float>(#[dtype(f32, i32)] x: TensorRef<'_, T>) -> usize {
    x.len()
}

fn main() {}
