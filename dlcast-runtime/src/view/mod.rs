//! The views a `#[dlpack_fn]` parameter receives, and views over Rust data.
//!
//! A view made for a call owns the imported DLPack tensor (its deleter runs
//! when the view drops) and borrows the Python argument for `'a`, so it
//! cannot outlive the call. A view made from Rust data
//! ([`TensorRef::from_slice`], [`TensorRef::from_ndarray`], ...) borrows
//! that data for `'a` and owns nothing. Views are neither `Send` nor
//! `Sync`: they stay on the thread that made them.
//!
//! The const parameter `N` of [`TensorRef`] and [`TensorMut`] is the number
//! of dimensions: [`DYN`] (the default) for a rank read at run time, or
//! `0..=6` for a rank fixed by the type, which adds accessors that take and
//! give arrays (`dims() -> [usize; N]`, `get([usize; N])`, `as_array()`).
//!
//! Here: the [`View`] trait through which the call driver makes every view,
//! what a borrowing view keeps ([`ReadSlot`]), the view types and what they
//! share (layout transforms, the `layout_methods!`/`transform_methods!`
//! macros). One module each: `typed` ([`TensorRef`], [`TensorMut`], their
//! fixed ranks), `untyped` ([`TensorDyn`], [`TensorDynMut`]), `iter`
//! ([`Iter`]), `native` (Rust's own views: slices and `ndarray` views). Their
//! errors ([`ViewError`], what the Rust views refuse) are in
//! [`crate::error`].

use crate::dtype::{DType, Element};
use crate::error::{Native, NativeRefusal};
use crate::import::numpy::NpRead;
use crate::import::RawTensor;
use crate::layout;
use crate::spec::FnSpec;
use fast::fast_raw;
pub use fast::{FastKeep, FastNeeds};
use pyo3::prelude::*;
use std::marker::PhantomData;

/// What the call context needs to know of a parameter's view type.
/// Implemented by the view types only (in the `view` module), each for its own
/// lifetime `'a`: the call context can then only make a view that borrows
/// the Python argument, never one that outlives it (`TensorRef<'static, _>`
/// does not implement `View<'a>` for a shorter `'a`).
#[doc(hidden)]
pub trait View<'a>: Sized {
    /// The element type, or `None` for the untyped views.
    const DTYPE: Option<DType>;
    /// Whether the view writes.
    const WRITABLE: bool;
    /// The number of dimensions the view type fixes (`TensorRef<'_, T, 2>`,
    /// `ArrayView2`, `&[T]`), or `None` for any.
    const NDIM: Option<usize>;
    /// Makes the view of `raw`, a read that passed every check of the
    /// parameter's [`ParamSpec`]. A view that owns its read keeps `raw`; one
    /// that borrows it (a slice, an `ndarray` view) hands it to `keep`,
    /// which holds it in the call context for `'a`.
    ///
    /// # Errors
    /// What the type needs that the read does not give (a rank, values a
    /// `bool` may hold), named by `keep`.
    #[doc(hidden)]
    fn from_raw(raw: RawTensor, keep: ReadSlot<'a>) -> PyResult<Self>;
    /// Whether the call driver may make this view from the fast read of an
    /// exact `numpy.ndarray` ([`View::from_fast`]), and what the read must
    /// then satisfy beyond the parameter's spec; `None`: never.
    #[doc(hidden)]
    const FAST: Option<FastNeeds> = None;
    /// Makes the view of a fast read that passed every check of the
    /// parameter's spec and of [`View::FAST`]. Like [`View::from_raw`], it
    /// checks once more what the type itself needs (so that no spec can
    /// make it unsound), and refuses (an error, never a panic) otherwise.
    #[doc(hidden)]
    fn from_fast(read: &'a NpRead, keep: FastKeep<'a>) -> PyResult<Self> {
        let _ = read;
        Err(keep.refuse(Native::NoFastView))
    }
}

/// Where a view that borrows its read (a slice, an `ndarray` view) leaves
/// it: the call context's slot, which the view's lifetime `'a` borrows, so
/// the read (its owner, its borrow-registry entry) outlives the view.
#[doc(hidden)]
pub struct ReadSlot<'a> {
    pub(crate) slot: &'a std::cell::Cell<Option<RawTensor>>,
    /// The function and the parameter (`spec.params[index]`), for errors.
    pub(crate) spec: &'static FnSpec,
    pub(crate) index: usize,
    pub(crate) func: &'static str,
    pub(crate) param: &'static str,
}

impl ReadSlot<'_> {
    /// Holds `raw` until the call context drops.
    pub(crate) fn hold(self, raw: RawTensor) {
        self.slot.set(Some(raw));
    }

    /// The refusal `why`, naming the function and the parameter.
    #[cold]
    pub(crate) fn refuse(&self, why: Native) -> PyErr {
        NativeRefusal {
            func: self.func,
            param: self.param,
            why,
        }
        .into()
    }
}

/// The rank parameter of a view whose number of dimensions is known only at
/// run time: `TensorRef<'_, T>` is `TensorRef<'_, T, DYN>`. Any other value
/// `N` fixes the number of dimensions to `N` (checked when the view is
/// made: a `TypeError` naming the parameter for a call's argument); ranks
/// `0..=6` get the array-typed accessors. Compiler messages spell it
/// `usize::MAX` (`TensorRef<'_, f32, usize::MAX>` is `TensorRef<'_, f32>`).
pub const DYN: usize = usize::MAX;

/// Where a view came from, for its errors: the function and parameter of
/// the call that made it, or nothing for a view over Rust data. Two words.
#[derive(Clone, Copy)]
struct Origin(Option<(&'static FnSpec, u32)>);

impl Origin {
    const RUST: Origin = Origin(None);

    fn param(spec: &'static FnSpec, index: usize) -> Origin {
        Origin(u32::try_from(index).ok().map(|i| (spec, i)))
    }

    /// The error of `method` on this view.
    #[cold]
    #[inline(never)]
    fn error(self, method: &'static str, kind: ViewErrorKind) -> ViewError {
        let (function, parameter) = match self.0 {
            Some((spec, i)) => (Some(spec.name), spec.params.get(i as usize).map(|p| p.name)),
            None => (None, None),
        };
        ViewError(Box::new(ErrorInner {
            kind,
            method: (!method.is_empty()).then_some(method),
            function,
            parameter,
        }))
    }
}

/// The most dimensions of a view with rank-typed accessors.
const MAX_RANK: usize = 6;

/// What the rank-typed accessors read on every access, kept in the view
/// itself (not behind the inline-or-heap pointer of the raw tensor's
/// shape), so that element loops keep it in registers and the compiler can
/// prove index checks redundant. Refreshed by every layout transform.
#[derive(Clone, Copy)]
struct Fast {
    /// The first `MAX_RANK` extents (0 beyond `ndim`).
    dims: [usize; MAX_RANK],
    /// The first `MAX_RANK` strides in elements.
    strides: [isize; MAX_RANK],
    /// The number of dimensions.
    ndim: usize,
    /// Whether the CPU can read the memory.
    host: bool,
}

impl Fast {
    #[inline(always)]
    fn of(raw: &RawTensor) -> Fast {
        // The slices once (a `SmallVec` dereference tests where it lives).
        let (shape, strides) = (raw.shape.as_slice(), raw.strides.as_slice());
        Fast {
            dims: std::array::from_fn(|k| shape.get(k).copied().unwrap_or(0)),
            strides: std::array::from_fn(|k| strides.get(k).copied().unwrap_or(0)),
            ndim: shape.len(),
            host: raw.device.is_host_accessible(),
        }
    }
}

impl RawTensor {
    fn overflow(&self, why: &'static str) -> ViewErrorKind {
        ViewErrorKind::Overflow {
            shape: self.shape.to_vec(),
            strides: self.strides.to_vec(),
            why,
        }
    }
}

/// A vector with room for the `count` elements of a view, or
/// [`ViewErrorKind::OutOfMemory`]: the size comes from a Python input, so an
/// impossible one must raise instead of aborting the process.
fn vec_for<T>(count: usize) -> Result<Vec<T>, ViewErrorKind> {
    let mut out = Vec::new();
    out.try_reserve_exact(count)
        .map_err(|_| ViewErrorKind::OutOfMemory {
            count,
            bytes: count.saturating_mul(std::mem::size_of::<T>()),
        })?;
    Ok(out)
}

/// Whether `raw` has the number of dimensions a view of rank `N` needs.
fn rank_fits<const N: usize>(raw: &RawTensor) -> Result<(), ViewErrorKind> {
    if N == DYN || raw.shape.len() == N {
        Ok(())
    } else {
        Err(ViewErrorKind::Rank {
            expected: N,
            shape: raw.shape.to_vec(),
        })
    }
}

/// Implemented by no view: what the compiler names when a view is kept
/// beyond its call (a `#[pyclass]` field, a `static`) or moved into
/// `py.detach` or another thread. Views stay with their call, on the thread
/// that holds the GIL (their producer's memory is released with it, and
/// Python code that runs while the GIL is released may resize or free it).
///
/// A view is neither `Send` nor `Sync` through its own `Send` and `Sync`
/// impls, both bounded by this trait, which nothing implements (it is
/// sealed): `Send + Sync` (PyO3's check of a `#[pyclass]`) then fails on one
/// bound, and the compiler reports one error, whose first line names the
/// fix: an [`ArrayHandle`](crate::ArrayHandle) to keep the array, a slice
/// (`as_slice()`, `&[T]` or `ndarray` view parameters, which are `Send`)
/// for another thread.
#[diagnostic::on_unimplemented(
    message = "a dlcast view stays in its call, on the GIL's thread: keep an `ArrayHandle<T>` in a `#[pyclass]`, move a slice into a thread",
    label = "a view kept beyond its call, or moved to another thread",
    note = "a `#[pyclass]` field: `ArrayHandle<T>`, borrowed again in each method (`self.weights.borrow(py)?`); `py.detach` or a thread: `as_slice()`, or a `&[T]` / ndarray view parameter, which are `Send`"
)]
pub trait MayLeaveTheGil: sealed::Sealed {}

#[diagnostic::do_not_recommend]
impl MayLeaveTheGil for sealed::Never {}

// A view's `Send` and `Sync` impls, bounded by `MayLeaveTheGil`, which no
// view implements: no view is `Send` or `Sync`, and `Send + Sync` fails on
// that one bound (one error, not one for each trait). Written out, not made
// by a macro, so that the compiler's note points at plain code.
//
// Each of the six never applies: `X: MayLeaveTheGil` holds for no
// view (the trait is sealed; its one impl is for `sealed::Never`), so the
// view is neither `Send` nor `Sync`, as its read requires (released with
// C-API calls, valid only while the GIL is held). `TensorMut` wraps a
// `TensorRef`, and so is neither either.
//
// SAFETY: never applies (see above).
unsafe impl<'a, T: Element, const N: usize> Send for TensorRef<'a, T, N> where Self: MayLeaveTheGil {}
// SAFETY: see above.
unsafe impl<'a, T: Element, const N: usize> Sync for TensorRef<'a, T, N> where Self: MayLeaveTheGil {}
// SAFETY: see above.
unsafe impl<'a> Send for TensorDyn<'a> where Self: MayLeaveTheGil {}
// SAFETY: see above.
unsafe impl<'a> Sync for TensorDyn<'a> where Self: MayLeaveTheGil {}
// SAFETY: see above.
unsafe impl<'a> Send for TensorDynMut<'a> where Self: MayLeaveTheGil {}
// SAFETY: see above.
unsafe impl<'a> Sync for TensorDynMut<'a> where Self: MayLeaveTheGil {}

/// A view's read (a newtype, so that views can hold it by a name of their
/// own).
struct ViewRead(RawTensor);

impl std::ops::Deref for ViewRead {
    type Target = RawTensor;
    fn deref(&self) -> &RawTensor {
        &self.0
    }
}

impl std::ops::DerefMut for ViewRead {
    fn deref_mut(&mut self) -> &mut RawTensor {
        &mut self.0
    }
}

/// Layout transforms, the same for every view: they change which elements
/// the view reaches and how, never the memory.
impl RawTensor {
    fn itemsize(&self) -> isize {
        self.dtype.itemsize().unwrap_or(1) as isize
    }

    /// Moves element 0 by `step` bytes: the address, or, where `data` is
    /// an opaque handle, the byte offset (which DLPack keeps unsigned).
    fn advance(&mut self, step: isize) -> Result<(), ViewErrorKind> {
        if self.device.data_is_handle() {
            self.byte_offset = self
                .byte_offset
                .checked_add_signed(step)
                .ok_or_else(|| self.overflow("the byte offset leaves 0..usize::MAX"))?;
        } else {
            self.data = self.data.wrapping_offset(step);
        }
        Ok(())
    }

    fn refresh_extent(&mut self) {
        // A sub-layout of a validated layout: the arithmetic cannot overflow.
        self.extent = layout::byte_extent(&self.shape, &self.strides, self.itemsize() as usize)
            .unwrap_or(None);
    }

    fn slice_axis(
        &mut self,
        axis: usize,
        range: std::ops::Range<usize>,
    ) -> Result<(), ViewErrorKind> {
        let Some(&extent) = self.shape.get(axis) else {
            return Err(ViewErrorKind::Axes {
                axes: vec![axis],
                ndim: self.shape.len(),
            });
        };
        if range.start > range.end || range.end > extent {
            return Err(ViewErrorKind::Range {
                axis,
                start: range.start,
                end: range.end,
                extent,
            });
        }
        let new_extent = range.end - range.start;
        let empty = new_extent == 0 || self.shape.contains(&0);
        if !empty {
            // Element `start` along `axis` is an element of the validated
            // layout, so its byte offset fits `isize` (byte_extent checked
            // it); checked anyway. An empty result keeps `data`: it is
            // never read, and the strides of empty arrays are unchecked.
            let step = isize::try_from(range.start)
                .ok()
                .and_then(|i| i.checked_mul(self.strides[axis]))
                .and_then(|o| o.checked_mul(self.itemsize()))
                .ok_or_else(|| self.overflow("the slice start's byte offset overflows"))?;
            self.advance(step)?;
        }
        self.shape[axis] = new_extent;
        self.refresh_extent();
        Ok(())
    }

    fn flip_axis(&mut self, axis: usize) -> Result<(), ViewErrorKind> {
        let Some(&extent) = self.shape.get(axis) else {
            return Err(ViewErrorKind::Axes {
                axes: vec![axis],
                ndim: self.shape.len(),
            });
        };
        if layout::stride_unused(&self.shape, axis) {
            // No index ever steps along `axis` (extent <= 1, or the array
            // is empty): flipping changes no address, and the stride, which
            // import never checked here, may be any value (`isize::MIN`
            // has no negation), so it becomes 0.
            self.strides[axis] = self.strides[axis].checked_neg().unwrap_or(0);
            self.refresh_extent();
            return Ok(());
        }
        // The last element along `axis` is an element of the validated
        // layout: its byte offset fits `isize`; checked anyway.
        let step = isize::try_from(extent - 1)
            .ok()
            .and_then(|n| n.checked_mul(self.strides[axis]))
            .and_then(|o| o.checked_mul(self.itemsize()))
            .ok_or_else(|| self.overflow("the last element's byte offset overflows"))?;
        let flipped = self.strides[axis]
            .checked_neg()
            .ok_or_else(|| self.overflow("the stride has no negation"))?;
        self.advance(step)?;
        self.strides[axis] = flipped;
        self.refresh_extent();
        Ok(())
    }

    fn permute(&mut self, axes: &[usize]) -> Result<(), ViewErrorKind> {
        let ndim = self.shape.len();
        let mut seen: smallvec::SmallVec<[bool; 8]> = smallvec::smallvec![false; ndim];
        let valid = axes.len() == ndim
            && axes
                .iter()
                .all(|&a| a < ndim && !std::mem::replace(&mut seen[a], true));
        if !valid {
            return Err(ViewErrorKind::Axes {
                axes: axes.to_vec(),
                ndim,
            });
        }
        self.shape = axes.iter().map(|&a| self.shape[a]).collect();
        self.strides = axes.iter().map(|&a| self.strides[a]).collect();
        Ok(())
    }

    /// A second description of the same elements, owning nothing: no
    /// owner to release, no borrow-registry entry. Only for a view that
    /// borrows the view holding `self` (`view()`, `reborrow()`,
    /// `index_axis()`): that view keeps the memory alive and its registry
    /// entry live for as long as the borrow lasts, and a view owning
    /// nothing is copied, never exported in place, if it is returned.
    fn share(&self) -> RawTensor {
        let mut raw = RawTensor::new(
            self.data,
            self.shape.clone(),
            self.strides.clone(),
            self.dtype,
            self.read_only,
            self.extent,
            self.path,
        );
        raw.device = self.device;
        raw.stream = self.stream;
        raw.byte_offset = self.byte_offset;
        raw.set_owner(crate::import::Owner::Rust);
        raw
    }

    /// Keeps index `index` of `axis` and drops that dimension (one fewer).
    fn index_axis(&mut self, axis: usize, index: usize) -> Result<(), ViewErrorKind> {
        // An index at or beyond the extent is a range outside it
        // (`usize::MAX..usize::MAX` for the one index with no successor).
        self.slice_axis(axis, index..index.checked_add(1).unwrap_or(index))?;
        self.shape.remove(axis);
        self.strides.remove(axis);
        self.refresh_extent();
        Ok(())
    }

    /// Windows of `window` consecutive indices along `axis`, one every
    /// `step` indices (PyTorch's `unfold(axis, window, step)`; NumPy's
    /// `sliding_window_view(x, window, axis)[.., ::step, ..]`): `axis`
    /// keeps the window starts, `count = (extent - window) / step + 1` of
    /// them at stride `stride * step`, and a new last axis of extent
    /// `window` walks a window at the old stride. Windows overlap where
    /// `step < window`, so the result is marked read-only (no export or
    /// writable view of it may write one element through two indices).
    ///
    /// Why the result stays within the original's memory: element `(.., c,
    /// .., w)` of the result (`c < count`, `w < window`) sits at index
    /// `c * step + w` of `axis`, and `c * step + w <= (count - 1) * step +
    /// window - 1 <= (extent - window) + window - 1 = extent - 1`: it is an
    /// element of the original, whose byte offsets import validated. So
    /// the new byte extent lies within the old one, `data` does not move,
    /// and every product below is bounded by an offset of the original
    /// (checked anyway, in every build profile).
    fn sliding_windows(
        &mut self,
        axis: usize,
        window: usize,
        step: usize,
    ) -> Result<(), ViewErrorKind> {
        let Some(&extent) = self.shape.get(axis) else {
            return Err(ViewErrorKind::Axes {
                axes: vec![axis],
                ndim: self.shape.len(),
            });
        };
        let refuse = |why| ViewErrorKind::Window {
            axis,
            extent,
            window,
            step,
            why,
        };
        if window == 0 {
            return Err(refuse("a window holds at least one element"));
        }
        if step == 0 {
            return Err(refuse("the step is at least 1"));
        }
        if window > extent {
            return Err(refuse("the window is longer than the axis"));
        }
        // `extent - window` does not underflow (checked above), and the
        // quotient is at most `extent - 1`, so `+ 1` does not overflow.
        let count = (extent - window) / step + 1;
        // `axis < ndim` (checked by `get` above), and `strides` has `ndim`
        // entries too: the indexing below cannot panic.
        let mut shape = self.shape.clone();
        shape[axis] = count;
        shape.push(window);
        // A view of more elements than `usize` counts (a broadcast axis of
        // extent 2**62, framed with long windows) has no `len()`: refused.
        layout::element_count(&shape)
            .ok_or_else(|| self.overflow("the windows' element count overflows"))?;
        let stride = self.strides[axis];
        let empty = shape.contains(&0);
        // The stride between window starts, `step * stride` (PyTorch's).
        // Used only if `count >= 2`, and then `step <= extent - 1`, so the
        // product is the offset of an element of the original and fits.
        // Otherwise (one window, or no elements) it addresses nothing, and
        // where it overflows (`step` = `usize::MAX`, say) it is 0 instead.
        let start_stride = match isize::try_from(step)
            .ok()
            .and_then(|k| k.checked_mul(stride))
        {
            Some(s) => s,
            None if count < 2 || empty => 0,
            None => return Err(self.overflow("the stride between windows overflows")),
        };
        // Within a window: the old stride (unused where `window == 1`,
        // which export and the overlap test allow for any value).
        let window_stride = stride;
        self.shape = shape;
        self.strides[axis] = start_stride;
        self.strides.push(window_stride);
        self.read_only = true;
        self.refresh_extent();
        Ok(())
    }

    fn reshape(&mut self, shape: &[usize]) -> Result<(), ViewErrorKind> {
        let err = |why| ViewErrorKind::Reshape {
            from: self.shape.to_vec(),
            to: shape.to_vec(),
            why,
        };
        if !layout::is_c_contiguous(&self.shape, &self.strides) {
            return Err(err("only a C-contiguous view can be reshaped"));
        }
        if layout::element_count(shape) != layout::element_count(&self.shape) {
            return Err(err("the element counts differ"));
        }
        let mut strides: crate::import::Dims<isize> = smallvec::smallvec![0; shape.len()];
        layout::fill_c_strides(shape, &mut strides).ok_or_else(|| err("the shape overflows"))?;
        self.shape = shape.iter().copied().collect();
        self.strides = strides;
        self.refresh_extent();
        Ok(())
    }
}

/// Read-only layout queries shared by every view.
macro_rules! layout_methods {
    () => {
        /// Extents, one per dimension (`[]` for a 0-d array).
        pub fn shape(&self) -> &[usize] {
            &self.raw.shape
        }
        /// Strides in elements, one per dimension, never absent (compact
        /// row-major strides when the producer sent none).
        pub fn strides(&self) -> &[isize] {
            &self.raw.strides
        }
        /// Number of dimensions.
        pub fn ndim(&self) -> usize {
            self.raw.shape.len()
        }
        /// Number of elements (1 for a 0-d array).
        pub fn len(&self) -> usize {
            // The import checked that the count fits.
            layout::element_count(&self.raw.shape).unwrap_or(0)
        }
        /// Whether the array has no elements.
        pub fn is_empty(&self) -> bool {
            self.len() == 0
        }
        /// The DLPack data type.
        pub fn dtype(&self) -> DType {
            self.raw.dtype
        }
        /// The DLPack device.
        pub fn device(&self) -> Device {
            self.raw.device
        }
        /// Whether the elements are laid out in C (row-major) order without
        /// gaps; extent-1 dimensions are ignored, empty arrays qualify.
        pub fn is_c_contiguous(&self) -> bool {
            layout::is_c_contiguous(&self.raw.shape, &self.raw.strides)
        }
        /// Whether the elements are laid out in F (column-major) order
        /// without gaps; same rules as [`Self::is_c_contiguous`].
        pub fn is_f_contiguous(&self) -> bool {
            layout::is_f_contiguous(&self.raw.shape, &self.raw.strides)
        }
        /// The bytes from `data_ptr()` to element 0 where the device's
        /// DLPack `data` is an opaque handle (OpenCL `cl_mem`, Vulkan
        /// `VkBuffer`, Metal `MTLBuffer`: see
        /// [`Device::data_is_handle`](crate::Device::data_is_handle)):
        /// `data_ptr()` is then the handle, and this is DLPack's
        /// `byte_offset`, moved by the layout transforms (`slice_axis`,
        /// `flip_axis`, `index_axis`). 0 on every other device, where
        /// `data_ptr()` is the address of element 0 (`data + byte_offset`).
        pub fn byte_offset(&self) -> usize {
            self.raw.byte_offset
        }
        /// Whether the data is read-only: the producer marked it so, or the
        /// view's windows overlap (`sliding_windows`).
        pub fn is_read_only(&self) -> bool {
            self.raw.read_only
        }
        /// The stream the data is ready on, as the array API standard's
        /// `__dlpack__(stream=...)` integer: for CUDA `1` (legacy default),
        /// `2` (per-thread default) or a `cudaStream_t`; for ROCm `0`
        /// (default) or a `hipStream_t`; `-1` if the function asked for no
        /// synchronisation. It is what dlcast passed to the producer's
        /// `__dlpack__`, or the producer's current work stream from the
        /// DLPack C exchange API. Launch work on the data on this stream.
        /// `None` for memory without streams (CPU, pinned host memory), for
        /// a DLPack capsule passed directly, and for a producer without
        /// `__dlpack_device__` (which could not be told a stream).
        /// See [`crate::stream`].
        pub fn stream(&self) -> Option<i64> {
            self.raw.stream
        }
        /// The device address of element 0 (`data + byte_offset`) as a
        /// `cudarc` `CUdeviceptr`, for CUDA device and managed memory; pass
        /// `&ptr` to a kernel launch, on [`Self::cu_stream`].
        ///
        /// # Errors
        /// [`ViewErrorKind::NotCuda`] for memory on other devices.
        #[cfg(feature = "cudarc")]
        pub fn cuda_device_ptr(&self) -> Result<cudarc::driver::sys::CUdeviceptr, ViewError> {
            match self.raw.device.device_type {
                crate::device::kind::CUDA | crate::device::kind::CUDA_MANAGED => {
                    Ok(self.raw.data as usize as u64)
                }
                _ => Err(self
                    .origin
                    .error("cuda_device_ptr", ViewErrorKind::NotCuda(self.raw.device))),
            }
        }
        /// [`Self::stream`] as a CUDA driver handle (`1` and `2` are
        /// `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`); `None` when there
        /// is no stream to order work on (`None` or `-1`).
        #[cfg(feature = "cudarc")]
        pub fn cu_stream(&self) -> Option<cudarc::driver::sys::CUstream> {
            self.raw.stream.and_then(crate::cuda::cu_stream)
        }
        /// How the argument was imported (NumPy fields, the exchange API, a
        /// capsule, `__dlpack__`, the buffer protocol, TensorFlow).
        pub fn import_path(&self) -> crate::import::ImportPath {
            self.raw.path
        }
    };
}

/// Layout transforms shared by every view; each keeps the number of
/// dimensions. They consume the view and return it, so a function can return
/// a slice of its input zero-copy. Needs `parts_mut` and `refresh` methods.
macro_rules! transform_methods {
    () => {
        /// Keeps the indices `range` along `axis`.
        ///
        /// # Errors
        /// [`ViewErrorKind::Axes`] or [`ViewErrorKind::Range`].
        pub fn slice_axis(
            mut self,
            axis: usize,
            range: std::ops::Range<usize>,
        ) -> Result<Self, ViewError> {
            let (raw, origin) = self.parts_mut();
            raw.slice_axis(axis, range)
                .map_err(|k| origin.error("slice_axis", k))?;
            self.refresh();
            Ok(self)
        }
        /// Reverses the order of the indices along `axis` (a negative stride).
        ///
        /// # Errors
        /// [`ViewErrorKind::Axes`].
        pub fn flip_axis(mut self, axis: usize) -> Result<Self, ViewError> {
            let (raw, origin) = self.parts_mut();
            raw.flip_axis(axis)
                .map_err(|k| origin.error("flip_axis", k))?;
            self.refresh();
            Ok(self)
        }
        /// Reorders the dimensions: dimension `i` of the result is
        /// dimension `axes[i]` of `self`.
        ///
        /// # Errors
        /// [`ViewErrorKind::Axes`] if `axes` is not a permutation of `0..ndim`.
        pub fn permute(mut self, axes: &[usize]) -> Result<Self, ViewError> {
            let (raw, origin) = self.parts_mut();
            raw.permute(axes).map_err(|k| origin.error("permute", k))?;
            self.refresh();
            Ok(self)
        }
        /// The transpose: the dimensions in reverse order.
        pub fn t(mut self) -> Self {
            let (raw, _) = self.parts_mut();
            let axes: Vec<usize> = (0..raw.shape.len()).rev().collect();
            // A reversal is always a valid permutation.
            let _ = raw.permute(&axes);
            self.refresh();
            self
        }
    };
}

// The views, one module each; after the macros above, which they use.
mod fast;
mod iter;
pub(crate) mod native;
mod typed;
mod untyped;

use crate::error::ErrorInner;
pub use crate::error::{ViewError, ViewErrorKind};
pub use iter::Iter;
pub use typed::{TensorMut, TensorRef};
pub use untyped::{TensorDyn, TensorDynMut};

/// The rank a view type fixes, for [`View::NDIM`].
const fn ndim_of(n: usize) -> Option<usize> {
    if n == DYN {
        None
    } else {
        Some(n)
    }
}

impl<'a, T: Element, const N: usize> View<'a> for TensorRef<'a, T, N> {
    const DTYPE: Option<DType> = Some(T::DTYPE);
    const WRITABLE: bool = false;
    const NDIM: Option<usize> = ndim_of(N);
    #[inline(always)]
    fn from_raw(raw: RawTensor, keep: ReadSlot<'a>) -> pyo3::PyResult<Self> {
        let origin = Origin::param(keep.spec, keep.index);
        rank_fits::<N>(&raw).map_err(|k| origin.error("", k))?;
        Ok(TensorRef::new(raw, origin))
    }
    const FAST: Option<FastNeeds> = Some(FastNeeds {
        ndim: ndim_of(N),
        // Its accessors hand out references: aligned at the boundary, as
        // the general path's checks do for every typed view.
        aligned: true,
        contiguous: false,
        itemsize: std::mem::size_of::<T>(),
        align: std::mem::align_of::<T>(),
    });
    #[inline(always)]
    fn from_fast(read: &'a NpRead, keep: FastKeep<'a>) -> pyo3::PyResult<Self> {
        if read.dtype != T::DTYPE {
            return Err(keep.refuse(Native::DType {
                want: T::DTYPE,
                got: read.dtype,
            }));
        }
        // The view owns what its general-path twin owns: a reference to the
        // array and the registry entry (so that it may be returned, and its
        // entry ends when it drops).
        let raw = fast_raw(read, &keep)?;
        let origin = Origin::param(keep.spec, keep.index);
        rank_fits::<N>(&raw).map_err(|k| origin.error("", k))?;
        Ok(TensorRef::new(raw, origin))
    }
}

impl<'a, T: Element, const N: usize> View<'a> for TensorMut<'a, T, N> {
    const DTYPE: Option<DType> = Some(T::DTYPE);
    const WRITABLE: bool = true;
    const NDIM: Option<usize> = ndim_of(N);
    #[inline(always)]
    fn from_raw(raw: RawTensor, keep: ReadSlot<'a>) -> pyo3::PyResult<Self> {
        Ok(TensorMut {
            inner: TensorRef::from_raw(raw, keep)?,
        })
    }
    const FAST: Option<FastNeeds> = <TensorRef<'a, T, N> as View<'a>>::FAST;
    #[inline(always)]
    fn from_fast(read: &'a NpRead, keep: FastKeep<'a>) -> pyo3::PyResult<Self> {
        // Writable and reaching no element twice: the checks of the
        // parameter (`CallIdentity::check`), made again.
        if read.read_only || read.may_self_overlap() {
            return Err(keep.refuse(Native::ReadOnly));
        }
        Ok(TensorMut {
            inner: TensorRef::from_fast(read, keep)?,
        })
    }
}

impl<'a> View<'a> for TensorDyn<'a> {
    const DTYPE: Option<DType> = None;
    const WRITABLE: bool = false;
    const NDIM: Option<usize> = None;
    fn from_raw(raw: RawTensor, keep: ReadSlot<'a>) -> pyo3::PyResult<Self> {
        Ok(TensorDyn {
            raw: ViewRead(raw),
            origin: Origin::param(keep.spec, keep.index),
            _marker: PhantomData,
        })
    }
}

impl<'a> View<'a> for TensorDynMut<'a> {
    const DTYPE: Option<DType> = None;
    const WRITABLE: bool = true;
    const NDIM: Option<usize> = None;
    fn from_raw(raw: RawTensor, keep: ReadSlot<'a>) -> pyo3::PyResult<Self> {
        Ok(TensorDynMut {
            raw: ViewRead(raw),
            origin: Origin::param(keep.spec, keep.index),
            _marker: PhantomData,
        })
    }
}

/// What `ndarray` needs for a view: the shape alone for an empty array (a
/// view over an empty slice), else a base pointer, shape, non-negative
/// strides and the axes to invert afterwards to restore negative strides.
#[cfg(feature = "ndarray")]
pub(crate) enum NdParts {
    Empty(ndarray::IxDyn),
    Strided((*mut u8, ndarray::IxDyn, ndarray::IxDyn, Vec<usize>)),
}

/// Shape, non-negative strides and a base pointer for `ndarray`, checked
/// against `ndarray::ArrayView::from_shape_ptr`'s requirements: element
/// count within `isize::MAX`, non-negative strides (as `isize`), every
/// offset in bytes within `isize`.
#[cfg(feature = "ndarray")]
pub(crate) fn ndarray_parts(raw: &RawTensor, itemsize: usize) -> Result<NdParts, ViewErrorKind> {
    if raw.shape.contains(&0) {
        return Ok(NdParts::Empty(ndarray::IxDyn(&raw.shape)));
    }
    // A broadcast view may hold more elements than `isize::MAX`, which
    // ndarray does not allow (it could not index them).
    layout::element_count(&raw.shape)
        .filter(|&n| isize::try_from(n).is_ok())
        .ok_or_else(|| raw.overflow("ndarray views hold at most isize::MAX elements"))?;
    let item = isize::try_from(itemsize).map_err(|_| raw.overflow("the itemsize overflows"))?;
    let mut ptr = raw.data;
    let mut flips = Vec::new();
    // Inline up to `INLINE_DIMS` dimensions, as the read's own strides: no
    // allocation for the view of an ordinary array.
    let mut strides: crate::import::Dims<usize> = smallvec::SmallVec::new();
    for (axis, (&n, &s)) in raw.shape.iter().zip(&raw.strides).enumerate() {
        if n <= 1 {
            // Never stepped along: any stride will do, and 0 is one ndarray
            // takes whatever the producer sent (`isize::MIN`, say).
            strides.push(0);
            continue;
        }
        if s < 0 {
            // Move to the lowest address along this axis: the byte offset
            // of an element of the validated layout (fits; checked anyway).
            let step = isize::try_from(n - 1)
                .ok()
                .and_then(|k| k.checked_mul(s))
                .and_then(|o| o.checked_mul(item))
                .ok_or_else(|| raw.overflow("an element offset overflows"))?;
            ptr = ptr.wrapping_offset(step);
            flips.push(axis);
        }
        strides.push(s.unsigned_abs());
    }
    Ok(NdParts::Strided((
        ptr,
        ndarray::IxDyn(&raw.shape),
        ndarray::IxDyn(&strides),
        flips,
    )))
}

/// What seals [`MayLeaveTheGil`] and [`NeedsDlpackFn`]: no other crate can
/// implement them.
mod sealed {
    pub trait Sealed {}
    /// The one implementation of [`super::MayLeaveTheGil`] (a type without
    /// values, no view), so that the compiler's error does not suggest
    /// adding one. Never constructed, only named.
    #[allow(dead_code)]
    pub enum Never {}
    impl Sealed for Never {}
}

/// Never implemented: it makes PyO3's extraction of a view type fail with a
/// message that says what is missing, when a function takes a view without
/// dlcast's attribute or with `#[dlpack_fn]` placed below `#[pyfunction]`
/// (PyO3 then sees the view parameter itself). The bound is on `(Self,)`, not on
/// the view: rustc reports the innermost unmet bound (this message) only
/// where its type differs from PyO3's own (`PyFunctionArgument`).
#[diagnostic::on_unimplemented(
    message = "a dlcast array parameter needs `#[dlcast::pyfunction]` (or `#[dlpack_fn]` above `#[pyfunction]`)",
    label = "PyO3 cannot take this dlcast view by itself",
    note = "write `#[dlcast::pyfunction]` instead of `#[pyfunction]`; for methods, `#[dlcast::pymethods]` instead of `#[pymethods]`",
    note = "dlcast recognises a view parameter spelled directly (`TensorRef<'_, T>`, `TensorMut`, `TensorDyn`, `TensorDynMut`, or an `Option` of one), not through a type alias or inside another type"
)]
pub trait NeedsDlpackFn: sealed::Sealed {}

macro_rules! refuse_direct_extraction {
    ($(impl[$($g:tt)*] $t:ty;)*) => {$(
        impl<'a, 'py, $($g)*> pyo3::FromPyObject<'a, 'py> for $t
        where
            (Self,): NeedsDlpackFn,
        {
            type Error = pyo3::PyErr;
            fn extract(_obj: pyo3::Borrowed<'a, 'py, pyo3::PyAny>) -> pyo3::PyResult<Self> {
                Err(crate::error::DirectExtraction.into())
            }
        }
    )*};
}

refuse_direct_extraction! {
    impl[T: Element, const N: usize] TensorRef<'a, T, N>;
    impl[T: Element, const N: usize] TensorMut<'a, T, N>;
    impl[] TensorDyn<'a>;
    impl[] TensorDynMut<'a>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::{Dims, ImportPath};
    use proptest::prelude::*;

    /// A raw tensor of `u32` elements with this layout; its address is
    /// never read (the tests compare offsets only).
    fn raw_of(shape: &[usize], strides: &[isize]) -> RawTensor {
        let extent = layout::byte_extent(shape, strides, 4).expect("a valid layout");
        RawTensor::new(
            std::ptr::null_mut::<u8>().wrapping_add(1 << 40),
            Dims::from_slice(shape),
            Dims::from_slice(strides),
            <u32 as Element>::DTYPE,
            false,
            extent,
            ImportPath::Rust,
        )
    }

    /// The indices of `shape` in C order.
    fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
        let total = layout::element_count(shape).unwrap();
        (0..total)
            .map(|mut flat| {
                let mut idx = vec![0; shape.len()];
                for d in (0..shape.len()).rev() {
                    idx[d] = flat % shape[d];
                    flat /= shape[d];
                }
                idx
            })
            .collect()
    }

    fn layout_and_windows() -> impl Strategy<Value = (Vec<usize>, Vec<isize>, usize, usize, usize)>
    {
        (
            prop::collection::vec((0usize..7, -7isize..8), 1..4),
            0usize..4,
            0usize..8,
            0usize..8,
        )
            .prop_map(|(dims, axis, window, step)| {
                let (shape, strides): (Vec<usize>, Vec<isize>) = dims.into_iter().unzip();
                let axis = axis % shape.len();
                (shape, strides, axis, window, step)
            })
    }

    proptest! {
        /// Every element of the windows is the element of the original at
        /// index `start * step + w` along the axis (PyTorch's `unfold`),
        /// and the windows touch no byte outside the original's extent.
        #[test]
        fn windows_are_elements_of_the_original((shape, strides, axis, window, step) in layout_and_windows()) {
            let mut raw = raw_of(&shape, &strides);
            let (data, before) = (raw.data, raw.extent);
            let extent = shape[axis];
            match raw.sliding_windows(axis, window, step) {
                Err(ViewErrorKind::Window { .. }) => {
                    prop_assert!(window == 0 || step == 0 || window > extent);
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
                Ok(()) => {
                    prop_assert!(window >= 1 && step >= 1 && window <= extent);
                    let mut want = shape.clone();
                    want[axis] = (extent - window) / step + 1;
                    want.push(window);
                    prop_assert_eq!(raw.shape.as_slice(), want.as_slice());
                    prop_assert!(raw.read_only);
                    prop_assert_eq!(raw.data, data);
                    for idx in indices(&raw.shape) {
                        let (w, head) = idx.split_last().unwrap();
                        let mut orig = head.to_vec();
                        orig[axis] = orig[axis] * step + w;
                        let got = layout::offset_of(&raw.shape, &raw.strides, &idx);
                        prop_assert_eq!(got, layout::offset_of(&shape, &strides, &orig));
                        prop_assert!(got.is_some());
                    }
                    if let Some(after) = raw.extent {
                        let before = before.expect("non-empty windows of an empty array");
                        prop_assert!(after.lo >= before.lo && after.hi <= before.hi);
                    }
                }
            }
        }
    }

    #[test]
    fn hostile_window_sizes_give_errors_not_panics() {
        let mut raw = raw_of(&[5], &[1]);
        let e = raw.sliding_windows(1, 1, 1).unwrap_err();
        assert!(matches!(e, ViewErrorKind::Axes { .. }), "{e}");
        for (window, step) in [
            (0, 1),
            (1, 0),
            (6, 1),
            (usize::MAX, 1),
            (usize::MAX, usize::MAX),
        ] {
            let e = raw.sliding_windows(0, window, step).unwrap_err();
            assert!(matches!(e, ViewErrorKind::Window { .. }), "{e}");
        }
        // A step past the end: one window, whose start stride is never used
        // (it would be `usize::MAX * 1`): 0, no overflow.
        raw.sliding_windows(0, 2, usize::MAX).unwrap();
        assert_eq!(
            (raw.shape.as_slice(), raw.strides.as_slice()),
            (&[1, 2][..], &[0, 1][..])
        );
        // Steps whose stride product would overflow cannot have two windows:
        // `step <= extent - 1`, an offset of the original.
        let mut raw = raw_of(&[3], &[isize::MAX / 8]);
        raw.sliding_windows(0, 1, 2).unwrap();
        assert_eq!(raw.strides.as_slice(), [isize::MAX / 8 * 2, isize::MAX / 8]);
        // A broadcast axis of 2**62 elements framed with windows of 2**20:
        // more elements than `usize` counts, refused.
        let mut raw = raw_of(&[1 << 62], &[0]);
        let e = raw.sliding_windows(0, 1 << 20, 1).unwrap_err();
        assert!(matches!(e, ViewErrorKind::Overflow { .. }), "{e}");
        // An empty array elsewhere: empty windows, strides that address nothing.
        let mut raw = raw_of(&[0, 4], &[isize::MIN, 1]);
        raw.sliding_windows(1, 2, 1).unwrap();
        assert_eq!(raw.shape.as_slice(), [0, 3, 2]);
        assert_eq!(raw.extent, None);
    }
}
