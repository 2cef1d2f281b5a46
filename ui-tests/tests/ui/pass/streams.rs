use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn(stream = per_thread)]
#[pyfunction]
fn per_thread(#[device(cuda)] x: TensorRef<'_, f32>) -> Option<i64> {
    x.stream()
}

#[dlpack_fn(returns = torch, stream = no_sync)]
#[pyfunction]
fn no_sync(#[device(cuda, rocm)] x: TensorDyn<'_>) -> TensorDyn<'_> {
    x
}

#[dlpack_fn]
#[pyfunction]
#[pyo3(signature = (x, stream=None))]
fn handle(#[device(cuda)] x: TensorRef<'_, f32>, #[stream] stream: Option<usize>) -> Option<i64> {
    let _ = stream;
    x.stream()
}

#[dlpack_fn(stream = legacy)]
#[pyfunction]
fn handle_and_option(#[device(cuda)] x: TensorMut<'_, f32>, #[stream] stream: i64) -> i64 {
    stream + x.len() as i64
}

#[pymodule]
fn streams_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(per_thread, m)?)?;
    m.add_function(wrap_pyfunction!(no_sync, m)?)?;
    m.add_function(wrap_pyfunction!(handle, m)?)?;
    m.add_function(wrap_pyfunction!(handle_and_option, m)?)?;
    Ok(())
}

fn main() {}
