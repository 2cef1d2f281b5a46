use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn f(
    #[shape] a: TensorRef<'_, f32>,
    #[shape(n 3)] b: TensorRef<'_, f32>,
    #[order] c: TensorRef<'_, f32>,
    #[device()] d: TensorRef<'_, f32>,
    #[device(cuda(-1))] e: TensorRef<'_, f32>,
    #[device(cuda(0, 1))] g: TensorRef<'_, f32>,
) -> usize {
    a.len() + b.len() + c.len() + d.len() + e.len() + g.len()
}

fn main() {}
