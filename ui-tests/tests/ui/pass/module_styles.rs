// Every spelling in both module styles: `#[dlcast::pyfunction]` registered by
// `wrap_pyfunction!` or, from an inline `#[pymodule] mod`, by
// `#[pymodule_export] use`; `#[dlpack_fn]` above `#[pyfunction]` inside the
// inline module; `#[dlcast::pymethods]` on a class of the inline module; and
// `#[dlcast::pyfunction]` inside a function body.
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlcast::pyfunction]
fn total(x: TensorRef<'_, f32>) -> PyResult<f32> {
    Ok(x.iter()?.sum())
}

#[dlcast::pyfunction]
fn count(x: TensorRef<'_, f32>) -> usize {
    x.len()
}

#[pymodule(gil_used = true)]
fn function_style(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(total, m)?)?;
    m.add_function(wrap_pyfunction!(count, m)?)
}

#[pymodule(gil_used = true)]
mod inline_style {
    use dlcast_runtime::prelude::*;
    use pyo3::prelude::*;

    #[pymodule_export]
    use super::total;

    #[dlpack_fn]
    #[pyfunction]
    fn first(x: TensorRef<'_, f32>) -> PyResult<f32> {
        Ok(x.iter()?.next().unwrap_or(0.0))
    }

    #[pyclass]
    struct Layer;

    #[dlcast::pymethods]
    impl Layer {
        fn __call__<'a>(&self, x: TensorRef<'a, f32>) -> TensorRef<'a, f32> {
            x
        }
    }
}

fn main() {
    #[dlcast::pyfunction]
    fn local(x: TensorRef<'_, f32>) -> usize {
        x.len()
    }
    let _ = local;
}
