//! Functions whose parameters are Rust's own types: slices and `ndarray`
//! views (tests/python/test_native_views.py).

use dlcast_runtime::prelude::*;
use ndarray::{ArrayView0, ArrayView2, ArrayViewD, ArrayViewMut2, Ix3};
use pyo3::prelude::*;

/// The sum of a 1-D contiguous `f64` array.
#[dlpack_fn]
#[pyfunction]
fn slice_sum(x: &[f64]) -> f64 {
    x.iter().sum()
}

/// As `slice_sum`, without conversion.
#[dlpack_fn]
#[pyfunction]
fn slice_sum_nc(#[noconvert] x: &[f64]) -> f64 {
    x.iter().sum()
}

/// Writes `value` into every element.
#[dlpack_fn]
#[pyfunction]
fn slice_fill(x: &mut [f64], value: f64) {
    x.fill(value);
}

/// `None` for `None`, else the first element (`nan` if empty).
#[dlpack_fn]
#[pyfunction]
#[pyo3(signature = (x=None))]
fn slice_first(x: Option<&[f32]>) -> Option<f32> {
    x.map(|s| s.first().copied().unwrap_or(f32::NAN))
}

/// How many elements are `true`.
#[dlpack_fn]
#[pyfunction]
fn native_count_true(x: &[bool]) -> usize {
    x.iter().filter(|b| **b).count()
}

/// A dtype-generic slice: the sum as `f64`.
#[dlpack_fn]
#[pyfunction]
fn generic_slice_sum<T: Copy + Into<f64>>(#[dtype(f32, f64, i32)] x: &[T]) -> f64 {
    x.iter().map(|&v| v.into()).sum()
}

/// The sum of a 2-D `f64` array, any strides.
#[dlpack_fn]
#[pyfunction]
fn nd2_sum(x: ArrayView2<'_, f64>) -> f64 {
    x.sum()
}

/// As `nd2_sum`, without conversion.
#[dlpack_fn]
#[pyfunction]
fn nd2_sum_nc(#[noconvert] x: ArrayView2<'_, f64>) -> f64 {
    x.sum()
}

/// Shape and strides (elements) of the `ndarray` view dlcast made.
#[dlpack_fn]
#[pyfunction]
fn nd2_layout(x: ArrayView2<'_, f64>) -> (Vec<usize>, Vec<isize>) {
    (x.shape().to_vec(), x.strides().to_vec())
}

/// The elements of a 2-D array in C order, read through `ndarray`.
#[dlpack_fn]
#[pyfunction]
fn nd2_elements(x: ArrayView2<'_, f64>) -> Vec<f64> {
    x.iter().copied().collect()
}

/// Any number of dimensions: the shape.
#[dlpack_fn]
#[pyfunction]
fn nd_dyn_shape(x: ArrayViewD<'_, f32>) -> Vec<usize> {
    x.shape().to_vec()
}

/// The generic spelling with a dimension type.
#[dlpack_fn]
#[pyfunction]
fn nd3_len(x: ndarray::ArrayView<'_, f32, Ix3>) -> usize {
    x.len()
}

/// A 0-d array's value.
#[dlpack_fn]
#[pyfunction]
fn nd0_value(x: ArrayView0<'_, f64>) -> f64 {
    x[()]
}

/// Multiplies every element by `k`, in place, through any strides.
#[dlpack_fn]
#[pyfunction]
fn nd2_scale(mut x: ArrayViewMut2<'_, f64>, k: f64) {
    x.mapv_inplace(|v| v * k);
}

/// The README's centroid with Rust's types: weighted mean of `n` points.
#[dlpack_fn]
#[pyfunction]
fn native_centroid(
    #[shape(n, 3)] points: ArrayView2<'_, f32>,
    #[shape(n)] weights: &[f32],
) -> [f32; 3] {
    let total: f32 = weights.iter().sum();
    let mut c = [0.0f32; 3];
    for (row, &w) in points.rows().into_iter().zip(weights) {
        for (ck, &p) in c.iter_mut().zip(row) {
            *ck += w * p / total;
        }
    }
    c
}

/// `TensorRef` under `#[order(c)]`: the slice accessor cannot fail on
/// host memory (alignment is guaranteed at the boundary).
#[dlpack_fn]
#[pyfunction]
fn ordered_sum(#[order(c)] x: TensorRef<'_, f32>) -> PyResult<f32> {
    let s = x
        .as_slice()
        .ok_or_else(|| pyo3::exceptions::PyAssertionError::new_err("as_slice failed"))?;
    Ok(s.iter().sum())
}

/// Writable `TensorMut` under `#[order(c)]`: doubles every element.
#[dlpack_fn]
#[pyfunction]
fn ordered_double(#[order(c)] mut x: TensorMut<'_, f32>) -> PyResult<()> {
    let s = x
        .as_slice_mut()
        .ok_or_else(|| pyo3::exceptions::PyAssertionError::new_err("as_slice_mut failed"))?;
    s.iter_mut().for_each(|v| *v *= 2.0);
    Ok(())
}

/// Sums `x` with the GIL released: slices are `Send`, so they go into
/// `py.detach` as they are.
#[dlpack_fn]
#[pyfunction]
fn detached_sum(py: Python<'_>, x: &[f64]) -> f64 {
    py.detach(|| x.iter().sum())
}

/// Registers the functions above.
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(slice_sum, m)?)?;
    m.add_function(wrap_pyfunction!(slice_sum_nc, m)?)?;
    m.add_function(wrap_pyfunction!(slice_fill, m)?)?;
    m.add_function(wrap_pyfunction!(slice_first, m)?)?;
    m.add_function(wrap_pyfunction!(native_count_true, m)?)?;
    m.add_function(wrap_pyfunction!(generic_slice_sum, m)?)?;
    m.add_function(wrap_pyfunction!(nd2_sum, m)?)?;
    m.add_function(wrap_pyfunction!(nd2_sum_nc, m)?)?;
    m.add_function(wrap_pyfunction!(nd2_layout, m)?)?;
    m.add_function(wrap_pyfunction!(nd2_elements, m)?)?;
    m.add_function(wrap_pyfunction!(nd_dyn_shape, m)?)?;
    m.add_function(wrap_pyfunction!(nd3_len, m)?)?;
    m.add_function(wrap_pyfunction!(nd0_value, m)?)?;
    m.add_function(wrap_pyfunction!(nd2_scale, m)?)?;
    m.add_function(wrap_pyfunction!(native_centroid, m)?)?;
    m.add_function(wrap_pyfunction!(ordered_sum, m)?)?;
    m.add_function(wrap_pyfunction!(ordered_double, m)?)?;
    m.add_function(wrap_pyfunction!(detached_sum, m)?)?;
    Ok(())
}
