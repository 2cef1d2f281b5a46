//! Parameters whose view type fixes the rank, and their array-typed
//! accessors.

use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

#[dlpack_fn]
#[pyfunction]
fn ranked(
    #[shape(n, 3)] points: TensorRef<'_, f32, 2>,
    #[shape(n)] mut out: TensorMut<'_, f32, 1>,
    #[shape()] scale: TensorRef<'_, f32, 0>,
    any: Option<TensorRef<'_, f64, 3>>,
) -> PyResult<usize> {
    let [n, _] = points.dims();
    let s = scale.get([])?;
    for i in 0..n {
        out.set([i], s * points.get([i, 0])?)?;
    }
    let total: f32 = points.iter_memory_order()?.sum();
    let _ = points.as_array()?;
    Ok(any.map_or(0, |a| a.dims()[2]) + total as usize)
}

#[pymodule]
fn ranked_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(ranked, m)?)?;
    Ok(())
}

fn main() {}
