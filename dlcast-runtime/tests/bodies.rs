//! Bodies of `#[dlpack_fn]` functions called from Rust, without Python:
//! the macro keeps each function callable as `<name>_rs`, with the
//! parameter types as written.

use dlcast_runtime::dlpack_fn;
use ndarray::{array, ArrayView2, ArrayViewMut2};
use pyo3::prelude::*;

/// Weighted mean of `n` points.
#[dlpack_fn]
#[pyfunction]
fn centroid(#[shape(n, 3)] points: ArrayView2<'_, f32>, #[shape(n)] weights: &[f32]) -> [f32; 3] {
    let total: f32 = weights.iter().sum();
    let mut c = [0.0f32; 3];
    for (row, &w) in points.rows().into_iter().zip(weights) {
        for (ck, &p) in c.iter_mut().zip(row) {
            *ck += w * p / total;
        }
    }
    c
}

/// Adds `k` to every element, in place.
#[dlpack_fn]
#[pyfunction]
fn shift(mut x: ArrayViewMut2<'_, f64>, k: f64) {
    x.mapv_inplace(|v| v + k);
}

/// A dtype-generic slice sum.
#[dlpack_fn]
#[pyfunction]
fn total<T: Copy + Into<f64>>(#[dtype(f32, f64)] x: &[T]) -> f64 {
    x.iter().map(|&v| v.into()).sum()
}

/// A fallible body keeps its `PyResult`.
#[dlpack_fn]
#[pyfunction]
fn first(x: Option<&[f64]>) -> PyResult<f64> {
    x.and_then(|s| s.first().copied())
        .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("empty"))
}

#[test]
fn a_body_runs_on_rust_data() {
    let points = array![[0.0f32, 0.0, 0.0], [2.0, 4.0, 6.0]];
    assert_eq!(centroid_rs(points.view(), &[1.0, 1.0]), [1.0, 2.0, 3.0]);
    assert_eq!(centroid_rs(points.view(), &[0.0, 2.0]), [2.0, 4.0, 6.0]);
}

#[test]
fn a_writable_body_writes_rust_data() {
    let mut a = array![[1.0, 2.0], [3.0, 4.0]];
    shift_rs(a.view_mut(), 0.5);
    assert_eq!(a, array![[1.5, 2.5], [3.5, 4.5]]);
    // Any strides, as from Python.
    shift_rs(a.view_mut().reversed_axes(), -0.5);
    assert_eq!(a, array![[1.0, 2.0], [3.0, 4.0]]);
}

#[test]
fn generic_and_optional_bodies() {
    assert_eq!(total_rs(&[1.0f32, 2.5]), 3.5);
    assert_eq!(total_rs(&[1.0f64, 2.0, 3.0]), 6.0);
    assert_eq!(first_rs(Some(&[4.0, 5.0])).ok(), Some(4.0));
    assert!(first_rs(None).is_err());
}
