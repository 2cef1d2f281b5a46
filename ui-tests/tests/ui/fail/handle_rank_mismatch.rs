// A `#[shape]` on a rank-typed `ArrayHandle<T, N>` has the type's `N`
// dimensions (`..` may stand for some): another count could never pass.
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlcast::pyfunction]
fn total(py: Python<'_>, #[shape(n)] w: ArrayHandle<f32, 2>) -> PyResult<f32> {
    Ok(w.borrow(py)?.iter()?.sum())
}

fn main() {}
