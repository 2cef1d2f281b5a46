//! Objects whose `ArrayBuffer` is exported while Rust writes it: a
//! read-only view that goes to TensorFlow (whose tensors are immutable)
//! while `with_mut` sorts the data, and a buffer under rust-numpy's own
//! borrow table. For tests/python/test_ownership.py and
//! test_rust_numpy.py.

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

/// An `ArrayBuffer<f64>` (rust-numpy's test extension takes `f64`) whose
/// read-only NumPy view Rust rewrites in bulk.
#[pyclass(module = "dlcast_testext")]
pub struct RoF64Buf {
    data: ArrayBuffer<f64>,
}

#[dlpack_fn]
#[pymethods]
impl RoF64Buf {
    #[new]
    fn new(n: usize) -> PyResult<Self> {
        Ok(RoF64Buf {
            data: ArrayBuffer::zeros(&[n])?,
        })
    }

    /// The read-only view, as NumPy.
    #[dlpack_fn(returns = numpy)]
    fn view_ro(slf: &Bound<'_, Self>) -> PyResult<Tensor<f64>> {
        slf.try_borrow()?.data.view_read_only(slf)
    }

    /// `fill(v)`.
    fn fill(&self, py: Python<'_>, v: f64) -> PyResult<()> {
        self.data.fill(py, v)
    }

    /// `with_mut`, every element set to `v`.
    fn fill_mut(&mut self, py: Python<'_>, v: f64) -> PyResult<()> {
        self.data.with_mut(py, |s| s.fill(v))
    }
}

/// Registers the classes above.
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<TfBuf>()?;
    m.add_class::<RoF64Buf>()
}
