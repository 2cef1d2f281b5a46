use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

fn keep(v: TensorRef<'static, f32>) {
    std::mem::forget(v);
}

#[dlpack_fn]
#[pyfunction]
fn f(x: TensorRef<'_, f32>) {
    keep(x);
}

fn main() {}
