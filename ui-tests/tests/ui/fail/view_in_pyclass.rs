// A view borrows its argument for the call only: a `#[pyclass]` cannot keep
// one. Store an `ArrayHandle<T>` instead and borrow it in each method.
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[pyclass]
struct Layer {
    weights: TensorRef<'static, f32>,
}

fn main() {}
