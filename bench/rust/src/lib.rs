//! The Rust side of the array-boundary benchmark (`make bench`).
//!
//! The same functions are written once per library, with the same work: the
//! conversion at the boundary, the checks the signature states, and a
//! minimal touch of the data, so the time is the library's call overhead.
//!
//! - `*_sum_len(x)`: any float64 CPU array, any shape and strides; returns
//!   the element count (metadata only).
//! - `*_sum_pts(x)`: a float32 `(n, 3)` C-contiguous array; returns the sum
//!   of the first row (three loads), `0.0` when `n == 0`.
//! - `*_make_f32(n)`: a new zero-filled 1-D float32 array of `n` elements,
//!   owned by the library's allocation and handed over without a copy.
//! - `*_slice_len(x)`: a 1-D contiguous float64 array as a slice (dlcast's
//!   `&[f64]` parameter); returns its length.
//! - `*_view_first(x)`: a 2-D float32 array, any strides, as an `ndarray`
//!   view (dlcast's `ArrayView2` parameter); returns the first element.
//! - `*_args1(a)` / `*_args4(a, b, w, out)`: one `(n, 3)` float32 argument
//!   against four (`(n, 3)`, `(n, 3)`, `(n,)` and a writable `(n,)`, the
//!   extent `n` shared), for the per-argument cost.
//! - The body functions (module `body`): a 5x5 convolution and a strided
//!   sum, with the same arithmetic in every access style.
//!
//! `floor(x)` takes `&Bound<PyAny>` and does nothing with it: the cost of a
//! PyO3 call with one argument, the floor of every other function here;
//! `floor4(a, b, w, out)` the same with four.

use dlcast_runtime::prelude::*;
use ndarray::ArrayView2;
use numpy::{
    PyArray1, PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArrayDyn, PyReadwriteArray1,
    PyReadwriteArrayDyn, PyUntypedArrayMethods,
};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

mod body;
mod limit;

// ---------------------------------------------------------------- floor

/// A PyO3 function taking one object and doing nothing with it.
#[pyfunction]
fn floor(x: &Bound<'_, PyAny>) -> usize {
    let _ = x;
    0
}

/// The floor of the four-argument functions: four objects, no conversion.
#[pyfunction]
fn floor4(
    a: &Bound<'_, PyAny>,
    b: &Bound<'_, PyAny>,
    w: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
) -> usize {
    let _ = (a, b, w, out);
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

/// `sum_len` with a slice parameter: a 1-D contiguous float64 array.
#[dlpack_fn]
#[pyfunction]
fn dlcast_slice_len(x: &[f64]) -> usize {
    x.len()
}

/// `slice_len` with a writable slice (`&mut [f64]`).
#[dlpack_fn]
#[pyfunction]
fn dlcast_slice_len_mut(x: &mut [f64]) -> usize {
    x.len()
}

/// An `ndarray` view parameter: any 2-D float32 array, any strides; the
/// first element (`0.0` when empty).
#[dlpack_fn]
#[pyfunction]
fn dlcast_view_first(x: ArrayView2<'_, f32>) -> f32 {
    x.first().copied().unwrap_or(0.0)
}

// Several arguments: one `(n, 3)` argument against four (two `(n, 3)`
// inputs, `(n,)` weights and a writable `(n,)` output, the extent `n`
// shared). Each body touches every argument once.

#[dlpack_fn]
#[pyfunction]
fn dlcast_args1(#[shape(n, 3)] a: TensorRef<'_, f32>) -> f32 {
    a.get(&[0, 0]).unwrap_or(0.0)
}

#[dlpack_fn]
#[pyfunction]
fn dlcast_args4(
    #[shape(n, 3)] a: TensorRef<'_, f32>,
    #[shape(n, 3)] b: TensorRef<'_, f32>,
    #[shape(n)] w: TensorRef<'_, f32>,
    #[shape(n)] mut out: TensorMut<'_, f32>,
) -> f32 {
    let v =
        a.get(&[0, 0]).unwrap_or(0.0) + b.get(&[0, 0]).unwrap_or(0.0) + w.get(&[0]).unwrap_or(0.0);
    // Empty inputs write nothing (and read zeros): the row measures the
    // boundary, not the body.
    let _ = out.set(&[0], v);
    v
}

/// `args1` with Rust's own types (an `ndarray` view).
#[dlpack_fn]
#[pyfunction]
fn dlcast_args1_native(#[shape(n, 3)] a: ArrayView2<'_, f32>) -> f32 {
    a.first().copied().unwrap_or(0.0)
}

/// `args4` with Rust's own types: `ndarray` views, a slice and a mutable
/// slice.
#[dlpack_fn]
#[pyfunction]
fn dlcast_args4_native(
    #[shape(n, 3)] a: ArrayView2<'_, f32>,
    #[shape(n, 3)] b: ArrayView2<'_, f32>,
    #[shape(n)] w: &[f32],
    #[shape(n)] out: &mut [f32],
) -> f32 {
    let v = a.first().copied().unwrap_or(0.0)
        + b.first().copied().unwrap_or(0.0)
        + w.first().copied().unwrap_or(0.0);
    if let Some(o) = out.first_mut() {
        *o = v;
    }
    v
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

/// `rnp_sum_len` with a writable array (`PyReadwriteArrayDyn`), against
/// `dlcast_sum_len_mut`.
#[pyfunction]
fn rnp_sum_len_mut(x: PyReadwriteArrayDyn<'_, f64>) -> usize {
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
fn rnp_slice_len(x: PyReadonlyArray1<'_, f64>) -> PyResult<usize> {
    // `as_slice` takes any contiguous array; a 1-D one is C-contiguous.
    let s = x
        .as_slice()
        .map_err(|_| PyTypeError::new_err("expected a contiguous array"))?;
    Ok(s.len())
}

#[pyfunction]
fn rnp_view_first(x: PyReadonlyArray2<'_, f32>) -> f32 {
    x.as_array().first().copied().unwrap_or(0.0)
}

/// The extent checks dlcast's `#[shape(n, 3)]` / `#[shape(n)]` make.
fn rnp_extents(a: &[usize], b: &[usize], w: &[usize], out: &[usize]) -> PyResult<()> {
    if a[1] != 3 || b[1] != 3 {
        return Err(PyTypeError::new_err("expected shape (n, 3)"));
    }
    if b[0] != a[0] || w[0] != a[0] || out[0] != a[0] {
        return Err(PyTypeError::new_err(
            "dimension 'n' differs between arguments",
        ));
    }
    Ok(())
}

#[pyfunction]
fn rnp_args1(a: PyReadonlyArray2<'_, f32>) -> PyResult<f32> {
    if a.shape()[1] != 3 {
        return Err(PyTypeError::new_err("expected shape (n, 3)"));
    }
    Ok(a.as_array().first().copied().unwrap_or(0.0))
}

#[pyfunction]
fn rnp_args4(
    a: PyReadonlyArray2<'_, f32>,
    b: PyReadonlyArray2<'_, f32>,
    w: PyReadonlyArray1<'_, f32>,
    mut out: PyReadwriteArray1<'_, f32>,
) -> PyResult<f32> {
    rnp_extents(a.shape(), b.shape(), w.shape(), out.shape())?;
    let v = a.as_array().first().copied().unwrap_or(0.0)
        + b.as_array().first().copied().unwrap_or(0.0)
        + w.as_array().first().copied().unwrap_or(0.0);
    if let Some(o) = out.as_array_mut().first_mut() {
        *o = v;
    }
    Ok(v)
}

#[pyfunction]
fn rnp_make_f32_numpy(py: Python<'_>, n: usize) -> Bound<'_, PyArray1<f32>> {
    PyArray1::zeros(py, n, false)
}

// --------------------------------------------------------------- dlpark

mod dlpark_fns {
    use dlpark::ffi::{DLDeviceType, DLManagedTensorVersioned};
    use dlpark::python::{from_dlpack, ImportedDlpack};
    use dlpark::{
        allocation::dynamic, DlpackElement, DlpackFlags, Managed, TensorRef, TryFromDlpack,
    };
    use ndarray::ArrayViewD;
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

    /// A 1-D contiguous float64 array as a slice (dlcast's `&[f64]`).
    #[pyfunction]
    pub fn dlpark_slice_len(x: &Bound<'_, PyAny>) -> PyResult<usize> {
        let imported = from_dlpack(x.as_borrowed(), None, None)?;
        let t = imported.validate().map_err(err)?;
        if t.dtype() != <f64 as DlpackElement>::DTYPE {
            return Err(PyTypeError::new_err("expected float64"));
        }
        if t.device().device_type != DLDeviceType::CPU {
            return Err(PyTypeError::new_err("expected a CPU array"));
        }
        if t.ndim() != 1 || !t.is_compact().map_err(err)? {
            return Err(PyTypeError::new_err("expected a 1-D contiguous array"));
        }
        // SAFETY: a validated, compact CPU float64 tensor, alive while
        // `imported` is.
        let s = unsafe { t.cpu_slice::<f64>() }.map_err(err)?;
        Ok(s.len())
    }

    /// dlpark's own `ndarray` view (`ArrayViewD`, then 2-D).
    #[pyfunction]
    pub fn dlpark_view_first(x: &Bound<'_, PyAny>) -> PyResult<f32> {
        let imported = from_dlpack(x.as_borrowed(), None, None)?;
        // SAFETY: the imported tensor outlives the view, and nothing writes
        // the memory while the view lives.
        let view = match &imported {
            ImportedDlpack::Legacy(m) => unsafe { ArrayViewD::<f32>::try_from_dlpack(m, ()) },
            ImportedDlpack::Versioned(m) => unsafe { ArrayViewD::<f32>::try_from_dlpack(m, ()) },
        }
        .map_err(err)?;
        let view = view
            .into_dimensionality::<ndarray::Ix2>()
            .map_err(|_| PyTypeError::new_err("expected 2 dimensions"))?;
        Ok(view.first().copied().unwrap_or(0.0))
    }

    /// One float32 CPU argument of `args1`/`args4`: dtype, device and rank
    /// checked by hand (`ndim` 2 also wants 3 columns); its extent `n`.
    fn args_check(t: &TensorRef<'_>, param: &str, ndim: usize) -> PyResult<i64> {
        if t.dtype() != <f32 as DlpackElement>::DTYPE {
            return Err(PyTypeError::new_err(format!("{param}: expected float32")));
        }
        if t.device().device_type != DLDeviceType::CPU {
            return Err(PyTypeError::new_err(format!(
                "{param}: expected a CPU array"
            )));
        }
        if t.ndim() != ndim || (ndim == 2 && t.shape()[1] != 3) {
            return Err(PyTypeError::new_err(format!(
                "{param}: expected shape {}",
                if ndim == 2 { "(n, 3)" } else { "(n,)" }
            )));
        }
        Ok(t.shape()[0])
    }

    /// The first element (index 0 in every dimension; strides do not
    /// matter for it) of a checked float32 CPU tensor, or None when empty.
    fn args_first(t: &TensorRef<'_>) -> PyResult<Option<*const f32>> {
        if t.num_elements() == 0 {
            return Ok(None);
        }
        // SAFETY: a validated non-empty CPU float32 tensor: the offset
        // pointer is its first element, inside the producer's allocation.
        Ok(Some(unsafe { t.offset_data_ptr::<f32>() }.map_err(err)?))
    }

    /// `args1` with dlpark: `from_dlpack`, `validate`, the checks by hand.
    #[pyfunction]
    pub fn dlpark_args1(a: &Bound<'_, PyAny>) -> PyResult<f32> {
        let ia = from_dlpack(a.as_borrowed(), None, None)?;
        let ta = ia.validate().map_err(err)?;
        args_check(&ta, "a", 2)?;
        // SAFETY: the first element of a live imported tensor, read once.
        Ok(args_first(&ta)?.map_or(0.0, |p| unsafe { *p }))
    }

    /// `args4` with dlpark: each argument imported and validated, dtype,
    /// device, rank and the shared extent `n` compared by hand, `out`
    /// refused when its producer flagged it read-only (what dlcast's
    /// `TensorMut` refuses too); the first elements read, `out`'s written.
    #[pyfunction]
    pub fn dlpark_args4(
        a: &Bound<'_, PyAny>,
        b: &Bound<'_, PyAny>,
        w: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
    ) -> PyResult<f32> {
        let (ia, ib) = (
            from_dlpack(a.as_borrowed(), None, None)?,
            from_dlpack(b.as_borrowed(), None, None)?,
        );
        let (iw, io) = (
            from_dlpack(w.as_borrowed(), None, None)?,
            from_dlpack(out.as_borrowed(), None, None)?,
        );
        let (ta, tb) = (ia.validate().map_err(err)?, ib.validate().map_err(err)?);
        let (tw, to) = (iw.validate().map_err(err)?, io.validate().map_err(err)?);
        let n = args_check(&ta, "a", 2)?;
        let ns = [
            args_check(&tb, "b", 2)?,
            args_check(&tw, "w", 1)?,
            args_check(&to, "out", 1)?,
        ];
        if ns.iter().any(|&m| m != n) {
            return Err(PyTypeError::new_err(
                "dimension 'n' differs between arguments",
            ));
        }
        if io.flags().contains(DlpackFlags::READ_ONLY) {
            return Err(PyTypeError::new_err("out: expected a writable array"));
        }
        let (Some(pa), Some(pb), Some(pw), Some(po)) = (
            args_first(&ta)?,
            args_first(&tb)?,
            args_first(&tw)?,
            args_first(&to)?,
        ) else {
            return Ok(0.0);
        };
        // SAFETY: first elements of live imported CPU tensors; `out` is not
        // flagged read-only, and nothing else runs during the call. The
        // reads happen before the write, so an `out` aliasing an input is
        // read before it is written.
        let v = unsafe { *pa + *pb + *pw };
        unsafe { *po.cast_mut() = v };
        Ok(v)
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
    m.add_function(wrap_pyfunction!(floor4, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_slice_len, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_view_first, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_args1, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_args4, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_args1_native, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_args4_native, m)?)?;
    m.add_function(wrap_pyfunction!(rnp_slice_len, m)?)?;
    m.add_function(wrap_pyfunction!(rnp_view_first, m)?)?;
    m.add_function(wrap_pyfunction!(rnp_args1, m)?)?;
    m.add_function(wrap_pyfunction!(rnp_args4, m)?)?;
    m.add_function(wrap_pyfunction!(dlpark_fns::dlpark_slice_len, m)?)?;
    m.add_function(wrap_pyfunction!(dlpark_fns::dlpark_view_first, m)?)?;
    m.add_function(wrap_pyfunction!(dlpark_fns::dlpark_args1, m)?)?;
    m.add_function(wrap_pyfunction!(dlpark_fns::dlpark_args4, m)?)?;
    body::add(m)?;
    m.add_function(wrap_pyfunction!(dlcast_sum_len, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_sum_pts, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_sum_len_mut, m)?)?;
    m.add_function(wrap_pyfunction!(dlcast_slice_len_mut, m)?)?;
    m.add_function(wrap_pyfunction!(rnp_sum_len_mut, m)?)?;
    m.add_function(wrap_pyfunction!(limit::limit_slice_len, m)?)?;
    m.add_function(wrap_pyfunction!(limit::limit_slice_len_mut, m)?)?;
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
