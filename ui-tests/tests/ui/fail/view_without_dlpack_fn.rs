use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[pyfunction]
fn f(x: TensorRef<'_, f32>) -> usize {
    x.len()
}

fn main() {}
