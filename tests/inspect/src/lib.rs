//! A small extension written as a `#[pymodule] mod`, built with
//! `dlcast-runtime`'s `inspect` feature: `maturin generate-stubs` writes its
//! stub from PyO3's introspection, which reads the hints `#[dlpack_fn]`
//! gives (tests/typing/check.py type-checks that stub, and dlcast's own).

use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

/// The sum of a float32 array: `#[dlcast::pyfunction]` outside the module,
/// exported into it by `#[pymodule_export] use` (inside a `#[pymodule] mod`
/// PyO3 would not see it, and dlcast refuses it there).
#[dlcast::pyfunction(returns = numpy)]
fn doubled(x: TensorRef<'_, f32, 1>) -> PyResult<Tensor<f32>> {
    Ok(Tensor::from(x.iter()?.map(|v| 2.0 * v).collect::<Vec<_>>()))
}

#[pymodule]
mod dlcast_inspect_ext {
    use dlcast_runtime::ndarray::ArrayView2;
    use dlcast_runtime::prelude::*;
    use pyo3::prelude::*;

    #[pymodule_export]
    use super::doubled;

    /// The sum of the rows of `points` weighted by `weights`.
    #[dlpack_fn]
    #[pyfunction]
    fn weighted_total(
        #[shape(n, 3)] points: TensorRef<'_, f32>,
        #[shape(n)] weights: TensorRef<'_, f32>,
    ) -> PyResult<f64> {
        let (p, w) = (points.to_vec()?, weights.to_vec()?);
        Ok(p.chunks(3)
            .zip(&w)
            .map(|(row, k)| row.iter().map(|v| f64::from(*v * *k)).sum::<f64>())
            .sum())
    }

    /// The 2-d view `x` itself, as NumPy.
    #[dlpack_fn(returns = numpy)]
    #[pyfunction]
    fn same_matrix(x: TensorRef<'_, f64, 2>) -> TensorRef<'_, f64, 2> {
        x
    }

    /// `n` ones as a PyTorch tensor, scaled by `k` (the user's own
    /// signature, with a default).
    #[dlpack_fn(returns = torch)]
    #[pyfunction]
    #[pyo3(signature = (like, k = 1.0))]
    fn ones_torch(like: Option<TensorDyn<'_>>, k: f32) -> PyResult<Tensor<f32>> {
        let n = like.map_or(1, |x| x.shape().iter().product());
        Ok(Tensor::from_vec(vec![k; n], &[n])?)
    }

    /// The sums of the rows of a 2-d float32 array, in the caller's framework.
    #[dlpack_fn(returns = like(x))]
    #[pyfunction]
    fn row_sums(x: ArrayView2<'_, f32>) -> PyResult<Tensor<f32>> {
        let sums: Vec<f32> = x.rows().into_iter().map(|r| r.sum()).collect();
        Ok(Tensor::from_vec(sums, &[x.nrows()])?)
    }

    /// A scale factor.
    #[pyclass]
    struct Scaler {
        k: f64,
    }

    #[dlpack_fn]
    #[pymethods]
    impl Scaler {
        #[new]
        fn new(k: f64) -> Self {
            Scaler { k }
        }

        /// `k` times the sum of `x`.
        fn apply(&self, x: TensorRef<'_, f64, 1>) -> PyResult<f64> {
            Ok(self.k * x.iter()?.sum::<f64>())
        }

        /// `k` times `v`.
        fn scale(&self, v: f64) -> f64 {
            self.k * v
        }

        /// The 1-d input itself, as NumPy: a layer's call, typed in both
        /// stubs.
        #[dlcast(returns = numpy)]
        fn __call__<'a>(&self, x: TensorRef<'a, f64, 1>) -> TensorRef<'a, f64, 1> {
            x
        }
    }
}
