//! Ownership: arrays over a `#[pyclass]`'s own buffer, read-only
//! owned tensors, static and foreign memory, converted inputs returned.
//! The ideas of nanobind's ownership tests (a matrix class with `data()`,
//! `data_ref()`, `data_copy()`; a class whose `mutate()` a returned array
//! sees; static data returned read-only), written for dlcast.

use dlcast_runtime::prelude::*;
use pyo3::exceptions::PyValueError;
use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// A 4x4 float32 matrix whose data Python can view in place.
#[pyclass(module = "dlcast_testext", weakref)]
pub struct Matrix4f {
    data: ArrayBuffer<f32>,
    /// Anything Python stores on the object (to build reference cycles).
    #[pyo3(get, set)]
    attached: Option<Py<PyAny>>,
}

#[dlpack_fn]
#[pymethods]
impl Matrix4f {
    #[new]
    fn new() -> PyResult<Self> {
        Ok(Matrix4f {
            data: ArrayBuffer::zeros(&[4, 4])?,
            attached: None,
        })
    }

    /// A writable view (`dlcast.Array`): writes change the matrix.
    fn data(slf: &Bound<'_, Self>) -> PyResult<Tensor<f32>> {
        slf.try_borrow()?.data.view(slf)
    }

    /// The same view as a NumPy array.
    #[dlpack_fn(returns = numpy)]
    fn data_ref(slf: &Bound<'_, Self>) -> PyResult<Tensor<f32>> {
        slf.try_borrow()?.data.view(slf)
    }

    /// A read-only view as a NumPy array.
    #[dlpack_fn(returns = numpy)]
    fn data_const(slf: &Bound<'_, Self>) -> PyResult<Tensor<f32>> {
        slf.try_borrow()?.data.view_read_only(slf)
    }

    /// A copy: writes to it do not reach the matrix.
    #[dlpack_fn(returns = numpy)]
    fn data_copy(&self, py: Python<'_>) -> PyResult<Tensor<f32>> {
        self.data.to_tensor(py)
    }

    /// The view handed to PyTorch.
    #[dlpack_fn(returns = torch)]
    fn data_torch(slf: &Bound<'_, Self>) -> PyResult<Tensor<f32>> {
        slf.try_borrow()?.data.view(slf)
    }

    /// The read-only view handed to PyTorch (refused).
    #[dlpack_fn(returns = torch)]
    fn data_const_torch(slf: &Bound<'_, Self>) -> PyResult<Tensor<f32>> {
        slf.try_borrow()?.data.view_read_only(slf)
    }

    /// The view handed to JAX.
    #[dlpack_fn(returns = jax)]
    fn data_jax(slf: &Bound<'_, Self>) -> PyResult<Tensor<f32>> {
        slf.try_borrow()?.data.view_read_only(slf)
    }

    /// Element `(i, j)`, read by Rust.
    fn get(&self, py: Python<'_>, i: usize, j: usize) -> PyResult<f32> {
        let r = self.data.read(py)?;
        r.get(i * 4 + j)
            .copied()
            .ok_or_else(|| PyValueError::new_err("index out of range"))
    }

    /// Writes `value` at `(i, j)` from Rust (`&mut`): refused while a view
    /// lives.
    fn set(&mut self, i: usize, j: usize, value: f32) -> PyResult<()> {
        let s = self.data.as_mut_slice()?;
        let v = s
            .get_mut(i * 4 + j)
            .ok_or_else(|| PyValueError::new_err("index out of range"))?;
        *v = value;
        Ok(())
    }

    /// Reallocates to `n` x `n` (refused while a view lives).
    fn resize(&mut self, n: usize) -> PyResult<()> {
        self.data.resize(&[n, n])
    }

    /// Replaces the buffer outright (allowed: old views keep the old memory).
    fn replace(&mut self) -> PyResult<()> {
        self.data = ArrayBuffer::from_slice(&[7.0; 16], &[4, 4])?;
        Ok(())
    }

    /// Calls `f()` while the object is mutably borrowed (`&mut self`).
    fn with_mut(&mut self, f: Bound<'_, PyAny>) -> PyResult<()> {
        f.call0()?;
        Ok(())
    }

    /// Live exports of the buffer.
    fn exports(&self) -> usize {
        self.data.exports()
    }

    /// Holds a read guard while calling `f()`, then returns the sum read
    /// after it (a re-entrant call from the body).
    fn sum_around(&self, py: Python<'_>, f: Bound<'_, PyAny>) -> PyResult<f32> {
        let r = self.data.read(py)?;
        f.call0()?;
        Ok(r.iter().sum())
    }

    /// Adds `x` elementwise into the matrix through a dlcast view.
    #[staticmethod]
    fn add_into(#[shape(4, 4)] mut out: TensorMut<'_, f32>, x: f32) -> PyResult<()> {
        for v in out.as_slice_mut().unwrap_or_default() {
            *v += x;
        }
        Ok(())
    }

    /// Sum through a read-only dlcast view.
    #[staticmethod]
    fn total(x: TensorRef<'_, f32>) -> PyResult<f32> {
        Ok(x.to_vec()?.iter().sum())
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(a) = &self.attached {
            visit.call(a)?;
        }
        Ok(())
    }

    fn __clear__(&mut self) {
        self.attached = None;
    }
}

/// A class whose `mutate()` changes data that an array returned earlier
/// sees.
#[pyclass(module = "dlcast_testext", weakref)]
pub struct Mutable {
    data: ArrayBuffer<i32>,
}

#[pymethods]
impl Mutable {
    #[new]
    fn new() -> PyResult<Self> {
        Ok(Mutable {
            data: ArrayBuffer::from_slice(&[1, 2, 3, 4, 5], &[5])?,
        })
    }

    fn array(slf: &Bound<'_, Self>) -> PyResult<Tensor<i32>> {
        slf.try_borrow()?.data.view(slf)
    }

    /// Doubles every element in place from Rust (`&self`, element by
    /// element: allowed while arrays are exported, which see it).
    fn mutate(&self, py: Python<'_>) -> PyResult<()> {
        for i in 0..self.data.len() {
            let v = self.data.get(py, &[i])?;
            self.data.set(py, &[i], v * 2)?;
        }
        Ok(())
    }

    /// Holds a read guard while calling `f()` (re-entrancy).
    fn read_around(&self, py: Python<'_>, f: Bound<'_, PyAny>) -> PyResult<i32> {
        let r = self.data.read(py)?;
        f.call0()?;
        Ok(r.iter().sum())
    }
}

static OWNERS_DROPPED: AtomicUsize = AtomicUsize::new(0);
static DROP_THREADS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The owner of foreign memory: frees a leaked `Vec` when dropped and
/// records which thread did it.
struct ForeignOwner {
    ptr: *mut f64,
    len: usize,
}

// SAFETY: the allocation is plain heap memory, not tied to a thread.
unsafe impl Send for ForeignOwner {}

impl Drop for ForeignOwner {
    fn drop(&mut self) {
        // SAFETY: made by `Box::into_raw` of a boxed slice of `len`
        // elements in `foreign`, freed once (this owner is dropped once).
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
        let name = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_string();
        DROP_THREADS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(name);
        OWNERS_DROPPED.fetch_add(1, Ordering::SeqCst);
    }
}

/// Foreign memory (a leaked boxed slice of `0..n` as f64) exported with
/// an owner that frees it; read-only if asked.
#[pyfunction]
#[pyo3(signature = (n, read_only = false))]
fn foreign(n: usize, read_only: bool) -> PyResult<Tensor<f64>> {
    let v: Box<[f64]> = (0..n).map(|i| i as f64).collect();
    let ptr = Box::into_raw(v).cast::<f64>();
    let owner = ForeignOwner { ptr, len: n };
    // SAFETY: `ptr` holds `n` initialised, aligned f64 (a boxed slice) that
    // `owner` alone frees, once, when dropped (on any thread); nothing else
    // refers to the memory.
    Ok(unsafe { Tensor::from_raw_parts(ptr, &[n], &[1], Device::CPU, read_only, owner) }?)
}

/// Foreign memory viewed with a negative stride (reversed).
#[pyfunction]
fn foreign_reversed(n: usize) -> PyResult<Tensor<f64>> {
    let v: Box<[f64]> = (0..n).map(|i| i as f64).collect();
    let ptr = Box::into_raw(v).cast::<f64>();
    let owner = ForeignOwner { ptr, len: n };
    // SAFETY: as in `foreign`; element 0 is the last of the `n` (n >= 1),
    // and stride -1 reaches back to the first.
    Ok(unsafe {
        Tensor::from_raw_parts(
            ptr.wrapping_add(n.saturating_sub(1)),
            &[n],
            &[-1],
            Device::CPU,
            false,
            owner,
        )
    }?)
}

/// `(owners dropped, names of the threads that dropped them)`.
#[pyfunction]
fn foreign_drops() -> (usize, Vec<String>) {
    let names = DROP_THREADS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    (OWNERS_DROPPED.load(Ordering::SeqCst), names)
}

/// Takes the DLPack capsule `cap` (renames it `used_dltensor_versioned`,
/// as a consumer does) and calls its deleter on a new thread named
/// `deleter-thread`, without the GIL (this thread released it and waits).
#[pyfunction]
fn consume_on_thread(py: Python<'_>, cap: Bound<'_, PyAny>) -> PyResult<()> {
    use dlpack_rs::ffi::DLManagedTensorVersioned;
    use pyo3::ffi;
    let name = c"dltensor_versioned";
    // SAFETY: GetPointer checks the capsule and its name (NULL + error else).
    let p = unsafe { ffi::PyCapsule_GetPointer(cap.as_ptr(), name.as_ptr()) };
    if p.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: renaming a live capsule we hold; the static name outlives it.
    if unsafe { ffi::PyCapsule_SetName(cap.as_ptr(), c"used_dltensor_versioned".as_ptr()) } != 0 {
        return Err(PyErr::fetch(py));
    }
    let addr = p as usize;
    py.detach(|| {
        std::thread::Builder::new()
            .name("deleter-thread".into())
            .spawn(move || {
                let m = addr as *mut DLManagedTensorVersioned;
                // SAFETY: the capsule was renamed, so this consumer owns the
                // managed tensor and calls its deleter exactly once; the
                // producer (dlcast) allows any thread, GIL or not.
                unsafe {
                    if let Some(d) = (*m).deleter {
                        d(m);
                    }
                }
            })
            .map(|h| h.join())
    })
    .map_err(|e| PyValueError::new_err(e.to_string()))?
    .map_err(|_| PyValueError::new_err("the deleter thread panicked"))
}

static TABLE: [u16; 6] = [10, 20, 30, 40, 50, 60];

/// Static data, read-only, as `dlcast.Array`.
#[pyfunction]
fn static_table() -> PyResult<Tensor<u16>> {
    Ok(Tensor::from_static(&TABLE, &[2, 3])?)
}

/// Static data, read-only, as NumPy.
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn static_table_numpy() -> PyResult<Tensor<u16>> {
    Ok(Tensor::from_static(&TABLE, &[2, 3])?)
}

/// Static data handed to PyTorch (refused: read-only).
#[dlpack_fn(returns = torch)]
#[pyfunction]
fn static_table_torch() -> PyResult<Tensor<u16>> {
    Ok(Tensor::from_static(&TABLE, &[2, 3])?)
}

/// A read-only owned tensor `0..n` as `dlcast.Array`.
#[pyfunction]
fn read_only_range(n: usize) -> PyResult<Tensor<f32>> {
    Ok(Tensor::from_fn(&[n], |i| i as f32)?.into_read_only())
}

/// The same, to NumPy.
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn read_only_range_numpy(n: usize) -> PyResult<Tensor<f32>> {
    Ok(Tensor::from_fn(&[n], |i| i as f32)?.into_read_only())
}

/// The same, to PyTorch (refused).
#[dlpack_fn(returns = torch)]
#[pyfunction]
fn read_only_range_torch(n: usize) -> PyResult<Tensor<f32>> {
    Ok(Tensor::from_fn(&[n], |i| i as f32)?.into_read_only())
}

/// The same, to JAX.
#[dlpack_fn(returns = jax)]
#[pyfunction]
fn read_only_range_jax(n: usize) -> PyResult<Tensor<f32>> {
    Ok(Tensor::from_fn(&[n], |i| i as f32)?.into_read_only())
}

/// Whether `as_slice_mut` is offered for a static / foreign tensor (never).
#[pyfunction]
fn shared_tensors_give_no_slice() -> PyResult<(bool, bool)> {
    let mut s = Tensor::from_static(&TABLE, &[6])?;
    let v: Box<[f64]> = vec![1.0; 3].into_boxed_slice();
    let ptr = Box::into_raw(v).cast::<f64>();
    // SAFETY: 3 initialised f64 that the owner frees once.
    let mut f = unsafe {
        Tensor::from_raw_parts(
            ptr,
            &[3],
            &[1],
            Device::CPU,
            false,
            ForeignOwner { ptr, len: 3 },
        )
    }?;
    Ok((s.as_slice_mut().is_some(), f.as_slice_mut().is_some()))
}

/// The input, converted to float64 if it is not: returned as is.
#[dlpack_fn(returns = like(x))]
#[pyfunction]
fn passthrough_f64(x: TensorRef<'_, f64>) -> TensorRef<'_, f64> {
    x
}

/// The same, always to PyTorch.
#[dlpack_fn(returns = torch)]
#[pyfunction]
fn passthrough_f64_torch(x: TensorRef<'_, f64>) -> TensorRef<'_, f64> {
    x
}

/// The same, to NumPy.
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn passthrough_f64_numpy(x: TensorRef<'_, f64>) -> TensorRef<'_, f64> {
    x
}

/// The same, C-ordered, as `dlcast.Array`.
#[dlpack_fn(returns = dlcast)]
#[pyfunction]
fn passthrough_f64_c(#[order(c)] x: TensorRef<'_, f64>) -> TensorRef<'_, f64> {
    x
}

/// The input itself (a view) with a fresh copy, in a tuple, returned like
/// the first argument (no `returns = ..`).
#[dlpack_fn]
#[pyfunction]
fn view_and_copy(x: TensorRef<'_, f64>) -> PyResult<(Tensor<f64>, TensorRef<'_, f64>)> {
    Ok((Tensor::from_vec(x.to_vec()?, x.shape())?, x))
}

/// The same, in a list, handed to `x`'s framework (`returns = like(x)`).
#[dlpack_fn(returns = like(x))]
#[pyfunction]
fn views_like(x: TensorDyn<'_>) -> Vec<TensorDyn<'_>> {
    vec![x]
}

/// `0..n` as float32 (`read_only`: exported read-only) to each target.
macro_rules! range_to {
    ($($name:ident => $fw:ident;)*) => {$(
        #[doc = concat!("`0..n` as float32, to ", stringify!($fw), ".")]
        #[dlpack_fn(returns = $fw)]
        #[pyfunction]
        #[pyo3(signature = (n, read_only = false))]
        fn $name(n: usize, read_only: bool) -> PyResult<Tensor<f32>> {
            let t = Tensor::from_fn(&[n], |i| i as f32)?;
            Ok(if read_only { t.into_read_only() } else { t })
        }
    )*};
}
range_to!(
    range_memoryview => memoryview;
    range_mlx => mlx;
    range_paddle => paddle;
);

/// A 2x3 float64 array with a negative stride on axis 1, to memoryview.
#[dlpack_fn(returns = memoryview)]
#[pyfunction]
fn flipped_memoryview() -> PyResult<Tensor<f64>> {
    Ok(Tensor::from_vec_strides(
        (0..6).map(f64::from).collect(),
        &[2, 3],
        &[3, -1],
    )?)
}

/// A negative-stride array to PaddlePaddle (refused).
#[dlpack_fn(returns = paddle)]
#[pyfunction]
fn flipped_paddle() -> PyResult<Tensor<f64>> {
    Ok(Tensor::from_vec_strides(
        (0..6).map(f64::from).collect(),
        &[2, 3],
        &[3, -1],
    )?)
}

/// `x * 2` (float32), returned in the framework of `x`.
#[dlpack_fn(returns = like(x))]
#[pyfunction]
fn doubled_like(x: TensorRef<'_, f32>) -> PyResult<Tensor<f32>> {
    let v = x.to_vec()?;
    Ok(Tensor::from_vec(
        v.iter().map(|a| a * 2.0).collect(),
        x.shape(),
    )?)
}

/// `x += 1` in place (float32, any strides).
#[dlpack_fn]
#[pyfunction]
fn increment_f32(mut x: TensorMut<'_, f32>) -> PyResult<()> {
    let mut a = x.as_ndarray_mut()?;
    a += 1.0;
    Ok(())
}

pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Matrix4f>()?;
    m.add_class::<Mutable>()?;
    macro_rules! add {
        ($($f:ident),* $(,)?) => {$( m.add_function(wrap_pyfunction!($f, m)?)?; )*};
    }
    add!(
        foreign,
        foreign_reversed,
        foreign_drops,
        consume_on_thread,
        static_table,
        static_table_numpy,
        static_table_torch,
        read_only_range,
        read_only_range_numpy,
        read_only_range_torch,
        read_only_range_jax,
        shared_tensors_give_no_slice,
        passthrough_f64,
        passthrough_f64_torch,
        passthrough_f64_numpy,
        passthrough_f64_c,
        view_and_copy,
        views_like,
        range_memoryview,
        range_mlx,
        range_paddle,
        flipped_memoryview,
        flipped_paddle,
        doubled_like,
        increment_f32,
    );
    Ok(())
}
