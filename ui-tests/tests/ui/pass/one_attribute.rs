// `#[dlcast::pyfunction]` / `#[dlcast::pymethods]`: PyO3's attribute and
// dlcast's in one, options of both split by name, with the prelude alone.
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlcast::pyfunction]
fn total(x: TensorRef<'_, f32>) -> PyResult<f32> {
    Ok(x.to_vec()?.iter().sum())
}

#[dlcast::pyfunction(name = "head", returns = numpy, signature = (x, n = 2))]
fn first(x: TensorRef<'_, f32>, n: usize) -> PyResult<Tensor<f32>> {
    Ok(Tensor::from(x.to_vec()?.into_iter().take(n).collect::<Vec<_>>()))
}

#[dlcast_runtime::pyfunction(noconvert, returns = dlcast)]
fn same(x: TensorDyn<'_>) -> TensorDyn<'_> {
    x
}

#[pyclass]
struct Scale(f32);

#[dlcast::pymethods]
impl Scale {
    #[new]
    fn new(k: f32) -> Self {
        Scale(k)
    }

    #[dlcast(returns = torch)]
    fn apply(&self, x: TensorRef<'_, f32>) -> PyResult<Tensor<f32>> {
        Ok(Tensor::from(x.to_vec()?.iter().map(|v| v * self.0).collect::<Vec<_>>()))
    }

    #[pyo3(name = "count")]
    fn len(&self, x: &[f32]) -> usize {
        x.len()
    }
}

#[pyclass]
struct Counter;

// A block-wide `returns` skips the methods that return no array.
#[dlcast::pymethods(returns = numpy)]
impl Counter {
    fn len(&self, x: TensorRef<'_, f32>) -> usize {
        x.len()
    }

    fn copy(&self, x: TensorRef<'_, f32>) -> PyResult<Tensor<f32>> {
        Ok(Tensor::from(x.to_vec()?))
    }
}

#[pymodule]
fn one_attribute(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(total, m)?)?;
    m.add_function(wrap_pyfunction!(first, m)?)?;
    m.add_function(wrap_pyfunction!(same, m)?)?;
    m.add_class::<Scale>()?;
    m.add_class::<Counter>()?;
    Ok(())
}

fn main() {}
