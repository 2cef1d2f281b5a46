use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn f(x: TensorRef<'static, f32>, y: Option<TensorMut<'static, f32>>) -> usize {
    x.len() + y.map_or(0, |y| y.len())
}

fn main() {}
