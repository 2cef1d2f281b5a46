use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn(strict)]
#[pyfunction]
fn f(x: TensorRef<'_, f32>) -> usize {
    x.len()
}

fn main() {}
