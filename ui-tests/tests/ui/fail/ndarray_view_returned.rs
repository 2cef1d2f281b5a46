// An `ndarray` view cannot go back to Python (PyO3 has no conversion for it,
// and it would not say which array it views): return the argument as a
// `TensorRef`, or an owned `Tensor`.
use dlcast_runtime::ndarray::ArrayView2;
use dlcast_runtime::prelude::*;

#[dlcast::pyfunction]
fn same(x: ArrayView2<'_, f32>) -> ArrayView2<'_, f32> {
    x
}

fn main() {}
