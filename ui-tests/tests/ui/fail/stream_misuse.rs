use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn(stream = default_stream)]
#[pyfunction]
fn unknown_stream(#[device(cuda)] x: TensorRef<'_, f32>) -> usize {
    x.len()
}

#[dlpack_fn]
#[pyfunction]
fn stream_on_array(#[stream] #[device(cuda)] x: TensorRef<'_, f32>) -> usize {
    x.len()
}

#[dlpack_fn]
#[pyfunction]
fn two_streams(#[device(cuda)] x: TensorRef<'_, f32>, #[stream] a: usize, #[stream] b: usize) -> usize {
    x.len() + a + b
}

#[dlpack_fn]
#[pyfunction]
fn stream_with_arguments(#[device(cuda)] x: TensorRef<'_, f32>, #[stream(1)] a: usize) -> usize {
    x.len() + a
}

#[dlpack_fn]
#[pyfunction]
fn stream_not_an_integer(#[device(cuda)] x: TensorRef<'_, f32>, #[stream] s: String) -> usize {
    x.len() + s.len()
}

fn main() {}
