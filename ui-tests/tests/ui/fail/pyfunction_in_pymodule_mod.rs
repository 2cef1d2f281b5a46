// Inside a `#[pymodule] mod`, PyO3 registers the functions whose attribute it
// recognises before any other attribute expands: `#[dlcast::pyfunction]` is
// not one of them, so the function would be silently left out of the
// module. dlcast refuses it and names the spelling PyO3 sees.
use pyo3::prelude::*;

#[pymodule]
mod ext {
    use dlcast_runtime::prelude::*;
    use pyo3::prelude::*;

    #[dlcast::pyfunction]
    fn total(x: TensorRef<'_, f32>) -> PyResult<f32> {
        Ok(x.iter()?.sum())
    }

    // The two attributes: registered.
    #[dlpack_fn]
    #[pyfunction]
    fn first(x: TensorRef<'_, f32>) -> PyResult<f32> {
        Ok(x.iter()?.next().unwrap_or(0.0))
    }
}

fn main() {}
