//! The views a `#[dlpack_fn]` parameter receives.
//!
//! A view owns the imported DLPack tensor (its deleter runs when the view
//! drops) and borrows the Python argument for `'a`, so it cannot outlive the
//! call. Views are neither `Send` nor `Sync`: they stay on the thread that
//! holds the GIL.

use crate::call::{Keep, View};
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::import::RawTensor;
use crate::layout;
use std::fmt;
use std::marker::PhantomData;

/// Why an element-level access to a view is not possible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    /// The memory is on a device the CPU cannot read (CUDA, ROCm, ...).
    #[error("the array is on {0}, not in memory the CPU can access")]
    NotHostAccessible(Device),
    /// The data pointer is not aligned for the element type; Rust references
    /// and `ndarray` views need aligned memory.
    #[error("the data is not aligned to {0} bytes for its element type")]
    Misaligned(usize),
    /// A CUDA device address was asked of memory on another device.
    #[error("the array is on {0}, not in CUDA memory")]
    NotCuda(Device),
    /// A slice needs C-contiguous memory.
    #[error("the array is not C-contiguous")]
    NotContiguous,
    /// Some byte is not a valid value of the element type (a `bool` other
    /// than 0 or 1).
    #[error("the array holds bytes that are not valid values of its element type")]
    InvalidValue,
    /// Several indices reach the same element; a writable view of that
    /// memory would alias.
    #[error("several indices of the array reach the same element")]
    SelfOverlap,
    /// An axis number at or beyond `ndim`, or a permutation that is not one.
    #[error("invalid axes {axes:?} for an array of {ndim} dimensions")]
    Axes {
        /// The axes given.
        axes: Vec<usize>,
        /// The array's number of dimensions.
        ndim: usize,
    },
    /// A range outside the extent of its axis.
    #[error("range {start}..{end} is outside the extent {extent} of axis {axis}")]
    Range {
        /// The axis.
        axis: usize,
        /// Range start.
        start: usize,
        /// Range end.
        end: usize,
        /// The axis' extent.
        extent: usize,
    },
    /// A reshape to a different element count, or of a non-C-contiguous view.
    #[error("cannot reshape {from:?} to {to:?}: {why}")]
    Reshape {
        /// The current shape.
        from: Vec<usize>,
        /// The requested shape.
        to: Vec<usize>,
        /// What is wrong.
        why: &'static str,
    },
    /// Memory for a copy of the elements could not be allocated (the
    /// request is too large for the address space, or the allocator
    /// refused it). Converts to Python's `MemoryError`.
    #[error("cannot allocate {bytes} bytes for a copy of {count} elements")]
    OutOfMemory {
        /// Elements to copy.
        count: usize,
        /// Bytes asked for (`usize::MAX` when the size itself overflows).
        bytes: usize,
    },
    /// The layout's sizes or offsets do not fit the arithmetic the access
    /// needs (`isize`), e.g. more than `isize::MAX` elements for an
    /// `ndarray` view, or a flip of a stride that has no negation.
    #[error(
        "the layout (shape {shape:?}, strides {strides:?}) is too large for this access: {why}"
    )]
    Overflow {
        /// The view's shape.
        shape: Vec<usize>,
        /// The view's strides (elements).
        strides: Vec<isize>,
        /// What overflows.
        why: &'static str,
    },
}

impl From<ViewError> for pyo3::PyErr {
    fn from(e: ViewError) -> Self {
        match e {
            ViewError::OutOfMemory { .. } => {
                pyo3::exceptions::PyMemoryError::new_err(e.to_string())
            }
            _ => pyo3::exceptions::PyValueError::new_err(e.to_string()),
        }
    }
}

impl RawTensor {
    fn overflow(&self, why: &'static str) -> ViewError {
        ViewError::Overflow {
            shape: self.shape.to_vec(),
            strides: self.strides.to_vec(),
            why,
        }
    }
}

/// A vector with room for the `count` elements of a view, or
/// [`ViewError::OutOfMemory`]: the size comes from a Python input, so an
/// impossible one must raise instead of aborting the process.
fn vec_for<T>(count: usize) -> Result<Vec<T>, ViewError> {
    let mut out = Vec::new();
    out.try_reserve_exact(count)
        .map_err(|_| ViewError::OutOfMemory {
            count,
            bytes: count.saturating_mul(std::mem::size_of::<T>()),
        })?;
    Ok(out)
}

/// A read-only view of an array from any DLPack producer, with elements of
/// type `T`.
///
/// Shape and strides are in elements (DLPack's unit); strides are always
/// present, whatever the producer sent. Element access (`get`, `to_vec`,
/// `as_slice`, `as_ndarray`) works on memory the CPU can read; for other
/// devices use [`TensorRef::data_ptr`] with the device's own API.
pub struct TensorRef<'a, T: Element> {
    raw: RawTensor,
    _marker: PhantomData<(&'a (), *const T)>,
}

/// A writable view: everything [`TensorRef`] offers (through `Deref`), plus
/// writes. Refuses read-only inputs (DLPack's `READ_ONLY` flag, non-writeable
/// NumPy arrays, `bytes`) and layouts where two indices reach one element.
pub struct TensorMut<'a, T: Element> {
    inner: TensorRef<'a, T>,
}

/// A read-only view whose element type is read at run time, for functions
/// that dispatch on [`TensorDyn::dtype`] themselves.
pub struct TensorDyn<'a> {
    raw: RawTensor,
    _marker: PhantomData<&'a ()>,
}

/// A writable view whose element type is read at run time.
pub struct TensorDynMut<'a> {
    raw: RawTensor,
    _marker: PhantomData<&'a ()>,
}

/// Layout transforms, the same for every view: they change which elements
/// the view reaches and how, never the memory.
impl RawTensor {
    fn itemsize(&self) -> isize {
        self.dtype.itemsize().unwrap_or(1) as isize
    }

    fn refresh_extent(&mut self) {
        // A sub-layout of a validated layout: the arithmetic cannot overflow.
        self.extent = layout::byte_extent(&self.shape, &self.strides, self.itemsize() as usize)
            .unwrap_or(None);
    }

    fn slice_axis(&mut self, axis: usize, range: std::ops::Range<usize>) -> Result<(), ViewError> {
        let Some(&extent) = self.shape.get(axis) else {
            return Err(ViewError::Axes {
                axes: vec![axis],
                ndim: self.shape.len(),
            });
        };
        if range.start > range.end || range.end > extent {
            return Err(ViewError::Range {
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
            self.data = self.data.wrapping_offset(step);
        }
        self.shape[axis] = new_extent;
        self.refresh_extent();
        Ok(())
    }

    fn flip_axis(&mut self, axis: usize) -> Result<(), ViewError> {
        let Some(&extent) = self.shape.get(axis) else {
            return Err(ViewError::Axes {
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
        self.data = self.data.wrapping_offset(step);
        self.strides[axis] = flipped;
        self.refresh_extent();
        Ok(())
    }

    fn permute(&mut self, axes: &[usize]) -> Result<(), ViewError> {
        let ndim = self.shape.len();
        let mut seen: smallvec::SmallVec<[bool; 8]> = smallvec::smallvec![false; ndim];
        let valid = axes.len() == ndim
            && axes
                .iter()
                .all(|&a| a < ndim && !std::mem::replace(&mut seen[a], true));
        if !valid {
            return Err(ViewError::Axes {
                axes: axes.to_vec(),
                ndim,
            });
        }
        self.shape = axes.iter().map(|&a| self.shape[a]).collect();
        self.strides = axes.iter().map(|&a| self.strides[a]).collect();
        Ok(())
    }

    fn reshape(&mut self, shape: &[usize]) -> Result<(), ViewError> {
        let err = |why| ViewError::Reshape {
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

/// Layout transforms shared by every view (they consume the view and
/// return it, so a function can return a slice of its input zero-copy).
macro_rules! transform_methods {
    ($($raw:ident).+) => {
        /// Keeps the indices `range` along `axis`.
        ///
        /// # Errors
        /// [`ViewError::Axes`] or [`ViewError::Range`].
        pub fn slice_axis(mut self, axis: usize, range: std::ops::Range<usize>) -> Result<Self, ViewError> {
            self.$($raw).+.slice_axis(axis, range)?;
            Ok(self)
        }
        /// Reverses the order of the indices along `axis` (a negative stride).
        ///
        /// # Errors
        /// [`ViewError::Axes`].
        pub fn flip_axis(mut self, axis: usize) -> Result<Self, ViewError> {
            self.$($raw).+.flip_axis(axis)?;
            Ok(self)
        }
        /// Reorders the dimensions: dimension `i` of the result is
        /// dimension `axes[i]` of `self`.
        ///
        /// # Errors
        /// [`ViewError::Axes`] if `axes` is not a permutation of `0..ndim`.
        pub fn permute(mut self, axes: &[usize]) -> Result<Self, ViewError> {
            self.$($raw).+.permute(axes)?;
            Ok(self)
        }
        /// The transpose: the dimensions in reverse order.
        pub fn t(mut self) -> Self {
            let axes: Vec<usize> = (0..self.$($raw).+.shape.len()).rev().collect();
            // A reversal is always a valid permutation.
            let _ = self.$($raw).+.permute(&axes);
            self
        }
        /// The same elements in C order under another shape with the same
        /// element count; the view must be C-contiguous.
        ///
        /// # Errors
        /// [`ViewError::Reshape`].
        pub fn reshape(mut self, shape: &[usize]) -> Result<Self, ViewError> {
            self.$($raw).+.reshape(shape)?;
            Ok(self)
        }
    };
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
        /// Whether the producer marked the data read-only.
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
        /// [`ViewError::NotCuda`] for memory on other devices.
        #[cfg(feature = "cudarc")]
        pub fn cuda_device_ptr(&self) -> Result<cudarc::driver::sys::CUdeviceptr, ViewError> {
            match self.raw.device.device_type {
                crate::device::kind::CUDA | crate::device::kind::CUDA_MANAGED => {
                    Ok(self.raw.data as usize as u64)
                }
                _ => Err(ViewError::NotCuda(self.raw.device)),
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

impl<T: Element> TensorRef<'_, T> {
    layout_methods!();

    /// The raw tensor, for export.
    pub(crate) fn into_raw(self) -> RawTensor {
        self.raw
    }
    transform_methods!(raw);

    /// Address of element 0 (the producer's `data` plus `byte_offset`).
    /// It may be unaligned, and for non-CPU devices it is a device address.
    pub fn data_ptr(&self) -> *const T {
        self.raw.data.cast()
    }

    fn host(&self) -> Result<(), ViewError> {
        if self.raw.device.is_host_accessible() {
            Ok(())
        } else {
            Err(ViewError::NotHostAccessible(self.raw.device))
        }
    }

    fn aligned(&self) -> Result<(), ViewError> {
        let align = std::mem::align_of::<T>();
        if self.raw.data as usize % align == 0 || self.is_empty() {
            Ok(())
        } else {
            Err(ViewError::Misaligned(align))
        }
    }

    /// Checks that every element holds a valid `T` (only `bool` can fail).
    fn valid_values(&self) -> Result<(), ViewError> {
        if T::ALL_BIT_PATTERNS_VALID {
            return Ok(());
        }
        let mut ok = true;
        layout::for_each_offset(&self.raw.shape, &self.raw.strides, |off| {
            // SAFETY: the import checked that every element offset lies in
            // the producer's memory, and the memory is host-accessible.
            ok &= unsafe { T::is_valid_at(self.data_ptr().offset(off)) };
        })
        .ok_or_else(|| self.raw.overflow("an element offset overflows"))?;
        if ok {
            Ok(())
        } else {
            Err(ViewError::InvalidValue)
        }
    }

    /// The element at `index` (one entry per dimension), or `None` if the
    /// index is out of bounds or the memory is not host-accessible. Works on
    /// unaligned memory.
    pub fn get(&self, index: &[usize]) -> Option<T> {
        self.host().ok()?;
        let off = layout::offset_of(&self.raw.shape, &self.raw.strides, index)?;
        // SAFETY: `off` addresses an in-bounds element, inside the memory
        // the import validated; `read_at` handles misalignment.
        Some(unsafe { T::read_at(self.data_ptr().offset(off)) })
    }

    /// All elements, copied in C order (last index fastest).
    ///
    /// # Errors
    /// [`ViewError::NotHostAccessible`] for device memory;
    /// [`ViewError::OutOfMemory`] when the copy cannot be allocated (a
    /// broadcast view may hold far more elements than memory).
    pub fn to_vec(&self) -> Result<Vec<T>, ViewError> {
        self.host()?;
        let mut out = vec_for::<T>(self.len())?;
        layout::for_each_offset(&self.raw.shape, &self.raw.strides, |off| {
            // SAFETY: every offset of the walk is an in-bounds element.
            // `push` never reallocates: the walk visits `len()` elements,
            // the capacity reserved above.
            out.push(unsafe { T::read_at(self.data_ptr().offset(off)) });
        })
        .ok_or_else(|| self.raw.overflow("an element offset overflows"))?;
        Ok(out)
    }

    /// The elements as a slice in C order, when the memory is host-
    /// accessible, C-contiguous, aligned for `T` and (for `bool`) holds only
    /// valid values; `None` otherwise.
    pub fn as_slice(&self) -> Option<&[T]> {
        self.slice_parts().ok().map(|(ptr, len)| {
            // SAFETY: `slice_parts` checked host access, C contiguity,
            // alignment and value validity; the memory stays alive and
            // unmodified by Rust code for the borrow of `self` (the only
            // writable access is through `&mut TensorMut`).
            unsafe { std::slice::from_raw_parts(ptr, len) }
        })
    }

    fn slice_parts(&self) -> Result<(*const T, usize), ViewError> {
        self.host()?;
        if !self.is_c_contiguous() {
            return Err(ViewError::NotContiguous);
        }
        self.aligned()?;
        self.valid_values()?;
        let len = self.len();
        let ptr = if len == 0 {
            std::ptr::NonNull::<T>::dangling().as_ptr().cast_const()
        } else {
            self.data_ptr()
        };
        Ok((ptr, len))
    }

    /// An `ndarray` view with the same shape and strides (negative strides
    /// included).
    ///
    /// # Errors
    /// [`ViewError`] when the memory is not host-accessible, not aligned for
    /// `T`, or (for `bool`) holds invalid values.
    #[cfg(feature = "ndarray")]
    pub fn as_ndarray(&self) -> Result<ndarray::ArrayViewD<'_, T>, ViewError> {
        self.host()?;
        self.aligned()?;
        self.valid_values()?;
        use ndarray::ShapeBuilder;
        let (ptr, shape, strides, flips) = match ndarray_parts(&self.raw, std::mem::size_of::<T>())?
        {
            NdParts::Empty(shape) => {
                // No memory to view: ndarray's safe constructor over an
                // empty slice checks the shape itself.
                return ndarray::ArrayViewD::from_shape(shape, &[])
                    .map_err(|_| self.raw.overflow("ndarray refuses the shape"));
            }
            NdParts::Strided(p) => p,
        };
        // SAFETY: `ptr` is the lowest-addressed element of memory the import
        // validated (host-accessible, in bounds for every index); strides
        // are non-negative after the flip, the element count fits `isize`
        // and the elements are aligned and valid (ndarray's requirements,
        // checked by `ndarray_parts` and above). The borrow of `self` keeps
        // the memory alive.
        let mut view =
            unsafe { ndarray::ArrayViewD::from_shape_ptr(shape.strides(strides), ptr.cast::<T>()) };
        for axis in flips {
            view.invert_axis(ndarray::Axis(axis));
        }
        Ok(view)
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
pub(crate) fn ndarray_parts(raw: &RawTensor, itemsize: usize) -> Result<NdParts, ViewError> {
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
    let mut strides = Vec::with_capacity(raw.strides.len());
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

impl<'a, T: Element> std::ops::Deref for TensorMut<'a, T> {
    type Target = TensorRef<'a, T>;
    fn deref(&self) -> &TensorRef<'a, T> {
        &self.inner
    }
}

impl<T: Element> TensorMut<'_, T> {
    transform_methods!(inner.raw);

    /// The raw tensor, for export.
    pub(crate) fn into_raw(self) -> RawTensor {
        self.inner.raw
    }

    /// Address of element 0, writable.
    pub fn data_ptr_mut(&mut self) -> *mut T {
        self.inner.raw.data.cast()
    }

    /// Writes `value` at `index`; `false` (nothing written) if the index is
    /// out of bounds or the memory is not host-accessible.
    pub fn set(&mut self, index: &[usize], value: T) -> bool {
        if self.inner.host().is_err() {
            return false;
        }
        let Some(off) = layout::offset_of(self.shape(), self.strides(), index) else {
            return false;
        };
        // SAFETY: in-bounds element of writable, host-accessible memory
        // validated at import; `&mut self` excludes every other Rust access.
        unsafe { self.data_ptr_mut().offset(off).write_unaligned(value) };
        true
    }

    /// Writes `value` into every element.
    ///
    /// # Errors
    /// [`ViewError::NotHostAccessible`] for device memory.
    pub fn fill(&mut self, value: T) -> Result<(), ViewError> {
        self.inner.host()?;
        let base = self.data_ptr_mut();
        layout::for_each_offset(&self.inner.raw.shape, &self.inner.raw.strides, |off| {
            // SAFETY: as in `set`, for every in-bounds element.
            unsafe { base.offset(off).write_unaligned(value) };
        })
        .ok_or_else(|| self.inner.raw.overflow("an element offset overflows"))
    }

    /// The elements as a mutable slice in C order; `None` unless host-
    /// accessible, C-contiguous, aligned and (for `bool`) valid.
    pub fn as_slice_mut(&mut self) -> Option<&mut [T]> {
        let (ptr, len) = self.inner.slice_parts().ok()?;
        // SAFETY: as in `as_slice`; in addition the memory is writable (not
        // read-only, checked at import), C-contiguous so no two slice
        // elements alias, and `&mut self` makes this the only live access.
        Some(unsafe { std::slice::from_raw_parts_mut(ptr.cast_mut(), len) })
    }

    /// A mutable `ndarray` view with the same shape and strides.
    ///
    /// # Errors
    /// As [`TensorRef::as_ndarray`].
    #[cfg(feature = "ndarray")]
    pub fn as_ndarray_mut(&mut self) -> Result<ndarray::ArrayViewMutD<'_, T>, ViewError> {
        self.inner.host()?;
        self.inner.aligned()?;
        self.inner.valid_values()?;
        use ndarray::ShapeBuilder;
        let (ptr, shape, strides, flips) =
            match ndarray_parts(&self.inner.raw, std::mem::size_of::<T>())? {
                NdParts::Empty(shape) => {
                    // As in `as_ndarray`: no memory, a view over `&mut []`
                    // (ndarray's debug checks refused the dangling pointer
                    // and zero strides this used to pass: kind 9).
                    return ndarray::ArrayViewMutD::from_shape(shape, &mut [])
                        .map_err(|_| self.inner.raw.overflow("ndarray refuses the shape"));
                }
                NdParts::Strided(p) => p,
            };
        // SAFETY: as in `as_ndarray`; the memory is writable, the import
        // refused self-overlapping layouts for writable views, and
        // `&mut self` makes this the only live access.
        let mut view = unsafe {
            ndarray::ArrayViewMutD::from_shape_ptr(shape.strides(strides), ptr.cast::<T>())
        };
        for axis in flips {
            view.invert_axis(ndarray::Axis(axis));
        }
        Ok(view)
    }
}

impl<'a> TensorDyn<'a> {
    layout_methods!();

    /// The raw tensor, for export.
    pub(crate) fn into_raw(self) -> RawTensor {
        self.raw
    }
    transform_methods!(raw);

    /// Address of element 0 (`data + byte_offset`), untyped.
    pub fn data_ptr(&self) -> *const u8 {
        self.raw.data
    }

    /// The typed view, if the data type is `T`'s; otherwise `self` back.
    // Handing the view back by value is the point (like `Box::downcast`);
    // it is moved once per dispatch step.
    #[allow(clippy::result_large_err)]
    pub fn into_typed<T: Element>(self) -> Result<TensorRef<'a, T>, Self> {
        if self.raw.dtype == T::DTYPE {
            Ok(TensorRef {
                raw: self.raw,
                _marker: PhantomData,
            })
        } else {
            Err(self)
        }
    }
}

impl<'a> TensorDynMut<'a> {
    layout_methods!();

    /// The raw tensor, for export.
    pub(crate) fn into_raw(self) -> RawTensor {
        self.raw
    }
    transform_methods!(raw);

    /// Address of element 0 (`data + byte_offset`), untyped and writable.
    pub fn data_ptr_mut(&mut self) -> *mut u8 {
        self.raw.data
    }

    /// The typed writable view, if the data type is `T`'s; otherwise `self`.
    #[allow(clippy::result_large_err)]
    pub fn into_typed<T: Element>(self) -> Result<TensorMut<'a, T>, Self> {
        if self.raw.dtype == T::DTYPE {
            Ok(TensorMut {
                inner: TensorRef {
                    raw: self.raw,
                    _marker: PhantomData,
                },
            })
        } else {
            Err(self)
        }
    }
}

macro_rules! debug_impl {
    ($($t:ty),*) => {$(
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($t))
                    .field("shape", &self.raw.shape.as_slice())
                    .field("strides", &self.raw.strides.as_slice())
                    .field("dtype", &self.raw.dtype)
                    .field("device", &self.raw.device)
                    .finish()
            }
        }
    )*};
}
debug_impl!(TensorDyn<'_>, TensorDynMut<'_>);

impl<T: Element> fmt::Debug for TensorRef<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorRef")
            .field("shape", &self.shape())
            .field("strides", &self.strides())
            .field("dtype", &self.dtype())
            .field("device", &self.device())
            .finish()
    }
}

impl<T: Element> fmt::Debug for TensorMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TensorMut").field(&self.inner).finish()
    }
}

impl<'a, T: Element> View<'a> for TensorRef<'a, T> {
    const DTYPE: Option<DType> = Some(T::DTYPE);
    const WRITABLE: bool = false;
    fn from_raw(raw: RawTensor, _: Keep<'a>) -> pyo3::PyResult<Self> {
        Ok(TensorRef {
            raw,
            _marker: PhantomData,
        })
    }
}

impl<'a, T: Element> View<'a> for TensorMut<'a, T> {
    const DTYPE: Option<DType> = Some(T::DTYPE);
    const WRITABLE: bool = true;
    fn from_raw(raw: RawTensor, _: Keep<'a>) -> pyo3::PyResult<Self> {
        Ok(TensorMut {
            inner: TensorRef {
                raw,
                _marker: PhantomData,
            },
        })
    }
}

impl<'a> View<'a> for TensorDyn<'a> {
    const DTYPE: Option<DType> = None;
    const WRITABLE: bool = false;
    fn from_raw(raw: RawTensor, _: Keep<'a>) -> pyo3::PyResult<Self> {
        Ok(TensorDyn {
            raw,
            _marker: PhantomData,
        })
    }
}

impl<'a> View<'a> for TensorDynMut<'a> {
    const DTYPE: Option<DType> = None;
    const WRITABLE: bool = true;
    fn from_raw(raw: RawTensor, _: Keep<'a>) -> pyo3::PyResult<Self> {
        Ok(TensorDynMut {
            raw,
            _marker: PhantomData,
        })
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Never implemented: it makes PyO3's extraction of a view type fail with a
/// message that says what is missing, when a function takes a view without
/// `#[dlpack_fn]` or with `#[dlpack_fn]` placed below `#[pyfunction]` (PyO3
/// then sees the view parameter itself).
#[diagnostic::on_unimplemented(
    message = "array parameter of type `{Self}` needs #[dlpack_fn] above #[pyfunction]",
    label = "PyO3 cannot take a dlcast view by itself",
    note = "place #[dlpack_fn] above #[pyfunction], or, for methods, on the impl block above #[pymethods]",
    note = "#[dlpack_fn] recognises a view parameter spelled directly (`TensorRef<'_, T>`, `TensorMut`, `TensorDyn`, `TensorDynMut`, or an `Option` of one), not through a type alias or inside another type"
)]
pub trait NeedsDlpackFn: sealed::Sealed {}

macro_rules! refuse_direct_extraction {
    ($(impl[$($g:tt)*] $t:ty;)*) => {$(
        impl<'a, 'py, $($g)*> pyo3::FromPyObject<'a, 'py> for $t
        where
            Self: NeedsDlpackFn,
        {
            type Error = pyo3::PyErr;
            fn extract(_obj: pyo3::Borrowed<'a, 'py, pyo3::PyAny>) -> pyo3::PyResult<Self> {
                Err(pyo3::exceptions::PyTypeError::new_err(
                    "dlcast views are taken through #[dlpack_fn]",
                ))
            }
        }
    )*};
}

refuse_direct_extraction! {
    impl[T: Element] TensorRef<'a, T>;
    impl[T: Element] TensorMut<'a, T>;
    impl[] TensorDyn<'a>;
    impl[] TensorDynMut<'a>;
}
