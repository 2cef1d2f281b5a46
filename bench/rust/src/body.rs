//! The body tables of `make bench`: the same arithmetic written in each of
//! dlcast's access styles and with rust-numpy's `ArrayView2` (the nanobind
//! versions, with `.view()`, are in bench/nanobind/nb_bench.cpp).
//!
//! - `conv5`: a valid 5x5 correlation of a float32 `(h, w)` image with a
//!   float32 `(5, 5)` kernel into a writable float32 `(h - 4, w - 4)` output:
//!   `out[i, j] = sum over di, dj of img[i + di, j + dj] * k[di, dj]`,
//!   accumulated from `0.0` with `di` outer and `dj` inner, one multiply and
//!   one add per term (no fused multiply-add), so every version computes the
//!   same bits.
//! - `strided_sum`: the sum of a float64 `(n, m)` array in C index order
//!   (`i` outer, `j` inner) from `0.0`, whatever its strides; the bench
//!   passes a transposed `(1000, 3)` array, strides `(1, 1000)` elements.
//!
//! Styles: `slices` (`#[order(..)]` and `as_slice()` / `as_slice_mut()`),
//! `indexed` (element access through the view, see
//! [`rank_typed`]), `ndarray` (`ArrayView2` / `ArrayViewMut2` parameters).

use dlcast_runtime::prelude::*;
use ndarray::{ArrayView2, ArrayViewMut2};
use numpy::{PyReadonlyArray2, PyReadwriteArray2, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

// ----------------------------------------------------------------- kernels

/// `out` is `(h - 4, w - 4)`: a `ValueError` otherwise.
fn check_conv(h: usize, w: usize, oh: usize, ow: usize) -> PyResult<()> {
    if h.checked_sub(4) != Some(oh) || w.checked_sub(4) != Some(ow) {
        return Err(PyValueError::new_err(format!(
            "conv5(): out must be (h - 4, w - 4) = ({}, {}) for an image of ({h}, {w}), got ({oh}, {ow})",
            h.saturating_sub(4),
            w.saturating_sub(4)
        )));
    }
    Ok(())
}

fn not_contiguous() -> PyErr {
    PyTypeError::new_err("as_slice(): not C-contiguous")
}

// The kernels are out of line, so the machine code of a body shared by two
// entry points (dlcast's `ArrayView2` and rust-numpy's) is the same for
// both: the comparison is of the boundary, not of the inliner's choices.

/// `conv5` over C-order slices: `img` rows of `w`, `out` rows of `ow`.
#[inline(never)]
fn conv5_slices(img: &[f32], w: usize, k: &[f32], out: &mut [f32], ow: usize) {
    if ow == 0 {
        return;
    }
    for (i, orow) in out.chunks_exact_mut(ow).enumerate() {
        for (j, o) in orow.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for di in 0..5 {
                let row = &img[(i + di) * w + j..][..5];
                let krow = &k[di * 5..][..5];
                for dj in 0..5 {
                    acc += row[dj] * krow[dj];
                }
            }
            *o = acc;
        }
    }
}

/// `conv5` over `ndarray` views, indexed `[[i, j]]`.
#[inline(never)]
fn conv5_nd(img: ArrayView2<'_, f32>, k: ArrayView2<'_, f32>, mut out: ArrayViewMut2<'_, f32>) {
    let (oh, ow) = out.dim();
    for i in 0..oh {
        for j in 0..ow {
            let mut acc = 0.0f32;
            for di in 0..5 {
                for dj in 0..5 {
                    acc += img[[i + di, j + dj]] * k[[di, dj]];
                }
            }
            out[[i, j]] = acc;
        }
    }
}

/// `strided_sum` over an `ndarray` view, indexed `[[i, j]]`.
#[inline(never)]
fn sum_nd(x: ArrayView2<'_, f64>) -> f64 {
    let (n, m) = x.dim();
    let mut acc = 0.0f64;
    for i in 0..n {
        for j in 0..m {
            acc += x[[i, j]];
        }
    }
    acc
}

// ------------------------------------------------------- dlcast: slices

#[dlpack_fn]
#[pyfunction]
fn dlcast_conv5_slices(
    #[shape(h, w)]
    #[order(c)]
    img: TensorRef<'_, f32>,
    #[shape(5, 5)]
    #[order(c)]
    k: TensorRef<'_, f32>,
    #[shape(oh, ow)]
    #[order(c)]
    mut out: TensorMut<'_, f32>,
) -> PyResult<()> {
    let (h, w) = (img.shape()[0], img.shape()[1]);
    let (oh, ow) = (out.shape()[0], out.shape()[1]);
    check_conv(h, w, oh, ow)?;
    let img = img.as_slice().ok_or_else(not_contiguous)?;
    let k = k.as_slice().ok_or_else(not_contiguous)?;
    let out = out.as_slice_mut().ok_or_else(not_contiguous)?;
    conv5_slices(img, w, k, out, ow);
    Ok(())
}

/// `strided_sum` with `#[order(c)]`: a transposed input is not C-ordered, so
/// the boundary converts it (a C-order copy) before the body sees a slice.
#[dlpack_fn]
#[pyfunction]
fn dlcast_sum_slices_c(
    #[shape(n, m)]
    #[order(c)]
    x: TensorRef<'_, f64>,
) -> PyResult<f64> {
    let s = x.as_slice().ok_or_else(not_contiguous)?;
    let mut acc = 0.0f64;
    for &v in s {
        acc += v;
    }
    Ok(acc)
}

/// `strided_sum` with `#[order(f)]`: the transposed input as it is; the
/// transpose of the view (`t()`) is C-ordered, read as a slice of `m`
/// columns of `n` in the body's index order (row `i` of every column, then
/// row `i + 1`).
#[dlpack_fn]
#[pyfunction]
fn dlcast_sum_slices_f(
    #[shape(n, m)]
    #[order(f)]
    x: TensorRef<'_, f64>,
) -> PyResult<f64> {
    let n = x.shape()[0];
    let xt = x.t();
    let s = xt.as_slice().ok_or_else(not_contiguous)?;
    Ok(sum_columns(s, n))
}

/// The sum of the `(n, m)` array whose columns are `s`'s chunks of `n`, in
/// C index order.
#[inline(never)]
fn sum_columns(s: &[f64], n: usize) -> f64 {
    if n == 0 {
        return 0.0;
    }
    let cols: Vec<&[f64]> = s.chunks_exact(n).collect();
    let mut acc = 0.0f64;
    for i in 0..n {
        for c in &cols {
            acc += c[i];
        }
    }
    acc
}

// ---------------------------------------------- dlcast: indexed access

/// Rank-typed indexing: `TensorRef<'_, f32, 2>` with `get([i, j])?`, whose
/// out-of-range failure is an `IndexError` naming the parameter.
mod rank_typed {
    use super::*;

    #[dlpack_fn]
    #[pyfunction]
    pub fn dlcast_conv5_indexed(
        #[shape(h, w)] img: TensorRef<'_, f32, 2>,
        #[shape(5, 5)] k: TensorRef<'_, f32, 2>,
        #[shape(oh, ow)] mut out: TensorMut<'_, f32, 2>,
    ) -> PyResult<()> {
        let [h, w] = img.dims();
        let [oh, ow] = out.dims();
        check_conv(h, w, oh, ow)?;
        for i in 0..oh {
            for j in 0..ow {
                let mut acc = 0.0f32;
                for di in 0..5 {
                    for dj in 0..5 {
                        acc += img.get([i + di, j + dj])? * k.get([di, dj])?;
                    }
                }
                out.set([i, j], acc)?;
            }
        }
        Ok(())
    }

    #[dlpack_fn]
    #[pyfunction]
    pub fn dlcast_sum_indexed(#[shape(n, m)] x: TensorRef<'_, f64, 2>) -> PyResult<f64> {
        let [n, m] = x.dims();
        let mut acc = 0.0f64;
        for i in 0..n {
            for j in 0..m {
                acc += x.get([i, j])?;
            }
        }
        Ok(acc)
    }
}

// ------------------------------------------------------ dlcast: ndarray

#[dlpack_fn]
#[pyfunction]
fn dlcast_conv5_ndarray(
    #[shape(h, w)] img: ArrayView2<'_, f32>,
    #[shape(5, 5)] k: ArrayView2<'_, f32>,
    #[shape(oh, ow)] out: ArrayViewMut2<'_, f32>,
) -> PyResult<()> {
    let (h, w) = img.dim();
    let (oh, ow) = out.dim();
    check_conv(h, w, oh, ow)?;
    conv5_nd(img, k, out);
    Ok(())
}

#[dlpack_fn]
#[pyfunction]
fn dlcast_sum_ndarray(x: ArrayView2<'_, f64>) -> f64 {
    sum_nd(x)
}

// ----------------------------------------------------------- rust-numpy

#[pyfunction]
fn rnp_conv5(
    img: PyReadonlyArray2<'_, f32>,
    k: PyReadonlyArray2<'_, f32>,
    mut out: PyReadwriteArray2<'_, f32>,
) -> PyResult<()> {
    if k.shape() != [5, 5] {
        return Err(PyTypeError::new_err("expected a (5, 5) kernel"));
    }
    let (h, w) = (img.shape()[0], img.shape()[1]);
    let (oh, ow) = (out.shape()[0], out.shape()[1]);
    check_conv(h, w, oh, ow)?;
    conv5_nd(img.as_array(), k.as_array(), out.as_array_mut());
    Ok(())
}

#[pyfunction]
fn rnp_strided_sum(x: PyReadonlyArray2<'_, f64>) -> f64 {
    sum_nd(x.as_array())
}

/// Registers the body functions.
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(dlcast_conv5_slices, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_sum_slices_c, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_sum_slices_f, m)?)?;
    m.add_function(wrap_pyfunction!(rank_typed::dlcast_conv5_indexed, m)?)?;
    m.add_function(wrap_pyfunction!(rank_typed::dlcast_sum_indexed, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_conv5_ndarray, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_sum_ndarray, m)?)?;
    m.add_function(wrap_pyfunction!(rnp_conv5, m)?)?;
    m.add_function(wrap_pyfunction!(rnp_strided_sum, m)?)?;
    Ok(())
}
