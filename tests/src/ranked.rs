//! Views whose type fixes the rank (`TensorRef<'_, T, N>`), their
//! array-typed accessors, iteration, the errors they raise (function,
//! parameter, index, exception type) and views over Rust data returned to
//! Python (tests/python/test_ranked_views.py and the hostile-layout test of
//! tests/python/test_export_layouts.py).

use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

/// `x.get([i, j])` of a 2-d view; raises what `get` returns.
#[dlpack_fn]
#[pyfunction]
fn rk_get2(x: TensorRef<'_, f64, 2>, i: usize, j: usize) -> PyResult<f64> {
    Ok(x.get([i, j])?)
}

/// `x.get([i])` of a 1-d view.
#[dlpack_fn]
#[pyfunction]
fn rk_get1(x: TensorRef<'_, f64, 1>, i: usize) -> PyResult<f64> {
    Ok(x.get([i])?)
}

/// `x.get([])` of a 0-d view.
#[dlpack_fn]
#[pyfunction]
fn rk_get0(x: TensorRef<'_, f64, 0>) -> PyResult<f64> {
    Ok(x.get([])?)
}

/// `x.get(index)` of a dynamic view; raises what `get` returns.
#[dlpack_fn]
#[pyfunction]
fn rk_get_dyn(x: TensorRef<'_, f64>, index: Vec<usize>) -> PyResult<f64> {
    Ok(x.get(&index)?)
}

/// `(dims(), stride_array())` of a 3-d view.
#[dlpack_fn]
#[pyfunction]
fn rk_dims3(#[device(any)] x: TensorRef<'_, f32, 3>) -> ([usize; 3], [isize; 3]) {
    (x.dims(), x.stride_array())
}

/// Every element of a 2-d view read with `get([i, j])` in C order (the
/// rank-typed accessor against any layout).
#[dlpack_fn]
#[pyfunction]
fn rk_all2(x: TensorRef<'_, f64, 2>) -> PyResult<Vec<f64>> {
    let [n, m] = x.dims();
    let mut out = Vec::new();
    if x.is_empty() {
        // `(2**62, 0)` is empty: no loop over its first extent.
        return Ok(out);
    }
    for i in 0..n {
        for j in 0..m {
            out.push(x.get([i, j])?);
        }
    }
    Ok(out)
}

/// `x.iter()` collected (C order).
#[dlpack_fn]
#[pyfunction]
fn rk_iter(x: TensorRef<'_, f64>) -> PyResult<Vec<f64>> {
    Ok(x.iter()?.take(10_000).collect())
}

/// `x.iter_memory_order()` collected (at most 10,000 elements).
#[dlpack_fn]
#[pyfunction]
fn rk_iter_memory(x: TensorRef<'_, f64>) -> PyResult<Vec<f64>> {
    Ok(x.iter_memory_order()?.take(10_000).collect())
}

/// `(len() of x.iter(), len() of x.iter_memory_order())`: the exact sizes,
/// without visiting the elements.
#[dlpack_fn]
#[pyfunction]
fn rk_iter_len(x: TensorRef<'_, f64>) -> PyResult<(usize, usize)> {
    Ok((x.iter()?.len(), x.iter_memory_order()?.len()))
}

/// `x.as_array()` of a 2-d view: its shape and elements in C order.
#[dlpack_fn]
#[pyfunction]
fn rk_as_array2(x: TensorRef<'_, f64, 2>) -> PyResult<(Vec<usize>, Vec<f64>)> {
    let a = x.as_array()?;
    Ok((a.shape().to_vec(), a.iter().take(10_000).copied().collect()))
}

/// `out.set([i, j], value)` of a 2-d writable view.
#[dlpack_fn]
#[pyfunction]
fn rk_set2(mut out: TensorMut<'_, f64, 2>, i: usize, j: usize, value: f64) -> PyResult<()> {
    Ok(out.set([i, j], value)?)
}

/// `out.set(index, value)` of a dynamic writable view.
#[dlpack_fn]
#[pyfunction]
fn rk_set_dyn(mut out: TensorMut<'_, f64>, index: Vec<usize>, value: f64) -> PyResult<()> {
    Ok(out.set(&index, value)?)
}

/// Writes `value` at every index of a 2-d writable view with `set([i, j])`.
#[dlpack_fn]
#[pyfunction]
fn rk_set_all2(mut out: TensorMut<'_, f64, 2>, value: f64) -> PyResult<()> {
    let [n, m] = out.dims();
    if out.is_empty() {
        return Ok(());
    }
    for i in 0..n {
        for j in 0..m {
            out.set([i, j], value)?;
        }
    }
    Ok(())
}

/// `out.as_array_mut()` of a 2-d writable view, filled with `value`.
#[dlpack_fn]
#[pyfunction]
fn rk_as_array_mut2(mut out: TensorMut<'_, f64, 2>, value: f64) -> PyResult<Vec<usize>> {
    let mut a = out.as_array_mut()?;
    a.fill(value);
    Ok(a.shape().to_vec())
}

/// `out.copy_from_slice(values)` (C order into any strides).
#[dlpack_fn]
#[pyfunction]
fn rk_copy_from(mut out: TensorMut<'_, f64>, values: Vec<f64>) -> PyResult<()> {
    Ok(out.copy_from_slice(&values)?)
}

/// `x.into_rank::<2>()` of a dynamic view, then its dims.
#[dlpack_fn]
#[pyfunction]
fn rk_into_rank2(x: TensorRef<'_, f64>) -> PyResult<[usize; 2]> {
    Ok(x.into_rank::<2>()?.dims())
}

/// A 3x3 box filter with clamped edges written with rank-typed accessors
/// (the shape of a 5x5 convolution), on any strides.
#[dlpack_fn]
#[pyfunction]
fn rk_box3(
    #[shape(h, w)] img: TensorRef<'_, f32, 2>,
    #[shape(h, w)] mut out: TensorMut<'_, f32, 2>,
) -> PyResult<()> {
    let [h, w] = img.dims();
    if img.is_empty() {
        return Ok(());
    }
    for y in 0..h {
        for x in 0..w {
            let mut sum = 0.0;
            for yy in [y.saturating_sub(1), y, (y + 1).min(h - 1)] {
                for xx in [x.saturating_sub(1), x, (x + 1).min(w - 1)] {
                    sum += img.get([yy, xx])?;
                }
            }
            out.set([y, x], sum / 9.0)?;
        }
    }
    Ok(())
}

/// `x.get([0, 0])` of a 2-d view on any device (an error off the host).
#[dlpack_fn]
#[pyfunction]
fn rk_device_get2(#[device(any)] x: TensorRef<'_, f32, 2>) -> PyResult<f32> {
    Ok(x.get([0, 0])?)
}

/// `x.iter()` / `x.iter_memory_order()` on any device: the error texts
/// (empty when they succeed).
#[dlpack_fn]
#[pyfunction]
fn rk_device_iter(#[device(any)] x: TensorRef<'_, f32>) -> (String, String) {
    let text = |r: Result<_, ViewError>| r.err().map(|e| e.to_string()).unwrap_or_default();
    (
        text(x.iter().map(|_| ())),
        text(x.iter_memory_order().map(|_| ())),
    )
}

/// The first `n` rows of a 2-d input, flipped, returned zero-copy (a
/// rank-typed view converts to Python like any view).
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn rk_first_rows_flipped(x: TensorRef<'_, f64, 2>, n: usize) -> PyResult<TensorRef<'_, f64, 2>> {
    Ok(x.slice_axis(0, 0..n)?.flip_axis(1)?)
}

/// A 1-d view over a Rust vector, flipped, returned to Python: copied into
/// a new array, since `data` is freed before Python reads it.
#[pyfunction]
fn rk_rust_view(py: Python<'_>, n: usize) -> PyResult<Py<PyAny>> {
    let data: Vec<f64> = (0..n).map(|i| i as f64).collect();
    let view = TensorRef::<f64, 1>::from_slice(&data, &[n])?.flip_axis(0)?;
    let out = pyo3::IntoPyObjectExt::into_py_any(view, py)?;
    drop(data);
    Ok(out)
}

/// The error text of `TensorRef::<f64, 2>::from_slice` for a slice of
/// `len` elements and `shape` (`None` if it succeeds): views over Rust
/// data name no function or parameter.
#[pyfunction]
fn rk_from_slice_error(len: usize, shape: Vec<usize>) -> Option<String> {
    let data = vec![0.0f64; len];
    TensorRef::<f64, 2>::from_slice(&data, &shape)
        .err()
        .map(|e| e.to_string())
}

/// Registers the rank-typed view functions.
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    macro_rules! add {
        ($($f:ident),* $(,)?) => {$( m.add_function(wrap_pyfunction!($f, m)?)?; )*};
    }
    add!(
        rk_get2,
        rk_get1,
        rk_get0,
        rk_get_dyn,
        rk_dims3,
        rk_all2,
        rk_iter,
        rk_iter_memory,
        rk_iter_len,
        rk_as_array2,
        rk_set2,
        rk_set_dyn,
        rk_set_all2,
        rk_as_array_mut2,
        rk_copy_from,
        rk_into_rank2,
        rk_box3,
        rk_first_rows_flipped,
        rk_device_get2,
        rk_device_iter,
        rk_rust_view,
        rk_from_slice_error,
    );
    Ok(())
}
