//! Every view accessor and transform, one function each, for the soundness
//! tests of hostile layouts (tests/python/test_export_layouts.py): each
//! must give the right values or raise an `Exception`, never panic.

use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

/// `x.get(index)`; `None` for the errors (out of bounds).
#[dlpack_fn]
#[pyfunction]
fn acc_get(x: TensorRef<'_, f64>, index: Vec<usize>) -> Option<f64> {
    x.get(&index).ok()
}

/// `x.to_vec()`.
#[dlpack_fn]
#[pyfunction]
fn acc_to_vec(x: TensorRef<'_, f64>) -> PyResult<Vec<f64>> {
    Ok(x.to_vec()?)
}

/// `x.as_slice()` copied out (`None` when no slice can be formed).
#[dlpack_fn]
#[pyfunction]
fn acc_as_slice(x: TensorRef<'_, f64>) -> Option<Vec<f64>> {
    x.as_slice().map(<[f64]>::to_vec)
}

/// `x.as_ndarray()`: its shape and its first (at most 10,000) elements in
/// logical (C) order.
#[dlpack_fn]
#[pyfunction]
fn acc_as_ndarray(x: TensorRef<'_, f64>) -> PyResult<(Vec<usize>, Vec<f64>)> {
    let a = x.as_ndarray()?;
    Ok((a.shape().to_vec(), a.iter().take(10_000).copied().collect()))
}

/// `x.set(index, value)`: whether it wrote.
#[dlpack_fn]
#[pyfunction]
fn acc_set(mut x: TensorMut<'_, f64>, index: Vec<usize>, value: f64) -> bool {
    x.set(&index, value).is_ok()
}

/// `x.fill(value)`.
#[dlpack_fn]
#[pyfunction]
fn acc_fill(mut x: TensorMut<'_, f64>, value: f64) -> PyResult<()> {
    Ok(x.fill(value)?)
}

/// Fills through `x.as_slice_mut()`; `false` when no slice can be formed.
#[dlpack_fn]
#[pyfunction]
fn acc_as_slice_mut(mut x: TensorMut<'_, f64>, value: f64) -> bool {
    match x.as_slice_mut() {
        Some(s) => {
            s.fill(value);
            true
        }
        None => false,
    }
}

/// Fills through `x.as_ndarray_mut()`; returns the view's shape.
#[dlpack_fn]
#[pyfunction]
fn acc_as_ndarray_mut(mut x: TensorMut<'_, f64>, value: f64) -> PyResult<Vec<usize>> {
    let mut a = x.as_ndarray_mut()?;
    a.fill(value);
    Ok(a.shape().to_vec())
}

/// `x.slice_axis(axis, start..stop)`, exported (a `dlcast.Array`).
#[dlpack_fn(returns = dlcast)]
#[pyfunction]
fn acc_slice_axis(
    x: TensorRef<'_, f64>,
    axis: usize,
    start: usize,
    stop: usize,
) -> PyResult<TensorRef<'_, f64>> {
    Ok(x.slice_axis(axis, start..stop)?)
}

/// `x.flip_axis(axis)`, exported.
#[dlpack_fn]
#[pyfunction]
fn acc_flip_axis(x: TensorRef<'_, f64>, axis: usize) -> PyResult<TensorRef<'_, f64>> {
    Ok(x.flip_axis(axis)?)
}

/// `x.permute(axes)`, exported.
#[dlpack_fn]
#[pyfunction]
fn acc_permute(x: TensorRef<'_, f64>, axes: Vec<usize>) -> PyResult<TensorRef<'_, f64>> {
    Ok(x.permute(&axes)?)
}

/// `x.reshape(shape)`, exported.
#[dlpack_fn]
#[pyfunction]
fn acc_reshape(x: TensorRef<'_, f64>, shape: Vec<usize>) -> PyResult<TensorRef<'_, f64>> {
    Ok(x.reshape(&shape)?)
}

/// `x.flip_axis(axis)` then `to_vec()`, in one call (no export between).
#[dlpack_fn]
#[pyfunction]
fn acc_flip_to_vec(x: TensorRef<'_, f64>, axis: usize) -> PyResult<Vec<f64>> {
    Ok(x.flip_axis(axis)?.to_vec()?)
}

/// `x.slice_axis(axis, start..stop)` then `to_vec()`, in one call.
#[dlpack_fn]
#[pyfunction]
fn acc_slice_to_vec(
    x: TensorRef<'_, f64>,
    axis: usize,
    start: usize,
    stop: usize,
) -> PyResult<Vec<f64>> {
    Ok(x.slice_axis(axis, start..stop)?.to_vec()?)
}

/// The input flipped along `axis`, handed to PyTorch (which refuses
/// negative strides).
#[dlpack_fn(returns = torch)]
#[pyfunction]
fn flipped_torch(x: TensorDyn<'_>, axis: usize) -> PyResult<TensorDyn<'_>> {
    Ok(x.flip_axis(axis)?)
}

/// The input itself, handed to PyTorch.
#[dlpack_fn(returns = torch)]
#[pyfunction]
fn identity_torch(x: TensorDyn<'_>) -> TensorDyn<'_> {
    x
}

/// The input itself, handed to NumPy (through its C API).
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn identity_numpy(x: TensorDyn<'_>) -> TensorDyn<'_> {
    x
}

/// The input itself, handed to array-api-strict.
#[dlpack_fn(returns = array_api)]
#[pyfunction]
fn identity_array_api(x: TensorDyn<'_>) -> TensorDyn<'_> {
    x
}

/// `Tensor::<f64>::zeros(shape)`.
#[pyfunction]
fn tensor_zeros(shape: Vec<usize>) -> PyResult<Tensor<f64>> {
    Ok(Tensor::<f64>::zeros(&shape)?)
}

/// `Tensor::<u8>::from_fn(shape, |i| i as u8)`.
#[pyfunction]
fn tensor_from_fn(shape: Vec<usize>) -> PyResult<Tensor<u8>> {
    Ok(Tensor::<u8>::from_fn(&shape, |i| i as u8)?)
}

/// `Tensor::<f64>::from_vec_strides(vec![1.0; len], shape, strides)`.
#[pyfunction]
fn tensor_from_vec_strides(
    len: usize,
    shape: Vec<usize>,
    strides: Vec<isize>,
) -> PyResult<Tensor<f64>> {
    Ok(Tensor::from_vec_strides(vec![1.0; len], &shape, &strides)?)
}

/// The Rust error `Tensor::<f64>::zeros(shape)` gives, as text (`None` if
/// it succeeds): the public API's error, before conversion to Python.
#[pyfunction]
fn tensor_zeros_error(shape: Vec<usize>) -> Option<String> {
    Tensor::<f64>::zeros(&shape).err().map(|e| format!("{e:?}"))
}

/// Registers the soundness functions (called from the module initialiser).
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    macro_rules! add {
        ($($f:ident),* $(,)?) => {$( m.add_function(wrap_pyfunction!($f, m)?)?; )*};
    }
    add!(
        acc_get,
        acc_to_vec,
        acc_as_slice,
        acc_as_ndarray,
        acc_set,
        acc_fill,
        acc_as_slice_mut,
        acc_as_ndarray_mut,
        acc_slice_axis,
        acc_flip_axis,
        acc_permute,
        acc_reshape,
        acc_flip_to_vec,
        acc_slice_to_vec,
        flipped_torch,
        identity_torch,
        identity_numpy,
        identity_array_api,
        tensor_zeros,
        tensor_from_fn,
        tensor_from_vec_strides,
        tensor_zeros_error,
    );
    Ok(())
}
