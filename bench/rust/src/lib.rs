//! The Rust side of the array-boundary benchmark (`make bench`).
//!
//! The same three functions are written once per library, with the same
//! work: the conversion at the boundary, the checks the signature states, and
//! a minimal touch of the data, so the time is the library's call overhead.
//!
//! - `*_sum_len(x)`: any float64 CPU array, any shape and strides; returns
//!   the element count (metadata only).
//! - `*_sum_pts(x)`: a float32 `(n, 3)` C-contiguous array; returns the sum
//!   of the first row (three loads), `0.0` when `n == 0`.
//! - `*_make_f32(n)`: a new zero-filled 1-D float32 array of `n` elements,
//!   owned by the library's allocation and handed over without a copy.
//!
//! `floor(x)` takes `&Bound<PyAny>` and does nothing with it: the cost of a
//! PyO3 call with one argument, the floor of every other function here.

use dlcast_runtime::prelude::*;
use numpy::{PyArray1, PyReadonlyArray2, PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

// ---------------------------------------------------------------- floor

/// A PyO3 function taking one object and doing nothing with it.
#[pyfunction]
fn floor(x: &Bound<'_, PyAny>) -> usize {
    let _ = x;
    0
}

// --------------------------------------------------------------- dlcast

#[dlpack_fn]
#[pyfunction]
fn dlcast_sum_len(x: TensorRef<'_, f64>) -> usize {
    x.len()
}

#[dlpack_fn]
#[pyfunction]
fn dlcast_sum_pts(
    #[shape(_, 3)]
    #[order(c)]
    x: TensorRef<'_, f32>,
) -> f32 {
    match x.as_slice() {
        Some(s) if s.len() >= 3 => s[0] + s[1] + s[2],
        _ => 0.0,
    }
}

/// `sum_len` with a writable view (`TensorMut`): not in the tables; for the
/// per-argument cost of a writable argument (callgrind, BENCHMARKS.md).
#[dlpack_fn]
#[pyfunction]
fn dlcast_sum_len_mut(x: TensorMut<'_, f64>) -> usize {
    x.len()
}

#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn dlcast_make_f32_numpy(n: usize) -> PyResult<Tensor<f32>> {
    Ok(Tensor::zeros(&[n])?)
}

#[dlpack_fn(returns = torch)]
#[pyfunction]
fn dlcast_make_f32_torch(n: usize) -> PyResult<Tensor<f32>> {
    Ok(Tensor::zeros(&[n])?)
}

// ----------------------------------------------------------- rust-numpy

#[pyfunction]
fn rnp_sum_len(x: PyReadonlyArrayDyn<'_, f64>) -> usize {
    x.len()
}

#[pyfunction]
fn rnp_sum_pts(x: PyReadonlyArray2<'_, f32>) -> PyResult<f32> {
    // The checks dlcast's #[shape(_, 3)] #[order(c)] make, by hand.
    if x.shape()[1] != 3 {
        return Err(PyTypeError::new_err("expected shape (n, 3)"));
    }
    // `as_slice` alone also takes F-contiguous arrays (in memory order).
    if !x.is_c_contiguous() {
        return Err(PyTypeError::new_err("expected a C-contiguous array"));
    }
    let s = x
        .as_slice()
        .map_err(|_| PyTypeError::new_err("expected a C-contiguous array"))?;
    Ok(if s.len() >= 3 {
        s[0] + s[1] + s[2]
    } else {
        0.0
    })
}

#[pyfunction]
fn rnp_make_f32_numpy(py: Python<'_>, n: usize) -> Bound<'_, PyArray1<f32>> {
    PyArray1::zeros(py, n, false)
}

// --------------------------------------------------------------- dlpark

mod dlpark_fns {
    use dlpark::ffi::{DLDeviceType, DLManagedTensorVersioned};
    use dlpark::python::from_dlpack;
    use dlpark::{allocation::dynamic, DlpackElement, Managed};
    use pyo3::exceptions::{PyBufferError, PyTypeError};
    use pyo3::prelude::*;

    fn err(e: impl std::fmt::Display) -> PyErr {
        PyBufferError::new_err(e.to_string())
    }

    /// dlpark's Python import (`python::from_dlpack`: C exchange API, then
    /// `__dlpack__`), then its validation; dtype and device checked by hand.
    #[pyfunction]
    pub fn dlpark_sum_len(x: &Bound<'_, PyAny>) -> PyResult<usize> {
        let imported = from_dlpack(x.as_borrowed(), None, None)?;
        let t = imported.validate().map_err(err)?;
        if t.dtype() != <f64 as DlpackElement>::DTYPE {
            return Err(PyTypeError::new_err("expected float64"));
        }
        if t.device().device_type != DLDeviceType::CPU {
            return Err(PyTypeError::new_err("expected a CPU array"));
        }
        Ok(t.num_elements())
    }

    #[pyfunction]
    pub fn dlpark_sum_pts(x: &Bound<'_, PyAny>) -> PyResult<f32> {
        let imported = from_dlpack(x.as_borrowed(), None, None)?;
        let t = imported.validate().map_err(err)?;
        if t.dtype() != <f32 as DlpackElement>::DTYPE {
            return Err(PyTypeError::new_err("expected float32"));
        }
        if t.device().device_type != DLDeviceType::CPU {
            return Err(PyTypeError::new_err("expected a CPU array"));
        }
        if t.ndim() != 2 || t.shape()[1] != 3 {
            return Err(PyTypeError::new_err("expected shape (n, 3)"));
        }
        if !t.is_compact().map_err(err)? {
            return Err(PyTypeError::new_err("expected a C-contiguous array"));
        }
        // SAFETY: a validated, compact CPU float32 tensor, alive while
        // `imported` is.
        let s = unsafe { t.cpu_slice::<f32>() }.map_err(err)?;
        Ok(if s.len() >= 3 {
            s[0] + s[1] + s[2]
        } else {
            0.0
        })
    }

    /// dlpark has no Python array type to return: it hands out a DLPack
    /// capsule (here a versioned one), which the caller gives to
    /// `torch.from_dlpack`. NumPy's `from_dlpack` takes no capsules.
    #[pyfunction]
    pub fn dlpark_make_f32_capsule(n: usize) -> PyResult<Managed<DLManagedTensorVersioned>> {
        let a = Box::new(ndarray::Array1::<f32>::zeros(n));
        let init: dynamic::Initialized<DLManagedTensorVersioned> = a.try_into().map_err(err)?;
        // SAFETY: the descriptor was filled from the owned array it manages.
        Ok(unsafe { init.finish() })
    }
}

#[pymodule]
fn dlcast_bench(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(floor, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_sum_len, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_sum_pts, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_sum_len_mut, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_make_f32_numpy, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_make_f32_torch, m)?)?;
    m.add_function(wrap_pyfunction!(rnp_sum_len, m)?)?;
    m.add_function(wrap_pyfunction!(rnp_sum_pts, m)?)?;
    m.add_function(wrap_pyfunction!(rnp_make_f32_numpy, m)?)?;
    m.add_function(wrap_pyfunction!(dlpark_fns::dlpark_sum_len, m)?)?;
    m.add_function(wrap_pyfunction!(dlpark_fns::dlpark_sum_pts, m)?)?;
    m.add_function(wrap_pyfunction!(dlpark_fns::dlpark_make_f32_capsule, m)?)?;
    Ok(())
}
