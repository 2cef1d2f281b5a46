//! Every annotation form `#[dlpack_fn]` accepts, registered in a module.

use dlcast_runtime::prelude::*;
use pyo3::prelude::*;

/// Integers, `_`, names shared across parameters, `..`; returns a value.
#[dlpack_fn]
#[pyfunction]
fn shapes(
    #[shape(n, 3)] points: TensorRef<'_, f32>,
    #[shape(n)] weights: TensorRef<'_, f32>,
    #[shape(_, n, ..)] batch: TensorDyn<'_>,
    #[shape(.., 2)] pairs: TensorRef<'_, f64>,
    #[shape(m, m)] square: TensorRef<'_, i64>,
) -> usize {
    points.len() + weights.len() + batch.len() + pairs.len() + square.len()
}

/// A 0-d array and a plain (non-array) parameter; returns `PyResult<..>`.
#[dlpack_fn]
#[pyfunction]
fn scalar(#[shape()] x: TensorRef<'_, f64>, offset: f64) -> PyResult<f64> {
    Ok(x.get(&[]).unwrap_or(0.0) + offset)
}

/// Device lists, with and without ids; returns `()`.
#[dlpack_fn]
#[pyfunction]
fn devices(
    #[device(cpu, cuda(0), any)] a: TensorDyn<'_>,
    #[device(cuda, rocm(1))] b: TensorDyn<'_>,
    #[device(cpu)] c: TensorRef<'_, u8>,
) {
    let _ = (a, b, c);
}

/// Each order, every view kind, and all three annotations on one parameter.
#[dlpack_fn]
#[pyfunction]
fn orders(
    #[order(c)] a: TensorRef<'_, f32>,
    #[order(f)] b: TensorMut<'_, f32>,
    #[order(contiguous)] c: TensorDyn<'_>,
    #[shape(k, ..)]
    #[device(cpu)]
    #[order(C)]
    mut d: TensorDynMut<'_>,
    #[order(F)] e: TensorDyn<'_>,
) -> PyResult<()> {
    let _ = (a, b, c, e);
    let _ = d.data_ptr_mut();
    Ok(())
}

/// Optional views, read-only and writable.
#[dlpack_fn]
#[pyfunction]
#[pyo3(signature = (x, out=None))]
fn optional(
    #[shape(n)] x: Option<TensorRef<'_, f64>>,
    #[shape(n)] out: Option<TensorMut<'_, f64>>,
) -> PyResult<bool> {
    if let (Some(x), Some(mut out)) = (x, out) {
        out.fill(x.get(&[0]).unwrap_or(0.0))?;
        return Ok(true);
    }
    Ok(false)
}

/// `Python<'_>` and a plain argument next to a view; returns a Python object.
#[dlpack_fn]
#[pyfunction]
fn with_py(py: Python<'_>, label: String, x: TensorDyn<'_>) -> Py<PyAny> {
    use pyo3::IntoPyObjectExt;
    (label, x.ndim()).into_py_any(py).unwrap()
}

#[pymodule]
fn every_form(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(shapes, m)?)?;
    m.add_function(wrap_pyfunction!(scalar, m)?)?;
    m.add_function(wrap_pyfunction!(devices, m)?)?;
    m.add_function(wrap_pyfunction!(orders, m)?)?;
    m.add_function(wrap_pyfunction!(optional, m)?)?;
    m.add_function(wrap_pyfunction!(with_py, m)?)?;
    Ok(())
}

fn main() {}
