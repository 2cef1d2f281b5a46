// `#[shape]`, `#[device]` and `#[order]` on an `ArrayHandle` parameter, or a
// rank in its type: checked when the argument is passed and at each borrow.
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[pyclass]
struct Layer {
    weights: ArrayHandle<f32>,
    bias: Option<ArrayHandle<f32>>,
}

#[dlcast::pymethods]
impl Layer {
    #[new]
    #[pyo3(signature = (weights, bias = None))]
    fn new(
        #[shape(n, 3)] weights: ArrayHandle<f32>,
        #[shape(n)] #[device(cpu)] bias: Option<ArrayHandle<f32>>,
    ) -> Self {
        Layer { weights, bias }
    }

    fn store(&mut self, #[order(c)] weights: ArrayHandle<f32>, x: TensorRef<'_, f32>) -> usize {
        self.weights = weights;
        x.len()
    }

    fn total(&self, py: Python<'_>) -> PyResult<f32> {
        let b: f32 = match &self.bias {
            Some(b) => b.borrow(py)?.iter()?.sum(),
            None => 0.0,
        };
        Ok(self.weights.borrow(py)?.iter()?.sum::<f32>() + b)
    }
}

#[dlpack_fn]
#[pyfunction]
fn sum3(py: Python<'_>, #[shape(3)] w: ArrayHandle<f64>) -> PyResult<f64> {
    Ok(w.borrow(py)?.iter()?.sum())
}

/// A rank-typed handle: its borrows are 2-d views (`dims()`, `get([i, j])`);
/// `..` in its `#[shape]` stands for the axes the others leave.
#[dlcast::pyfunction]
fn corner(py: Python<'_>, #[shape(.., 3)] m: ArrayHandle<f64, 2>) -> PyResult<f64> {
    let m = m.borrow(py)?;
    let [rows, _] = m.dims();
    Ok(if rows == 0 { 0.0 } else { m.get([0, 2])? })
}

fn main() {}
