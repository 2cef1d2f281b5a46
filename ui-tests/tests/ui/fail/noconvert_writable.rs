// `#[noconvert]` means nothing on a writable parameter: writable
// parameters never convert.
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn f(#[noconvert] x: TensorMut<'_, f32>) -> usize {
    x.len()
}

#[dlpack_fn]
#[pyfunction]
fn g(#[noconvert] x: &mut [f32]) -> usize {
    x.len()
}

fn main() {}
