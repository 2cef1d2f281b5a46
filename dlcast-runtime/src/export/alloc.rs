//! What an export is: the exported layout ([`Exported`], checked once by
//! [`Exported::describe`]), the memory it keeps alive ([`KeepAlive`] and the
//! buffers dlcast allocates, [`OwnedAlloc`]), the counters of what was
//! exported ([`stats`]) and why a [`Tensor`](super::Tensor) cannot be built
//! ([`ShapeError`]).

use crate::borrow::{self, Borrow, Refused};
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::error::ExportError;
use crate::import::{Dims, RawTensor};
use crate::layout;
use pyo3::prelude::*;
use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Counters of what dlcast exported, for leak tests and debugging.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportStats {
    /// Exported buffers created ([`Array`](super::Array) objects).
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
pub(super) static CAPSULES_CREATED: AtomicUsize = AtomicUsize::new(0);
pub(super) static CAPSULE_DELETERS: AtomicUsize = AtomicUsize::new(0);

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
/// would need Python leak instead of touching it.
pub(super) static FINALIZING: AtomicBool = AtomicBool::new(false);

pub use crate::error::ShapeError;

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

/// Alignment in bytes of the buffers dlcast allocates for an export
/// (`Tensor::zeros`, `Tensor::from_fn`, copies): XLA's, for JAX's
/// zero-copy import. `Tensor::ALIGN` publishes it.
pub(super) const EXPORT_ALIGN: usize = 64;

/// An allocation an export owns, with the layout it was made with, freed
/// on drop: a buffer dlcast allocated, or a `Vec`'s. Held inline in
/// [`KeepAlive`], which stays small so (`Layout` leaves room for its tag): an
/// export is moved several times on its way into its Python object.
pub(super) struct OwnedAlloc {
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
    pub(super) fn zeroed(bytes: usize, align: usize) -> Option<(Self, *mut u8)> {
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
    pub(super) fn keep_vec<T: Element>(v: Vec<T>) -> KeepAlive {
        let Ok(layout) = std::alloc::Layout::array::<T>(v.capacity()) else {
            return KeepAlive::Owned(Box::new(v));
        };
        let mut v = std::mem::ManuallyDrop::new(v);
        // `as_mut_ptr`, not `as_mut_slice`: it makes no reference to the
        // elements, so the pointer the caller took into them for the export
        // (`as_ptr`/`as_mut_ptr`, used for every later read and write)
        // stays valid under Rust's aliasing rules, and so does this one, which
        // frees the allocation after those accesses. A `Vec`'s pointer is
        // never null (dangling when unallocated).
        let Some(ptr) = std::ptr::NonNull::new(v.as_mut_ptr().cast::<u8>()) else {
            return KeepAlive::Owned(Box::new(std::mem::ManuallyDrop::into_inner(v)));
        };
        KeepAlive::Alloc(OwnedAlloc { ptr, layout })
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
pub(super) enum KeepAlive {
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
pub(super) struct Exported {
    pub(super) data: *mut u8,
    /// DLPack's `byte_offset`: 0, except on a device whose `data` is an
    /// opaque handle ([`Device::data_is_handle`]), where `data` is the
    /// handle and element 0 lies this many bytes into its buffer.
    pub(super) byte_offset: u64,
    /// Extents, as `Py_ssize_t` (the buffer protocol's and NumPy's form);
    /// each also fits `i64` (DLPack's), checked by [`Exported::describe`].
    pub(super) shape: ExDims,
    /// In elements; each also fits `i64`, checked as above.
    pub(super) strides: ExDims,
    /// In bytes, as `Py_ssize_t` (the buffer protocol's and NumPy's form).
    pub(super) byte_strides: ExDims,
    pub(super) dtype: DType,
    pub(super) device: Device,
    pub(super) read_only: bool,
    /// For CUDA/ROCm memory, the stream the data is ready on (the array API
    /// standard's integer, see [`crate::stream`]); `None` or `-1` when no
    /// pending work is known. A consumer asking for another stream is made
    /// to wait for this one.
    pub(super) stream: Option<i64>,
    _keep: KeepAlive,
    /// The Python object the memory belongs to (an [`ArrayBuffer`]'s
    /// object), kept alive with the export and reported to the garbage
    /// collector by `Array.__traverse__`.
    ///
    /// [`ArrayBuffer`]: crate::ArrayBuffer
    pub(super) py_owner: Option<Py<PyAny>>,
    /// Read-only memory that must never be written (static data, foreign
    /// read-only memory): `__dlpack__` hands consumers a copy, since some
    /// (PyTorch) ignore `READ_ONLY` and would write it.
    pub(super) never_written: bool,
    /// C-order data of a `&'static [T]`
    /// ([`Tensor::from_static`](super::Tensor::from_static)): its exports
    /// share one interned copy ([`Exported::interned`]).
    pub(super) static_data: bool,
    /// Read-only because it is a view of a PyTorch tensor that requires
    /// grad (writes through it would bypass autograd): refusals say so.
    pub(super) requires_grad: bool,
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

/// One interned copy of static data: `bytes` bytes from address `src`,
/// copied once to `copy` (aligned to [`EXPORT_ALIGN`]), kept for the rest
/// of the process like the static itself.
struct InternedCopy {
    src: usize,
    bytes: usize,
    copy: usize,
}

/// Every interned copy made so far; looked up by the static's address
/// range (a sub-slice of an interned one shares it). Grows by one entry per
/// distinct static slice exported, never shrinks.
static INTERNED: std::sync::Mutex<Vec<InternedCopy>> = std::sync::Mutex::new(Vec::new());

impl Exported {
    /// For [`Tensor::from_static`](super::Tensor::from_static) data
    /// (`static_data`, C order from `data`, host memory): the same array
    /// over the process's one read-only copy of the static's bytes, made on
    /// its first export and shared by every later one, so that two exports
    /// of one static are the same memory (`numpy.shares_memory`), as
    /// exports of the static itself would be. The static itself is never
    /// exported: NumPy hands a read-only array on to PyTorch
    /// (`torch.from_dlpack`), which ignores `READ_ONLY` and writes, and a
    /// write into a Rust static faults (or breaks Rust's immutability of
    /// `&'static` data). A consumer that
    /// writes the copy that way changes what later exports show, never
    /// what Rust reads.
    ///
    /// # Errors
    /// `MemoryError` if the first copy cannot be allocated.
    pub(super) fn interned(&self) -> PyResult<Exported> {
        let shape = self.shape_usize();
        let item = self.dtype.itemsize().unwrap_or(1);
        let oom = |bytes| ExportError::CopyMemory {
            bytes,
            shape: shape.to_vec(),
        };
        let count = layout::element_count(&shape).ok_or_else(|| oom(usize::MAX))?;
        // A live `&'static [T]` holds at most `isize::MAX` bytes.
        let bytes = layout::checked_bytes(count, item).ok_or_else(|| oom(usize::MAX))?;
        let src = self.data as usize;
        let align = item.max(1).next_power_of_two().min(EXPORT_ALIGN);
        let copy = if bytes == 0 {
            // Nothing is ever read: no copy, the static's (dangling or
            // real) address as it is.
            src
        } else {
            let mut table = INTERNED.lock().unwrap_or_else(|e| e.into_inner());
            // An interned range holding this one, at an offset that keeps
            // the element type's alignment (the copy is 64-byte aligned).
            let found = table.iter().find(|e| {
                e.src <= src
                    && src - e.src <= e.bytes
                    && bytes <= e.bytes - (src - e.src)
                    && (src - e.src) % align == 0
            });
            match found {
                Some(e) => e.copy + (src - e.src),
                None => {
                    let layout = std::alloc::Layout::from_size_align(bytes, EXPORT_ALIGN)
                        .map_err(|_| oom(bytes))?;
                    // SAFETY: `layout` has a non-zero size.
                    let dst = unsafe { std::alloc::alloc(layout) };
                    if dst.is_null() {
                        return Err(oom(bytes).into());
                    }
                    // SAFETY: `src` is a live `&'static [T]` of `bytes`
                    // bytes (`from_static`'s argument, C order from `data`),
                    // never written (shared, no interior mutability);
                    // `dst` is a fresh allocation of `bytes` bytes.
                    unsafe { std::ptr::copy_nonoverlapping(self.data, dst, bytes) };
                    table.push(InternedCopy {
                        src,
                        bytes,
                        copy: dst as usize,
                    });
                    // Kept for the rest of the process: never freed.
                    dst as usize
                }
            }
        };
        let strides = self.strides_isize();
        let mut e = Exported::new(
            copy as *mut u8,
            &shape,
            strides,
            self.dtype,
            self.device,
            true,
            KeepAlive::Owned(Box::new(())),
        )
        .map_err(|_| oom(bytes))?;
        e.never_written = true;
        e.static_data = true;
        Ok(e)
    }
}

/// Why an [`Exported`] cannot describe a layout (see [`Exported::new`]).
#[derive(Debug)]
pub(super) struct Unrepresentable(pub(super) &'static str);

/// How many dimensions an export holds inline (no allocation); more spill
/// to the heap. Small, because an export is moved several times on its way
/// into its Python object, and each move copies all of it.
pub(super) const EXPORT_INLINE_DIMS: usize = 4;
/// Extents or strides of an export.
type ExDims = smallvec::SmallVec<[isize; EXPORT_INLINE_DIMS]>;

/// `nd` zeros, filled without a loop when they fit inline.
pub(super) fn zeroed_dims(nd: usize) -> ExDims {
    if nd <= EXPORT_INLINE_DIMS {
        ExDims::from_buf_and_len([0; EXPORT_INLINE_DIMS], nd)
    } else {
        smallvec::smallvec![0; nd]
    }
}

/// Shape and strides in the forms DLPack and the buffer protocol need.
pub(super) struct Described {
    pub(super) shape: ExDims,
    pub(super) strides: ExDims,
    pub(super) byte_strides: ExDims,
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
    pub(super) fn new(
        data: *mut u8,
        shape: &[usize],
        strides: &[isize],
        dtype: DType,
        device: Device,
        read_only: bool,
        keep: KeepAlive,
    ) -> Result<Self, Unrepresentable> {
        let d = Self::describe(shape, strides, dtype)?;
        BUFFERS_CREATED.fetch_add(1, Ordering::SeqCst);
        Ok(Exported {
            data,
            byte_offset: 0,
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
            static_data: false,
            requires_grad: false,
        })
    }

    /// The checked conversions of [`Exported::new`], without the data.
    #[inline(always)]
    pub(super) fn describe(
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
    pub(super) fn shape_i64(&self) -> impl Iterator<Item = i64> + '_ {
        self.shape.iter().map(|&n| n as i64)
    }

    /// Strides in elements as `i64`, DLPack's form (checked as above).
    pub(super) fn strides_i64(&self) -> impl Iterator<Item = i64> + '_ {
        self.strides.iter().map(|&s| s as i64)
    }

    /// Extents as `usize` (they were `usize` values, checked to fit `i64`).
    pub(super) fn shape_usize(&self) -> Dims<usize> {
        self.shape.iter().map(|&n| n.unsigned_abs()).collect()
    }

    /// Strides in elements.
    pub(super) fn strides_isize(&self) -> &[isize] {
        &self.strides
    }

    pub(super) fn is_c_contiguous(&self) -> bool {
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
        let overflow = || ExportError::SpanOverflow {
            what,
            shape: shape.to_vec(),
            strides: self.strides.to_vec(),
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
            return Err(overflow().into());
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
            Err(Refused::NoMemory) => Err(ExportError::RegistryFull.into()),
            Err(Refused::Conflict(other)) => {
                let function = borrow::name(other.function, other.function_len);
                let holder = if function == borrow::rust_numpy::RUST_NUMPY {
                    "a rust-numpy PyReadwriteArray".to_string()
                } else {
                    format!(
                        "argument '{}' of {function}(), a writable view",
                        borrow::name(other.param, other.param_len)
                    )
                };
                Err(ExportError::CopyInUse { what, holder }.into())
            }
        }
    }

    /// The elements copied, in C order, into a new buffer aligned to
    /// [`EXPORT_ALIGN`] bytes (host memory only); same dtype, device and
    /// read-only mark. The copy is a read in the borrow registry while it
    /// reads ([`Exported::copy_borrow`]; `what` names it in errors).
    ///
    /// # Errors
    /// `BufferError` while a writable dlcast view of the memory is live;
    /// `MemoryError` when the copy cannot be allocated (a broadcast array
    /// may hold far more elements than memory), `ValueError` for a layout
    /// whose offsets overflow.
    pub(super) fn aligned_copy(&self, py: Python<'_>, what: &'static str) -> PyResult<Exported> {
        let _read = self.copy_borrow(py, what)?;
        let item = self.dtype.itemsize().unwrap_or(1);
        let shape = self.shape_usize();
        let strides = self.strides_isize();
        let oom = |bytes| ExportError::CopyMemory {
            bytes,
            shape: shape.to_vec(),
        };
        let count = layout::element_count(&shape).ok_or_else(|| oom(usize::MAX))?;
        let bytes = layout::checked_bytes(count, item)
            .filter(|&b| b <= isize::MAX as usize - EXPORT_ALIGN)
            .ok_or_else(|| oom(count.saturating_mul(item)))?;
        let (buf, dst) = OwnedAlloc::zeroed(bytes, EXPORT_ALIGN).ok_or_else(|| oom(bytes))?;
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
            return Err(ExportError::OffsetOverflow {
                shape: shape.to_vec(),
                strides: strides.to_vec(),
            }
            .into());
        }
        let mut c_strides: Dims<isize> = smallvec::smallvec![0; shape.len()];
        // Compact strides of a non-empty shape whose byte size fits `isize`
        // fit too; an empty one gets zeros where they would overflow.
        layout::fill_c_strides_or_empty(&shape, &mut c_strides)
            .ok_or(ExportError::CompactStrides)?;
        Exported::new(
            dst,
            &shape,
            &c_strides,
            self.dtype,
            self.device,
            self.read_only,
            KeepAlive::Alloc(buf),
        )
        .map_err(|e| ExportError::CopyUndescribable(e.0).into())
    }
}

#[cfg(test)]
mod tests {
    use super::{KeepAlive, OwnedAlloc, EXPORT_ALIGN, ZEROED_BY_ALLOCATOR};

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
            let (buf, ptr) = OwnedAlloc::zeroed(bytes, EXPORT_ALIGN).unwrap();
            assert_eq!(ptr as usize % EXPORT_ALIGN, 0, "{bytes} bytes");
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
            KeepAlive::Alloc(a) => {
                assert_eq!(a.ptr.as_ptr() as usize, data);
                assert_eq!(a.layout.size(), 10 * 8);
                assert_eq!(a.layout.align(), std::mem::align_of::<f64>());
            }
            _ => panic!("a Vec<f64> has an array layout"),
        }
        match OwnedAlloc::keep_vec(Vec::<u8>::new()) {
            KeepAlive::Alloc(a) => assert_eq!(a.layout.size(), 0), // nothing to free
            _ => panic!("an empty Vec has an array layout"),
        }
    }
}
