//! The typed views, [`TensorRef`] and [`TensorMut`]: views over Rust data,
//! element access, copies, transforms, and the accessors of fixed ranks.

use super::*;
use crate::device::Device;
use crate::dtype::{DType, Element};
use crate::import::{Dims, ImportPath, RawTensor};
use crate::layout;
use std::fmt;
use std::marker::PhantomData;

/// A read-only view of an array with elements of type `T` and `N`
/// dimensions ([`DYN`], the default: any number, read at run time).
///
/// Shape and strides are in elements (DLPack's unit); strides are always
/// present, whatever the producer sent. Element access (`get`, `iter`,
/// `to_vec`, `as_slice`, `as_ndarray`) works on memory the CPU can read; for
/// other devices use [`TensorRef::data_ptr`] with the device's own API.
/// No accessor panics: each failure is a [`ViewError`] naming the method and,
/// for a call's argument, the function and parameter.
///
/// A `#[dlpack_fn]` parameter `x: TensorRef<'_, f32, 2>` takes 2-d arrays
/// only; its accessors take and give arrays:
///
/// ```
/// use dlcast_runtime::{TensorRef, ViewError};
///
/// fn trace(x: &TensorRef<'_, f32, 2>) -> Result<f32, ViewError> {
///     let [n, m] = x.dims();
///     (0..n.min(m)).map(|i| x.get([i, i])).sum()
/// }
///
/// let data = [1.0, 2.0, 3.0, 4.0];
/// let x = TensorRef::<f32, 2>::from_slice(&data, &[2, 2])?;
/// assert_eq!(trace(&x)?, 5.0);
/// assert!(x.get([2, 0]).is_err()); // out of bounds: an error, not a panic
/// # Ok::<(), ViewError>(())
/// ```
pub struct TensorRef<'a, T: Element, const N: usize = DYN> {
    pub(super) raw: ViewRead,
    pub(super) origin: Origin,
    pub(super) fast: Fast,
    pub(super) _marker: PhantomData<&'a fn() -> T>,
}

/// A writable view: everything [`TensorRef`] offers (through `Deref`), plus
/// writes. Refuses read-only inputs (DLPack's `READ_ONLY` flag, non-writeable
/// NumPy arrays, `bytes`) and layouts where two indices reach one element.
pub struct TensorMut<'a, T: Element, const N: usize = DYN> {
    pub(super) inner: TensorRef<'a, T, N>,
}

/// Checks that the elements of a view over Rust data are addressable, and
/// makes its raw tensor: host memory, no owner, no borrow-registry entry
/// (Rust's borrow checker guards the data). `strides` `None`: C order.
fn rust_raw<T: Element, const N: usize>(
    data: *mut T,
    len: Option<usize>,
    shape: &[usize],
    strides: Option<&[isize]>,
    read_only: bool,
) -> Result<RawTensor, ViewErrorKind> {
    if N != DYN && shape.len() != N {
        return Err(ViewErrorKind::Rank {
            expected: N,
            shape: shape.to_vec(),
        });
    }
    let count = layout::element_count(shape);
    if let Some(len) = len {
        if count != Some(len) {
            return Err(ViewErrorKind::Length {
                shape: shape.to_vec(),
                expected: count.unwrap_or(usize::MAX),
                got: len,
            });
        }
    }
    let overflow = |why| ViewErrorKind::Overflow {
        shape: shape.to_vec(),
        strides: strides.map(<[isize]>::to_vec).unwrap_or_default(),
        why,
    };
    let strides: Dims<isize> = match strides {
        Some(s) if s.len() == shape.len() => Dims::from_slice(s),
        Some(_) => return Err(overflow("the strides do not match the shape")),
        None => {
            let mut s: Dims<isize> = smallvec::smallvec![0; shape.len()];
            layout::fill_c_strides_or_empty(shape, &mut s)
                .ok_or_else(|| overflow("the C-order strides overflow"))?;
            s
        }
    };
    count.ok_or_else(|| overflow("the element count overflows"))?;
    let extent = layout::byte_extent(shape, &strides, std::mem::size_of::<T>())
        .ok_or_else(|| overflow("the byte extent overflows"))?;
    let mut raw = RawTensor::new(
        data.cast(),
        Dims::from_slice(shape),
        strides,
        T::DTYPE,
        read_only,
        extent,
        ImportPath::Rust,
    );
    raw.set_owner(crate::import::Owner::Rust);
    Ok(raw)
}

impl<'a, T: Element, const N: usize> TensorRef<'a, T, N> {
    layout_methods!();
    transform_methods!();

    fn parts_mut(&mut self) -> (&mut RawTensor, Origin) {
        (&mut self.raw, self.origin)
    }

    /// The raw tensor, for export.
    pub(crate) fn into_raw(self) -> RawTensor {
        self.raw.0
    }

    /// Whether the view borrows Rust data (export copies it).
    pub(crate) fn is_rust_data(&self) -> bool {
        self.raw.is_rust_data()
    }

    /// The same view with rank parameter `M` (the caller checked it).
    fn with_rank<const M: usize>(self) -> TensorRef<'a, T, M> {
        TensorRef::new(self.raw.0, self.origin)
    }

    /// A view of `raw` (whose rank the caller checked).
    #[inline(always)]
    pub(super) fn new(raw: RawTensor, origin: Origin) -> Self {
        TensorRef {
            fast: Fast::of(&raw),
            raw: ViewRead(raw),
            origin,
            _marker: PhantomData,
        }
    }

    /// After a layout transform.
    fn refresh(&mut self) {
        self.fast = Fast::of(&self.raw);
    }

    /// A view of the C-order elements of `data` under `shape` (host memory,
    /// read-only, owning nothing), for calling a `#[dlpack_fn]` body from
    /// Rust (unit tests) without Python. Its errors name no function or
    /// parameter.
    ///
    /// ```
    /// # use dlcast_runtime::TensorRef;
    /// let x = TensorRef::<i32, 2>::from_slice(&[1, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
    /// assert_eq!((x.dims(), x.get([1, 0]).unwrap()), ([2, 3], 4));
    /// ```
    ///
    /// # Errors
    /// [`ViewErrorKind::Rank`] if `shape` does not have `N` entries (for a
    /// fixed `N`), [`ViewErrorKind::Length`] if it does not hold
    /// `data.len()` elements.
    pub fn from_slice(data: &'a [T], shape: &[usize]) -> Result<Self, ViewError> {
        let raw = rust_raw::<T, N>(
            data.as_ptr().cast_mut(),
            Some(data.len()),
            shape,
            None,
            true,
        )
        .map_err(|k| Origin::RUST.error("from_slice", k))?;
        Ok(TensorRef::new(raw, Origin::RUST))
    }

    /// A read-only view of an `ndarray` view's elements, same shape and
    /// strides (negative ones included), owning nothing.
    ///
    /// ```
    /// # use dlcast_runtime::TensorRef;
    /// let a = ndarray::arr2(&[[1.0f64, 2.0], [3.0, 4.0]]);
    /// let x = TensorRef::<f64, 2>::from_ndarray(a.t()).unwrap();
    /// assert_eq!(x.get([0, 1]).unwrap(), 3.0);
    /// ```
    ///
    /// # Errors
    /// [`ViewErrorKind::Rank`] if the array does not have `N` dimensions
    /// (for a fixed `N`).
    #[cfg(feature = "ndarray")]
    pub fn from_ndarray<D: ndarray::Dimension>(
        array: ndarray::ArrayView<'a, T, D>,
    ) -> Result<Self, ViewError> {
        let raw = rust_raw::<T, N>(
            array.as_ptr().cast_mut(),
            None,
            array.shape(),
            Some(array.strides()),
            true,
        )
        .map_err(|k| Origin::RUST.error("from_ndarray", k))?;
        Ok(TensorRef::new(raw, Origin::RUST))
    }

    /// Another view of the same elements (same shape, strides, dtype and
    /// device), borrowing this one: what `Clone` would give, for as long as
    /// `self` is borrowed. Its transforms (which consume it) leave `self`
    /// as it was, so one argument gives any number of views. It owns
    /// nothing: the memory and the argument's borrow-registry entry are
    /// `self`'s, which the borrow keeps alive; returned to Python (where
    /// the borrow allows it), it is copied.
    ///
    /// Views are not `Clone`: a view of a call's argument owns its import
    /// (the producer's deleter runs, and its registry entry ends, when the
    /// view drops), which a copy cannot share.
    ///
    /// ```
    /// # use dlcast_runtime::{TensorRef, ViewError};
    /// let x = TensorRef::<i32, 2>::from_slice(&[1, 2, 3, 4, 5, 6], &[2, 3])?;
    /// let t = x.view().t();                      // x is still usable
    /// let tail = x.view().slice_axis(1, 1..3)?;
    /// assert_eq!((t.dims(), tail.dims(), x.dims()), ([3, 2], [2, 2], [2, 3]));
    /// # Ok::<(), ViewError>(())
    /// ```
    pub fn view(&self) -> TensorRef<'_, T, N> {
        TensorRef::new(self.raw.share(), self.origin)
    }

    /// The sub-array at `index` along `axis`, one dimension fewer (NumPy's
    /// `x[i]` for `axis` 0, `x[:, i]` for 1), borrowing this view as
    /// [`TensorRef::view`] does: `(0..n).map(|i| x.index_axis(0, i))`
    /// splits a batch into its items. The result has a dynamic rank (fix it
    /// with [`TensorRef::into_rank`]); a 1-d view gives a 0-d one.
    ///
    /// ```
    /// # use dlcast_runtime::{TensorRef, ViewError};
    /// let batch = TensorRef::<f32, 2>::from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])?;
    /// let sums = (0..batch.dims()[0])
    ///     .map(|i| Ok(batch.index_axis(0, i)?.to_vec()?.iter().sum()))
    ///     .collect::<Result<Vec<f32>, ViewError>>()?;
    /// assert_eq!(sums, [3.0, 7.0, 11.0]);
    /// let column = batch.index_axis(1, 1)?.into_rank::<1>()?;
    /// assert_eq!(column.to_vec()?, [2.0, 4.0, 6.0]);
    /// # Ok::<(), ViewError>(())
    /// ```
    ///
    /// # Errors
    /// [`ViewErrorKind::Axes`] if `axis >= ndim()`; [`ViewErrorKind::Range`]
    /// if `index` is at or beyond the extent of `axis`.
    pub fn index_axis(&self, axis: usize, index: usize) -> Result<TensorRef<'_, T>, ViewError> {
        let mut raw = self.raw.share();
        raw.index_axis(axis, index)
            .map_err(|k| self.origin.error("index_axis", k))?;
        Ok(TensorRef::new(raw, self.origin))
    }

    /// The view with its rank fixed to `M` (or made dynamic, `M` = [`DYN`]).
    ///
    /// # Errors
    /// [`ViewErrorKind::Rank`] if the view does not have `M` dimensions.
    pub fn into_rank<const M: usize>(self) -> Result<TensorRef<'a, T, M>, ViewError> {
        rank_fits::<M>(&self.raw).map_err(|k| self.origin.error("into_rank", k))?;
        Ok(self.with_rank())
    }

    /// The view with a dynamic rank.
    pub fn into_dyn(self) -> TensorRef<'a, T> {
        self.with_rank()
    }

    /// The same elements in C order under another shape with the same
    /// element count; the view must be C-contiguous. The result has a
    /// dynamic rank (fix it with [`TensorRef::into_rank`]).
    ///
    /// # Errors
    /// [`ViewErrorKind::Reshape`].
    pub fn reshape(mut self, shape: &[usize]) -> Result<TensorRef<'a, T>, ViewError> {
        let origin = self.origin;
        self.raw
            .reshape(shape)
            .map_err(|k| origin.error("reshape", k))?;
        Ok(self.with_rank())
    }

    /// Overlapping windows of `window` consecutive elements along `axis`,
    /// one starting every `step` elements, without a copy: PyTorch's
    /// `x.unfold(axis, window, step)`, and NumPy's
    /// `sliding_window_view(x, window, axis=axis)` taken every `step`th
    /// window. `axis` keeps `(extent - window) / step + 1` window starts
    /// and a new last axis of extent `window` walks each window, so a 1-d
    /// signal of `n` samples becomes `[frames, window]`. Consumes the view
    /// like the other transforms (a function can return it); frame a
    /// borrowed view with `x.view().sliding_windows(..)`. The result has a
    /// dynamic rank (fix it with [`TensorRef::into_rank`]).
    ///
    /// The windows share elements where `step < window`, so the result is
    /// read-only everywhere: [`is_read_only`](Self::is_read_only) is true,
    /// and returned to Python it is exported read-only (there is no
    /// `TensorMut` version: two indices of it reach one element).
    ///
    /// ```
    /// # use dlcast_runtime::{TensorRef, ViewError};
    /// let signal = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    /// let x = TensorRef::<f32, 1>::from_slice(&signal, &[7])?;
    /// let frames = x.view().sliding_windows(0, 3, 2)?.into_rank::<2>()?;
    /// assert_eq!(frames.dims(), [3, 3]); // starts 0, 2, 4
    /// assert_eq!(frames.stride_array(), [2, 1]);
    /// assert_eq!(frames.get([2, 1])?, 5.0);
    /// assert_eq!(frames.data_ptr(), x.data_ptr()); // no copy
    /// assert!(x.view().sliding_windows(0, 8, 1).is_err()); // longer than the axis
    /// # Ok::<(), ViewError>(())
    /// ```
    ///
    /// # Errors
    /// [`ViewErrorKind::Axes`] if `axis >= ndim()`;
    /// [`ViewErrorKind::Window`] if `window` is 0 or longer than the axis,
    /// or `step` is 0; [`ViewErrorKind::Overflow`] if the result would
    /// hold more elements than `usize` counts (long windows of a broadcast
    /// axis).
    pub fn sliding_windows(
        mut self,
        axis: usize,
        window: usize,
        step: usize,
    ) -> Result<TensorRef<'a, T>, ViewError> {
        let origin = self.origin;
        self.raw
            .sliding_windows(axis, window, step)
            .map_err(|k| origin.error("sliding_windows", k))?;
        Ok(self.with_rank())
    }

    /// Address of element 0 (the producer's `data` plus `byte_offset`).
    /// It may be unaligned, and for non-CPU devices it is a device address;
    /// for a device whose `data` is an opaque handle (OpenCL, Vulkan,
    /// Metal) it is the handle, and element 0 lies
    /// [`byte_offset`](Self::byte_offset) bytes into its buffer.
    pub fn data_ptr(&self) -> *const T {
        self.raw.data.cast()
    }

    fn host(&self, method: &'static str) -> Result<(), ViewError> {
        if self.raw.device.is_host_accessible() {
            Ok(())
        } else {
            Err(self
                .origin
                .error(method, ViewErrorKind::NotHostAccessible(self.raw.device)))
        }
    }

    fn aligned(&self, method: &'static str) -> Result<(), ViewError> {
        let align = std::mem::align_of::<T>();
        if self.raw.data as usize % align == 0 || self.is_empty() {
            Ok(())
        } else {
            Err(self.origin.error(method, ViewErrorKind::Misaligned(align)))
        }
    }

    /// Checks that every element holds a valid `T` (only `bool` can fail).
    fn valid_values(&self, method: &'static str) -> Result<(), ViewError> {
        if T::ALL_BIT_PATTERNS_VALID {
            return Ok(());
        }
        let mut ok = true;
        layout::for_each_offset(&self.raw.shape, &self.raw.strides, |off| {
            // SAFETY: the import checked that every element offset lies in
            // the producer's memory, and the memory is host-accessible.
            ok &= unsafe { T::is_valid_at(self.data_ptr().offset(off)) };
        })
        .ok_or_else(|| {
            self.origin
                .error(method, self.raw.overflow("an element offset overflows"))
        })?;
        if ok {
            Ok(())
        } else {
            Err(self.origin.error(method, ViewErrorKind::InvalidValue))
        }
    }

    /// Offset (elements) of the element at `index`, for a view of `M`
    /// dimensions in host memory; `None` out of bounds, for memory the CPU
    /// cannot read (or if the rank is not `M`).
    #[inline(always)]
    fn offset_n<const M: usize>(&self, index: &[usize; M]) -> Option<isize> {
        // `M <= MAX_RANK` for every caller; the rank is `M` (checked when
        // the view was made), so these are the view's extents and strides.
        let shape: &[usize; M] = self.fast.dims.get(..M)?.try_into().ok()?;
        let strides: &[isize; M] = self.fast.strides.get(..M)?.try_into().ok()?;
        if !self.fast.host {
            return None;
        }
        // One test for all entries (`|`, not `||`).
        let mut outside = false;
        for (&i, &n) in index.iter().zip(shape) {
            outside |= i >= n;
        }
        if outside {
            return None;
        }
        let mut off: isize = 0;
        for (&i, &s) in index.iter().zip(strides) {
            // In bounds: `i <= n - 1 <= isize::MAX`, `|i * s|` is at most
            // the byte extent of the dimension, and every partial sum lies
            // within the layout's byte extent, which the import (or
            // `rust_raw`) checked fits `isize`: the wrapping operations are
            // exact.
            off = off.wrapping_add((i as isize).wrapping_mul(s));
        }
        Some(off)
    }

    /// Offset (elements) of the element at `index` (any length); `None` if
    /// out of bounds or of the wrong length.
    #[inline(always)]
    fn offset_dyn(&self, index: &[usize]) -> Option<isize> {
        if index.len() != self.fast.ndim {
            return None;
        }
        if index.len() > MAX_RANK {
            return layout::offset_of(&self.raw.shape, &self.raw.strides, index);
        }
        let mut off: isize = 0;
        for ((&i, &n), &s) in index.iter().zip(&self.fast.dims).zip(&self.fast.strides) {
            if i >= n {
                return None;
            }
            // Exact, as in `offset_n`.
            off = off.wrapping_add((i as isize).wrapping_mul(s));
        }
        Some(off)
    }

    /// The element at `index` of a view of rank `M`.
    #[inline(always)]
    fn read_n<const M: usize>(
        &self,
        method: &'static str,
        index: &[usize; M],
    ) -> Result<T, ViewError> {
        match self.offset_n(index) {
            Some(off) => {
                // SAFETY: `off` addresses an in-bounds element, inside the
                // memory the import validated, which the host can read
                // (`offset_n` checked both); `read_at` handles misalignment.
                Ok(unsafe { T::read_at(self.data_ptr().offset(off)) })
            }
            None => Err(self.index_error_n(method, *index)),
        }
    }

    /// [`Self::index_error`] for an array index, taken by value: element
    /// loops then keep their indices in registers.
    #[cold]
    #[inline(never)]
    fn index_error_n<const M: usize>(&self, method: &'static str, index: [usize; M]) -> ViewError {
        self.index_error(method, &index)
    }

    /// Why the element at `index` cannot be read or written.
    #[cold]
    #[inline(never)]
    fn index_error(&self, method: &'static str, index: &[usize]) -> ViewError {
        if let Err(e) = self.host(method) {
            return e;
        }
        self.origin.error(
            method,
            ViewErrorKind::Index {
                index: index.to_vec(),
                shape: self.raw.shape.to_vec(),
            },
        )
    }

    /// All elements, copied in C order (last index fastest).
    ///
    /// # Errors
    /// [`ViewErrorKind::NotHostAccessible`] for device memory;
    /// [`ViewErrorKind::OutOfMemory`] when the copy cannot be allocated (a
    /// broadcast view may hold far more elements than memory).
    pub fn to_vec(&self) -> Result<Vec<T>, ViewError> {
        self.host("to_vec")?;
        let mut out = vec_for::<T>(self.len()).map_err(|k| self.origin.error("to_vec", k))?;
        layout::for_each_offset(&self.raw.shape, &self.raw.strides, |off| {
            // SAFETY: every offset of the walk is an in-bounds element.
            // `push` never reallocates: the walk visits `len()` elements,
            // the capacity reserved above.
            out.push(unsafe { T::read_at(self.data_ptr().offset(off)) });
        })
        .ok_or_else(|| {
            self.origin
                .error("to_vec", self.raw.overflow("an element offset overflows"))
        })?;
        Ok(out)
    }

    /// The elements one by one, by value, in C order (last index fastest),
    /// whatever the strides (negative ones included); nothing for an empty
    /// array, one element for a 0-d one. Reads unaligned memory too.
    ///
    /// ```
    /// # use dlcast_runtime::TensorRef;
    /// let x = TensorRef::<u8, 2>::from_slice(&[1, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
    /// let t: Vec<u8> = x.t().iter().unwrap().collect();
    /// assert_eq!(t, [1, 4, 2, 5, 3, 6]);
    /// ```
    ///
    /// # Errors
    /// [`ViewErrorKind::NotHostAccessible`] for device memory.
    pub fn iter(&self) -> Result<Iter<'_, T>, ViewError> {
        self.host("iter")?;
        Ok(Iter::new(&self.raw, false))
    }

    /// The elements one by one, by value, in the order they lie in memory:
    /// every index once, the fastest traversal (contiguous runs are read
    /// straight through). For the layouts strided libraries make (C, F,
    /// permuted, sliced, flipped) that is increasing address order; for
    /// overlapping layouts (a broadcast) an address is visited once per
    /// index reaching it. Use it for reductions where the order does not
    /// matter.
    ///
    /// ```
    /// # use dlcast_runtime::TensorRef;
    /// let x = TensorRef::<u8, 2>::from_slice(&[1, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
    /// let t: Vec<u8> = x.t().iter_memory_order().unwrap().collect();
    /// assert_eq!(t, [1, 2, 3, 4, 5, 6]);
    /// ```
    ///
    /// # Errors
    /// [`ViewErrorKind::NotHostAccessible`] for device memory.
    pub fn iter_memory_order(&self) -> Result<Iter<'_, T>, ViewError> {
        self.host("iter_memory_order")?;
        Ok(Iter::new(&self.raw, true))
    }

    /// The elements as a slice in C order, when the memory is host-
    /// accessible, C-contiguous, aligned for `T` and (for `bool`) holds only
    /// valid values; `None` otherwise ([`TensorRef::iter`] and
    /// [`TensorRef::to_vec`] work on every layout).
    pub fn as_slice(&self) -> Option<&[T]> {
        self.slice_parts("as_slice").ok().map(|(ptr, len)| {
            // SAFETY: `slice_parts` checked host access, C contiguity,
            // alignment and value validity; the memory stays alive and
            // unmodified by Rust code for the borrow of `self` (the only
            // writable access is through `&mut TensorMut`).
            unsafe { std::slice::from_raw_parts(ptr, len) }
        })
    }

    fn slice_parts(&self, method: &'static str) -> Result<(*const T, usize), ViewError> {
        self.host(method)?;
        if !self.is_c_contiguous() {
            return Err(self.origin.error(method, ViewErrorKind::NotContiguous));
        }
        self.aligned(method)?;
        self.valid_values(method)?;
        let len = self.len();
        let ptr = if len == 0 {
            std::ptr::NonNull::<T>::dangling().as_ptr().cast_const()
        } else {
            self.data_ptr()
        };
        Ok((ptr, len))
    }

    /// An `ndarray` view of dynamic rank with the same shape and strides
    /// (negative strides included); [`TensorRef::as_array`] gives a view of
    /// static rank for views of rank `0..=6`.
    ///
    /// # Errors
    /// [`ViewError`] when the memory is not host-accessible, not aligned for
    /// `T`, or (for `bool`) holds invalid values.
    #[cfg(feature = "ndarray")]
    pub fn as_ndarray(&self) -> Result<ndarray::ArrayViewD<'_, T>, ViewError> {
        self.ndarray_in("as_ndarray")
    }

    #[cfg(feature = "ndarray")]
    fn ndarray_in(&self, method: &'static str) -> Result<ndarray::ArrayViewD<'_, T>, ViewError> {
        self.host(method)?;
        self.aligned(method)?;
        self.valid_values(method)?;
        use ndarray::ShapeBuilder;
        let parts = ndarray_parts(&self.raw, std::mem::size_of::<T>())
            .map_err(|k| self.origin.error(method, k))?;
        let (ptr, shape, strides, flips) = match parts {
            NdParts::Empty(shape) => {
                // No memory to view: ndarray's safe constructor over an
                // empty slice checks the shape itself.
                return ndarray::ArrayViewD::from_shape(shape, &[]).map_err(|_| {
                    self.origin
                        .error(method, self.raw.overflow("ndarray refuses the shape"))
                });
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

impl<T: Element> TensorRef<'_, T> {
    /// The element at `index` (one entry per dimension). Works on unaligned
    /// memory. Views of a fixed rank take an array instead
    /// (`x.get([i, j])`), which is faster.
    ///
    /// # Errors
    /// [`ViewErrorKind::Index`] if `index` does not have `ndim()` entries
    /// or an entry is out of bounds (Python's `IndexError`);
    /// [`ViewErrorKind::NotHostAccessible`] for device memory.
    #[inline]
    pub fn get(&self, index: &[usize]) -> Result<T, ViewError> {
        match self.offset_dyn(index) {
            Some(off) if self.fast.host => {
                // SAFETY: `off` addresses an in-bounds element, inside the
                // memory the import validated; `read_at` handles misalignment.
                Ok(unsafe { T::read_at(self.data_ptr().offset(off)) })
            }
            _ => Err(self.index_error("get", index)),
        }
    }
}

impl<'a, T: Element, const N: usize> std::ops::Deref for TensorMut<'a, T, N> {
    type Target = TensorRef<'a, T, N>;
    fn deref(&self) -> &TensorRef<'a, T, N> {
        &self.inner
    }
}

impl<'a, T: Element, const N: usize> TensorMut<'a, T, N> {
    transform_methods!();

    fn parts_mut(&mut self) -> (&mut RawTensor, Origin) {
        (&mut self.inner.raw, self.inner.origin)
    }

    fn refresh(&mut self) {
        self.inner.refresh();
    }

    /// The raw tensor, for export.
    pub(crate) fn into_raw(self) -> RawTensor {
        self.inner.raw.0
    }

    /// A writable view of the C-order elements of `data` under `shape`
    /// (host memory, owning nothing), for calling a `#[dlpack_fn]` body
    /// from Rust without Python.
    ///
    /// ```
    /// # use dlcast_runtime::TensorMut;
    /// let mut data = [0u8; 6];
    /// let mut out = TensorMut::<u8, 2>::from_slice_mut(&mut data, &[2, 3]).unwrap();
    /// out.set([1, 2], 7).unwrap();
    /// drop(out);
    /// assert_eq!(data, [0, 0, 0, 0, 0, 7]);
    /// ```
    ///
    /// # Errors
    /// As [`TensorRef::from_slice`].
    pub fn from_slice_mut(data: &'a mut [T], shape: &[usize]) -> Result<Self, ViewError> {
        let raw = rust_raw::<T, N>(data.as_mut_ptr(), Some(data.len()), shape, None, false)
            .map_err(|k| Origin::RUST.error("from_slice_mut", k))?;
        Ok(Self::wrap(raw))
    }

    /// A writable view of an `ndarray` mutable view's elements, same shape
    /// and strides, owning nothing.
    ///
    /// # Errors
    /// [`ViewErrorKind::Rank`] if the array does not have `N` dimensions
    /// (for a fixed `N`); [`ViewErrorKind::SelfOverlap`] if two indices
    /// reach one element (ndarray's mutable views never do).
    #[cfg(feature = "ndarray")]
    pub fn from_ndarray_mut<D: ndarray::Dimension>(
        mut array: ndarray::ArrayViewMut<'a, T, D>,
    ) -> Result<Self, ViewError> {
        let err = |k| Origin::RUST.error("from_ndarray_mut", k);
        if layout::may_self_overlap(array.shape(), array.strides()) {
            return Err(err(ViewErrorKind::SelfOverlap));
        }
        let shape = Dims::<usize>::from_slice(array.shape());
        let strides = Dims::<isize>::from_slice(array.strides());
        let raw = rust_raw::<T, N>(array.as_mut_ptr(), None, &shape, Some(&strides), false)
            .map_err(err)?;
        Ok(Self::wrap(raw))
    }

    fn wrap(raw: RawTensor) -> Self {
        TensorMut {
            inner: TensorRef::new(raw, Origin::RUST),
        }
    }

    /// The view with its rank fixed to `M` (or made dynamic, `M` = [`DYN`]).
    ///
    /// # Errors
    /// [`ViewErrorKind::Rank`] if the view does not have `M` dimensions.
    pub fn into_rank<const M: usize>(self) -> Result<TensorMut<'a, T, M>, ViewError> {
        Ok(TensorMut {
            inner: self.inner.into_rank()?,
        })
    }

    /// The view with a dynamic rank.
    pub fn into_dyn(self) -> TensorMut<'a, T> {
        TensorMut {
            inner: self.inner.into_dyn(),
        }
    }

    /// As [`TensorRef::reshape`], writable.
    ///
    /// # Errors
    /// [`ViewErrorKind::Reshape`].
    pub fn reshape(self, shape: &[usize]) -> Result<TensorMut<'a, T>, ViewError> {
        Ok(TensorMut {
            inner: self.inner.reshape(shape)?,
        })
    }

    /// A writable view of the same elements that borrows this one
    /// exclusively, for a shorter time: pass it to a function that takes
    /// `TensorMut` by value, or transform it (`slice_axis`, `t`, ...), and
    /// use `self` again afterwards. It owns nothing (see
    /// [`TensorRef::view`]).
    ///
    /// ```
    /// # use dlcast_runtime::{TensorMut, ViewError};
    /// fn fill_row(row: TensorMut<'_, u8>, v: u8) -> Result<(), ViewError> {
    ///     let mut row = row;
    ///     row.fill(v)
    /// }
    /// let mut data = [0u8; 6];
    /// let mut out = TensorMut::<u8, 2>::from_slice_mut(&mut data, &[2, 3])?;
    /// fill_row(out.reborrow().into_dyn().slice_axis(0, 1..2)?, 7)?;
    /// out.set([0, 0], 1)?; // `out` is usable again
    /// drop(out);
    /// assert_eq!(data, [1, 0, 0, 7, 7, 7]);
    /// # Ok::<(), ViewError>(())
    /// ```
    pub fn reborrow(&mut self) -> TensorMut<'_, T, N> {
        TensorMut {
            inner: TensorRef::new(self.inner.raw.share(), self.inner.origin),
        }
    }

    /// The writable sub-array at `index` along `axis`, one dimension fewer,
    /// borrowing this view exclusively (as [`TensorMut::reborrow`]); see
    /// [`TensorRef::index_axis`].
    ///
    /// ```
    /// # use dlcast_runtime::{TensorMut, ViewError};
    /// let mut data = [0i32; 6];
    /// let mut out = TensorMut::<i32, 2>::from_slice_mut(&mut data, &[3, 2])?;
    /// for i in 0..3 {
    ///     out.index_axis_mut(0, i)?.fill(i as i32)?;
    /// }
    /// drop(out);
    /// assert_eq!(data, [0, 0, 1, 1, 2, 2]);
    /// # Ok::<(), ViewError>(())
    /// ```
    ///
    /// # Errors
    /// As [`TensorRef::index_axis`].
    pub fn index_axis_mut(
        &mut self,
        axis: usize,
        index: usize,
    ) -> Result<TensorMut<'_, T>, ViewError> {
        let mut raw = self.inner.raw.share();
        raw.index_axis(axis, index)
            .map_err(|k| self.inner.origin.error("index_axis_mut", k))?;
        Ok(TensorMut {
            inner: TensorRef::new(raw, self.inner.origin),
        })
    }

    /// Address of element 0, writable.
    pub fn data_ptr_mut(&mut self) -> *mut T {
        self.inner.raw.data.cast()
    }

    /// Writes `value` at the element of rank-`M` index `index`.
    #[inline(always)]
    fn write_n<const M: usize>(
        &mut self,
        method: &'static str,
        index: &[usize; M],
        value: T,
    ) -> Result<(), ViewError> {
        match self.inner.offset_n(index) {
            Some(off) => {
                // SAFETY: in-bounds element of writable, host-accessible
                // memory validated at import (or a `&mut` slice); `&mut
                // self` excludes every other Rust access.
                unsafe { self.data_ptr_mut().offset(off).write_unaligned(value) };
                Ok(())
            }
            None => Err(self.inner.index_error_n(method, *index)),
        }
    }

    /// Writes `value` into every element.
    ///
    /// # Errors
    /// [`ViewErrorKind::NotHostAccessible`] for device memory.
    pub fn fill(&mut self, value: T) -> Result<(), ViewError> {
        self.inner.host("fill")?;
        let base = self.data_ptr_mut();
        layout::for_each_offset(&self.inner.raw.shape, &self.inner.raw.strides, |off| {
            // SAFETY: as in `set`, for every in-bounds element.
            unsafe { base.offset(off).write_unaligned(value) };
        })
        .ok_or_else(|| {
            self.inner.origin.error(
                "fill",
                self.inner.raw.overflow("an element offset overflows"),
            )
        })
    }

    /// Writes the elements of `src`, in C order, into the view, whatever
    /// its strides: the inverse of [`TensorRef::to_vec`].
    ///
    /// # Errors
    /// [`ViewErrorKind::Length`] if `src.len()` is not [`TensorRef::len`];
    /// [`ViewErrorKind::NotHostAccessible`] for device memory.
    pub fn copy_from_slice(&mut self, src: &[T]) -> Result<(), ViewError> {
        self.inner.host("copy_from_slice")?;
        if src.len() != self.len() {
            return Err(self.inner.origin.error(
                "copy_from_slice",
                ViewErrorKind::Length {
                    shape: self.shape().to_vec(),
                    expected: self.len(),
                    got: src.len(),
                },
            ));
        }
        let base = self.data_ptr_mut();
        let mut values = src.iter();
        layout::for_each_offset(&self.inner.raw.shape, &self.inner.raw.strides, |off| {
            if let Some(&v) = values.next() {
                // SAFETY: as in `set`, for every in-bounds element.
                unsafe { base.offset(off).write_unaligned(v) };
            }
        })
        .ok_or_else(|| {
            self.inner.origin.error(
                "copy_from_slice",
                self.inner.raw.overflow("an element offset overflows"),
            )
        })
    }

    /// The elements as a mutable slice in C order; `None` unless host-
    /// accessible, C-contiguous, aligned and (for `bool`) valid.
    pub fn as_slice_mut(&mut self) -> Option<&mut [T]> {
        let (ptr, len) = self.inner.slice_parts("as_slice_mut").ok()?;
        // SAFETY: as in `as_slice`; in addition the memory is writable (not
        // read-only, checked at import), C-contiguous so no two slice
        // elements alias, and `&mut self` makes this the only live access.
        Some(unsafe { std::slice::from_raw_parts_mut(ptr.cast_mut(), len) })
    }

    /// A mutable `ndarray` view of dynamic rank with the same shape and
    /// strides.
    ///
    /// # Errors
    /// As [`TensorRef::as_ndarray`].
    #[cfg(feature = "ndarray")]
    pub fn as_ndarray_mut(&mut self) -> Result<ndarray::ArrayViewMutD<'_, T>, ViewError> {
        self.ndarray_mut_in("as_ndarray_mut")
    }

    #[cfg(feature = "ndarray")]
    fn ndarray_mut_in(
        &mut self,
        method: &'static str,
    ) -> Result<ndarray::ArrayViewMutD<'_, T>, ViewError> {
        self.inner.host(method)?;
        self.inner.aligned(method)?;
        self.inner.valid_values(method)?;
        use ndarray::ShapeBuilder;
        let origin = self.inner.origin;
        let parts = ndarray_parts(&self.inner.raw, std::mem::size_of::<T>())
            .map_err(|k| origin.error(method, k))?;
        let (ptr, shape, strides, flips) = match parts {
            NdParts::Empty(shape) => {
                // As in `as_ndarray`: no memory, a view over `&mut []`
                // (ndarray's debug checks refused the dangling pointer
                // and zero strides this used to pass).
                return ndarray::ArrayViewMutD::from_shape(shape, &mut []).map_err(|_| {
                    origin.error(method, self.inner.raw.overflow("ndarray refuses the shape"))
                });
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

impl<T: Element> TensorMut<'_, T> {
    /// Writes `value` at `index` (one entry per dimension). Views of a fixed
    /// rank take an array instead (`out.set([i, j], v)`), which is faster.
    ///
    /// # Errors
    /// [`ViewErrorKind::Index`] if `index` does not have `ndim()` entries
    /// or an entry is out of bounds (Python's `IndexError`);
    /// [`ViewErrorKind::NotHostAccessible`] for device memory. Nothing is
    /// written then.
    #[must_use = "an index out of bounds writes nothing: handle the error (`?`)"]
    #[inline]
    pub fn set(&mut self, index: &[usize], value: T) -> Result<(), ViewError> {
        match self.inner.offset_dyn(index) {
            Some(off) if self.inner.fast.host => {
                // SAFETY: in-bounds element of writable, host-accessible
                // memory validated at import; `&mut self` excludes every
                // other Rust access.
                unsafe { self.data_ptr_mut().offset(off).write_unaligned(value) };
                Ok(())
            }
            _ => Err(self.inner.index_error("set", index)),
        }
    }
}

/// The accessors of views whose rank the type fixes.
macro_rules! ranked {
    ($($n:literal $ix:ident),* $(,)?) => {$(
        impl<T: Element> TensorRef<'_, T, $n> {
            #[doc = concat!("The shape as an array of ", stringify!($n), " extents.")]
            #[inline]
            pub fn dims(&self) -> [usize; $n] {
                // The rank is `N` (checked when the view was made).
                std::array::from_fn(|k| self.fast.dims.get(k).copied().unwrap_or(0))
            }

            #[doc = concat!("The strides (elements) as an array of ", stringify!($n), ".")]
            #[inline]
            pub fn stride_array(&self) -> [isize; $n] {
                std::array::from_fn(|k| self.fast.strides.get(k).copied().unwrap_or(0))
            }

            /// The element at `index`; no allocation, no panic. Works on
            /// unaligned memory.
            ///
            /// # Errors
            /// [`ViewErrorKind::Index`] if an entry is out of bounds
            /// (Python's `IndexError`, naming the function, the parameter,
            /// the index and the shape); [`ViewErrorKind::NotHostAccessible`]
            /// for device memory.
            #[inline]
            pub fn get(&self, index: [usize; $n]) -> Result<T, ViewError> {
                self.read_n("get", &index)
            }

            #[doc = concat!("An `ndarray` view of static rank (`ndarray::", stringify!($ix), "`) with the same shape and strides.")]
            ///
            /// # Errors
            /// As [`TensorRef::as_ndarray`].
            #[cfg(feature = "ndarray")]
            pub fn as_array(&self) -> Result<ndarray::ArrayView<'_, T, ndarray::$ix>, ViewError> {
                let a = self.ndarray_in("as_array")?;
                a.into_dimensionality::<ndarray::$ix>().map_err(|_| {
                    self.origin.error(
                        "as_array",
                        ViewErrorKind::Rank { expected: $n, shape: self.raw.shape.to_vec() },
                    )
                })
            }
        }

        impl<T: Element> TensorMut<'_, T, $n> {
            /// Writes `value` at `index`; no allocation, no panic.
            ///
            /// # Errors
            /// [`ViewErrorKind::Index`] if an entry is out of bounds
            /// (Python's `IndexError`); [`ViewErrorKind::NotHostAccessible`]
            /// for device memory. Nothing is written then.
            #[must_use = "an index out of bounds writes nothing: handle the error (`?`)"]
            #[inline]
            pub fn set(&mut self, index: [usize; $n], value: T) -> Result<(), ViewError> {
                self.write_n("set", &index, value)
            }

            #[doc = concat!("A mutable `ndarray` view of static rank (`ndarray::", stringify!($ix), "`).")]
            ///
            /// # Errors
            /// As [`TensorRef::as_ndarray`].
            #[cfg(feature = "ndarray")]
            pub fn as_array_mut(&mut self) -> Result<ndarray::ArrayViewMut<'_, T, ndarray::$ix>, ViewError> {
                let origin = self.inner.origin;
                let shape = self.inner.raw.shape.to_vec();
                let a = self.ndarray_mut_in("as_array_mut")?;
                a.into_dimensionality::<ndarray::$ix>().map_err(|_| {
                    origin.error("as_array_mut", ViewErrorKind::Rank { expected: $n, shape })
                })
            }
        }
    )*};
}
ranked!(0 Ix0, 1 Ix1, 2 Ix2, 3 Ix3, 4 Ix4, 5 Ix5, 6 Ix6);

impl<T: Element, const N: usize> fmt::Debug for TensorRef<'_, T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorRef")
            .field("shape", &self.shape())
            .field("strides", &self.strides())
            .field("dtype", &self.dtype())
            .field("device", &self.device())
            .finish()
    }
}

impl<T: Element, const N: usize> fmt::Debug for TensorMut<'_, T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TensorMut").field(&self.inner).finish()
    }
}
