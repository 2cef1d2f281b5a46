//! Overlapping windows of a read-only view (`TensorRef::sliding_windows`,
//! `TensorDyn::sliding_windows`) and an owned result whose type fixes its
//! rank (`Tensor<T, N>`): tests/python/test_windows.py.

use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

/// The sum of each window of `window` samples, one every `step`: framing
/// borrows `x` (`x.view()`), so the body reads the frames in place.
#[dlpack_fn]
#[pyfunction]
fn win_sums(x: TensorRef<'_, f32, 1>, window: usize, step: usize) -> PyResult<Vec<f32>> {
    let frames = x
        .view()
        .sliding_windows(0, window, step)?
        .into_rank::<2>()?;
    let [count, len] = frames.dims();
    let mut sums = Vec::with_capacity(count);
    for c in 0..count {
        let mut s = 0.0;
        for w in 0..len {
            s += frames.get([c, w])?;
        }
        sums.push(s);
    }
    Ok(sums)
}

/// The windows view itself, returned: exported in place (the caller's
/// memory, read-only).
#[dlpack_fn]
#[pyfunction]
fn win_frames(
    x: TensorRef<'_, f32>,
    axis: usize,
    window: usize,
    step: usize,
) -> PyResult<TensorRef<'_, f32>> {
    Ok(x.sliding_windows(axis, window, step)?)
}

/// The windows of a 1-d signal as a 2-d view, handed to NumPy.
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn win_frames_numpy(
    x: TensorRef<'_, f64, 1>,
    window: usize,
    step: usize,
) -> PyResult<TensorRef<'_, f64, 2>> {
    Ok(x.sliding_windows(0, window, step)?.into_rank::<2>()?)
}

/// The windows of an array of any dtype (the untyped view).
#[dlpack_fn]
#[pyfunction]
fn win_frames_dyn(
    x: TensorDyn<'_>,
    axis: usize,
    window: usize,
    step: usize,
) -> PyResult<TensorDyn<'_>> {
    Ok(x.sliding_windows(axis, window, step)?)
}

/// The windows of `x` returned like `like` (`returns = like(like)`): a
/// read-only view handed to `like`'s framework.
#[dlpack_fn(returns = like(like))]
#[pyfunction]
fn win_frames_like<'a>(
    x: TensorRef<'a, f32, 1>,
    like: TensorDyn<'_>,
    window: usize,
    step: usize,
) -> PyResult<TensorRef<'a, f32>> {
    let _ = like;
    Ok(x.sliding_windows(0, window, step)?)
}

/// The windows of `x` (step 1) and of `y` (step `window`), in a tuple and
/// a list (the default return).
#[dlpack_fn]
#[pyfunction]
#[allow(clippy::type_complexity)]
fn win_frames_nested<'a>(
    x: TensorRef<'a, f32, 1>,
    y: TensorRef<'a, f32, 1>,
    window: usize,
) -> PyResult<(TensorRef<'a, f32>, Vec<TensorRef<'a, f32>>)> {
    let a = x.sliding_windows(0, window, 1)?;
    let b = y.sliding_windows(0, window, window)?;
    Ok((a, vec![b]))
}

/// The windows view to PyTorch (`returns = torch`).
#[dlpack_fn(returns = torch)]
#[pyfunction]
fn win_frames_torch(
    x: TensorRef<'_, f32, 1>,
    window: usize,
    step: usize,
) -> PyResult<TensorRef<'_, f32>> {
    Ok(x.sliding_windows(0, window, step)?)
}

/// The windows copied into an owned 2-d tensor: its rank is in the type,
/// and so in the signature line.
#[dlpack_fn]
#[pyfunction]
fn win_frames_owned(
    x: TensorRef<'_, f32, 1>,
    window: usize,
    step: usize,
) -> PyResult<Tensor<f32, 2>> {
    let frames = x.sliding_windows(0, window, step)?;
    let t = Tensor::from_vec(frames.to_vec()?, frames.shape())?;
    Ok(t.into_rank::<2>()?)
}

/// `Tensor::into_rank::<2>()` of a 1-d tensor: a `TypeError`.
#[dlpack_fn]
#[pyfunction]
fn win_wrong_rank(n: usize) -> PyResult<Tensor<f32, 2>> {
    Ok(Tensor::<f32>::zeros(&[n])?.into_rank::<2>()?)
}

pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    macro_rules! add {
        ($($f:ident),* $(,)?) => {$( m.add_function(wrap_pyfunction!($f, m)?)?; )*};
    }
    add!(
        win_sums,
        win_frames,
        win_frames_numpy,
        win_frames_dyn,
        win_frames_owned,
        win_wrong_rank,
        win_frames_like,
        win_frames_nested,
        win_frames_torch,
    );
    Ok(())
}
