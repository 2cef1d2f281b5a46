use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn f<T: Element>(x: TensorRef<'_, T>) -> usize {
    x.len()
}

fn main() {}
