use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn f<T: Element>(#[dtype(f32, f64)] x: Option<TensorRef<'_, T>>) -> bool {
    x.is_some()
}

fn main() {}
