//! Parameters typed as Rust's own views: `&[T]`, `&mut [T]`,
//! `ndarray::ArrayView<'_, T, D>` and `ArrayViewMut<'_, T, D>` (with the
//! aliases `ArrayView1` .. `ArrayViewD`).
//!
//! What these types need is guaranteed at the boundary, by the checks of the
//! parameter's [`crate::spec::ParamSpec`] (`aligned`, the rank the type
//! fixes, C order for slices, host devices): memory the CPU reads, aligned
//! for `T`, native byte order, and for `&mut` no element reached twice. Each
//! view is made here once more against the read (so that no spec can make one
//! unsound), borrows the call context for its lifetime, and leaves the read —
//! its owner and its borrow-registry entry — in the context
//! ([`ReadSlot`]), which outlives it.

use crate::dtype::{DType, Element};
use crate::error::Native;
use crate::import::numpy::NpRead;
use crate::import::RawTensor;
use crate::layout;
use crate::view::{FastKeep, FastNeeds, ReadSlot, View};
use pyo3::PyResult;

/// The checks every Rust view repeats over a read: host memory, aligned for
/// `T` where not empty, the element type's dtype, and (for `bool`) valid
/// values.
fn check_native<T: Element>(raw: &RawTensor, keep: &ReadSlot<'_>) -> PyResult<()> {
    if !raw.device.is_host_accessible() {
        return Err(keep.refuse(Native::NotHost(raw.device)));
    }
    if raw.dtype != T::DTYPE {
        return Err(keep.refuse(Native::DType {
            want: T::DTYPE,
            got: raw.dtype,
        }));
    }
    if raw.extent.is_none() {
        return Ok(());
    }
    if raw.data as usize % std::mem::align_of::<T>() != 0 {
        return Err(keep.refuse(Native::Misaligned(std::mem::align_of::<T>())));
    }
    if !T::ALL_BIT_PATTERNS_VALID && !raw.holds_valid_bools() {
        return Err(keep.refuse(Native::InvalidBool));
    }
    Ok(())
}

/// The elements of a C-contiguous read as `(pointer, length)`: a dangling,
/// aligned pointer for an empty array.
fn slice_parts<T: Element>(raw: &RawTensor, keep: &ReadSlot<'_>) -> PyResult<(*mut T, usize)> {
    check_native::<T>(raw, keep)?;
    if !layout::is_c_contiguous(&raw.shape, &raw.strides) {
        return Err(keep.refuse(Native::NotCContiguous));
    }
    let len =
        layout::element_count(&raw.shape).ok_or_else(|| keep.refuse(Native::CountOverflow))?;
    if len == 0 || raw.extent.is_none() {
        return Ok((std::ptr::NonNull::dangling().as_ptr(), 0));
    }
    Ok((raw.data.cast::<T>(), len))
}

/// What every Rust view of a fast read checks once more: the element
/// type's dtype, and data aligned for it (the read is host memory, non-empty,
/// with non-negative strides; `bool` arrays never take the fast path, and
/// are refused here too).
#[inline(always)]
fn check_fast<T: Element>(read: &NpRead, keep: &FastKeep<'_>) -> PyResult<()> {
    if read.dtype != T::DTYPE || !T::ALL_BIT_PATTERNS_VALID {
        return Err(keep.refuse(Native::DType {
            want: T::DTYPE,
            got: read.dtype,
        }));
    }
    if read.data as usize % std::mem::align_of::<T>() != 0 {
        return Err(keep.refuse(Native::Misaligned(std::mem::align_of::<T>())));
    }
    Ok(())
}

/// The elements of a one-dimensional fast read with unit stride.
#[inline(always)]
fn fast_slice_parts<T: Element>(read: &NpRead, keep: &FastKeep<'_>) -> PyResult<(*mut T, usize)> {
    check_fast::<T>(read, keep)?;
    match (read.shape(), read.elem_strides()) {
        ([n], [s]) if *s == 1 || *n == 1 => Ok((read.data.cast::<T>(), *n)),
        _ => Err(keep.refuse(Native::NotCContiguous)),
    }
}

impl<'a, T: Element> View<'a> for &'a [T] {
    const DTYPE: Option<DType> = Some(T::DTYPE);
    const WRITABLE: bool = false;
    const NDIM: Option<usize> = Some(1);
    fn from_raw(raw: RawTensor, keep: ReadSlot<'a>) -> PyResult<Self> {
        let (ptr, len) = slice_parts::<T>(&raw, &keep)?;
        keep.hold(raw);
        // SAFETY: `ptr` addresses `len` contiguous, aligned, valid elements
        // of host memory the import validated (or is dangling for `len` 0);
        // the read that keeps that memory alive and registered read-only is
        // held by the call context for `'a`; no writable view shares it (the
        // borrow registry refused any).
        Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
    }
    const FAST: Option<FastNeeds> = Some(FastNeeds {
        ndim: Some(1),
        aligned: true,
        contiguous: true,
        itemsize: std::mem::size_of::<T>(),
        align: std::mem::align_of::<T>(),
    });
    #[inline(always)]
    fn from_fast(read: &'a NpRead, keep: FastKeep<'a>) -> PyResult<Self> {
        let (ptr, len) = fast_slice_parts::<T>(read, &keep)?;
        // SAFETY: `ptr` addresses `len` (at least 1) contiguous, aligned
        // elements of a non-empty NumPy array of `T`'s dtype in native byte
        // order, whose span `read_fast` checked; every bit pattern is a
        // valid `T` (checked). The call context holds the array and its
        // read-only registry entry for `'a`; no writable view shares it.
        Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
    }
}

impl<'a, T: Element> View<'a> for &'a mut [T] {
    const DTYPE: Option<DType> = Some(T::DTYPE);
    const WRITABLE: bool = true;
    const NDIM: Option<usize> = Some(1);
    fn from_raw(raw: RawTensor, keep: ReadSlot<'a>) -> PyResult<Self> {
        if raw.read_only {
            return Err(keep.refuse(Native::ReadOnly));
        }
        let (ptr, len) = slice_parts::<T>(&raw, &keep)?;
        keep.hold(raw);
        // SAFETY: as for `&[T]`; in addition the memory is writable (not
        // read-only), C-contiguous so no two elements alias, and registered
        // writable: no other view, in this call or another, reaches it.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }
    const FAST: Option<FastNeeds> = <&'a [T] as View<'a>>::FAST;
    #[inline(always)]
    fn from_fast(read: &'a NpRead, keep: FastKeep<'a>) -> PyResult<Self> {
        if read.read_only {
            return Err(keep.refuse(Native::ReadOnly));
        }
        let (ptr, len) = fast_slice_parts::<T>(read, &keep)?;
        // SAFETY: as for `&[T]`; in addition the array is writeable, its
        // elements distinct (unit stride), and the call context holds its
        // writable registry entry: no other view reaches it.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }
}

/// The shape of an `ndarray` view of dimension `D` from `dims` (elements),
/// or an error when the read's rank is not `D`'s.
#[cfg(feature = "ndarray")]
fn nd_dim<D: ndarray::Dimension>(dims: &[usize], keep: &ReadSlot<'_>) -> PyResult<D> {
    if D::NDIM.is_some_and(|n| n != dims.len()) {
        return Err(keep.refuse(Native::Rank {
            want: D::NDIM.unwrap_or_default(),
            got: dims.len(),
        }));
    }
    let mut d = D::zeros(dims.len());
    d.slice_mut().copy_from_slice(dims);
    Ok(d)
}

/// Makes an `ndarray` view (read-only or mutable, through `make`) of a read
/// that passed [`check_native`], with its shape and strides, negative ones
/// included.
#[cfg(feature = "ndarray")]
fn nd_view<T: Element, D: ndarray::Dimension, V>(
    raw: &RawTensor,
    keep: &ReadSlot<'_>,
    empty: impl FnOnce(D) -> Option<V>,
    make: impl FnOnce(ndarray::StrideShape<D>, *mut T) -> V,
    invert: impl Fn(&mut V, usize),
) -> PyResult<V> {
    use crate::view::{ndarray_parts, NdParts};
    use ndarray::ShapeBuilder;
    let overflow = |_| keep.refuse(Native::TooLarge);
    match ndarray_parts(raw, std::mem::size_of::<T>()).map_err(overflow)? {
        NdParts::Empty(shape) => {
            let shape = nd_dim::<D>(ndarray::Dimension::slice(&shape), keep)?;
            let dims = ndarray::Dimension::slice(&shape).to_vec();
            empty(shape).ok_or_else(|| keep.refuse(Native::EmptyShape(dims)))
        }
        NdParts::Strided((ptr, shape, strides, flips)) => {
            let shape = nd_dim::<D>(ndarray::Dimension::slice(&shape), keep)?;
            let strides = nd_dim::<D>(ndarray::Dimension::slice(&strides), keep)?;
            let mut view = make(shape.strides(strides), ptr.cast::<T>());
            for axis in flips {
                invert(&mut view, axis);
            }
            Ok(view)
        }
    }
}

/// The shape and strides of an `ndarray` view of dimension `D` of a fast
/// read, and its element 0 (strides are non-negative: no axis to invert).
#[cfg(feature = "ndarray")]
#[inline(always)]
fn fast_nd_shape<T, D: ndarray::Dimension>(
    read: &NpRead,
    keep: &FastKeep<'_>,
) -> PyResult<(ndarray::StrideShape<D>, *mut T)> {
    use ndarray::ShapeBuilder;
    let n = read.shape().len();
    if D::NDIM.is_some_and(|d| d != n) {
        return Err(keep.refuse(Native::Rank {
            want: D::NDIM.unwrap_or(0),
            got: read.shape().len(),
        }));
    }
    let (mut shape, mut strides) = (D::zeros(n), D::zeros(n));
    for (k, (&e, &s)) in read.shape().iter().zip(read.elem_strides()).enumerate() {
        // As `ndarray_parts`: 0 for an axis never stepped along.
        shape[k] = e;
        strides[k] = if e <= 1 { 0 } else { s.unsigned_abs() };
    }
    Ok((shape.strides(strides), read.data.cast::<T>()))
}

#[cfg(feature = "ndarray")]
impl<'a, T: Element, D: ndarray::Dimension> View<'a> for ndarray::ArrayView<'a, T, D> {
    const DTYPE: Option<DType> = Some(T::DTYPE);
    const WRITABLE: bool = false;
    const NDIM: Option<usize> = D::NDIM;
    fn from_raw(raw: RawTensor, keep: ReadSlot<'a>) -> PyResult<Self> {
        check_native::<T>(&raw, &keep)?;
        let view = nd_view::<T, D, _>(
            &raw,
            &keep,
            |shape| ndarray::ArrayView::from_shape(shape, &[]).ok(),
            // SAFETY: `ndarray_parts` gives the lowest-addressed element of
            // memory the import validated (host-accessible, checked above;
            // in bounds for every index), non-negative strides, an element
            // count within `isize::MAX`; the elements are aligned and valid
            // (`check_native`). The read that keeps the memory alive is held
            // by the call context for `'a`, registered read-only.
            |shape, ptr| unsafe { ndarray::ArrayView::from_shape_ptr(shape, ptr) },
            |v, axis| v.invert_axis(ndarray::Axis(axis)),
        )?;
        keep.hold(raw);
        Ok(view)
    }
    const FAST: Option<FastNeeds> = Some(FastNeeds {
        ndim: D::NDIM,
        aligned: true,
        contiguous: false,
        itemsize: std::mem::size_of::<T>(),
        align: std::mem::align_of::<T>(),
    });
    #[inline(always)]
    fn from_fast(read: &'a NpRead, keep: FastKeep<'a>) -> PyResult<Self> {
        check_fast::<T>(read, &keep)?;
        let (shape, ptr) = fast_nd_shape::<T, D>(read, &keep)?;
        // SAFETY: `ptr` is element 0 and the lowest address of a non-empty
        // host array of `T`'s dtype (aligned, native byte order, every bit
        // pattern valid: checked), with non-negative strides, every offset
        // within the span `read_fast` checked and at most `isize::MAX`
        // elements. The call context holds the array and its read-only
        // registry entry for `'a`.
        Ok(unsafe { ndarray::ArrayView::from_shape_ptr(shape, ptr) })
    }
}

#[cfg(feature = "ndarray")]
impl<'a, T: Element, D: ndarray::Dimension> View<'a> for ndarray::ArrayViewMut<'a, T, D> {
    const DTYPE: Option<DType> = Some(T::DTYPE);
    const WRITABLE: bool = true;
    const NDIM: Option<usize> = D::NDIM;
    fn from_raw(raw: RawTensor, keep: ReadSlot<'a>) -> PyResult<Self> {
        check_native::<T>(&raw, &keep)?;
        if raw.read_only {
            return Err(keep.refuse(Native::ReadOnly));
        }
        if layout::may_self_overlap(&raw.shape, &raw.strides) {
            return Err(keep.refuse(Native::SelfOverlap));
        }
        let view = nd_view::<T, D, _>(
            &raw,
            &keep,
            |shape| ndarray::ArrayViewMut::from_shape(shape, &mut []).ok(),
            // SAFETY: as for `ArrayView`; in addition the memory is writable,
            // no element is reached twice (checked above), and it is
            // registered writable: no other view reaches it.
            |shape, ptr| unsafe { ndarray::ArrayViewMut::from_shape_ptr(shape, ptr) },
            |v, axis| v.invert_axis(ndarray::Axis(axis)),
        )?;
        keep.hold(raw);
        Ok(view)
    }
    const FAST: Option<FastNeeds> = <ndarray::ArrayView<'a, T, D> as View<'a>>::FAST;
    #[inline(always)]
    fn from_fast(read: &'a NpRead, keep: FastKeep<'a>) -> PyResult<Self> {
        check_fast::<T>(read, &keep)?;
        if read.read_only || read.may_self_overlap() {
            return Err(keep.refuse(Native::ReadOnly));
        }
        let (shape, ptr) = fast_nd_shape::<T, D>(read, &keep)?;
        // SAFETY: as for `ArrayView`; in addition the array is writeable, no
        // element is reached twice (checked above), and the call context
        // holds its writable registry entry: no other view reaches it.
        Ok(unsafe { ndarray::ArrayViewMut::from_shape_ptr(shape, ptr) })
    }
}
