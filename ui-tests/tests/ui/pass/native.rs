// Rust's own view types as parameters, in every form, and the bodies
// called from Rust.
use dlcast_runtime::prelude::*;
use ndarray::{ArrayView, ArrayView1, ArrayViewD, ArrayViewMut2, Dim, Ix2, IxDyn};
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn slices(a: &[f32], b: &mut [f64], c: Option<&[u8]>, d: Option<&mut [i32]>) -> usize {
    a.len() + b.len() + c.map_or(0, |c| c.len()) + d.map_or(0, |d| d.len())
}

#[dlpack_fn]
#[pyfunction]
fn views(
    #[shape(n, 3)]
    #[order(c)]
    a: ArrayView<'_, f32, Ix2>,
    #[shape(n)] b: ArrayView1<'_, f32>,
    #[shape(n, ..)] c: ArrayViewD<'_, f32>,
    d: ArrayView<'_, f64, IxDyn>,
    e: ArrayView<'_, f64, Dim<[usize; 2]>>,
    f: ArrayViewMut2<'_, f64>,
) -> usize {
    a.len() + b.len() + c.len() + d.len() + e.len() + f.len()
}

#[dlpack_fn]
#[pyfunction]
fn generic<T: Element>(#[dtype(f32, f64)] x: &[T], y: ArrayView1<'_, T>) -> usize {
    x.len() + y.len()
}

#[pymodule]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(slices, m)?)?;
    m.add_function(wrap_pyfunction!(views, m)?)?;
    m.add_function(wrap_pyfunction!(generic, m)?)?;
    Ok(())
}

fn main() {
    let mut out = [0.0f64; 2];
    assert_eq!(slices_rs(&[1.0], &mut out, None, None), 3);
    assert_eq!(generic_rs(&[1.0f32], ArrayView1::from(&[2.0f32])), 2);
}
