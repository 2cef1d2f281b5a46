use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn f<T: Element>(#[dtype(f32)] x: TensorRef<'_, T>, fill: T) -> usize {
    let _ = fill;
    x.len()
}

fn main() {}
