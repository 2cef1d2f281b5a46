// Views are neither `Send` nor `Sync`: they cannot be used inside
// `py.detach(..)`, where other threads may run Python code (and free or
// change the array). Copy what the detached code needs out of the view first.
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn f(py: Python<'_>, x: TensorRef<'_, f32>) -> usize {
    py.detach(|| x.len())
}

fn main() {}
