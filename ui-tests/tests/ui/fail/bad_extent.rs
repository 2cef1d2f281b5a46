use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn f(
    #[shape(n, 3.5)] a: TensorRef<'_, f32>,
    #[shape("n")] b: TensorRef<'_, f32>,
    #[shape(-1)] c: TensorRef<'_, f32>,
    #[shape(3usize)] d: TensorRef<'_, f32>,
) -> usize {
    a.len() + b.len() + c.len() + d.len()
}

fn main() {}
