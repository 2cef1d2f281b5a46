// `#[dlcast::pyfunction(..)]`: dlcast's options are checked by dlcast, the
// others by PyO3.
use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlcast::pyfunction(returns = nump)]
fn a(x: TensorRef<'_, f32>) -> usize {
    x.len()
}

#[dlcast::pyfunction(nmae = "b")]
fn b(x: TensorRef<'_, f32>) -> usize {
    x.len()
}

fn main() {}
