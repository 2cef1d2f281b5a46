use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn f(x: TensorRef<'_, String>) -> usize {
    x.len()
}

fn main() {}
