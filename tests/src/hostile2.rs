//! A second hostile review of the bulk writes of `ArrayBuffer`, static
//! data and the default return: an object whose read-only buffer view goes
//! to TensorFlow, whose data `with_mut` sorts. For
//! tests/python/test_ownership.py.

use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

/// An `ArrayBuffer<f32>` whose read-only view goes to TensorFlow (whose
/// tensors are immutable) and that Rust rewrites through `with_mut`.
#[pyclass(module = "dlcast_testext")]
pub struct TfBuf {
    data: ArrayBuffer<f32>,
}

#[dlpack_fn]
#[pymethods]
impl TfBuf {
    #[new]
    fn new(n: usize) -> PyResult<Self> {
        Ok(TfBuf {
            data: ArrayBuffer::zeros(&[n])?,
        })
    }

    /// The read-only view, to TensorFlow.
    #[dlpack_fn(returns = tensorflow)]
    fn frozen_tf(slf: &Bound<'_, Self>) -> PyResult<Tensor<f32>> {
        slf.try_borrow()?.data.view_read_only(slf)
    }

    /// The read-only view, to the framework of `like` (the default
    /// return: the first array argument's framework).
    fn frozen_like(slf: &Bound<'_, Self>, like: TensorDyn<'_>) -> PyResult<Tensor<f32>> {
        let _ = like;
        slf.try_borrow()?.data.view_read_only(slf)
    }

    /// `set([i], v)`, allowed while exports live.
    fn set(&self, py: Python<'_>, i: usize, v: f32) -> PyResult<()> {
        self.data.set(py, &[i], v)
    }

    /// Sorts in descending order through `with_mut` (refused while a
    /// writable export lives); returns the largest.
    fn sort_desc(&mut self, py: Python<'_>) -> PyResult<f32> {
        self.data.with_mut(py, |s| {
            s.sort_by(|a, b| b.total_cmp(a));
            s.first().copied().unwrap_or(0.0)
        })
    }

    /// `(exports, writable exports)`.
    fn exports(&self) -> (usize, usize) {
        (self.data.exports(), self.data.writable_exports())
    }
}

/// Registers the class above.
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<TfBuf>()
}
