//! Functions and a class whose stubs say what the call enforces (the
//! generated stub's `mypy --strict` check, tests/typing, and
//! tests/python/test_stubgen.py): the rank a parameter's type fixes, a
//! `like(x)` return, a NumPy return of fixed rank and dtype, a `dlcast.Array`
//! return of fixed rank, and the plain methods and `#[new]` of a class with
//! dlcast methods.

use dlcast_runtime::ndarray::ArrayView2;
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

/// The sums of the rows of a 2-d float32 array, in the caller's framework.
#[dlpack_fn(returns = like(x))]
#[pyfunction]
fn st_row_sums(x: ArrayView2<'_, f32>) -> PyResult<Tensor<f32>> {
    let sums: Vec<f32> = x.rows().into_iter().map(|r| r.sum()).collect();
    Ok(Tensor::from_vec(sums, &[x.nrows()])?)
}

/// The 2-d view `x` itself, as NumPy.
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn st_same_matrix(x: TensorRef<'_, f64, 2>) -> TensorRef<'_, f64, 2> {
    x
}

/// The 2-d view `x` itself, as a `dlcast.Array`: its `shape` has two
/// dimensions in the stub.
#[dlpack_fn(returns = dlcast)]
#[pyfunction]
fn st_same_matrix_dlcast(x: TensorRef<'_, f64, 2>) -> TensorRef<'_, f64, 2> {
    x
}

/// The 2-d view `x` itself, like `x` (the default return): an argument of
/// no framework (a buffer) gets a 2-d NumPy array.
#[dlpack_fn]
#[pyfunction]
fn st_same_matrix_like(x: TensorRef<'_, f64, 2>) -> TensorRef<'_, f64, 2> {
    x
}

/// A scale factor whose `apply` takes arrays.
#[pyclass(module = "dlcast_testext")]
pub struct StScaler {
    k: f64,
}

#[dlpack_fn]
#[pymethods]
impl StScaler {
    /// A scaler by `k`.
    #[new]
    #[pyo3(signature = (k = 1.0))]
    fn new(k: f64) -> Self {
        StScaler { k }
    }

    /// `k` times `v` (a plain method).
    fn scale(&self, v: f64) -> f64 {
        self.k * v
    }

    /// The factor.
    #[getter]
    fn k(&self) -> f64 {
        self.k
    }

    /// `k` times the sum of `x`.
    fn apply(&self, x: TensorRef<'_, f64, 1>) -> PyResult<f64> {
        Ok(self.k * x.iter()?.sum::<f64>())
    }
}

pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(st_row_sums, m)?)?;
    m.add_function(wrap_pyfunction!(st_same_matrix, m)?)?;
    m.add_function(wrap_pyfunction!(st_same_matrix_dlcast, m)?)?;
    m.add_function(wrap_pyfunction!(st_same_matrix_like, m)?)?;
    m.add_class::<StScaler>()?;
    Ok(())
}
