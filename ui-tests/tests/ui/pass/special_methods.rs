// Special methods that return any object (`__call__`, `__getitem__`, the
// operators) are converted as any method: a view of an argument can be
// returned, `returns = ..` applies; those whose result Python fixes
// (`__len__`, `__contains__`) return the body's value as it is.
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[pyclass]
struct Layer {
    k: f32,
}

#[dlcast::pymethods]
impl Layer {
    /// The input itself.
    fn __call__<'a>(&self, x: TensorRef<'a, f32>) -> TensorRef<'a, f32> {
        x
    }

    #[dlcast(returns = torch)]
    fn __getitem__(&self, x: TensorRef<'_, f32>) -> PyResult<Tensor<f32>> {
        Ok(Tensor::from(x.to_vec()?))
    }

    fn __neg__(&self) -> f32 {
        -self.k
    }

    fn __radd__(&self, x: TensorRef<'_, f32>) -> PyResult<(Tensor<f32>, usize)> {
        Ok((Tensor::from(x.to_vec()?), x.len()))
    }

    fn __contains__(&self, x: TensorRef<'_, f32>) -> bool {
        x.len() == self.k as usize
    }

    fn __len__(&self) -> usize {
        self.k as usize
    }
}

// A block-wide `returns` skips the methods whose result Python fixes.
#[pyclass]
struct Strict;

#[dlcast::pymethods(returns = numpy)]
impl Strict {
    fn __call__(&self, x: TensorRef<'_, f32>) -> PyResult<Tensor<f32>> {
        Ok(Tensor::from(x.to_vec()?))
    }

    fn __contains__(&self, x: TensorRef<'_, f32>) -> bool {
        x.is_empty()
    }
}

fn main() {}
