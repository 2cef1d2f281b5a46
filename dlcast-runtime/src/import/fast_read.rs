//! What the call driver's fast path reads of an argument, with no Python
//! code and no allocation ([`NpRead`]): from an exact `numpy.ndarray`'s
//! fields (`numpy::read_fast`) or a PyTorch tensor's C++ fields (the direct
//! read, `torch::direct`), which adds what the call then holds
//! ([`TorchRead`]: the storage's reference, [`Hold`], and the version
//! counter to bump). Both readers depend on this file, and it on neither.

use crate::dtype::DType;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The most dimensions the call driver's fast path reads (NumPy's
/// `read_fast`, PyTorch's direct read).
pub(crate) const FAST_DIMS: usize = 4;

/// What the call driver's fast path reads of an exact `numpy.ndarray` (or
/// of a PyTorch tensor read directly, see [`NpRead::torch`]): a non-empty
/// array of native byte order, with 1 to [`FAST_DIMS`] dimensions, non-negative
/// strides of whole elements, and an element count and byte span within
/// `isize::MAX`. Plain values, no owner: the call context that made it holds
/// the array (and its borrow-registry entry) while views of it live.
#[doc(hidden)]
pub struct NpRead {
    /// Element 0, the lowest address the array reaches.
    pub(crate) data: *mut u8,
    pub(crate) ndim: usize,
    /// The first `ndim` entries are the extents (all at least 1).
    pub(crate) dims: [usize; FAST_DIMS],
    /// The first `ndim` entries are the strides, in elements (all >= 0).
    pub(crate) strides: [isize; FAST_DIMS],
    pub(crate) dtype: DType,
    pub(crate) read_only: bool,
    /// One past the highest byte reached, relative to `data`.
    pub(crate) hi: isize,
    /// A PyTorch tensor read directly: the storage held and the version
    /// counter to bump (see `import::torch::direct`); `None` for NumPy.
    pub(crate) torch: Option<TorchRead>,
}

impl NpRead {
    /// The extents.
    #[inline(always)]
    pub(crate) fn shape(&self) -> &[usize] {
        &self.dims[..self.ndim.min(FAST_DIMS)]
    }

    /// The strides in elements.
    #[inline(always)]
    pub(crate) fn elem_strides(&self) -> &[isize] {
        &self.strides[..self.ndim.min(FAST_DIMS)]
    }

    /// Whether two indices may reach the same element:
    /// [`crate::layout::may_self_overlap`]'s answer, by the same steps on
    /// fixed arrays (no allocation, no copy of variable length).
    #[inline(always)]
    pub(crate) fn may_self_overlap(&self) -> bool {
        // The dimensions with more than one index, as (stride, extent),
        // sorted (an insertion sort of at most `FAST_DIMS` pairs).
        let mut dims = [(0usize, 0usize); FAST_DIMS];
        let mut len = 0;
        for (&n, &s) in self.shape().iter().zip(self.elem_strides()) {
            if n > 1 {
                let mut k = len;
                let item = (s.unsigned_abs(), n);
                while k > 0 && dims[k - 1] > item {
                    dims[k] = dims[k - 1];
                    k -= 1;
                }
                dims[k] = item;
                len += 1;
            }
        }
        crate::layout::sorted_dims_overlap(&dims[..len])
    }
}

/// What a direct read leaves for the call: the held storage, and for a
/// writable parameter the version counter to bump once every argument
/// passed.
pub(crate) struct TorchRead {
    /// Taken by the first view that owns its read (see `view::fast_raw`);
    /// else dropped with the call.
    pub(crate) storage: std::cell::Cell<Option<Hold>>,
    pub(crate) version: Option<std::ptr::NonNull<AtomicU32>>,
}

/// A reference to a `c10::StorageImpl`, taken and given back by one atomic
/// step of its combined reference count, only where PyTorch's own
/// `intrusive_ptr` retain and release would do nothing else (the low 32
/// bits count strong references, bit 63 says a Python object is attached:
/// PyTorch increments that object when the count goes from 1 to 2 and
/// decrements it when it goes from 2 to 1, and destroys the storage at 0).
/// A release that would be one of those transitions is not made: the
/// reference is leaked, the storage never freed (it happens only where
/// Python code dropped every other reference to the storage during the
/// call).
pub(crate) struct Hold(std::ptr::NonNull<AtomicU64>);

pub(crate) const STRONG: u64 = 0xffff_ffff;
const HAS_PYOBJECT: u64 = 1 << 63;

impl Hold {
    /// A new reference, if taking it is a plain increment.
    ///
    /// # Safety
    /// `count` must be the combined reference count of a live
    /// `StorageImpl` of a layout the direct read's `learn` verified.
    #[inline(always)]
    pub(crate) unsafe fn take(count: *mut AtomicU64) -> Option<Hold> {
        let count = std::ptr::NonNull::new(count)?;
        // SAFETY: the caller's contract.
        let atomic = unsafe { count.as_ref() };
        let mut now = atomic.load(Ordering::Relaxed);
        loop {
            let strong = now & STRONG;
            if strong == 0 || strong == STRONG || (strong == 1 && now & HAS_PYOBJECT != 0) {
                return None;
            }
            match atomic.compare_exchange_weak(now, now + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(Hold(count)),
                Err(seen) => now = seen,
            }
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        // SAFETY: the storage lives while this reference is held.
        let atomic = unsafe { self.0.as_ref() };
        let mut now = atomic.load(Ordering::Acquire);
        loop {
            let strong = now & STRONG;
            // After the decrement: at least 2, or 1 without a Python object.
            if !(strong > 2 || (strong == 2 && now & HAS_PYOBJECT == 0)) {
                return;
            }
            match atomic.compare_exchange_weak(now, now - 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(seen) => now = seen,
            }
        }
    }
}
