// A misspelled annotation is refused with the one it resembles.
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlcast::pyfunction]
fn total(#[shap(n)] x: TensorRef<'_, f32>) -> PyResult<f32> {
    Ok(x.iter()?.sum())
}

fn main() {}
