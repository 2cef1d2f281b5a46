//! Edge cases of ownership (`ArrayBuffer`, `Tensor::from_static`,
//! `Tensor::from_raw_parts`, `into_read_only`, `returns = memoryview | mlx |
//! paddle`) and of the rank-typed views (`TensorRef<'_, T, N>`, views over
//! Rust data): safe Rust a user could write, called from
//! tests/python/test_ownership.py, test_ranked_views.py, test_lifetimes.py,
//! test_registry.py and test_export_constructions.py.

use dlcast_runtime::ndarray::{self, s, ArrayView, ArrayView2};
use dlcast_runtime::prelude::*;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

// --- ArrayBuffer<bool> ------------------------------------------------------

/// A class that keeps booleans in an `ArrayBuffer<bool>` and hands them to
/// NumPy writable, as the README's `Matrix` does with floats.
#[pyclass(module = "dlcast_testext")]
pub struct BoolBuf {
    data: ArrayBuffer<bool>,
}

#[dlpack_fn]
#[pymethods]
impl BoolBuf {
    #[new]
    fn new(n: usize) -> PyResult<Self> {
        Ok(BoolBuf {
            data: ArrayBuffer::zeros(&[n])?,
        })
    }

    /// The flags as a writable NumPy array.
    #[dlpack_fn(returns = numpy)]
    fn data(slf: &Bound<'_, Self>) -> PyResult<Tensor<bool>> {
        slf.try_borrow()?.data.view(slf)
    }

    /// The bytes behind `read()`'s `&[bool]`, as safe Rust sees them.
    fn read_bytes(&self, py: Python<'_>) -> PyResult<Vec<u8>> {
        let r = self.data.read(py)?;
        Ok(r.iter().map(|&b| u8::from(b)).collect())
    }

    /// Element `i` through `ArrayBuffer::get`, as a byte.
    fn get_byte(&self, py: Python<'_>, i: usize) -> PyResult<u8> {
        Ok(u8::from(self.data.get(py, &[i])?))
    }

    /// `&mut [bool]` (no export alive), as bytes.
    fn mut_bytes(&mut self) -> PyResult<Vec<u8>> {
        Ok(self
            .data
            .as_mut_slice()?
            .iter()
            .map(|&b| u8::from(b))
            .collect())
    }
}

// --- static data through frameworks that re-export --------------------------

static TABLE2: [f32; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];

/// Static data, read-only, to JAX (zero-copy: JAX arrays are immutable).
#[dlpack_fn(returns = jax)]
#[pyfunction]
fn a2_static_jax() -> PyResult<Tensor<f32>> {
    Ok(Tensor::from_static(&TABLE2, &[2, 3])?)
}

/// Static data, read-only, to NumPy.
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn a2_static_numpy() -> PyResult<Tensor<f32>> {
    Ok(Tensor::from_static(&TABLE2, &[2, 3])?)
}

/// A 64-byte aligned static (JAX takes such memory without a copy).
#[repr(C, align(64))]
struct Aligned([f32; 16]);
static ALIGNED: Aligned = Aligned([1.0; 16]);

/// The aligned static to JAX.
#[dlpack_fn(returns = jax)]
#[pyfunction]
fn a2_static_aligned_jax() -> PyResult<Tensor<f32>> {
    Ok(Tensor::from_static(&ALIGNED.0, &[16])?)
}

/// The aligned static to MLX.
#[dlpack_fn(returns = mlx)]
#[pyfunction]
fn a2_static_aligned_mlx() -> PyResult<Tensor<f32>> {
    Ok(Tensor::from_static(&ALIGNED.0, &[16])?)
}

/// The first element of the aligned static.
#[pyfunction]
fn a2_static_aligned_first() -> f32 {
    let p: *const f32 = &ALIGNED.0[0];
    // SAFETY: `p` points to a live, aligned, initialised static f32.
    unsafe { p.read_volatile() }
}

/// Static data to TensorFlow.
#[dlpack_fn(returns = tensorflow)]
#[pyfunction]
fn a2_static_tensorflow() -> PyResult<Tensor<f32>> {
    Ok(Tensor::from_static(&TABLE2, &[2, 3])?)
}

/// Static data to a memoryview.
#[dlpack_fn(returns = memoryview)]
#[pyfunction]
fn a2_static_memoryview() -> PyResult<Tensor<f32>> {
    Ok(Tensor::from_static(&TABLE2, &[2, 3])?)
}

/// Static data to MLX.
#[dlpack_fn(returns = mlx)]
#[pyfunction]
fn a2_static_mlx() -> PyResult<Tensor<f32>> {
    Ok(Tensor::from_static(&TABLE2, &[2, 3])?)
}

/// Static data to PaddlePaddle (refused: read-only).
#[dlpack_fn(returns = paddle)]
#[pyfunction]
fn a2_static_paddle() -> PyResult<Tensor<f32>> {
    Ok(Tensor::from_static(&TABLE2, &[2, 3])?)
}

/// The first element of the static table (to see whether it was written).
#[pyfunction]
fn a2_static_first() -> f32 {
    // SAFETY-free: a plain read of a static (a volatile read so that a
    // write through a consumer, if one happened, is observed).
    // `read_volatile` needs a raw pointer, which a safe reference gives.
    let p: *const f32 = &TABLE2[0];
    // SAFETY: `p` points to a live, aligned, initialised static f32.
    unsafe { p.read_volatile() }
}

// --- foreign memory: owners dropped exactly once -----------------------------

static COUNTED_MADE: AtomicUsize = AtomicUsize::new(0);
static COUNTED_DROPPED: AtomicUsize = AtomicUsize::new(0);

/// Owns a leaked boxed slice; counts its drops.
struct Counted {
    ptr: *mut f64,
    len: usize,
}

// SAFETY: plain heap memory, not tied to a thread.
unsafe impl Send for Counted {}

impl Drop for Counted {
    fn drop(&mut self) {
        // SAFETY: made by `Box::into_raw` of a boxed slice of `len`
        // elements in `counted_tensor`; this owner is its only freer.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
        COUNTED_DROPPED.fetch_add(1, Ordering::SeqCst);
    }
}

/// `0..n` as float64 over foreign memory; `reversed`: stride -1;
/// `offset1`: element 0 one byte past an f64 boundary is not allowed by
/// the contract, so instead one element in (still aligned).
fn counted_tensor(
    n: usize,
    read_only: bool,
    reversed: bool,
    device: Device,
) -> PyResult<Tensor<f64>> {
    let v: Box<[f64]> = (0..n).map(|i| i as f64).collect();
    let ptr = Box::into_raw(v).cast::<f64>();
    COUNTED_MADE.fetch_add(1, Ordering::SeqCst);
    let owner = Counted { ptr, len: n };
    let (data, stride) = if reversed {
        (ptr.wrapping_add(n.saturating_sub(1)), -1)
    } else {
        (ptr, 1)
    };
    // SAFETY: `n` initialised, aligned f64 freed only by `owner`; with a
    // stride of -1 element 0 is the last one (n >= 1 in the tests). For a
    // non-CPU `device` the memory is never read (export fails or hands a
    // description only).
    Ok(unsafe { Tensor::from_raw_parts(data, &[n], &[stride], device, read_only, owner) }?)
}

macro_rules! counted_to {
    ($($name:ident => $fw:ident;)*) => {$(
        #[doc = concat!("Counted foreign memory to ", stringify!($fw), ".")]
        #[dlpack_fn(returns = $fw)]
        #[pyfunction]
        #[pyo3(signature = (n, read_only = false, reversed = false))]
        fn $name(n: usize, read_only: bool, reversed: bool) -> PyResult<Tensor<f64>> {
            counted_tensor(n, read_only, reversed, Device::CPU)
        }
    )*};
}
counted_to!(
    a2_counted_torch => torch;
    a2_counted_jax => jax;
    a2_counted_numpy => numpy;
    a2_counted_memoryview => memoryview;
    a2_counted_mlx => mlx;
    a2_counted_paddle => paddle;
);

/// Counted "device" memory (never read) to a memoryview: refused, the
/// owner dropped once.
#[dlpack_fn(returns = memoryview)]
#[pyfunction]
fn a2_counted_device_memoryview(n: usize) -> PyResult<Tensor<f64>> {
    counted_tensor(
        n,
        false,
        false,
        Device {
            device_type: 2,
            device_id: 0,
        },
    )
}

/// Counted "device" memory to NumPy: refused, the owner dropped once.
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn a2_counted_device_numpy(n: usize) -> PyResult<Tensor<f64>> {
    counted_tensor(
        n,
        false,
        false,
        Device {
            device_type: 2,
            device_id: 0,
        },
    )
}

/// A bfloat16 tensor (no buffer-protocol format) to a memoryview.
#[dlpack_fn(returns = memoryview)]
#[pyfunction]
fn a2_mv_bf16(n: usize) -> PyResult<Tensor<half::bf16>> {
    Ok(Tensor::from_vec(vec![half::bf16::from_f32(1.5); n], &[n])?)
}

/// A broadcast of `rows` x 3 over 3 elements (stride 0) to a memoryview.
#[dlpack_fn(returns = memoryview)]
#[pyfunction]
fn a2_mv_broadcast(rows: usize) -> PyResult<Tensor<f64>> {
    Ok(Tensor::from_vec_strides(
        vec![1.0, 2.0, 3.0],
        &[rows, 3],
        &[0, 1],
    )?)
}

/// Counted foreign memory as `dlcast.Array`.
#[pyfunction]
#[pyo3(signature = (n, read_only = false, reversed = false))]
fn a2_counted(n: usize, read_only: bool, reversed: bool) -> PyResult<Tensor<f64>> {
    counted_tensor(n, read_only, reversed, Device::CPU)
}

/// `(made, dropped)` counted owners.
#[pyfunction]
fn a2_counted_stats() -> (usize, usize) {
    (
        COUNTED_MADE.load(Ordering::SeqCst),
        COUNTED_DROPPED.load(Ordering::SeqCst),
    )
}

// --- a writable ArrayBuffer view to JAX --------------------------------------

/// An object whose data goes to JAX (immutable arrays) and to NumPy
/// (writable) from the same buffer.
#[pyclass(module = "dlcast_testext", weakref)]
pub struct JaxBuf {
    data: ArrayBuffer<f32>,
}

#[dlpack_fn]
#[pymethods]
impl JaxBuf {
    #[new]
    fn new() -> PyResult<Self> {
        Ok(JaxBuf {
            data: ArrayBuffer::zeros(&[16])?,
        })
    }

    /// The read-only view to JAX.
    #[dlpack_fn(returns = jax)]
    fn frozen(slf: &Bound<'_, Self>) -> PyResult<Tensor<f32>> {
        slf.try_borrow()?.data.view_read_only(slf)
    }

    /// The read-only view, made read-only through `into_read_only` of a
    /// writable export, to JAX.
    #[dlpack_fn(returns = jax)]
    fn frozen2(slf: &Bound<'_, Self>) -> PyResult<Tensor<f32>> {
        Ok(slf.try_borrow()?.data.view(slf)?.into_read_only())
    }

    /// A writable view (dlcast.Array).
    fn view(slf: &Bound<'_, Self>) -> PyResult<Tensor<f32>> {
        slf.try_borrow()?.data.view(slf)
    }

    /// The sum read through a guard.
    fn total(&self, py: Python<'_>) -> PyResult<f32> {
        Ok(self.data.read(py)?.iter().sum())
    }

    /// The writable view to PaddlePaddle.
    #[dlpack_fn(returns = paddle)]
    fn to_paddle(slf: &Bound<'_, Self>) -> PyResult<Tensor<f32>> {
        slf.try_borrow()?.data.view(slf)
    }

    /// Live exports.
    fn exports(&self) -> usize {
        self.data.exports()
    }

    /// The read-only view to MLX.
    #[dlpack_fn(returns = mlx)]
    fn frozen_mlx(slf: &Bound<'_, Self>) -> PyResult<Tensor<f32>> {
        slf.try_borrow()?.data.view_read_only(slf)
    }

    /// `x.get([i, j])` of a 2-d view, in a method (error names).
    #[staticmethod]
    fn peek(x: TensorRef<'_, f32, 2>, i: usize, j: usize) -> PyResult<f32> {
        Ok(x.get([i, j])?)
    }

    /// Holds a read guard (`ArrayBuffer::read`) while the GIL is released,
    /// until `a2_release()`; `a2_held()` is true meanwhile. Gives the sum
    /// read after.
    fn hold_read(&self, py: Python<'_>) -> PyResult<f32> {
        let r = self.data.read(py)?;
        HELD.store(true, Ordering::SeqCst);
        py.detach(|| {
            while !RELEASE.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
        HELD.store(false, Ordering::SeqCst);
        RELEASE.store(false, Ordering::SeqCst);
        Ok(r.iter().sum())
    }

    /// Rust writes element `i` (allowed while views live).
    fn set(&self, py: Python<'_>, i: usize, v: f32) -> PyResult<()> {
        self.data.set(py, &[i], v)
    }
}

static HELD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static RELEASE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a body is parked inside `py.detach` holding a borrow.
#[pyfunction]
fn a2_held() -> bool {
    HELD.load(Ordering::SeqCst)
}

/// Lets the parked body go.
#[pyfunction]
fn a2_release() {
    RELEASE.store(true, Ordering::SeqCst);
}

/// Holds `&mut [f32]` of `x` while the GIL is released, until
/// `a2_release()`, then adds 1 to every element.
#[dlpack_fn]
#[pyfunction]
fn a2_hold_mut(py: Python<'_>, x: &mut [f32]) {
    HELD.store(true, Ordering::SeqCst);
    py.detach(|| {
        while !RELEASE.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        x.iter_mut().for_each(|v| *v += 1.0);
    });
    HELD.store(false, Ordering::SeqCst);
    RELEASE.store(false, Ordering::SeqCst);
}

/// An `ArrayBuffer<f64>` (rust-numpy's test functions take float64).
#[pyclass(module = "dlcast_testext")]
pub struct F64Buf {
    data: ArrayBuffer<f64>,
}

#[dlpack_fn]
#[pymethods]
impl F64Buf {
    #[new]
    fn new(n: usize) -> PyResult<Self> {
        Ok(F64Buf {
            data: ArrayBuffer::zeros(&[n])?,
        })
    }

    /// A writable NumPy view.
    #[dlpack_fn(returns = numpy)]
    fn data(slf: &Bound<'_, Self>) -> PyResult<Tensor<f64>> {
        slf.try_borrow()?.data.view(slf)
    }

    /// Holds `read()`'s `&[f64]` while calling `f()`; gives the sums read
    /// before and after.
    fn sum_around(&self, py: Python<'_>, f: Bound<'_, PyAny>) -> PyResult<(f64, f64)> {
        let r = self.data.read(py)?;
        let before: f64 = r.iter().sum();
        f.call0()?;
        Ok((before, r.iter().sum()))
    }

    /// `ArrayBuffer::set` of element 0.
    fn set0(&self, py: Python<'_>, v: f64) -> PyResult<()> {
        self.data.set(py, &[0], v)
    }
}

// --- ArrayBuffer errors -------------------------------------------------------

/// The error `ArrayBuffer::<f64>::zeros(shape)` gives, as
/// `(exception type name, message)`, or `None`.
#[pyfunction]
fn a2_buffer_zeros_error(py: Python<'_>, shape: Vec<usize>) -> Option<(String, String)> {
    match ArrayBuffer::<f64>::zeros(&shape) {
        Ok(_) => None,
        Err(e) => {
            let e = PyErr::from(e);
            let name = e
                .get_type(py)
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default();
            Some((name, e.value(py).to_string()))
        }
    }
}

/// The error `ArrayBuffer::get` gives for `index` on a (4, 4) buffer.
#[pyfunction]
fn a2_buffer_get_error(py: Python<'_>, index: Vec<usize>) -> Option<String> {
    let b = ArrayBuffer::<f64>::zeros(&[4, 4]).ok()?;
    b.get(py, &index).err().map(|e| e.value(py).to_string())
}

// --- rank-typed views ---------------------------------------------------------

/// `x.get(index)` of a dynamic view of any rank (7-d included).
#[dlpack_fn]
#[pyfunction]
fn a2_get_dyn(x: TensorRef<'_, f64>, index: Vec<usize>) -> PyResult<f64> {
    Ok(x.get(&index)?)
}

/// `x.iter()` of a 7-d view, collected.
#[dlpack_fn]
#[pyfunction]
fn a2_iter7(x: TensorRef<'_, f64, 7>) -> PyResult<Vec<f64>> {
    Ok(x.iter()?.collect())
}

/// `x.into_rank::<2>()`'s error text, or the dims.
#[dlpack_fn]
#[pyfunction]
fn a2_into_rank2(x: TensorRef<'_, f64, 1>) -> PyResult<[usize; 2]> {
    Ok(x.into_dyn().into_rank::<2>()?.dims())
}

/// `x.reshape(shape)` then `into_rank::<2>()` and `get([i, j])`.
#[dlpack_fn]
#[pyfunction]
fn a2_reshape_get(
    x: TensorRef<'_, f64, 1>,
    shape: Vec<usize>,
    i: usize,
    j: usize,
) -> PyResult<f64> {
    Ok(x.reshape(&shape)?.into_rank::<2>()?.get([i, j])?)
}

/// `copy_from_slice(values)` into a 2-d writable view after `t()` and a
/// flip: C order of the transformed view.
#[dlpack_fn]
#[pyfunction]
fn a2_copy_into_flipped_t(out: TensorMut<'_, f64, 2>, values: Vec<f64>) -> PyResult<()> {
    let mut v = out.t().flip_axis(0)?;
    Ok(v.copy_from_slice(&values)?)
}

/// `set([i, j])` after `slice_axis` (the cached extents must follow).
#[dlpack_fn]
#[pyfunction]
fn a2_set_after_slice(
    out: TensorMut<'_, f64, 2>,
    rows: usize,
    i: usize,
    j: usize,
    v: f64,
) -> PyResult<()> {
    let mut s = out.slice_axis(0, 0..rows)?;
    Ok(s.set([i, j], v)?)
}

/// The sum through `as_array()` of a permuted 3-d view.
#[dlpack_fn]
#[pyfunction]
fn a2_as_array_permuted(x: TensorRef<'_, f64, 3>) -> PyResult<(Vec<usize>, f64)> {
    let p = x.permute(&[2, 0, 1])?;
    let a = p.as_array()?;
    Ok((a.shape().to_vec(), a.sum()))
}

// --- views over Rust data, returned -------------------------------------------

static GRID: [f64; 6] = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0];

/// A flipped view of static Rust data (ndarray), returned (copied).
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn a2_rust_flipped() -> PyResult<TensorRef<'static, f64, 2>> {
    let a: ArrayView2<'static, f64> = ArrayView::from_shape((2, 3), &GRID[..])
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let a = a.slice_move(s![..;-1, ..;-1]);
    Ok(TensorRef::from_ndarray(a)?)
}

/// A broadcast view of static Rust data (stride 0), returned (copied).
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn a2_rust_broadcast(rows: usize) -> PyResult<TensorRef<'static, f64>> {
    let a =
        ArrayView::from_shape(3, &GRID[..3]).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let b = a
        .broadcast((rows, 3))
        .ok_or_else(|| PyValueError::new_err("broadcast refused"))?;
    // `broadcast` borrows `a`; rebuild the view with the static lifetime.
    let _ = b;
    let shape = [rows, 3];
    let strides = [0isize, 1];
    let v: ndarray::ArrayView2<'static, f64> =
        ndarray::ArrayView::from_shape(ndarray::ShapeBuilder::strides(shape, [0, 1]), &GRID[..3])
            .map_err(|e| PyValueError::new_err(format!("{e} {strides:?}")))?;
    Ok(TensorRef::from_ndarray(v)?)
}

/// An empty view of Rust data with a huge extent, returned.
#[dlpack_fn(returns = numpy)]
#[pyfunction]
fn a2_rust_empty(shape: Vec<usize>) -> PyResult<TensorRef<'static, f64>> {
    Ok(TensorRef::from_slice(&[], &shape)?)
}

/// A read-only view over an object's Rust data (a `Vec`), returned.
#[pyclass(module = "dlcast_testext")]
pub struct VecHolder {
    v: Vec<f32>,
}

#[dlpack_fn]
#[pymethods]
impl VecHolder {
    #[new]
    fn new(n: usize) -> Self {
        VecHolder {
            v: (0..n).map(|i| i as f32).collect(),
        }
    }

    /// A view of `self.v` (Rust data), returned to NumPy: a copy.
    #[dlpack_fn(returns = numpy)]
    fn view(&self) -> PyResult<TensorRef<'_, f32, 1>> {
        Ok(TensorRef::from_slice(&self.v, &[self.v.len()])?)
    }

    /// Overwrites the data (the copy returned earlier must not change).
    fn fill(&mut self, x: f32) {
        self.v.iter_mut().for_each(|v| *v = x);
    }

    /// Frees the data (a returned view must not dangle).
    fn clear(&mut self) {
        self.v = Vec::new();
    }
}

pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BoolBuf>()?;
    m.add_class::<JaxBuf>()?;
    m.add_class::<VecHolder>()?;
    m.add_class::<F64Buf>()?;
    macro_rules! add {
        ($($f:ident),* $(,)?) => {$( m.add_function(wrap_pyfunction!($f, m)?)?; )*};
    }
    add!(
        a2_static_jax,
        a2_static_tensorflow,
        a2_static_aligned_jax,
        a2_static_aligned_mlx,
        a2_static_aligned_first,
        a2_static_numpy,
        a2_static_memoryview,
        a2_static_mlx,
        a2_static_paddle,
        a2_static_first,
        a2_counted_torch,
        a2_counted_jax,
        a2_counted_numpy,
        a2_counted_memoryview,
        a2_counted_mlx,
        a2_counted_paddle,
        a2_counted,
        a2_counted_stats,
        a2_held,
        a2_release,
        a2_hold_mut,
        a2_counted_device_memoryview,
        a2_counted_device_numpy,
        a2_mv_bf16,
        a2_mv_broadcast,
        a2_buffer_zeros_error,
        a2_buffer_get_error,
        a2_get_dyn,
        a2_iter7,
        a2_into_rank2,
        a2_reshape_get,
        a2_copy_into_flipped_t,
        a2_set_after_slice,
        a2_as_array_permuted,
        a2_rust_flipped,
        a2_rust_broadcast,
        a2_rust_empty,
    );
    Ok(())
}
