//! Functions written with `#[dlcast::pyfunction]` / `#[dlcast::pymethods]`
//! (PyO3's attribute and dlcast's in one), and the default framework of
//! returned arrays (tests/python/test_returns.py).

use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

/// The sum of a float32 array, under the one attribute.
#[dlcast::pyfunction]
fn fh_total(x: TensorRef<'_, f32>) -> PyResult<f32> {
    Ok(x.to_vec()?.iter().sum())
}

/// The first `n` elements, copied: PyO3's options (`name`, `signature`)
/// and none of dlcast's, so the result is like `x`.
#[dlcast::pyfunction(name = "fh_first_n", signature = (x, n = 2))]
fn fh_head(x: TensorRef<'_, f64>, n: usize) -> PyResult<Tensor<f64>> {
    Ok(Tensor::from(
        x.to_vec()?.into_iter().take(n).collect::<Vec<_>>(),
    ))
}

/// `x` itself, exported zero-copy: like `x` by default.
#[dlcast::pyfunction]
fn fh_view(x: TensorRef<'_, f64>) -> TensorRef<'_, f64> {
    x
}

/// A new array from no array argument: NumPy by default.
#[dlcast::pyfunction]
fn fh_zeros(n: usize) -> Tensor<f32> {
    Tensor::from(vec![0.0f32; n])
}

/// `x` copied, with its length: the tuple's array is like `x`.
#[dlcast::pyfunction]
fn fh_pair(x: TensorRef<'_, f32>) -> PyResult<(Tensor<f32>, usize)> {
    Ok((Tensor::from(x.to_vec()?), x.len()))
}

/// Like `fh_pair`'s copy, but the first array parameter is optional and
/// the second required: the required one decides.
#[dlcast::pyfunction]
fn fh_second(a: Option<TensorRef<'_, f32>>, b: TensorRef<'_, f32>) -> PyResult<Tensor<f32>> {
    let _ = a;
    Ok(Tensor::from(b.to_vec()?))
}

/// `returns = dlcast` with PyO3's `name`: the plain `dlcast.Array`.
#[dlcast::pyfunction(returns = dlcast, name = "fh_plain")]
fn fh_plain_rs_name(x: TensorRef<'_, f32>) -> PyResult<Tensor<f32>> {
    Ok(Tensor::from(x.to_vec()?))
}

/// `noconvert` through the one attribute: a float64 array is refused.
#[dlcast::pyfunction(noconvert)]
fn fh_strict(x: TensorRef<'_, f32>) -> usize {
    x.len()
}

/// `&[u8]` under PyO3's attribute alone: PyO3 takes it (`bytes` only).
#[pyfunction]
fn fh_bytes_only(x: &[u8]) -> usize {
    x.len()
}

/// A class whose methods use the one attribute on the impl block.
#[pyclass]
struct FhScale(f32);

#[dlcast::pymethods]
impl FhScale {
    #[new]
    fn new(k: f32) -> Self {
        FhScale(k)
    }

    /// `x * k`, like `x`.
    fn apply(&self, x: TensorRef<'_, f32>) -> PyResult<Tensor<f32>> {
        Ok(Tensor::from(
            x.to_vec()?.iter().map(|v| v * self.0).collect::<Vec<_>>(),
        ))
    }

    /// `x * k`, a `dlcast.Array`, under its Python name `raw`.
    #[dlcast(returns = dlcast)]
    #[pyo3(name = "raw")]
    fn apply_raw(&self, x: TensorRef<'_, f32>) -> PyResult<Tensor<f32>> {
        self.apply_rs(x)
    }
}

/// Returns what `f()` returns, with `returns = numpy`: the exported arrays
/// in it go to NumPy; a container Python code built comes back whole
/// (test_returns.py).
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn fh_callback_result_numpy(x: TensorRef<'_, f64>, f: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    drop(x);
    Ok(f.call0()?.unbind())
}

/// A layer, as a class is written for it: `__call__` and the operators are
/// converted as any method (tests/python/test_special_methods.py), and the
/// weights, kept as an `ArrayHandle` with annotations, are checked at each
/// borrow (tests/python/test_stored_arrays.py).
#[pyclass]
struct FhLayer {
    k: f32,
    weights: Option<ArrayHandle<f32>>,
}

#[dlcast::pymethods]
impl FhLayer {
    #[new]
    #[pyo3(signature = (k, weights = None))]
    fn new(k: f32, #[shape(n, 2)] weights: Option<ArrayHandle<f32>>) -> Self {
        FhLayer { k, weights }
    }

    /// The input itself, exported zero-copy: like the input.
    fn __call__<'a>(&self, x: TensorRef<'a, f32>) -> TensorRef<'a, f32> {
        x
    }

    /// `x * k`, always NumPy.
    #[dlcast(returns = numpy)]
    fn __matmul__(&self, x: TensorRef<'_, f32>) -> PyResult<Tensor<f32>> {
        Ok(Tensor::from(
            x.to_vec()?.iter().map(|v| v * self.k).collect::<Vec<_>>(),
        ))
    }

    /// `x * k`, like `x`.
    fn __rmul__(&self, x: TensorRef<'_, f32>) -> PyResult<Tensor<f32>> {
        self.__matmul___rs(x)
    }

    /// Whether `x` has as many elements as `k` says: a result Python fixes.
    fn __contains__(&self, x: TensorRef<'_, f32>) -> bool {
        x.len() == self.k as usize
    }

    /// The sum of the stored weights, as they are now.
    fn weights_sum(&self, py: Python<'_>) -> PyResult<f32> {
        match &self.weights {
            Some(w) => Ok(w.borrow(py)?.iter()?.sum()),
            None => Ok(0.0),
        }
    }

    /// Stores other weights: any number of rows of 2, on the CPU, C order.
    fn store(
        &mut self,
        #[shape(_, 2)]
        #[order(c)]
        weights: ArrayHandle<f32>,
    ) {
        self.weights = Some(weights);
    }
}

/// The sum of the array `w` names, checked as `#[shape(3)]` when it is
/// borrowed, not when it is passed (a free function's annotated handle).
#[dlcast::pyfunction]
fn fh_handle_sum(py: Python<'_>, #[shape(3)] w: ArrayHandle<f64>) -> PyResult<f64> {
    Ok(w.borrow(py)?.iter()?.sum())
}

pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<FhLayer>()?;
    m.add_function(wrap_pyfunction!(fh_handle_sum, m)?)?;
    m.add_function(wrap_pyfunction!(fh_total, m)?)?;
    m.add_function(wrap_pyfunction!(fh_head, m)?)?;
    m.add_function(wrap_pyfunction!(fh_view, m)?)?;
    m.add_function(wrap_pyfunction!(fh_zeros, m)?)?;
    m.add_function(wrap_pyfunction!(fh_pair, m)?)?;
    m.add_function(wrap_pyfunction!(fh_second, m)?)?;
    m.add_function(wrap_pyfunction!(fh_plain_rs_name, m)?)?;
    m.add_function(wrap_pyfunction!(fh_strict, m)?)?;
    m.add_function(wrap_pyfunction!(fh_bytes_only, m)?)?;
    m.add_function(wrap_pyfunction!(fh_callback_result_numpy, m)?)?;
    m.add_class::<FhScale>()?;
    Ok(())
}
