// Slice and ndarray parameters without #[dlpack_fn]: PyO3 sees them itself.
use ndarray::ArrayView2;
use pyo3::prelude::*;

#[pyfunction]
fn f(x: ArrayView2<'_, f32>) -> usize {
    x.len()
}

#[pyfunction]
fn g(#[shape(n)] x: &[f32]) -> usize {
    x.len()
}

fn main() {}
