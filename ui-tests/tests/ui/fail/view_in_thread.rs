// Views stay with the thread that holds the GIL: a scoped thread cannot
// take one. Take a slice first (`as_slice()`), or declare the parameter as
// `&[T]` / an ndarray view, which are `Send`.
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn f(x: TensorRef<'_, f32>) -> usize {
    std::thread::scope(|s| s.spawn(|| x.len()).join().unwrap_or(0))
}

fn main() {}
