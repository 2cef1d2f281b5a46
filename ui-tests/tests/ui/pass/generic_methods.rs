use dlcast_runtime::prelude::*;
use pyo3::prelude::*;
use pyo3::types::PyType;

#[dlpack_fn(noconvert)]
#[pyfunction]
fn sum_any<T: Element + Into<f64>>(#[dtype(f32, i32, u8)] x: TensorRef<'_, T>) -> PyResult<f64> {
    Ok(x.to_vec()?.into_iter().map(Into::into).sum())
}

#[dlpack_fn]
#[pyfunction]
#[pyo3(signature = (a, b = None, _c = None, *, k = 1))]
fn pair<'a, A: Element>(
    #[dtype(f32, f64)] a: TensorRef<'a, A>,
    b: Option<TensorRef<'_, A>>,
    #[noconvert] _c: Option<TensorDyn<'_>>,
    k: usize,
) -> TensorRef<'a, A> {
    let _ = (b, k);
    a
}

#[pyclass]
struct C {
    n: usize,
}

#[dlpack_fn]
#[pymethods]
impl C {
    #[new]
    fn new() -> Self {
        C { n: 0 }
    }

    fn add(&mut self, #[shape(n, 3)] x: TensorRef<'_, f32>) -> usize {
        self.n += x.len();
        self.n
    }

    #[staticmethod]
    fn count<T: Element>(#[dtype(f32, f64)] x: TensorMut<'_, T>) -> usize {
        x.len()
    }

    #[classmethod]
    fn make(_cls: &Bound<'_, PyType>, py: Python<'_>, x: TensorRef<'_, u8>) -> PyResult<Self> {
        let _ = py;
        Ok(C { n: x.len() })
    }

    #[dlpack_fn(returns = numpy)]
    fn echo<'a>(&self, x: TensorRef<'a, f32>) -> TensorRef<'a, f32> {
        x
    }

    fn plain(&self) -> usize {
        self.n
    }
}

fn main() {}
