use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[pyclass]
struct C;

#[pymethods]
#[dlpack_fn]
impl C {
    fn m(&self, x: TensorRef<'_, f32>) -> usize {
        x.len()
    }
}

fn main() {}
