use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn f<T: Element>(
    #[dtype(f32)] x: TensorRef<'_, T>,
    #[dtype(f64)] y: TensorRef<'_, T>,
) -> usize {
    x.len() + y.len()
}

fn main() {}
