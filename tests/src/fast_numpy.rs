//! Functions of every parameter kind the fast path for exact NumPy arrays
//! takes, each returning what its view saw (shape, strides, values, address,
//! read-only mark), and the switch that turns that path off; called from
//! tests/python/test_fast_paths.py, which runs the same inputs with the fast
//! path on and off and compares.

use dlcast_runtime::prelude::*;
use ndarray::{ArrayView2, ArrayViewMutD};
use pyo3::prelude::*;

/// What a view saw: shape, strides, values (C order), address of element
/// 0, read-only mark.
type Seen = (Vec<usize>, Vec<isize>, Vec<f64>, usize, bool);

fn seen_ref<T: Element + Into<f64>, const N: usize>(x: &TensorRef<'_, T, N>) -> Seen {
    (
        x.shape().to_vec(),
        x.strides().to_vec(),
        x.iter()
            .map(|it| it.map(Into::into).collect())
            .unwrap_or_default(),
        x.data_ptr() as usize,
        x.is_read_only(),
    )
}

/// A read-only typed view of any rank.
#[dlpack_fn]
#[pyfunction]
fn fp_ref(x: TensorRef<'_, f64>) -> Seen {
    seen_ref(&x)
}

/// A fixed-rank `(_, 3)` C-order float32 view.
#[dlpack_fn]
#[pyfunction]
fn fp_pts(
    #[shape(_, 3)]
    #[order(c)]
    x: TensorRef<'_, f32, 2>,
) -> Seen {
    seen_ref(&x)
}

/// An int64 view under `#[order(f)]`.
#[dlpack_fn]
#[pyfunction]
fn fp_ref_f(#[order(f)] x: TensorRef<'_, i32>) -> Seen {
    seen_ref(&x)
}

/// A writable typed view: adds 1 to every element, then reports.
#[dlpack_fn]
#[pyfunction]
fn fp_mut(mut x: TensorMut<'_, f64>) -> PyResult<Seen> {
    x.as_ndarray_mut()
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?
        .map_inplace(|v| *v += 1.0);
    Ok(seen_ref(&x))
}

/// A slice.
#[dlpack_fn]
#[pyfunction]
fn fp_slice(x: &[f64]) -> (Vec<f64>, usize) {
    (x.to_vec(), x.as_ptr() as usize)
}

/// A writable slice: adds 1 to every element.
#[dlpack_fn]
#[pyfunction]
fn fp_slice_mut(x: &mut [f64]) -> (Vec<f64>, usize) {
    x.iter_mut().for_each(|v| *v += 1.0);
    (x.to_vec(), x.as_ptr() as usize)
}

/// A 2-d `ndarray` view.
#[dlpack_fn]
#[pyfunction]
fn fp_view(x: ArrayView2<'_, f32>) -> (Vec<usize>, Vec<isize>, Vec<f64>, usize) {
    (
        x.shape().to_vec(),
        x.strides().to_vec(),
        x.iter().map(|&v| v.into()).collect(),
        x.as_ptr() as usize,
    )
}

/// A writable `ndarray` view of any rank: adds 1 to every element.
#[dlpack_fn]
#[pyfunction]
fn fp_view_mut(mut x: ArrayViewMutD<'_, i32>) -> (Vec<usize>, Vec<isize>, Vec<i64>) {
    x.map_inplace(|v| *v += 1);
    (
        x.shape().to_vec(),
        x.strides().to_vec(),
        x.iter().map(|&v| v.into()).collect(),
    )
}

/// Four arguments sharing the extent `n`, one writable: writes `a[i, 0] +
/// w[i]` into `out[i]`.
#[dlpack_fn]
#[pyfunction]
fn fp_args(
    #[shape(n, 3)] a: TensorRef<'_, f32>,
    #[shape(n, 3)] b: ArrayView2<'_, f32>,
    #[shape(n)] w: &[f32],
    #[shape(n)] out: &mut [f32],
) -> f32 {
    for (i, o) in out.iter_mut().enumerate() {
        *o = a.get(&[i, 0]).unwrap_or(0.0) + b[[i, 1]] + w[i];
    }
    out.iter().sum()
}

/// Returns its argument's view: the view outlives the body.
#[dlpack_fn(returns = like(x))]
#[pyfunction]
fn fp_return(x: TensorRef<'_, f64>) -> TensorRef<'_, f64> {
    x
}

/// Drops its writable view inside the body, then calls `f` (which may call
/// another dlcast function with the same array): the view's registry entry
/// ends with it, as on the general path.
#[dlpack_fn]
#[pyfunction]
fn fp_drop_then_call(x: TensorMut<'_, f64>, f: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    drop(x);
    Ok(f.call0()?.unbind())
}

/// The fast path's switch (see `dlcast_runtime::__private::numpy_fast_path`):
/// `on` sets it; returns the number of calls it completed (None in release
/// builds).
#[pyfunction]
#[pyo3(signature = (on=None))]
fn numpy_fast_path(on: Option<bool>) -> Option<u64> {
    dlcast_runtime::__private::numpy_fast_path(on)
}

/// Registers the functions above.
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    macro_rules! add {
        ($($f:ident),* $(,)?) => {$( m.add_function(wrap_pyfunction!($f, m)?)?; )*};
    }
    add!(
        fp_ref,
        fp_pts,
        fp_ref_f,
        fp_mut,
        fp_slice,
        fp_slice_mut,
        fp_view,
        fp_view_mut,
        fp_args,
        fp_return,
        fp_drop_then_call,
        numpy_fast_path,
    );
    Ok(())
}
