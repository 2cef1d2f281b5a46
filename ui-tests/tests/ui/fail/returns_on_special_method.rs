// `returns = ..` on a special method whose result Python fixes (`__len__`,
// `__contains__`) or on a setter would be ignored: it is refused.
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[pyclass]
struct Layer;

#[dlcast::pymethods]
impl Layer {
    #[dlcast(returns = numpy)]
    fn __contains__(&self, x: TensorRef<'_, f32>) -> bool {
        x.is_empty()
    }
}

fn main() {}
