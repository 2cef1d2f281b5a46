// The rank of `&[T]`, `ArrayView2` and `TensorRef<'_, T, N>` comes from the
// type; a `#[shape]` of another rank is an error at the annotation.
use dlcast_runtime::prelude::*;
use ndarray::{ArrayView2, ArrayView3};
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn a(#[shape(n)] x: ArrayView2<'_, f32>) -> usize {
    x.len()
}

#[dlpack_fn]
#[pyfunction]
fn b(#[shape(n, 3)] x: &[f32]) -> usize {
    x.len()
}

#[dlpack_fn]
#[pyfunction]
fn c(#[shape(1, 2, 3, 4, ..)] x: ArrayView3<'_, f32>) -> usize {
    x.len()
}

fn main() {}
