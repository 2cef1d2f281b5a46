use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn f(x: TensorRef<'_, f32>, #[shape(3)] scale: f64) -> f64 {
    x.len() as f64 * scale
}

fn main() {}
