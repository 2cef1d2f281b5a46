// Slices and ndarray views take host memory, and an ndarray view's
// dimension must be one dlcast can read.
use dlcast_runtime::prelude::*;
use ndarray::{ArrayView, Dimension};
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn on_gpu(#[device(cuda)] x: &[f32]) -> usize {
    x.len()
}

#[dlpack_fn]
#[pyfunction]
fn generic_dim<D: Dimension>(x: ArrayView<'_, f32, D>) -> usize {
    x.len()
}

#[dlpack_fn]
#[pyfunction]
fn static_slice(x: &'static [f32]) -> usize {
    x.len()
}

fn main() {}
