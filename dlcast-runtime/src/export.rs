//! Export: arrays handed back to Python, zero-copy.
//!
//! - [`Tensor<T>`] owns Rust data (a `Vec<T>`, a `Box<[T]>`, an
//!   `ndarray::Array`); its allocation becomes the exported buffer.
//! - A view of an input (`TensorRef`, `TensorMut`, `TensorDyn`, ...) returned
//!   from a `#[dlpack_fn]` function keeps the input's producer alive until
//!   the last consumer lets go (case C14).
//!
//! Both become an [`Array`]: a small Python class (`dlcast.Array`) that
//! follows the array API standard's `__dlpack__` / `__dlpack_device__`
//! protocol to the letter and offers the buffer protocol for CPU data, so
//! every framework's `from_dlpack` and `numpy.asarray` take it. With
//! `#[dlpack_fn(returns = numpy)]` (or `torch`, `jax`, `cupy`, `tensorflow`,
//! `array_api`) the function hands that framework's array instead.

use crate::borrow::{self, Borrow, Refused};
use crate::device::Device;
use crate::dtype::{code, DType, Element};
pub use crate::framework::Framework;
use crate::import::{Dims, RawTensor};
use crate::layout;
use crate::view::{TensorDyn, TensorDynMut, TensorMut, TensorRef};
use dlpack_rs::ffi::{
    DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
};
use pyo3::exceptions::{PyBufferError, PyMemoryError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyTuple};
use std::any::Any;
use std::ffi::{c_int, c_void, CStr};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// `DLPACK_FLAG_BITMASK_READ_ONLY` and `..._IS_COPIED` (DLPack header).
const FLAG_READ_ONLY: u64 = 1;
const FLAG_IS_COPIED: u64 = 2;
/// The version written into versioned capsules.
const EXPORT_VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 3 };
const NAME_LEGACY: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";

/// Counters of what dlcast exported, for leak tests and debugging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportStats {
    /// Exported buffers created ([`Array`] objects).
    pub buffers_created: usize,
    /// Exported buffers freed: their memory (or the input they view) was
    /// released because neither Python nor any consumer holds them.
    pub buffers_freed: usize,
    /// DLPack capsules handed out by `__dlpack__`.
    pub capsules_created: usize,
    /// Deleters of those capsules that ran (by a consumer, or by the capsule
    /// destructor when nobody consumed the capsule).
    pub capsule_deleters_run: usize,
}

static BUFFERS_CREATED: AtomicUsize = AtomicUsize::new(0);
static BUFFERS_FREED: AtomicUsize = AtomicUsize::new(0);
static CAPSULES_CREATED: AtomicUsize = AtomicUsize::new(0);
static CAPSULE_DELETERS: AtomicUsize = AtomicUsize::new(0);

/// The counters since the process started.
pub fn stats() -> ExportStats {
    ExportStats {
        buffers_created: BUFFERS_CREATED.load(Ordering::SeqCst),
        buffers_freed: BUFFERS_FREED.load(Ordering::SeqCst),
        capsules_created: CAPSULES_CREATED.load(Ordering::SeqCst),
        capsule_deleters_run: CAPSULE_DELETERS.load(Ordering::SeqCst),
    }
}

/// Set by an `atexit` hook: once the interpreter shuts down, deleters that
/// would need Python leak instead of touching it (case C13).
static FINALIZING: AtomicBool = AtomicBool::new(false);

/// Why a [`Tensor`] cannot be built from the given parts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// The shape's element count differs from the data's length.
    #[error("shape {shape:?} holds {expected} elements, but the data has {got}")]
    Length {
        /// The requested shape.
        shape: Vec<usize>,
        /// Elements the shape holds.
        expected: usize,
        /// Elements given.
        got: usize,
    },
    /// Shape and strides have different lengths.
    #[error("shape has {0} dimensions but strides have {1}")]
    Rank(usize, usize),
    /// Some index would reach outside the data.
    #[error(
        "strides {strides:?} reach outside the {len} elements of the data for shape {shape:?}"
    )]
    OutOfBounds {
        /// The requested shape.
        shape: Vec<usize>,
        /// The requested strides (elements).
        strides: Vec<isize>,
        /// Elements given.
        len: usize,
    },
    /// The shape or strides cannot be described to a consumer: an extent
    /// beyond `i64::MAX`, or a byte stride beyond `isize`.
    #[error("shape {shape:?} with strides {strides:?} cannot be exported: {why}")]
    Unrepresentable {
        /// The requested shape.
        shape: Vec<usize>,
        /// The requested strides (elements).
        strides: Vec<isize>,
        /// What does not fit.
        why: &'static str,
    },
    /// The buffer could not be allocated: more bytes than the address space
    /// holds, or the allocator refused. Converts to Python's `MemoryError`.
    #[error("cannot allocate {bytes} bytes for shape {shape:?}")]
    OutOfMemory {
        /// The requested shape.
        shape: Vec<usize>,
        /// Bytes asked for (`usize::MAX` when the size itself overflows).
        bytes: usize,
    },
}

impl From<ShapeError> for PyErr {
    fn from(e: ShapeError) -> Self {
        match e {
            ShapeError::OutOfMemory { .. } => PyMemoryError::new_err(e.to_string()),
            _ => PyValueError::new_err(e.to_string()),
        }
    }
}

/// The alignment the global allocator is asked for by [`OwnedAlloc`]: the
/// one `malloc`/`calloc` give every block on the usual 64-bit targets, so
/// that the request takes the allocator's plain path instead of its aligned
/// one (glibc's `posix_memalign` splits a larger block and frees the rest,
/// every call).
const ALLOC_ALIGN: usize = 16;

/// From this many bytes [`OwnedAlloc::zeroed`] asks the allocator for
/// zeroed memory (`calloc`, which skips zeroing fresh pages from the system:
/// glibc maps blocks of 128 KiB and more afresh by default); below, it
/// zeroes the bytes used itself (`calloc` would zero the slack too).
const ZEROED_BY_ALLOCATOR: usize = 128 << 10;

/// An allocation an export owns, with the layout it was made with, freed
/// on drop: a buffer dlcast allocated, or a `Vec`'s. Held inline in
/// [`Keep`], which stays small so (`Layout` leaves room for its tag): an
/// export is moved several times on its way into its Python object.
struct OwnedAlloc {
    ptr: std::ptr::NonNull<u8>,
    /// Of size 0 when nothing was allocated (an empty `Vec`).
    layout: std::alloc::Layout,
}

impl OwnedAlloc {
    /// `bytes` zero bytes aligned to `align` (a power of two), and the
    /// address of the first (what the export describes), or `None`
    /// when the size does not fit a layout (over `isize::MAX` once the
    /// slack is added) or the allocator refuses: the size comes from a
    /// Python input, so failure must raise `MemoryError`, not abort.
    ///
    /// A plain allocation of `bytes` plus the slack an
    /// [`ALLOC_ALIGN`]-aligned block may need to reach `align`, the data
    /// starting at the first aligned address.
    fn zeroed(bytes: usize, align: usize) -> Option<(Self, *mut u8)> {
        if !align.is_power_of_two() {
            return None;
        }
        // An `ALLOC_ALIGN`-aligned address is at most `align - ALLOC_ALIGN`
        // bytes below the next `align`-aligned one (both powers of two).
        let slack = align.max(ALLOC_ALIGN) - ALLOC_ALIGN;
        let size = bytes.checked_add(slack)?.max(1);
        let layout = std::alloc::Layout::from_size_align(size, ALLOC_ALIGN).ok()?;
        let zeroed = bytes >= ZEROED_BY_ALLOCATOR;
        // SAFETY: `layout` has a non-zero size.
        let base = std::ptr::NonNull::new(unsafe {
            if zeroed {
                std::alloc::alloc_zeroed(layout)
            } else {
                std::alloc::alloc(layout)
            }
        })?;
        let this = OwnedAlloc { ptr: base, layout };
        let misalign = (base.as_ptr() as usize) & (align - 1);
        let offset = if misalign == 0 { 0 } else { align - misalign };
        // `base` is `ALLOC_ALIGN`-aligned, so `misalign` is a multiple of it
        // and `offset <= slack`: the aligned start plus `bytes` stays inside
        // the `bytes + slack` bytes allocated (`this` frees them otherwise).
        if offset > slack {
            return None;
        }
        // SAFETY: `offset <= slack <= size`: inside the allocation, or one
        // past its end when `bytes` is 0.
        let ptr = unsafe { base.as_ptr().add(offset) };
        if !zeroed {
            // SAFETY: `ptr + bytes` ends inside the `bytes + slack` bytes
            // allocated (`offset <= slack`), which nothing else refers to.
            unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        }
        Some((this, ptr))
    }

    /// What keeps `v`'s allocation alive (its elements stay where they are,
    /// for the export to describe): the allocation itself, or, should its
    /// layout not be expressible (never, for a live `Vec`), the boxed `Vec`.
    fn keep_vec<T: Element>(v: Vec<T>) -> Keep {
        let Ok(layout) = std::alloc::Layout::array::<T>(v.capacity()) else {
            return Keep::Owned(Box::new(v));
        };
        let mut v = std::mem::ManuallyDrop::new(v);
        // `as_mut_ptr`, not `as_mut_slice`: it makes no reference to the
        // elements, so the pointer the caller took into them for the export
        // (`as_ptr`/`as_mut_ptr`, used for every later read and write)
        // stays valid under Rust's aliasing rules, and so does this one, which
        // frees the allocation after those accesses. A `Vec`'s pointer is
        // never null (dangling when unallocated).
        let Some(ptr) = std::ptr::NonNull::new(v.as_mut_ptr().cast::<u8>()) else {
            return Keep::Owned(Box::new(std::mem::ManuallyDrop::into_inner(v)));
        };
        Keep::Alloc(OwnedAlloc { ptr, layout })
    }
}

impl Drop for OwnedAlloc {
    fn drop(&mut self) {
        if self.layout.size() == 0 {
            return;
        }
        // SAFETY: `ptr` was allocated by the global allocator with `layout`:
        // in `zeroed`, or by a `Vec<T>` with `Layout::array::<T>(capacity)`
        // (the layout `Vec` documents for its allocation, and that
        // `Vec::from_raw_parts` requires); this value owns it alone and is
        // dropped once. An unallocated `Vec` has a layout of size 0.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: a plain heap allocation (of bytes, or of `Element`s, which are
// `Send`) owned by this value alone.
unsafe impl Send for OwnedAlloc {}

/// What keeps an exported buffer's memory alive; held only to be dropped.
#[allow(dead_code)]
enum Keep {
    /// Rust data an owner given by the caller keeps alive, dropped then.
    Owned(Box<dyn Any + Send>),
    /// A buffer dlcast allocated (`Tensor::zeros`, copies) or a `Vec`'s
    /// (`Tensor::from_vec`, `ndarray` arrays), freed on drop; inline, with
    /// no box of its own.
    Alloc(OwnedAlloc),
    /// An imported input; dropping it runs the producer's deleter.
    Imported(Box<RawTensor>),
}

/// An exported buffer: a description plus what keeps its memory alive.
struct Exported {
    data: *mut u8,
    /// Extents, as `Py_ssize_t` (the buffer protocol's and NumPy's form);
    /// each also fits `i64` (DLPack's), checked by [`Exported::describe`].
    shape: ExDims,
    /// In elements; each also fits `i64`, checked as above.
    strides: ExDims,
    /// In bytes, as `Py_ssize_t` (the buffer protocol's and NumPy's form).
    byte_strides: ExDims,
    dtype: DType,
    device: Device,
    read_only: bool,
    /// For CUDA/ROCm memory, the stream the data is ready on (the array API
    /// standard's integer, see [`crate::stream`]); `None` or `-1` when no
    /// pending work is known. A consumer asking for another stream is made
    /// to wait for this one.
    stream: Option<i64>,
    _keep: Keep,
    /// The Python object the memory belongs to (an [`ArrayBuffer`]'s
    /// object), kept alive with the export and reported to the garbage
    /// collector by `Array.__traverse__`.
    ///
    /// [`ArrayBuffer`]: crate::ArrayBuffer
    py_owner: Option<Py<PyAny>>,
    /// Read-only memory that must never be written (static data, foreign
    /// read-only memory): `__dlpack__` hands consumers a copy, since some
    /// (PyTorch) ignore `READ_ONLY` and would write it.
    never_written: bool,
}

// SAFETY: `data` points into memory that `keep` owns or keeps alive; no
// thread-bound state is involved except an imported `RawTensor`, which is
// dropped only in `Array`'s deallocation, with the GIL held (deleters and
// `PyBuffer_Release` then run with the GIL, as they require), and
// `py_owner`, a `Py` (which is `Send`: dropped without the GIL, PyO3 defers
// its decref). Rust never forms references into the exported memory from
// an `Array`.
unsafe impl Send for Exported {}
// SAFETY: all fields are read-only after construction.
unsafe impl Sync for Exported {}

impl Drop for Exported {
    fn drop(&mut self) {
        BUFFERS_FREED.fetch_add(1, Ordering::SeqCst);
    }
}

/// Why an [`Exported`] cannot describe a layout (see [`Exported::new`]).
#[derive(Debug)]
struct Unrepresentable(&'static str);

/// How many dimensions an export holds inline (no allocation); more spill
/// to the heap. Small, because an export is moved several times on its way
/// into its Python object, and each move copies all of it.
const EXPORT_INLINE_DIMS: usize = 4;
/// Extents or strides of an export.
type ExDims = smallvec::SmallVec<[isize; EXPORT_INLINE_DIMS]>;

/// `nd` zeros, filled without a loop when they fit inline.
fn zeroed_dims(nd: usize) -> ExDims {
    if nd <= EXPORT_INLINE_DIMS {
        ExDims::from_buf_and_len([0; EXPORT_INLINE_DIMS], nd)
    } else {
        smallvec::smallvec![0; nd]
    }
}

/// Shape and strides in the forms DLPack and the buffer protocol need.
struct Described {
    shape: ExDims,
    strides: ExDims,
    byte_strides: ExDims,
}

impl Exported {
    /// The description of an export; the layout was validated by its maker
    /// (import, or a `Tensor` constructor). Every size is converted with
    /// checked arithmetic: extents must fit `i64` (DLPack) and `isize`
    /// (`Py_ssize_t`), `ndim` an `i32`, and byte strides `isize`. A stride
    /// that no index steps along (extent <= 1, or an empty array) may be
    /// any value and is exported as 0 when it has no such form.
    ///
    /// Inlined, as is `describe`: a `Tensor<T>` constructor's dtype is a
    /// constant then, and the description is built in place.
    #[inline(always)]
    fn new(
        data: *mut u8,
        shape: &[usize],
        strides: &[isize],
        dtype: DType,
        device: Device,
        read_only: bool,
        keep: Keep,
    ) -> Result<Self, Unrepresentable> {
        let d = Self::describe(shape, strides, dtype)?;
        BUFFERS_CREATED.fetch_add(1, Ordering::SeqCst);
        Ok(Exported {
            data,
            shape: d.shape,
            strides: d.strides,
            byte_strides: d.byte_strides,
            dtype,
            device,
            read_only,
            stream: None,
            _keep: keep,
            py_owner: None,
            never_written: false,
        })
    }

    /// The checked conversions of [`Exported::new`], without the data.
    #[inline(always)]
    fn describe(
        shape: &[usize],
        strides: &[isize],
        dtype: DType,
    ) -> Result<Described, Unrepresentable> {
        if shape.len() != strides.len() || i32::try_from(shape.len()).is_err() {
            return Err(Unrepresentable("too many dimensions"));
        }
        let item = isize::try_from(dtype.itemsize().unwrap_or(1))
            .map_err(|_| Unrepresentable("the itemsize overflows"))?;
        let nd = shape.len();
        let mut d = Described {
            shape: zeroed_dims(nd),
            strides: zeroed_dims(nd),
            byte_strides: zeroed_dims(nd),
        };
        for (&n, out) in shape.iter().zip(d.shape.iter_mut()) {
            *out = match (i64::try_from(n), isize::try_from(n)) {
                (Ok(_), Ok(b)) => b,
                _ => return Err(Unrepresentable("an extent exceeds i64::MAX")),
            };
        }
        let outs = d.strides.iter_mut().zip(d.byte_strides.iter_mut());
        for (axis, (&s, (out, out_bytes))) in strides.iter().zip(outs).enumerate() {
            (*out, *out_bytes) = match (i64::try_from(s), s.checked_mul(item)) {
                (Ok(_), Some(b)) => (s, b),
                _ if layout::stride_unused(shape, axis) => (0, 0),
                // A dimension stepped along: its byte stride is at most the
                // byte extent its maker checked, so this cannot happen.
                _ => return Err(Unrepresentable("a byte stride overflows")),
            };
        }
        Ok(d)
    }

    /// Extents as `i64`, DLPack's form (checked to fit by `describe`).
    fn shape_i64(&self) -> impl Iterator<Item = i64> + '_ {
        self.shape.iter().map(|&n| n as i64)
    }

    /// Strides in elements as `i64`, DLPack's form (checked as above).
    fn strides_i64(&self) -> impl Iterator<Item = i64> + '_ {
        self.strides.iter().map(|&s| s as i64)
    }

    /// Extents as `usize` (they were `usize` values, checked to fit `i64`).
    fn shape_usize(&self) -> Dims<usize> {
        self.shape.iter().map(|&n| n.unsigned_abs()).collect()
    }

    /// Strides in elements.
    fn strides_isize(&self) -> &[isize] {
        &self.strides
    }

    fn is_c_contiguous(&self) -> bool {
        layout::is_c_contiguous(&self.shape_usize(), &self.strides)
    }

    /// A read of the exported memory entered in the borrow registry, for a
    /// copy that `what` names (`__dlpack__(copy=True)`, `returns = jax`,
    /// ...): `None` for an empty array, which touches no memory. The
    /// memory is Python's (an export is not registered itself), so a
    /// `&mut` view of it may be live in another call's body (a nested call,
    /// a callback, another thread while the body is inside `py.detach`);
    /// every copy dlcast makes of memory it did not just allocate holds
    /// this read while it reads, as a read-only view would.
    ///
    /// # Errors
    /// `BufferError` naming the call whose writable view holds any of the
    /// bytes; `MemoryError` when the registry cannot grow; `ValueError` for
    /// a span that overflows (a validated export has none).
    fn copy_borrow(&self, py: Python<'_>, what: &'static str) -> PyResult<Option<Borrow>> {
        // The bytes of one element as DLPack counts them (`bits * lanes`
        // rounded up), as the registry entries of views are sized.
        let item = (usize::from(self.dtype.bits) * usize::from(self.dtype.lanes))
            .div_ceil(8)
            .max(1);
        let shape = self.shape_usize();
        let overflow = || {
            PyValueError::new_err(format!(
                "{what}: the array's byte span overflows (shape {shape:?}, strides {:?})",
                self.strides.as_slice()
            ))
        };
        let Some(extent) = layout::byte_extent(&shape, &self.strides, item).ok_or_else(overflow)?
        else {
            return Ok(None);
        };
        let base = self.data as usize;
        let (Some(lo), Some(hi)) = (
            base.checked_add_signed(extent.lo),
            base.checked_add_signed(extent.hi),
        ) else {
            return Err(overflow());
        };
        let req = borrow::request(
            self.device,
            lo,
            hi,
            base,
            &shape,
            &self.strides,
            item,
            false,
            borrow::new_call_id(),
            "dlcast.Array",
            what,
        );
        match borrow::acquire_with(borrow::api(py)?, &req) {
            Ok(b) => Ok(Some(b)),
            Err(Refused::NoMemory) => Err(PyMemoryError::new_err(
                "dlcast's borrow registry could not grow",
            )),
            Err(Refused::Conflict(other)) => {
                let function = borrow::name(other.function, other.function_len);
                let holder = if function == borrow::rnp::RUST_NUMPY {
                    "a rust-numpy PyReadwriteArray".to_string()
                } else {
                    format!(
                        "argument '{}' of {function}(), a writable view",
                        borrow::name(other.param, other.param_len)
                    )
                };
                Err(PyBufferError::new_err(format!(
                    "{what}: cannot copy the array: its memory is in use by a call still \
                     running ({holder}; a nested call, a callback or another thread), and a \
                     copy would read it while it is written; copy it once that call returned"
                )))
            }
        }
    }

    /// The elements copied, in C order, into a new buffer aligned to
    /// [`Tensor::ALIGN`] bytes (host memory only); same dtype, device and
    /// read-only mark. The copy is a read in the borrow registry while it
    /// reads ([`Exported::copy_borrow`]; `what` names it in errors).
    ///
    /// # Errors
    /// `BufferError` while a writable dlcast view of the memory is live;
    /// `MemoryError` when the copy cannot be allocated (a broadcast array
    /// may hold far more elements than memory), `ValueError` for a layout
    /// whose offsets overflow.
    fn aligned_copy(&self, py: Python<'_>, what: &'static str) -> PyResult<Exported> {
        let _read = self.copy_borrow(py, what)?;
        let item = self.dtype.itemsize().unwrap_or(1);
        let shape = self.shape_usize();
        let strides = self.strides_isize();
        let oom = |bytes| {
            PyMemoryError::new_err(format!(
                "cannot allocate {bytes} bytes for a copy of an array of shape {shape:?}"
            ))
        };
        let count = layout::element_count(&shape).ok_or_else(|| oom(usize::MAX))?;
        let bytes = layout::checked_bytes(count, item)
            .filter(|&b| b <= isize::MAX as usize - Tensor::<u8>::ALIGN)
            .ok_or_else(|| oom(count.saturating_mul(item)))?;
        let (buf, dst) =
            OwnedAlloc::zeroed(bytes, Tensor::<u8>::ALIGN).ok_or_else(|| oom(bytes))?;
        let mut written = 0usize;
        let mut overflow = false;
        let walked = layout::for_each_offset(&shape, strides, |off| {
            let src = match off.checked_mul(item as isize) {
                // `written < bytes` always: the walk visits `count` elements.
                Some(b) if written < bytes => self.data.wrapping_offset(b),
                _ => {
                    overflow = true;
                    return;
                }
            };
            // SAFETY: every offset of the walk is an element inside the
            // exported memory (validated when the export was made), which is
            // host-accessible (checked by the caller) and `item` bytes long,
            // and which no dlcast view writes meanwhile (`_read` above);
            // `dst + written` has `item` writable bytes left (`written <
            // bytes = count * item`, a multiple of `item`) in a fresh buffer
            // that does not overlap the source.
            unsafe { std::ptr::copy_nonoverlapping(src, dst.add(written), item) };
            written += item;
        });
        if walked.is_none() || overflow {
            return Err(PyValueError::new_err(format!(
                "cannot copy an array of shape {shape:?} and strides {strides:?}: \
                 an element offset overflows"
            )));
        }
        let mut c_strides: Dims<isize> = smallvec::smallvec![0; shape.len()];
        // Compact strides of a non-empty shape whose byte size fits `isize`
        // fit too; an empty one gets zeros where they would overflow.
        layout::fill_c_strides_or_empty(&shape, &mut c_strides)
            .ok_or_else(|| PyValueError::new_err("the compact strides overflow"))?;
        Exported::new(
            dst,
            &shape,
            &c_strides,
            self.dtype,
            self.device,
            self.read_only,
            Keep::Alloc(buf),
        )
        .map_err(|e| PyValueError::new_err(format!("cannot describe the copy: {}", e.0)))
    }
}

/// An owned array made in Rust, exported to Python without a copy.
///
/// Build it from a `Vec<T>` plus a shape (C or F order, or explicit strides
/// in elements), from a `Box<[T]>` (1-d), or from an `ndarray::Array` (its
/// allocation becomes the exported buffer). Return it from a `#[dlpack_fn]`
/// function (also inside `Option`, `PyResult` or a tuple); Python receives a
/// `dlcast.Array`, or the framework named in `returns = ...`. The data is
/// freed when the last Python object or DLPack consumer lets go.
///
/// # Examples
///
/// ```
/// use dlcast_runtime::Tensor;
///
/// // C order over a `Vec` (no copy):
/// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
/// assert_eq!((t.shape(), t.strides()), (vec![2, 3], vec![3, 1])); // strides in elements
/// // The same values in F order:
/// let f = Tensor::from_vec_f(vec![1.0f32, 4.0, 2.0, 5.0, 3.0, 6.0], &[2, 3])?;
/// assert_eq!(f.strides(), [1, 2]);
/// // Zeros in a 64-byte aligned buffer, then filled:
/// let mut z = Tensor::<u8>::zeros(&[2, 2])?;
/// assert_eq!(z.data_ptr() as usize % Tensor::<u8>::ALIGN, 0);
/// z.as_slice_mut().unwrap().copy_from_slice(&[1, 0, 0, 1]);
/// // A shape that does not hold the data:
/// assert!(Tensor::from_vec(vec![0i32; 5], &[2, 3]).is_err());
/// # Ok::<(), dlcast_runtime::ShapeError>(())
/// ```
///
/// Returned from a `#[dlpack_fn]` function, Python gets a `dlcast.Array`
/// over the same buffer (or the framework `returns = ..` names):
///
/// ```
/// # use dlcast_runtime::prelude::*;
/// # use pyo3::prelude::*;
/// #[dlpack_fn(returns = numpy)]
/// #[pyfunction]
/// fn identity(n: usize) -> PyResult<Tensor<f64>> {
///     Ok(Tensor::from_fn(&[n, n], |i| if i % (n + 1) == 0 { 1.0 } else { 0.0 })?)
/// }
/// ```
pub struct Tensor<T: Element> {
    inner: Exported,
    _marker: PhantomData<T>,
    /// Whether Rust owns the memory and nothing else refers to it (so
    /// [`Tensor::as_slice_mut`] may hand it out): false for views of an
    /// [`ArrayBuffer`](crate::ArrayBuffer), static and foreign memory.
    exclusive: bool,
}

impl<T: Element> Tensor<T> {
    /// A C-order (row-major) array of `shape` over `data`.
    ///
    /// # Errors
    /// [`ShapeError::Length`] if the shape does not hold `data.len()` elements.
    pub fn from_vec(data: Vec<T>, shape: &[usize]) -> Result<Self, ShapeError> {
        let mut strides = zeroed_dims(shape.len());
        Self::check_len(&data, shape)?;
        // The count fits (checked), so only an empty shape with a huge
        // extent can overflow its strides: no consumer could be told them.
        layout::fill_c_strides(shape, &mut strides).ok_or_else(|| ShapeError::Unrepresentable {
            shape: shape.to_vec(),
            strides: Vec::new(),
            why: "the compact strides of an extent overflow isize",
        })?;
        Self::from_vec_strides(data, shape, &strides)
    }

    /// An F-order (column-major) array of `shape` over `data`.
    ///
    /// # Errors
    /// [`ShapeError::Length`] if the shape does not hold `data.len()` elements.
    pub fn from_vec_f(data: Vec<T>, shape: &[usize]) -> Result<Self, ShapeError> {
        Self::check_len(&data, shape)?;
        let rev: Dims<usize> = shape.iter().rev().copied().collect();
        let mut strides: Dims<isize> = smallvec::smallvec![0; shape.len()];
        layout::fill_c_strides(&rev, &mut strides).ok_or_else(|| Self::len_error(&data, shape))?;
        strides.reverse();
        Self::from_vec_strides(data, shape, &strides)
    }

    /// An array of `shape` with explicit `strides` (in elements, negative
    /// allowed) whose element 0 is `data[0]`... unless strides are negative,
    /// in which case element 0 is placed so that the lowest element is
    /// `data[0]`.
    ///
    /// # Errors
    /// [`ShapeError`] if the ranks differ or an index reaches outside `data`.
    pub fn from_vec_strides(
        mut data: Vec<T>,
        shape: &[usize],
        strides: &[isize],
    ) -> Result<Self, ShapeError> {
        if shape.len() != strides.len() {
            return Err(ShapeError::Rank(shape.len(), strides.len()));
        }
        let item = std::mem::size_of::<T>();
        let oob = || ShapeError::OutOfBounds {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            len: data.len(),
        };
        let (first, empty) = match layout::byte_extent(shape, strides, item).ok_or_else(oob)? {
            None => (0usize, true),
            Some(e) => {
                let span =
                    e.hi.checked_sub(e.lo)
                        .and_then(|d| usize::try_from(d).ok())
                        .ok_or_else(oob)?;
                // `data.len() * item` is the byte size of a live `Vec`,
                // which fits `isize`; checked anyway.
                if data.len().checked_mul(item).is_none_or(|b| span > b) {
                    return Err(oob());
                }
                (e.lo.unsigned_abs(), false)
            }
        };
        let base = data.as_mut_ptr().cast::<u8>();
        // Element 0 sits `first` bytes above the lowest element, which is
        // `data[0]`; in bounds as checked above (or empty: never read).
        let ptr = if empty {
            base
        } else {
            base.wrapping_add(first)
        };
        let unrepresentable = |e: Unrepresentable| ShapeError::Unrepresentable {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            why: e.0,
        };
        Ok(Tensor {
            inner: Exported::new(
                ptr,
                shape,
                strides,
                T::DTYPE,
                Device::CPU,
                false,
                OwnedAlloc::keep_vec(data),
            )
            .map_err(unrepresentable)?,
            _marker: PhantomData,
            exclusive: true,
        })
    }

    /// A C-order array of `shape` whose element at flat (C-order) index `i`
    /// is `f(i)`, in a buffer aligned to [`Tensor::ALIGN`] bytes.
    ///
    /// # Errors
    /// [`ShapeError::Length`] if the element count overflows,
    /// [`ShapeError::OutOfMemory`] (Python's `MemoryError`) if the buffer
    /// cannot be allocated.
    pub fn from_fn(shape: &[usize], mut f: impl FnMut(usize) -> T) -> Result<Self, ShapeError> {
        let mut t = Self::zeros(shape)?;
        // `zeros` makes owned, C-contiguous, aligned and valid elements.
        for (i, v) in t.as_slice_mut().unwrap_or_default().iter_mut().enumerate() {
            *v = f(i);
        }
        Ok(t)
    }

    /// A C-order array of `shape` filled with zero bytes (0, 0.0, `false`),
    /// in a buffer aligned to [`Tensor::ALIGN`] bytes, which frameworks such
    /// as JAX need to take the buffer without a copy.
    ///
    /// # Errors
    /// [`ShapeError::Length`] if the element count overflows `usize`,
    /// [`ShapeError::Unrepresentable`] if an extent exceeds `i64::MAX`,
    /// [`ShapeError::OutOfMemory`] (Python's `MemoryError`) if the byte
    /// size exceeds the address space or the allocator refuses it.
    pub fn zeros(shape: &[usize]) -> Result<Self, ShapeError> {
        let overflow = || ShapeError::Length {
            shape: shape.to_vec(),
            expected: usize::MAX,
            got: 0,
        };
        let count = layout::element_count(shape).ok_or_else(overflow)?;
        let oom = |bytes| ShapeError::OutOfMemory {
            shape: shape.to_vec(),
            bytes,
        };
        let item = std::mem::size_of::<T>();
        let bytes = layout::checked_bytes(count, item)
            .filter(|&b| b <= isize::MAX as usize - Self::ALIGN)
            .ok_or_else(|| oom(count.saturating_mul(item)))?;
        let mut strides = zeroed_dims(shape.len());
        // Compact strides of a non-empty shape whose byte size fits `isize`
        // fit too; an empty one gets zeros where they would overflow.
        layout::fill_c_strides_or_empty(shape, &mut strides).ok_or_else(|| {
            ShapeError::Unrepresentable {
                shape: shape.to_vec(),
                strides: Vec::new(),
                why: "an extent exceeds i64::MAX, or its compact strides overflow",
            }
        })?;
        let (buf, data) = OwnedAlloc::zeroed(bytes, Self::ALIGN).ok_or_else(|| oom(bytes))?;
        let inner = Exported::new(
            data,
            shape,
            &strides,
            T::DTYPE,
            Device::CPU,
            false,
            Keep::Alloc(buf),
        )
        .map_err(|e| ShapeError::Unrepresentable {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            why: e.0,
        })?;
        Ok(Tensor {
            inner,
            _marker: PhantomData,
            exclusive: true,
        })
    }

    /// Alignment in bytes of the buffers [`Tensor::zeros`] and
    /// [`Tensor::from_fn`] allocate (XLA's, for JAX's zero-copy import).
    pub const ALIGN: usize = 64;

    /// The elements in C order, when the tensor is in host memory,
    /// C-contiguous and its data aligned for `T` (always so for `zeros`,
    /// `from_fn`, `from_vec`; never for device memory).
    ///
    /// `None` also for memory Rust does not own alone: views of an
    /// [`ArrayBuffer`](crate::ArrayBuffer), [`Tensor::from_static`] and
    /// [`Tensor::from_raw_parts`] tensors.
    pub fn as_slice_mut(&mut self) -> Option<&mut [T]> {
        if !self.exclusive {
            return None;
        }
        let e = &self.inner;
        // Device memory (a `CudaSlice` export) is never handed out as a slice.
        let ok = e.device.is_host_accessible()
            && e.is_c_contiguous()
            && (e.data as usize) % std::mem::align_of::<T>() == 0;
        if !ok {
            return None;
        }
        let len = layout::element_count(&e.shape_usize())?;
        let ptr = if len == 0 {
            std::ptr::NonNull::<T>::dangling().as_ptr()
        } else {
            e.data.cast::<T>()
        };
        // SAFETY: the tensor owns its buffer alone (`exclusive`; no Python
        // object exists yet, since exporting consumes the tensor), which holds `len` valid,
        // aligned, C-contiguous elements; `&mut self` makes this the only
        // access.
        Some(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }

    /// An owned `ndarray` array, exported with its own strides; its
    /// allocation becomes the exported buffer.
    #[cfg(feature = "ndarray")]
    pub fn from_ndarray<D: ndarray::Dimension>(array: ndarray::Array<T, D>) -> Self {
        let shape: Dims<usize> = array.shape().iter().copied().collect();
        let strides: Dims<isize> = array.strides().iter().copied().collect();
        if Exported::describe(&shape, &strides, T::DTYPE).is_err() {
            // Unreachable by ndarray's invariants (extents and the byte
            // offset of every element fit `isize`; strides of extent-1 axes
            // are exported as 0 when they do not fit): a C-order copy, never
            // a panic. Its compact strides always fit, so the last resort,
            // an empty array, is never taken either.
            let v: Vec<T> = array.iter().copied().collect();
            return Tensor::from_vec(v, &shape).unwrap_or_else(|_| Tensor::from(Vec::new()));
        }
        let (vec, offset) = array.into_raw_vec_and_offset();
        let mut vec = vec;
        let base = vec.as_mut_ptr();
        // `offset` is the index of element 0 in the vector (ndarray's own
        // guarantee); an empty array may report none.
        let ptr = base.wrapping_add(offset.unwrap_or(0)).cast::<u8>();
        match Exported::new(
            ptr,
            &shape,
            &strides,
            T::DTYPE,
            Device::CPU,
            false,
            OwnedAlloc::keep_vec(vec),
        ) {
            Ok(inner) => Tensor {
                inner,
                _marker: PhantomData,
                exclusive: true,
            },
            // `describe` accepted this very shape and strides above.
            Err(_) => Tensor::from(Vec::new()),
        }
    }

    fn check_len(data: &[T], shape: &[usize]) -> Result<(), ShapeError> {
        match layout::element_count(shape) {
            Some(n) if n == data.len() => Ok(()),
            _ => Err(Self::len_error(data, shape)),
        }
    }

    fn len_error(data: &[T], shape: &[usize]) -> ShapeError {
        ShapeError::Length {
            shape: shape.to_vec(),
            expected: layout::element_count(shape).unwrap_or(usize::MAX),
            got: data.len(),
        }
    }

    /// Extents.
    pub fn shape(&self) -> Vec<usize> {
        self.inner.shape_usize().to_vec()
    }

    /// Strides in elements.
    pub fn strides(&self) -> Vec<isize> {
        self.inner.strides_isize().to_vec()
    }

    /// Address of element 0 (for zero-copy checks).
    pub fn data_ptr(&self) -> *const T {
        self.inner.data.cast()
    }
}

impl<T: Element> Tensor<T> {
    /// The same tensor, exported read-only: DLPack consumers get the
    /// `READ_ONLY` flag (versioned capsules; a legacy capsule is refused
    /// unless copied), NumPy arrays have `writeable == False`, the buffer
    /// protocol refuses writable requests, JAX and TensorFlow take it as
    /// usual (their arrays are immutable), and `returns = torch` raises
    /// `BufferError` (PyTorch has no read-only tensors). Rust may still
    /// write it through [`Tensor::as_slice_mut`] until it is returned.
    ///
    /// ```
    /// # use dlcast_runtime::Tensor;
    /// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap().into_read_only();
    /// assert!(t.is_read_only());
    /// ```
    pub fn into_read_only(mut self) -> Self {
        self.inner.read_only = true;
        self
    }

    /// Whether the tensor is exported read-only.
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only
    }

    /// A read-only C-order array of `shape` over static data, exported
    /// without a copy (nanobind's `rv_policy::reference` for constants) to
    /// NumPy (`returns = numpy`, `numpy.asarray`, `memoryview`: read-only)
    /// and JAX (`returns = jax`). `__dlpack__` hands other consumers a
    /// copy (`copy=False` raises `BufferError`): some, PyTorch among them,
    /// ignore DLPack's `READ_ONLY` and would write into the static.
    ///
    /// ```
    /// # use dlcast_runtime::Tensor;
    /// static TABLE: [u16; 6] = [1, 2, 3, 4, 5, 6];
    /// let t = Tensor::from_static(&TABLE, &[2, 3]).unwrap();
    /// assert!(t.is_read_only());
    /// ```
    ///
    /// # Errors
    /// [`ShapeError::Length`] if `shape` does not hold `data.len()` elements.
    pub fn from_static(data: &'static [T], shape: &[usize]) -> Result<Self, ShapeError> {
        match layout::element_count(shape) {
            Some(n) if n == data.len() => {}
            _ => {
                return Err(ShapeError::Length {
                    shape: shape.to_vec(),
                    expected: layout::element_count(shape).unwrap_or(usize::MAX),
                    got: data.len(),
                })
            }
        }
        let mut strides: Dims<isize> = smallvec::smallvec![0; shape.len()];
        // A live slice holds at most `isize::MAX` bytes, so its compact
        // strides fit; checked anyway.
        layout::fill_c_strides_or_empty(shape, &mut strides).ok_or_else(|| {
            ShapeError::Unrepresentable {
                shape: shape.to_vec(),
                strides: Vec::new(),
                why: "the compact strides overflow",
            }
        })?;
        // SAFETY: a `'static` shared slice is valid, initialised and
        // aligned for reads for the rest of the process, and never written
        // (`T` has no interior mutability); exported read-only, so no
        // consumer may write it; `shape` covers exactly `data.len()`
        // elements in C order (checked above). The owner `()` holds nothing.
        unsafe {
            Self::from_raw_parts(
                data.as_ptr().cast_mut(),
                shape,
                &strides,
                Device::CPU,
                true,
                (),
            )
        }
    }

    /// An array over memory dlcast did not allocate — a C library's
    /// buffer, an mmap, another library's device memory — exported without
    /// a copy; `owner` is dropped, exactly once, when Rust drops the tensor
    /// unexported or when the last Python object and DLPack consumer lets
    /// go of the export (nanobind's `nb::ndarray(ptr, shape, owner)` with a
    /// capsule deleter). Put what frees the memory in `owner`'s `Drop`.
    ///
    /// - `data`: address of element 0 (element `(i0, i1, ..)` is at
    ///   `data.offset(i0 * strides[0] + i1 * strides[1] + ..)`);
    /// - `shape`, `strides`: extents, and strides **in elements** (negative
    ///   allowed), of the same length;
    /// - `device`: where the memory is (`Device::CPU`, CUDA, ...); the dtype
    ///   is `T`'s;
    /// - `read_only`: export read-only, as memory that must never be
    ///   written: NumPy arrays over it have `writeable == False`,
    ///   `returns = torch` refuses it, and `__dlpack__` hands consumers a
    ///   copy of host memory (PyTorch ignores DLPack's `READ_ONLY`), as for
    ///   [`Tensor::from_static`];
    /// - `owner`: any `Send + 'static` value, kept until the memory is no
    ///   longer used.
    ///
    /// The tensor never hands the memory to Rust code:
    /// [`Tensor::as_slice_mut`] gives `None`.
    ///
    /// # Safety
    /// The caller guarantees, from this call until `owner` is dropped:
    /// 1. every element the layout reaches (each index in `shape` with
    ///    `strides`) lies inside one allocation on `device`, with `data`
    ///    aligned for `T`; for memory the host can access, every such
    ///    element holds a valid `T` (`bool`: 0 or 1);
    /// 2. that memory stays allocated and is neither moved nor freed while
    ///    `owner` lives, whatever thread holds it;
    /// 3. if `read_only` is false, the memory may be written by consumers
    ///    (Python code, other frameworks) at any time, and no Rust
    ///    reference (`&[T]`, `&mut [T]`) to it exists or is made while the
    ///    export lives; if `read_only` is true, host memory is never written
    ///    by consumers (they get copies, see above), but device memory is
    ///    handed out with DLPack's `READ_ONLY` flag only, which a consumer
    ///    such as PyTorch ignores: it must tolerate such writes;
    /// 4. dropping `owner` is sound on any thread, with or without the GIL
    ///    (it must not call Python without taking the GIL itself), and frees
    ///    nothing that other live tensors still use.
    ///
    /// # Errors
    /// [`ShapeError::Rank`] if `shape` and `strides` differ in length;
    /// [`ShapeError::Unrepresentable`] for a null or misaligned `data` of a
    /// non-empty array, or a layout whose byte offsets overflow. `owner` is
    /// dropped then.
    ///
    /// ```
    /// # use dlcast_runtime::{Device, Tensor};
    /// // A buffer from a C-style allocator, freed by the owner's Drop.
    /// struct Freed(*mut f64, usize);
    /// // SAFETY: the allocation is not tied to a thread.
    /// unsafe impl Send for Freed {}
    /// impl Drop for Freed {
    ///     fn drop(&mut self) {
    ///         // SAFETY: made by `Box::into_raw` below, freed once.
    ///         drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.0, self.1)) });
    ///     }
    /// }
    /// let ptr = Box::into_raw(vec![0.0f64; 6].into_boxed_slice()).cast::<f64>();
    /// // SAFETY: 6 valid f64 elements, kept alive by `Freed` until it drops.
    /// let t = unsafe { Tensor::from_raw_parts(ptr, &[2, 3], &[3, 1], Device::CPU, false, Freed(ptr, 6)) }
    ///     .unwrap();
    /// assert_eq!(t.shape(), vec![2, 3]);
    /// ```
    pub unsafe fn from_raw_parts<O: Send + 'static>(
        data: *mut T,
        shape: &[usize],
        strides: &[isize],
        device: Device,
        read_only: bool,
        owner: O,
    ) -> Result<Self, ShapeError> {
        if shape.len() != strides.len() {
            return Err(ShapeError::Rank(shape.len(), strides.len()));
        }
        let bad = |why| ShapeError::Unrepresentable {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            why,
        };
        let item = std::mem::size_of::<T>();
        let empty = match layout::byte_extent(shape, strides, item) {
            None => return Err(bad("a byte offset overflows")),
            Some(e) => e.is_none(),
        };
        if !empty && data.is_null() {
            return Err(bad("the data pointer is null"));
        }
        if !empty && (data as usize) % std::mem::align_of::<T>() != 0 {
            return Err(bad("the data pointer is not aligned for the element type"));
        }
        Self::from_shared_parts(
            data.cast(),
            shape,
            strides,
            device,
            read_only,
            Box::new(owner),
            None,
        )
    }

    /// A tensor over memory `keep` keeps alive, which Rust code does not
    /// own alone ([`Tensor::as_slice_mut`] gives `None`). The layout's
    /// byte offsets were checked by the caller.
    pub(crate) fn from_shared_parts(
        data: *mut u8,
        shape: &[usize],
        strides: &[isize],
        device: Device,
        read_only: bool,
        keep: Box<dyn Any + Send>,
        py_owner: Option<Py<PyAny>>,
    ) -> Result<Self, ShapeError> {
        let mut inner = Exported::new(
            data,
            shape,
            strides,
            T::DTYPE,
            device,
            read_only,
            Keep::Owned(keep),
        )
        .map_err(|e| ShapeError::Unrepresentable {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            why: e.0,
        })?;
        inner.py_owner = py_owner;
        // Memory Rust does not own, marked read-only, may be a Rust static
        // or a read-only mapping: no consumer may get it writable.
        inner.never_written = read_only && inner.py_owner.is_none();
        Ok(Tensor {
            inner,
            _marker: PhantomData,
            exclusive: false,
        })
    }
}

impl<T: Element> Tensor<T> {
    /// A C-order array over device memory that `keep` owns (freed when the
    /// export is), ready on `stream`. Only for the device features
    /// (`cudarc`): nothing here reads the memory.
    #[cfg(feature = "cudarc")]
    pub(crate) fn from_device_parts(
        data: *mut u8,
        shape: &[usize],
        device: Device,
        stream: Option<i64>,
        keep: Box<dyn Any + Send>,
    ) -> Result<Self, ShapeError> {
        let mut strides: Dims<isize> = smallvec::smallvec![0; shape.len()];
        let unrepresentable = |why, strides: &[isize]| ShapeError::Unrepresentable {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            why,
        };
        // The caller checked the element count (that of a real allocation),
        // so compact strides fit; checked anyway.
        if layout::fill_c_strides(shape, &mut strides).is_none() {
            return Err(unrepresentable("the compact strides overflow", &[]));
        }
        let mut inner = Exported::new(
            data,
            shape,
            &strides,
            T::DTYPE,
            device,
            false,
            Keep::Owned(keep),
        )
        .map_err(|e| unrepresentable(e.0, &strides))?;
        inner.stream = stream;
        Ok(Tensor {
            inner,
            _marker: PhantomData,
            exclusive: true,
        })
    }
}

impl<T: Element> From<Vec<T>> for Tensor<T> {
    /// A 1-d array over the vector.
    fn from(v: Vec<T>) -> Self {
        let n = v.len();
        let data = v.as_ptr().cast_mut().cast::<u8>();
        // A `Vec` holds at most `isize::MAX` bytes, so its length fits
        // `i64` and `isize`, and stride 1 times the itemsize fits: no check
        // of `Exported::new` can fail for a 1-d vector.
        match Exported::new(
            data,
            &[n],
            &[1],
            T::DTYPE,
            Device::CPU,
            false,
            OwnedAlloc::keep_vec(v),
        ) {
            Ok(inner) => Tensor {
                inner,
                _marker: PhantomData,
                exclusive: true,
            },
            Err(_) => Tensor::from(Vec::new()),
        }
    }
}

impl<T: Element> From<Box<[T]>> for Tensor<T> {
    /// A 1-d array over the boxed slice (no copy: it becomes a `Vec`).
    fn from(b: Box<[T]>) -> Self {
        Tensor::from(b.into_vec())
    }
}

#[cfg(feature = "ndarray")]
impl<T: Element, D: ndarray::Dimension> From<ndarray::Array<T, D>> for Tensor<T> {
    fn from(a: ndarray::Array<T, D>) -> Self {
        Tensor::from_ndarray(a)
    }
}

impl<T: Element> std::fmt::Debug for Tensor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("shape", &self.inner.shape.as_slice())
            .field("strides", &self.inner.strides.as_slice())
            .field("dtype", &self.inner.dtype)
            .finish()
    }
}

/// Exports an imported view (a slice, transpose, reshape or the input
/// itself): the input stays alive inside the exported object.
/// The export is read-only when the input was, and for views of PyTorch
/// tensors that require grad.
///
/// A view of a converted temporary (an argument whose dtype or order did
/// not fit) exports writable: the temporary belongs to the call alone, so
/// returned it is a new array of the caller's, which no one else sees.
/// Where its producer marked it read-only (JAX and TensorFlow arrays are
/// immutable), an aligned copy is exported instead, once.
pub(crate) fn export_view(py: Python<'_>, mut raw: RawTensor) -> PyResult<ExportedArray> {
    if raw.is_rust_data() {
        // Borrowed Rust memory would outlive its borrow inside Python (the
        // typed views copy before they get here).
        return Err(PyBufferError::new_err(
            "a view of Rust data cannot be exported in place; return a Tensor",
        ));
    }
    let mut copy_converted = false;
    if let Some(producer_read_only) = raw.converted {
        raw.read_only = false;
        copy_converted = producer_read_only;
    }
    // A view of a PyTorch tensor that requires grad exports read-only:
    // writes through it would bypass autograd, which PyTorch's own
    // `.numpy()` and `__dlpack__` refuse.
    if let Some(original) = raw.torch_original() {
        if crate::import::torch::requires_grad(original.bind(py))? {
            raw.read_only = true;
        }
    }
    raw.prepare_export(py)?;
    let (data, dtype, device, stream) = (raw.data, raw.dtype, raw.device, raw.stream);
    let shape = raw.shape.clone();
    let strides = raw.strides.clone();
    // On error `raw` is dropped inside `new`: the producer's deleter runs
    // once, here.
    let mut e = Exported::new(
        data,
        &shape,
        &strides,
        dtype,
        device,
        raw.read_only,
        Keep::Imported(Box::new(raw)),
    )
    .map_err(|e| {
        PyBufferError::new_err(format!(
            "cannot export a view of shape {shape:?} and strides {strides:?} \
             (elements of {dtype}): {}",
            e.0
        ))
    })?;
    // The data is ready on the stream the input was made ready on (and the
    // body's work on it, if it followed `view.stream()`).
    e.stream = stream;
    if copy_converted {
        if e.device.is_host_accessible() {
            // The temporary is dropped with `e` (its producer's deleter
            // runs once, here); the copy is the caller's alone.
            let mut copy = e.aligned_copy(py, "a returned view of a converted argument")?;
            copy.read_only = false;
            return Ok(ExportedArray(copy));
        }
        // Device memory: no copy here, so it stays read-only.
        e.read_only = true;
    }
    Ok(ExportedArray(e))
}

/// An export ready to become a Python object; what views convert into.
#[doc(hidden)]
pub struct ExportedArray(Exported);

impl<'py> IntoPyObject<'py> for ExportedArray {
    type Target = Array;
    type Output = Bound<'py, Array>;
    type Error = PyErr;
    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, Array>> {
        Array::new(py, self.0)
    }
}

impl<'py, T: Element> IntoPyObject<'py> for Tensor<T> {
    type Target = Array;
    type Output = Bound<'py, Array>;
    type Error = PyErr;
    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, Array>> {
        Array::new(py, self.inner)
    }
}

/// `dlcast.Array`: an array exported by a dlcast function.
///
/// Follows the array API standard's DLPack protocol: `__dlpack__(*,
/// stream=None, max_version=None, dl_device=None, copy=None)` and
/// `__dlpack_device__()`; offers the buffer protocol for host memory
/// (refusing writable requests on read-only data); has `shape`, `dtype`,
/// `ndim`, `__len__` and a readable `__repr__`. Pass it to any framework's
/// `from_dlpack`, or to `numpy.asarray`.
#[pyclass(module = "dlcast", name = "Array", frozen)]
pub struct Array {
    inner: Exported,
}

fn register_atexit(py: Python<'_>) {
    static REGISTERED: PyOnceLock<()> = PyOnceLock::new();
    REGISTERED.get_or_init(py, || {
        #[pyfunction]
        fn dlcast_mark_finalizing() {
            FINALIZING.store(true, Ordering::SeqCst);
        }
        let hook = wrap_pyfunction!(dlcast_mark_finalizing, py);
        if let (Ok(atexit), Ok(hook)) = (py.import("atexit"), hook) {
            // Failing to register only means deleters keep their normal path.
            let _ = atexit.call_method1("register", (hook,));
        }
    });
}

impl Array {
    fn new(py: Python<'_>, mut inner: Exported) -> PyResult<Bound<'_, Array>> {
        register_atexit(py);
        // Read-only host memory that must never be written (static data,
        // read-only foreign memory) goes out as one aligned copy, made here:
        // every route to a consumer (NumPy's or JAX's re-export, a legacy
        // capsule for TensorFlow, the buffer protocol) may end at PyTorch,
        // which ignores READ_ONLY and writes. The copy stays read-only, and
        // `__dlpack__` still copies it again for each DLPack consumer.
        if inner.never_written && inner.device.is_host_accessible() {
            let mut copy = inner.aligned_copy(py, "exporting read-only data")?;
            copy.read_only = true;
            copy.never_written = true;
            inner = copy;
        }
        Bound::new(py, Array { inner })
    }
}

/// What the manager context of an exported capsule holds.
struct CapsuleCtx {
    /// The exported object (keeps the memory alive), or `None` for a copy.
    owner: Option<Py<Array>>,
    /// The copy, when `copy=True` (boxed: rare, and large).
    _copy: Option<Box<Exported>>,
    /// What the tensor's `shape` and `strides` point to (inline up to
    /// [`EXPORT_INLINE_DIMS`] dimensions, inside the allocation).
    shape: smallvec::SmallVec<[i64; EXPORT_INLINE_DIMS]>,
    strides: smallvec::SmallVec<[i64; EXPORT_INLINE_DIMS]>,
    /// Set when the deleter runs, for a caller that must know whether a
    /// consumer that failed freed the tensor (see [`torch_from_array`]).
    deleted: Option<Arc<AtomicBool>>,
}

impl Drop for CapsuleCtx {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            release_array(owner);
        }
        if let Some(flag) = &self.deleted {
            flag.store(true, Ordering::SeqCst);
        }
        CAPSULE_DELETERS.fetch_add(1, Ordering::SeqCst);
    }
}

/// A managed tensor (`DLManagedTensorVersioned` or `DLManagedTensor`) and
/// its context in one allocation. The tensor comes first (`repr(C)`), so the
/// pointer handed to consumers is the allocation's own, and the deleter
/// frees both at once; the tensor's `manager_ctx` points at `ctx`.
#[repr(C)]
struct Managed<M> {
    tensor: M,
    ctx: CapsuleCtx,
}

/// Drops a reference to an exported array from a DLPack deleter, which a
/// consumer may call on any thread, with or without the GIL, and even from
/// inside a call of ours after it released the GIL itself (JAX does). PyO3's
/// own bookkeeping can then believe the GIL is held when it is not, so this
/// takes the GIL through `PyGILState_Ensure`, which asks CPython. Once the
/// interpreter is shutting down the reference is leaked instead (case C13).
fn release_array(owner: Py<Array>) {
    let ptr = owner.into_ptr();
    if FINALIZING.load(Ordering::SeqCst) {
        return;
    }
    // SAFETY: the interpreter is running (not finalizing: checked above), so
    // PyGILState_Ensure may be called from any thread, GIL held or not;
    // `ptr` is a strong reference we own, released exactly once, with the
    // GIL held.
    unsafe {
        let state = ffi::PyGILState_Ensure();
        ffi::Py_DECREF(ptr);
        ffi::PyGILState_Release(state);
    }
}

unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    if m.is_null() {
        return;
    }
    // SAFETY: `m` is the first field of a `Managed` made by `Box::into_raw`
    // in `make_managed` (this deleter is set only there, on versioned
    // tensors), so it is the allocation's address; the DLPack protocol has
    // the deleter called once.
    drop(unsafe { Box::from_raw(m.cast::<Managed<DLManagedTensorVersioned>>()) });
}

unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: as in `delete_versioned`, for legacy tensors.
    drop(unsafe { Box::from_raw(m.cast::<Managed<DLManagedTensor>>()) });
}

/// Destructor of our capsules: frees the tensor if no consumer took it.
unsafe extern "C" fn capsule_destructor(cap: *mut ffi::PyObject) {
    // SAFETY: CPython calls this with the dying capsule and the GIL held; a
    // consumer that took the capsule renamed it, so the names below match
    // only untaken capsules, whose pointer is ours.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, NAME_VERSIONED.as_ptr()) != 0 {
            let m = ffi::PyCapsule_GetPointer(cap, NAME_VERSIONED.as_ptr());
            delete_versioned(m.cast());
        } else if ffi::PyCapsule_IsValid(cap, NAME_LEGACY.as_ptr()) != 0 {
            let m = ffi::PyCapsule_GetPointer(cap, NAME_LEGACY.as_ptr());
            delete_legacy(m.cast());
        }
    }
}

/// The struct format character of a dtype (PEP 3118), for the buffer
/// protocol; `None` where `struct` has none (bfloat16).
fn buffer_format(dtype: DType) -> Option<&'static CStr> {
    Some(match (dtype.code, dtype.bits) {
        (code::BOOL, 8) => c"?",
        (code::INT, 8) => c"b",
        (code::INT, 16) => c"h",
        (code::INT, 32) => c"i",
        (code::INT, 64) => c"q",
        (code::UINT, 8) => c"B",
        (code::UINT, 16) => c"H",
        (code::UINT, 32) => c"I",
        (code::UINT, 64) => c"Q",
        (code::FLOAT, 16) => c"e",
        (code::FLOAT, 32) => c"f",
        (code::FLOAT, 64) => c"d",
        (code::COMPLEX, 64) => c"Zf",
        (code::COMPLEX, 128) => c"Zd",
        _ => return None,
    })
}

/// What the buffer protocol (and, below Python 3.11 in abi3 builds,
/// NumPy's array interface) needs of an exported array whatever the
/// request: host memory, a dtype with a struct format, and a byte length
/// that fits `Py_ssize_t`. Gives the format and that length.
fn host_buffer(this: &Exported) -> PyResult<(&'static CStr, isize)> {
    if !this.device.is_host_accessible() {
        return Err(PyBufferError::new_err(format!(
            "the array is on {}; the buffer protocol needs host memory",
            this.device
        )));
    }
    let format = buffer_format(this.dtype).ok_or_else(|| {
        PyBufferError::new_err(format!(
            "{} has no buffer-protocol format; use DLPack",
            this.dtype
        ))
    })?;
    let shape = this.shape_usize();
    let item = this.dtype.itemsize().unwrap_or(1);
    // `len` is the product of the extents times the itemsize, which
    // CPython trusts (memoryview.tobytes() copies `len` bytes): a
    // broadcast array can describe more bytes than `Py_ssize_t` holds.
    let len = layout::element_count(&shape)
        .and_then(|n| layout::checked_bytes(n, item))
        .and_then(|b| isize::try_from(b).ok())
        .ok_or_else(|| {
            PyBufferError::new_err(format!(
                "the array of shape {shape:?} holds more than {} bytes (Py_ssize_t), \
                 which the buffer protocol cannot describe; use DLPack",
                isize::MAX
            ))
        })?;
    Ok((format, len))
}

/// Whether exported [`Array`]s offer the buffer protocol (`memoryview(a)`)
/// and buffer-protocol inputs are read through `PyObject_GetBuffer`: true
/// except in abi3 builds for Python 3.9 and 3.10 (PyO3's `abi3-py39` and
/// `abi3-py310` features), whose limited API has no buffer protocol. There,
/// an `Array` offers NumPy's `__array_interface__` instead (so
/// `numpy.asarray(a)` still shares its memory), and inputs other than
/// `bytes` and `bytearray` are read through a `memoryview` and NumPy.
///
/// ```
/// if !dlcast_runtime::export::BUFFER_PROTOCOL {
///     // memoryview(a) raises TypeError; use numpy.asarray(a) or DLPack.
/// }
/// ```
pub const BUFFER_PROTOCOL: bool = cfg!(any(Py_3_11, not(Py_LIMITED_API)));

/// NumPy's array-interface `typestr` of a dtype (`"<f4"`, `"|b1"`, ...),
/// for the dtypes that have a buffer-protocol format.
#[cfg(all(Py_LIMITED_API, not(Py_3_11)))]
fn array_typestr(dtype: DType) -> Option<String> {
    buffer_format(dtype)?;
    let kind = match dtype.code {
        code::BOOL => 'b',
        code::INT => 'i',
        code::UINT => 'u',
        code::FLOAT => 'f',
        code::COMPLEX => 'c',
        _ => return None,
    };
    let bytes = dtype.itemsize()?;
    let order = match (bytes, cfg!(target_endian = "little")) {
        (1, _) => '|',
        (_, true) => '<',
        (_, false) => '>',
    };
    Some(format!("{order}{kind}{bytes}"))
}

/// Checks a consumer's `stream` against the array API standard's rules for
/// the array's device and makes that stream wait for the array's own
/// (see [`crate::stream`]).
fn consumer_stream(this: &Exported, stream: Option<i64>) -> PyResult<()> {
    use crate::stream::StreamKind;
    let device = this.device;
    let refuse = |s: i64, why: &str| {
        Err(PyBufferError::new_err(format!(
            "stream={s} is not supported for an array on {device}{why}"
        )))
    };
    let consumer = match (crate::stream::stream_kind(device.device_type), stream) {
        (StreamKind::None, None | Some(-1)) => return Ok(()),
        (StreamKind::None, Some(s)) => return refuse(s, "; pass None"),
        (StreamKind::Cuda, None) => 1,
        (StreamKind::Cuda, Some(s @ (0 | i64::MIN..=-2))) => {
            return refuse(
                s,
                " (CUDA streams: -1, 1, 2 or a cudaStream_t; 0 is ambiguous)",
            )
        }
        (StreamKind::Rocm, None) => 0,
        (StreamKind::Rocm, Some(s @ (1 | 2 | i64::MIN..=-2))) => {
            return refuse(s, " (ROCm streams: -1, 0 or a hipStream_t)")
        }
        (_, Some(s)) => s,
    };
    let ready = match this.stream {
        None | Some(-1) => return Ok(()),
        Some(r) => r,
    };
    let cuda = crate::stream::stream_kind(device.device_type) == StreamKind::Cuda;
    // CUDA's legacy default stream and the per-thread default stream
    // synchronise with each other implicitly.
    if consumer == -1 || consumer == ready || (cuda && matches!((ready, consumer), (1, 2) | (2, 1)))
    {
        return Ok(());
    }
    crate::stream::wait_for(device, ready, consumer).map_err(|why| {
        PyBufferError::new_err(format!(
            "stream={consumer}: cannot make it wait for stream {ready}, on which the array \
             on {device} is ready: {why}"
        ))
    })
}

/// Reads `max_version` as the standard defines it: a `(major, minor)` tuple.
fn parse_version(v: &Bound<'_, PyAny>) -> PyResult<(i64, i64)> {
    v.extract::<(i64, i64)>().map_err(|_| {
        PyTypeError::new_err("max_version must be a tuple (major, minor) of two integers")
    })
}

#[pymethods]
impl Array {
    /// Exports the array as a DLPack capsule (array API standard).
    ///
    /// - `max_version`: `None` or major `< 1` gives a legacy `"dltensor"`
    ///   capsule; `(1, x)` a `"dltensor_versioned"` one, with `READ_ONLY`
    ///   set for read-only data.
    /// - `copy`: `True` copies (setting `IS_COPIED`); `False` never copies.
    /// - `dl_device`: `None` or the array's own device.
    /// - `stream`: `None` or `-1` for memory without streams. For CUDA
    ///   memory `None` means `1` (legacy default stream), `0` is refused;
    ///   for ROCm `None` means `0`, `1` and `2` are refused. The consumer's
    ///   stream is made to wait for the work pending on the array's own
    ///   stream (nothing to do when they are the same, or for `-1`).
    ///
    /// Raises `BufferError` for what cannot be honoured, `TypeError` for
    /// positional or unknown arguments.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        slf: &Bound<'_, Self>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<&Bound<'_, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let this = &slf.get().inner;
        let stream: Option<i64> = match stream.filter(|s| !s.is_none()) {
            None => None,
            Some(s) => Some(
                s.extract()
                    .map_err(|_| PyTypeError::new_err("stream must be None or an integer"))?,
            ),
        };
        if let Some((t, id)) = dl_device {
            let own = (this.device.device_type, this.device.device_id);
            if (t, id) != own {
                return Err(PyBufferError::new_err(format!(
                    "cannot export an array on {} to device ({t}, {id})",
                    this.device
                )));
            }
        }
        let versioned = match max_version.filter(|v| !v.is_none()) {
            None => false,
            Some(v) => parse_version(v)?.0 >= 1,
        };
        // Device memory cannot be copied here: it goes with READ_ONLY only
        // (see `Tensor::from_raw_parts`).
        let never_written = this.never_written && this.device.is_host_accessible();
        if never_written && copy == Some(false) {
            return Err(PyBufferError::new_err(
                "copy=False: the array is read-only memory that must never be written \
                 (static or foreign data), and DLPack consumers may ignore READ_ONLY; \
                 call with copy=None or copy=True for a copy, or read it with \
                 numpy.asarray / memoryview, which share it read-only",
            ));
        }
        let copied = copy == Some(true) || never_written;
        if copied && !this.device.is_host_accessible() {
            return Err(PyBufferError::new_err(format!(
                "copy=True is not supported for an array on {}",
                this.device
            )));
        }
        if this.read_only && !versioned && !copied {
            return Err(PyBufferError::new_err(
                "the array is read-only; a legacy DLPack capsule cannot say so. \
                 Ask for max_version=(1, 0) or later, or copy=True",
            ));
        }
        // Last, once everything else is known to be fine: it may enqueue a
        // wait on the consumer's stream.
        consumer_stream(this, stream)?;
        let copied = copied.then_some(if copy == Some(true) {
            "__dlpack__(copy=True)"
        } else {
            "__dlpack__ (read-only data goes as a copy)"
        });
        make_capsule(py, slf, versioned, copied)
    }

    /// `(device_type, device_id)` as DLPack numbers them (array API standard).
    fn __dlpack_device__(&self) -> (i32, i32) {
        (self.inner.device.device_type, self.inner.device.device_id)
    }

    /// Extents, as a tuple.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.shape.iter())
    }

    /// Strides in elements, as a tuple.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.strides.iter())
    }

    /// The dtype's name (`"float32"`, ...).
    #[getter]
    fn dtype(&self) -> String {
        self.inner.dtype.to_string()
    }

    /// Number of dimensions.
    #[getter]
    fn ndim(&self) -> usize {
        self.inner.shape.len()
    }

    /// Whether the data is read-only.
    #[getter]
    fn read_only(&self) -> bool {
        self.inner.read_only
    }

    /// Reports the object whose buffer the array views (if any) to the
    /// garbage collector, so that a cycle through it is collected. There is
    /// no `__clear__`: the array's memory belongs to that object, so the
    /// reference is dropped only with the array (the cycle is broken at the
    /// object's own `__clear__`).
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        if let Some(owner) = &self.inner.py_owner {
            visit.call(owner)?;
        }
        Ok(())
    }

    fn __len__(&self) -> PyResult<usize> {
        self.inner
            .shape
            .first()
            .map(|&n| n.unsigned_abs())
            .ok_or_else(|| PyTypeError::new_err("len() of a 0-d array"))
    }

    fn __repr__(&self) -> String {
        let dims: Vec<String> = self.inner.shape.iter().map(isize::to_string).collect();
        let shape = match dims.len() {
            1 => format!("({},)", dims[0]),
            _ => format!("({})", dims.join(", ")),
        };
        format!(
            "dlcast.Array(shape={shape}, dtype={}, device={}{})",
            self.inner.dtype,
            self.inner.device,
            if self.inner.read_only {
                ", read_only=True"
            } else {
                ""
            }
        )
    }

    // The buffer protocol: in the limited API from Python 3.11 (for
    // Python 3.9/3.10 abi3 builds, `__array_interface__` below instead).
    #[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = &slf.get().inner;
        let (format, len) = host_buffer(this)?;
        if flags & ffi::PyBUF_WRITABLE != 0 && this.read_only {
            return Err(PyBufferError::new_err("the array is read-only"));
        }
        let strided = flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES;
        if !strided && !this.is_c_contiguous() {
            return Err(PyBufferError::new_err(
                "the array is not C-contiguous; request strides",
            ));
        }
        let c_req = flags & ffi::PyBUF_C_CONTIGUOUS == ffi::PyBUF_C_CONTIGUOUS;
        if c_req && !this.is_c_contiguous() {
            return Err(PyBufferError::new_err("the array is not C-contiguous"));
        }
        let shape = this.shape_usize();
        let strides = this.strides_isize();
        let f_req = flags & ffi::PyBUF_F_CONTIGUOUS == ffi::PyBUF_F_CONTIGUOUS;
        if f_req && !layout::is_f_contiguous(&shape, strides) {
            return Err(PyBufferError::new_err("the array is not F-contiguous"));
        }
        let any_req = flags & ffi::PyBUF_ANY_CONTIGUOUS == ffi::PyBUF_ANY_CONTIGUOUS;
        if any_req && !this.is_c_contiguous() && !layout::is_f_contiguous(&shape, strides) {
            return Err(PyBufferError::new_err("the array is not contiguous"));
        }
        let item = this.dtype.itemsize().unwrap_or(1);
        let (Ok(itemsize), Ok(ndim)) = (isize::try_from(item), c_int::try_from(this.shape.len()))
        else {
            return Err(PyBufferError::new_err(
                "the array has too many dimensions for the buffer protocol",
            ));
        };
        // SAFETY: CPython passes a writable Py_buffer. The pointers stored
        // (data, shape, strides, format) stay valid while `obj` (a new
        // reference to this frozen object) lives, i.e. until release.
        unsafe {
            (*view).buf = this.data.cast();
            (*view).obj = slf.clone().into_any().into_ptr();
            (*view).len = len;
            (*view).readonly = c_int::from(this.read_only);
            (*view).itemsize = itemsize;
            (*view).format = if flags & ffi::PyBUF_FORMAT != 0 {
                format.as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = ndim;
            (*view).shape = if flags & ffi::PyBUF_ND != 0 {
                this.shape.as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if strided {
                this.byte_strides.as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }

    #[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        // Nothing to free: the view's arrays live in the object itself.
    }

    /// NumPy's array interface (version 3), offered only by abi3 builds for
    /// Python 3.9/3.10, whose limited API cannot offer the buffer protocol:
    /// `numpy.asarray(a)` still takes the host memory without a copy.
    /// NumPy keeps a reference to the `Array` as the new array's `base`,
    /// which keeps the memory alive, and honours the read-only flag.
    /// Raises `BufferError` where the buffer protocol would refuse (memory
    /// the host cannot read, dtypes without a format such as bfloat16).
    #[cfg(all(Py_LIMITED_API, not(Py_3_11)))]
    #[getter]
    fn __array_interface__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let py = slf.py();
        let this = &slf.get().inner;
        // The same refusals as the buffer protocol's, in the same words.
        host_buffer(this)?;
        let typestr = array_typestr(this.dtype).ok_or_else(|| {
            PyBufferError::new_err(format!(
                "{} has no NumPy array-interface type; use DLPack",
                this.dtype
            ))
        })?;
        let d = pyo3::types::PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("typestr", typestr)?;
        d.set_item("shape", PyTuple::new(py, this.shape.iter())?)?;
        d.set_item("strides", PyTuple::new(py, this.byte_strides.iter())?)?;
        d.set_item("data", (this.data as usize, this.read_only))?;
        Ok(d)
    }
}

/// A managed tensor describing `slf` (or, when `copied` names the copy, a
/// copy of it), owned by the caller: a `DLManagedTensorVersioned` if
/// `versioned`, else a legacy `DLManagedTensor`; its deleter releases what
/// it holds, and sets `deleted` (when given) as it does.
///
/// # Errors
/// `MemoryError` when the copy cannot be allocated; `BufferError` for a
/// description DLPack cannot carry, or a copy of memory a writable dlcast
/// view holds. Nothing is left allocated then.
fn make_managed(
    slf: &Bound<'_, Array>,
    versioned: bool,
    copied: Option<&'static str>,
    deleted: Option<Arc<AtomicBool>>,
) -> PyResult<*mut c_void> {
    let this = &slf.get().inner;
    let (Ok(ndim), Ok(device_type)) = (
        i32::try_from(this.shape.len()),
        u32::try_from(this.device.device_type),
    ) else {
        return Err(PyBufferError::new_err(format!(
            "an array of {} dimensions on {} cannot be described to DLPack",
            this.shape.len(),
            this.device
        )));
    };
    // A copy is the same aligned C-order copy `returns = jax` uses, owned
    // by the capsule; otherwise the capsule keeps `slf` alive.
    let (copy, owner) = if let Some(what) = copied {
        (Some(Box::new(this.aligned_copy(slf.py(), what)?)), None)
    } else {
        (None, Some(slf.clone().unbind()))
    };
    let described = copy.as_deref().unwrap_or(this);
    let (data, strides) = (
        described.data.cast::<c_void>(),
        described.strides_i64().collect(),
    );
    let ctx = CapsuleCtx {
        owner,
        _copy: copy,
        shape: this.shape_i64().collect(),
        strides,
        deleted,
    };
    // `shape` and `strides` are set once the context has its final place.
    let tensor = DLTensor {
        data,
        device: DLDevice {
            device_type,
            device_id: this.device.device_id,
        },
        ndim,
        dtype: DLDataType {
            code: this.dtype.code,
            bits: this.dtype.bits,
            lanes: this.dtype.lanes,
        },
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    let ptr: *mut c_void = if versioned {
        let mut flags = 0;
        if copied.is_some() {
            flags |= FLAG_IS_COPIED;
        } else if this.read_only {
            flags |= FLAG_READ_ONLY;
        }
        let m = Box::into_raw(Box::new(Managed {
            tensor: DLManagedTensorVersioned {
                version: EXPORT_VERSION,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_versioned),
                flags,
                dl_tensor: tensor,
            },
            ctx,
        }));
        // SAFETY: `m` is a fresh allocation only this function knows, never
        // moved (freed in place by the deleter); the three pointers are
        // its own fields.
        unsafe {
            wire_header(
                &raw mut (*m).ctx,
                &raw mut (*m).tensor.manager_ctx,
                &raw mut (*m).tensor.dl_tensor,
            );
        }
        m.cast()
    } else {
        let m = Box::into_raw(Box::new(Managed {
            tensor: DLManagedTensor {
                dl_tensor: tensor,
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_legacy),
            },
            ctx,
        }));
        // SAFETY: as above.
        unsafe {
            wire_header(
                &raw mut (*m).ctx,
                &raw mut (*m).tensor.manager_ctx,
                &raw mut (*m).tensor.dl_tensor,
            );
        }
        m.cast()
    };
    CAPSULES_CREATED.fetch_add(1, Ordering::SeqCst);
    Ok(ptr)
}

/// Points a managed tensor's header (legacy or versioned) at its context:
/// `manager_ctx` at the context, the `DLTensor`'s shape and strides into it.
///
/// # Safety
/// The three pointers are fields of one live `Managed` allocation that is
/// never moved while the header is in use.
unsafe fn wire_header(
    ctx: *mut CapsuleCtx,
    manager_ctx: *mut *mut c_void,
    dl_tensor: *mut DLTensor,
) {
    // SAFETY: the caller's contract. The context pointer first: the shape
    // and strides pointers taken into it afterwards stay the latest.
    unsafe {
        *manager_ctx = ctx.cast();
        (*dl_tensor).shape = (*ctx).shape.as_mut_ptr();
        (*dl_tensor).strides = (*ctx).strides.as_mut_ptr();
    }
}

/// A DLPack capsule over `slf` (legacy or versioned, or over a copy when
/// `copied` names one, see [`make_managed`]).
fn make_capsule(
    py: Python<'_>,
    slf: &Bound<'_, Array>,
    versioned: bool,
    copied: Option<&'static str>,
) -> PyResult<Py<PyAny>> {
    let ptr = make_managed(slf, versioned, copied, None)?;
    let name = if versioned {
        NAME_VERSIONED
    } else {
        NAME_LEGACY
    };
    // SAFETY: `ptr` is a non-NULL managed tensor; the name is 'static; the
    // destructor frees the tensor only if no consumer renamed the capsule.
    let cap = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(capsule_destructor)) };
    if cap.is_null() {
        // SAFETY: the capsule was not made, so nobody else owns `ptr`.
        unsafe {
            if versioned {
                delete_versioned(ptr.cast());
            } else {
                delete_legacy(ptr.cast());
            }
        }
        return Err(PyErr::fetch(py));
    }
    // SAFETY: PyCapsule_New returned a new, non-NULL reference.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) }.unbind())
}

/// Hands a read-only [`Array`] to a consumer whose arrays are immutable
/// (JAX) through a legacy capsule, which the array itself refuses to give.
#[pyclass(module = "dlcast", frozen)]
struct ImmutableConsumer(Py<Array>);

#[pymethods]
impl ImmutableConsumer {
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<&Bound<'_, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = (stream, max_version, dl_device, copy);
        make_capsule(py, self.0.bind(py), false, None)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        let d = self.0.get().inner.device;
        (d.device_type, d.device_id)
    }
}

impl Framework {
    fn importer<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        static CACHE: [PyOnceLock<Py<PyAny>>; 9] = [
            PyOnceLock::new(),
            PyOnceLock::new(),
            PyOnceLock::new(),
            PyOnceLock::new(),
            PyOnceLock::new(),
            PyOnceLock::new(),
            PyOnceLock::new(),
            PyOnceLock::new(),
            PyOnceLock::new(),
        ];
        let (slot, module, attr) = match self {
            Framework::Numpy => (0, "numpy", "from_dlpack"),
            Framework::Torch => (1, "torch", "from_dlpack"),
            Framework::Jax => (2, "jax.numpy", "from_dlpack"),
            Framework::Cupy => (3, "cupy", "from_dlpack"),
            Framework::Tensorflow => (4, "tensorflow.experimental.dlpack", "from_dlpack"),
            Framework::ArrayApi => (5, "array_api_strict", "from_dlpack"),
            Framework::Memoryview => (6, "builtins", "memoryview"),
            Framework::Mlx => (7, "mlx.core", "from_dlpack"),
            Framework::Paddle => (8, "paddle", "from_dlpack"),
        };
        CACHE[slot]
            .get_or_try_init(py, || Ok(py.import(module)?.getattr(attr)?.unbind()))
            .map(|f| f.bind(py).clone())
    }

    /// Hands one exported array to the framework.
    fn convert<'py>(self, arr: &Bound<'py, Array>) -> PyResult<Bound<'py, PyAny>> {
        let py = arr.py();
        if self == Framework::Numpy {
            // NumPy's C API first; its `from_dlpack` only where that cannot
            // be used (looked up only then).
            if let Some(out) = numpy_from_array(arr)? {
                return Ok(out);
            }
            let device = arr.get().inner.device;
            if !device.is_host_accessible() {
                return Err(PyBufferError::new_err(format!(
                    "returns = numpy: the array is on {device}, and NumPy reads host memory \
                     only; return it to a framework of that device (returns = torch, \
                     cupy, ...) or copy it to the host first"
                )));
            }
            return self.importer(py)?.call1((arr,));
        }
        let from_dlpack = self.importer(py)?;
        match self {
            Framework::Jax => jax_from_array(py, &from_dlpack, arr),
            // TensorFlow takes a legacy capsule. Its tensors are immutable,
            // so read-only data may go to it although a legacy capsule
            // cannot carry READ_ONLY.
            Framework::Tensorflow => from_dlpack.call1((make_capsule(py, arr, false, None)?,)),
            Framework::Torch => torch_from_array(py, &from_dlpack, arr),
            // MLX arrays are immutable: read-only data goes to it like to JAX.
            Framework::Mlx => {
                let mut array = arr.clone();
                // MLX takes no negative strides: those go as a C-order copy.
                let e = &array.get().inner;
                if e.device.is_host_accessible() && e.strides.iter().any(|&s| s < 0) {
                    let copy = e.aligned_copy(py, "returns = mlx")?;
                    array = Array::new(py, copy)?;
                }
                if array.get().inner.read_only {
                    let consumer = ImmutableConsumer(array.clone().unbind());
                    from_dlpack.call1((Bound::new(py, consumer)?,))
                } else {
                    from_dlpack.call1((array,))
                }
            }
            Framework::Paddle => {
                refuse_for_mutable_only(arr, "paddle", "PaddlePaddle")?;
                from_dlpack.call1((arr,))
            }
            // Handled above.
            Framework::Numpy => from_dlpack.call1((arr,)),
            // Below abi3-py311 `dlcast.Array` has no buffer protocol: the
            // memoryview is NumPy's, over the same memory (NumPy keeps the
            // array alive as its base).
            Framework::Memoryview if !BUFFER_PROTOCOL => {
                let np = py.import(pyo3::intern!(py, "numpy"))?;
                let view = np.call_method1(pyo3::intern!(py, "asarray"), (arr,))?;
                from_dlpack.call1((view,))
            }
            _ => from_dlpack.call1((arr,)),
        }
    }
}

/// An `ndarray` over a host array's memory through NumPy's C API (see
/// [`crate::npapi`]); `None` where only `numpy.from_dlpack` applies.
fn numpy_from_array<'py>(array: &Bound<'py, Array>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let e = &array.get().inner;
    if e.device != Device::CPU {
        return Ok(None);
    }
    crate::npapi::ndarray(
        array.as_any(),
        &crate::npapi::HostArray {
            data: e.data,
            shape: &e.shape,
            byte_strides: &e.byte_strides,
            dtype: e.dtype,
            read_only: e.read_only,
        },
    )
}

/// For consumers without read-only tensors or negative strides (PyTorch,
/// PaddlePaddle): they ignore DLPack's `READ_ONLY` flag, so handing them
/// read-only memory would let Python write into it; say so, with what to do
/// instead, before anything is handed over (the export is then freed by the
/// caller, as for any error).
fn refuse_for_mutable_only(array: &Bound<'_, Array>, option: &str, name: &str) -> PyResult<()> {
    let e = &array.get().inner;
    if e.read_only {
        return Err(PyBufferError::new_err(format!(
            "returns = {option}: the array is read-only (a view of a read-only input, a \
             Tensor made read-only, static data or a read-only ArrayBuffer view), and \
             {name} has no read-only tensors: it ignores DLPack's READ_ONLY flag, so Python \
             code could write into memory that must not change. Return a writable copy \
             instead (e.g. Tensor::from_vec(view.to_vec()?, view.shape()), or \
             ArrayBuffer::to_tensor), or use returns = numpy, whose arrays carry \
             writeable=False"
        )));
    }
    let negative = e.strides.iter().any(|&s| s < 0);
    let shape = if negative {
        e.shape_usize()
    } else {
        Dims::new()
    };
    if let Some(axis) = (0..shape.len())
        .find(|&d| e.strides.get(d).is_some_and(|&s| s < 0) && !layout::stride_unused(&shape, d))
    {
        return Err(PyBufferError::new_err(format!(
            "returns = {option}: the array has a negative stride ({}) in dimension {axis} \
             (strides {:?}), and {name} tensors cannot have negative strides; return a copy \
             (e.g. Tensor::from_vec(view.to_vec()?, view.shape())) or use returns = numpy",
            e.strides[axis],
            e.strides.as_slice(),
        )));
    }
    Ok(())
}

/// Hands an array to PyTorch through `torch.Tensor`'s DLPack C exchange API
/// (`managed_tensor_to_py_object_no_sync`: no capsule, no Python-level
/// `from_dlpack`), or `torch.from_dlpack` where the API is missing. Host
/// memory only: there is no stream to synchronise.
fn torch_from_array<'py>(
    py: Python<'py>,
    from_dlpack: &Bound<'py, PyAny>,
    array: &Bound<'py, Array>,
) -> PyResult<Bound<'py, PyAny>> {
    static TO_TORCH: PyOnceLock<usize> = PyOnceLock::new();
    // PyTorch's own table, checked to be its C code (whatever sits on
    // `torch.Tensor.__dlpack_c_exchange_api__`): the call below relies on
    // how PyTorch's function treats the tensor it is handed.
    let to_torch = *TO_TORCH.get_or_init(py, || {
        crate::import::exchange::torch_table(py)
            .and_then(|a| a.managed_tensor_to_py_object_no_sync)
            .map_or(0, |f| f as usize)
    });
    refuse_for_mutable_only(array, "torch", "PyTorch")?;
    let e = &array.get().inner;
    if to_torch == 0 || !e.device.is_host_accessible() {
        return from_dlpack.call1((array,));
    }
    // SAFETY: `to_torch` is the non-NULL `managed_tensor_to_py_object_no_sync`
    // of PyTorch's process-lifetime exchange table.
    let to_torch: unsafe extern "C" fn(*mut DLManagedTensorVersioned, *mut *mut c_void) -> c_int =
        unsafe { std::mem::transmute::<usize, _>(to_torch) };
    let deleted = Arc::new(AtomicBool::new(false));
    let managed =
        make_managed(array, true, None, Some(deleted.clone()))?.cast::<DLManagedTensorVersioned>();
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `managed` is an owning versioned tensor whose ownership the
    // call takes ("stolen", per the header); `out` receives a new reference,
    // or the call fails with an exception set.
    let rc = unsafe { to_torch(managed, &mut out) };
    if rc != 0 || out.is_null() {
        let err = PyErr::take(py)
            .unwrap_or_else(|| PyBufferError::new_err("torch's exchange API returned no tensor"));
        if !deleted.load(Ordering::SeqCst) {
            // SAFETY: PyTorch's implementation (`ManagedTensorToPyObjectNoSync`
            // in torch/csrc/Module.cpp) is `at::fromDLPackVersioned` then
            // `THPVariable_Wrap`, inside a try block: once a tensor exists,
            // its storage calls our deleter when it is destroyed, which on
            // failure happens before the call returns (the flag is then
            // set). A failure before that point (a refused dtype, device or
            // layout) destroys the deleter closure without calling it, and
            // nothing in PyTorch refers to `managed` any more. So with the
            // flag unset the tensor is still ours, and freeing it here is
            // its one deleter call (without this, every refused call leaked
            // the export and the input it keeps alive).
            // SAFETY: as above, `managed` is ours and freed once, here.
            unsafe { delete_versioned(managed) };
        }
        return Err(err);
    }
    // SAFETY: `out` is a new reference to a torch.Tensor.
    Ok(unsafe { Bound::from_owned_ptr(py, out.cast()) })
}

/// Hands an array to `jax.numpy.from_dlpack`, working around three JAX
/// behaviours (jaxlib 0.10, CPU):
/// - JAX takes a buffer without a copy only if it is 64-byte aligned; it
///   copies others asynchronously yet calls the producer's deleter before
///   that copy has finished, so freeing the buffer then can crash.
/// - JAX refuses layouts that are not compact (slices with steps, negative
///   strides).
/// - JAX asks without `max_version` (a legacy capsule, which cannot carry
///   `READ_ONLY`); JAX arrays are immutable, so read-only data may go to it.
///
/// Buffers of the first two kinds are copied here, once, into an aligned
/// C-order buffer that JAX then takes without a copy.
fn jax_from_array<'py>(
    py: Python<'py>,
    from_dlpack: &Bound<'py, PyAny>,
    array: &Bound<'py, Array>,
) -> PyResult<Bound<'py, PyAny>> {
    let e = &array.get().inner;
    let mut array = array.clone();
    let (shape, strides) = (e.shape_usize(), e.strides_isize());
    let compact =
        layout::is_c_contiguous(&shape, strides) || layout::is_f_contiguous(&shape, strides);
    let aligned = (e.data as usize) % Tensor::<u8>::ALIGN == 0;
    // JAX arrays are immutable: memory an object may still write (an
    // `ArrayBuffer`'s) goes as a copy.
    let shared = e.py_owner.is_some();
    if e.device.is_host_accessible() && (shared || !(compact && aligned)) {
        array = Array::new(py, e.aligned_copy(py, "returns = jax")?)?;
    }
    if array.get().inner.read_only {
        from_dlpack.call1((Bound::new(py, ImmutableConsumer(array.unbind()))?,))
    } else {
        from_dlpack.call1((array,))
    }
}

/// Replaces every `dlcast.Array` in a function's result (the result
/// itself, or the items of a tuple or list) by `framework`'s array.
#[doc(hidden)]
pub fn convert_result(out: Bound<'_, PyAny>, framework: Option<Framework>) -> PyResult<Py<PyAny>> {
    let Some(fw) = framework else {
        return Ok(out.unbind());
    };
    let py = out.py();
    if let Ok(array) = out.cast::<Array>() {
        return Ok(fw.convert(array)?.unbind());
    }
    if let Ok(t) = out.cast::<PyTuple>() {
        let items = t
            .iter()
            .map(|x| convert_result(x, framework))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(PyTuple::new(py, items)?.into_any().unbind());
    }
    if let Ok(l) = out.cast::<PyList>() {
        let items = l
            .iter()
            .map(|x| convert_result(x, framework))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(PyList::new(py, items)?.into_any().unbind());
    }
    Ok(out.unbind())
}

/// Converts a `#[dlpack_fn]` function's result to Python, handing exported
/// arrays to `framework` when `returns = ...` names one.
#[doc(hidden)]
pub fn into_py_result<'py, R: IntoPyObject<'py>>(
    py: Python<'py>,
    result: R,
    framework: Option<Framework>,
) -> PyResult<Py<PyAny>> {
    let out = pyo3::IntoPyObjectExt::into_bound_py_any(result, py)?;
    convert_result(out, framework)
}

/// `Tensor::from_cuda_slice` (feature `cudarc`).
#[cfg(feature = "cudarc")]
mod cuda_tensor {
    use super::{ShapeError, Tensor};
    use crate::device::{kind, Device};
    use crate::dtype::Element;
    use cudarc::driver::{CudaSlice, DevicePtr};

    /// Keeps a `CudaSlice` alive inside an exported array and frees it with
    /// its context current on whatever thread the last consumer lets go.
    struct CudaKeep<T>(Option<CudaSlice<T>>);

    impl<T> Drop for CudaKeep<T> {
        fn drop(&mut self) {
            if let Some(slice) = self.0.take() {
                // Errors are recorded in the context by cudarc, never raised.
                let _ = slice.context().bind_to_thread();
                drop(slice);
            }
        }
    }

    impl<T: Element + cudarc::driver::DeviceRepr> Tensor<T> {
        /// A C-order CUDA array of `shape` over `slice` (its elements, not
        /// bytes), exported without a copy on the slice's device. The data is
        /// ready on the slice's stream (any write cudarc tracks is waited for
        /// first); consumers asking for another stream are made to wait for it.
        /// The slice is freed when the last Python object or consumer lets go.
        ///
        /// # Errors
        /// [`ShapeError::Length`] if `shape` does not hold `slice.len()` elements.
        pub fn from_cuda_slice(slice: CudaSlice<T>, shape: &[usize]) -> Result<Self, ShapeError> {
            let n = crate::layout::element_count(shape);
            if n != Some(slice.len()) {
                return Err(ShapeError::Length {
                    shape: shape.to_vec(),
                    expected: n.unwrap_or(usize::MAX),
                    got: slice.len(),
                });
            }
            let stream = slice.stream().clone();
            // Makes the slice's own stream wait for cudarc-tracked writes from
            // other streams; then the data is ready on `stream`.
            let (ptr, sync) = slice.device_ptr(&stream);
            drop(sync);
            let handle = stream.cu_stream() as usize as i64;
            // The NULL stream is the legacy default stream, `1` in the standard.
            let stream_value = if handle == 0 { 1 } else { handle };
            let device = Device {
                device_type: kind::CUDA,
                device_id: slice.ordinal() as i32,
            };
            Tensor::from_device_parts(
                ptr as usize as *mut u8,
                shape,
                device,
                Some(stream_value),
                Box::new(CudaKeep(Some(slice))),
            )
        }
    }
}

/// Returning a view exports it: the input stays alive inside the exported
/// object until the last consumer lets go (case C14); a view of a read-only
/// input is exported read-only. A view over Rust data (`TensorRef::from_slice`
/// and friends) is copied into a new C-order array instead: Python objects
/// may outlive the Rust data it borrows.
macro_rules! into_py_view {
    ($([$($g:tt)*] $t:ty;)*) => {$(
        impl<'py, $($g)*> pyo3::IntoPyObject<'py> for $t {
            type Target = Array;
            type Output = pyo3::Bound<'py, Array>;
            type Error = pyo3::PyErr;
            fn into_pyobject(self, py: pyo3::Python<'py>) -> pyo3::PyResult<Self::Output> {
                if self.is_rust_data() {
                    let copy = Tensor::from_vec(self.to_vec()?, self.shape())?;
                    return copy.into_pyobject(py);
                }
                export_view(py, self.into_raw())?.into_pyobject(py)
            }
        }
    )*};
}
into_py_view!(
    [T: Element, const N: usize] TensorRef<'_, T, N>;
    [T: Element, const N: usize] TensorMut<'_, T, N>;
);

/// Untyped views are always a call's arguments, never Rust data.
macro_rules! into_py_dyn_view {
    ($($t:ty;)*) => {$(
        impl<'py> pyo3::IntoPyObject<'py> for $t {
            type Target = Array;
            type Output = pyo3::Bound<'py, Array>;
            type Error = pyo3::PyErr;
            fn into_pyobject(self, py: pyo3::Python<'py>) -> pyo3::PyResult<Self::Output> {
                export_view(py, self.into_raw())?.into_pyobject(py)
            }
        }
    )*};
}
into_py_dyn_view!(
    TensorDyn<'_>;
    TensorDynMut<'_>;
);

#[cfg(test)]
mod tests {
    use super::{Keep, OwnedAlloc, Tensor, ZEROED_BY_ALLOCATOR};

    #[test]
    fn zeroed_buffers_are_aligned_and_zero_on_both_paths() {
        // Below and above the size from which the allocator zeroes.
        for bytes in [
            0,
            1,
            15,
            48,
            4000,
            ZEROED_BY_ALLOCATOR - 1,
            ZEROED_BY_ALLOCATOR + 3,
        ] {
            let (buf, ptr) = OwnedAlloc::zeroed(bytes, Tensor::<u8>::ALIGN).unwrap();
            assert_eq!(ptr as usize % Tensor::<u8>::ALIGN, 0, "{bytes} bytes");
            let start = buf.ptr.as_ptr() as usize;
            let end = start + buf.layout.size();
            assert!(
                ptr as usize >= start && ptr as usize + bytes <= end,
                "{bytes} bytes"
            );
            // SAFETY: `bytes` initialised bytes at `ptr`, inside `buf`.
            let data = unsafe { std::slice::from_raw_parts(ptr, bytes) };
            assert!(data.iter().all(|&b| b == 0), "{bytes} bytes");
        }
    }

    #[test]
    fn zeroed_refuses_sizes_without_a_layout() {
        assert!(OwnedAlloc::zeroed(isize::MAX as usize, 64).is_none());
        assert!(OwnedAlloc::zeroed(usize::MAX - 8, 64).is_none());
        assert!(OwnedAlloc::zeroed(16, 48).is_none()); // not a power of two
    }

    #[test]
    fn vecs_are_kept_by_their_own_allocation() {
        let mut v = Vec::<f64>::with_capacity(10);
        v.extend([1.0, 2.0, 3.0]);
        let data = v.as_ptr() as usize;
        match OwnedAlloc::keep_vec(v) {
            Keep::Alloc(a) => {
                assert_eq!(a.ptr.as_ptr() as usize, data);
                assert_eq!(a.layout.size(), 10 * 8);
                assert_eq!(a.layout.align(), std::mem::align_of::<f64>());
            }
            _ => panic!("a Vec<f64> has an array layout"),
        }
        match OwnedAlloc::keep_vec(Vec::<u8>::new()) {
            Keep::Alloc(a) => assert_eq!(a.layout.size(), 0), // nothing to free
            _ => panic!("an empty Vec has an array layout"),
        }
    }

    #[test]
    fn tensors_from_vecs_and_zeros_describe_their_memory() {
        let t = Tensor::from_vec(vec![1u16, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
        assert_eq!((t.shape(), t.strides()), (vec![2, 3], vec![3, 1]));
        assert_eq!(t.inner.byte_strides.as_slice(), [6, 2]);
        // More dimensions than are held inline.
        let mut z = Tensor::<f32>::zeros(&[2, 1, 3, 1, 2, 1]).unwrap();
        assert_eq!(z.strides(), vec![6, 6, 2, 2, 1, 1]);
        assert_eq!(z.inner.byte_strides.as_slice(), [24, 24, 8, 8, 4, 4]);
        assert!(z.as_slice_mut().unwrap().iter().all(|&x| x == 0.0));
    }
}
