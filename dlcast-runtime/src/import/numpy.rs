//! NumPy arrays, read from the array object's own fields: after an exact
//! type check against `numpy.ndarray`, the data pointer, ndim, shape,
//! strides, dtype, flags and byte order. No capsule, no Python call, no
//! allocation (up to [`super::INLINE_DIMS`] dimensions). The fields read sit
//! at the same offsets in NumPy 1.x and 2.x.

use super::{Dims, ImportPath, RawTensor, INLINE_DIMS};
use crate::dtype::DType;
use crate::facts::DTYPES;
use crate::layout::ByteExtent;
use crate::npyffi::{PyArrayObject, NPY_ARRAY_WRITEABLE};
use pyo3::ffi;
use pyo3::prelude::*;
use smallvec::SmallVec;
use std::ffi::c_int;
use std::sync::atomic::{AtomicPtr, Ordering};

/// `numpy.ndarray` (`&PyArray_Type`, a static type of NumPy's extension
/// module: valid for the process), once learned.
static NDARRAY: AtomicPtr<ffi::PyTypeObject> = AtomicPtr::new(std::ptr::null_mut());

/// Whether `obj`'s type is exactly `numpy.ndarray` (subclasses take the
/// generic path: they may override `__dlpack__`).
#[inline(always)]
pub(crate) fn is_ndarray(obj: &Bound<'_, PyAny>) -> bool {
    // SAFETY: `obj` is a live object; its type pointer is valid.
    let tp = unsafe { ffi::Py_TYPE(obj.as_ptr()) };
    // Until `numpy.ndarray` is known, every object takes the generic path,
    // which learns the type (`learn_ndarray`), running Python code only there.
    tp == NDARRAY.load(Ordering::Relaxed)
}

/// Whether `obj` is exactly a `numpy.ndarray`, learning the type the first
/// time one is seen (which may run Python code: NumPy's C API table is
/// looked up). Called on the generic path, so that [`numpy`] never runs
/// Python.
///
/// The type is NumPy's `&PyArray_Type` as entry 2 of its verified C API
/// table gives it ([`crate::npapi::table`]), not the `numpy.ndarray`
/// attribute (Python code can replace that). Where no table can be
/// verified, a static type named `numpy.ndarray` (no Python code can make
/// one) is NumPy's all the same; rust-numpy's borrows then cannot be
/// followed, and [`crate::borrow::rust_numpy::check`] refuses such arrays.
pub(crate) fn learn_ndarray(obj: &Bound<'_, PyAny>) -> bool {
    // SAFETY: `obj` is a live object; its type pointer is valid.
    let tp = unsafe { ffi::Py_TYPE(obj.as_ptr()) };
    let known = NDARRAY.load(Ordering::Relaxed);
    if !known.is_null() {
        return tp == known;
    }
    if !type_named_ndarray(obj, tp) {
        return false;
    }
    let py = obj.py();
    let numpys = match crate::npapi::table(py) {
        Some(table) => table.ndarray == tp,
        None => {
            crate::trust::static_type_name(obj.get_type().as_any()).as_deref()
                == Some("numpy.ndarray")
        }
    };
    if !numpys {
        return false;
    }
    NDARRAY.store(tp, Ordering::Relaxed);
    true
}

/// Whether the type's name is `numpy.ndarray` (a cheap filter before the
/// exact check against NumPy's type).
#[cfg(not(Py_LIMITED_API))]
fn type_named_ndarray(_obj: &Bound<'_, PyAny>, tp: *mut ffi::PyTypeObject) -> bool {
    // SAFETY: `tp` is a live type object; `tp_name` is a C string.
    unsafe { std::ffi::CStr::from_ptr((*tp).tp_name) == c"numpy.ndarray" }
}

/// The same for abi3 builds, where type objects are opaque: the name is
/// asked through the API (only until `numpy.ndarray` is first seen).
#[cfg(Py_LIMITED_API)]
fn type_named_ndarray(obj: &Bound<'_, PyAny>, _tp: *mut ffi::PyTypeObject) -> bool {
    obj.get_type()
        .fully_qualified_name()
        .is_ok_and(|n| n.to_cow().is_ok_and(|n| n == "numpy.ndarray"))
}

/// For each NumPy type number below 32, the index of its row in the dtype
/// table plus one (0: none), built from the table's NumPy column at
/// compile time.
const BY_TYPE_NUM: [u8; 32] = {
    let mut rows = [0u8; 32];
    let mut i = 0;
    while i < DTYPES.len() {
        let mut k = 0;
        while k < DTYPES[i].numpy.len() {
            let num = DTYPES[i].numpy[k] as usize;
            assert!(num < 32 && rows[num] == 0);
            rows[num] = i as u8 + 1;
            k += 1;
        }
        i += 1;
    }
    rows
};

/// DLPack type of a NumPy `type_num`, for the types DLPack can describe
/// (the NumPy column of the dtype table).
#[inline(always)]
fn numpy_dtype(type_num: c_int) -> Option<DType> {
    let row = *BY_TYPE_NUM.get(usize::try_from(type_num).ok()?)?;
    let d = DTYPES.get(usize::from(row).checked_sub(1)?)?;
    Some(DType::new(d.code, d.bits, 1))
}

/// Imports an exact `numpy.ndarray` from its fields, in one pass over its
/// dimensions: shape, strides (bytes to elements), element count and byte
/// extent together, with the checks of [`super::make_raw`]. `None` for
/// other objects and for arrays this path does not take: dtypes DLPack
/// cannot describe, byte-swapped data, byte strides that are not whole
/// elements, sizes or spans that overflow. Those go the generic way, which
/// gives NumPy's own `BufferError` or dlcast's error for the layout.
///
/// The read is written into `out` (`false`, and `out` untouched, where this
/// path does not take the array), so that a call's read is built where it is
/// kept: no copy of the whole [`RawTensor`].
#[inline(always)]
pub(crate) fn read_into(obj: &Bound<'_, PyAny>, out: &mut Option<RawTensor>) -> bool {
    read_fields(obj, out).is_some()
}

#[inline(always)]
fn read_fields(obj: &Bound<'_, PyAny>, out: &mut Option<RawTensor>) -> Option<()> {
    if !is_ndarray(obj) {
        return None;
    }
    // SAFETY: `obj` is exactly a `numpy.ndarray`, whose object starts with
    // the fields of `PyArrayObject`; we hold the GIL and a reference to `obj`, so
    // the fields and the descr they point to stay valid while we read.
    let arr = unsafe { &*obj.as_ptr().cast::<PyArrayObject>() };
    let dtype = native_dtype(arr)?;
    let ndim = usize::try_from(arr.nd).ok()?;
    // Every dtype of `numpy_dtype` has a power-of-two size.
    let item = dtype.itemsize()? as isize;
    // SAFETY: `arr` is a live array (as above) of `ndim` dimensions.
    let (dims, byte_strides) = unsafe { dims_and_strides(arr, ndim) };
    let extent = byte_extent(arr, dims, byte_strides, item)?;

    // Built where it is kept, then filled: no copy of its inline dims.
    let raw = out.insert(RawTensor::new(
        arr.data.cast(),
        zeros(ndim),
        zeros(ndim),
        dtype,
        arr.flags & NPY_ARRAY_WRITEABLE == 0,
        extent,
        ImportPath::Numpy,
    ));
    let shift = item.trailing_zeros();
    for ((&n, &s), (shape, stride)) in dims
        .iter()
        .zip(byte_strides)
        .zip(raw.shape.iter_mut().zip(raw.strides.iter_mut()))
    {
        *shape = n as usize;
        *stride = s >> shift;
    }
    Some(())
}

/// The dtype of `arr` where DLPack can describe it and its bytes are in
/// native order (else `None`: the generic way).
#[inline(always)]
fn native_dtype(arr: &PyArrayObject) -> Option<DType> {
    // SAFETY: every array has a descr, live while the array is.
    let descr = unsafe { &*arr.descr };
    let dtype = numpy_dtype(descr.type_num)?;
    let native = if cfg!(target_endian = "little") {
        b'<'
    } else {
        b'>'
    };
    let order = descr.byteorder as u8;
    if order != b'=' && order != b'|' && order != native {
        return None;
    }
    Some(dtype)
}

/// The shape and byte strides of `arr`, `ndim` of each.
///
/// # Safety
/// `arr` must be a live array with `nd == ndim`, read under the GIL with no
/// Python code running while the slices are used (the caller holds it).
#[inline(always)]
unsafe fn dims_and_strides(arr: &PyArrayObject, ndim: usize) -> (&[isize], &[isize]) {
    // A 0-d array's `dimensions` and `strides` may be NULL, which no slice
    // may point at, even an empty one.
    if ndim == 0 {
        (&[], &[])
    } else {
        // SAFETY: `dimensions` and `strides` of an array with `nd` > 0 are
        // non-NULL, aligned and hold `nd` values each, valid while we hold
        // `obj` and the GIL (no Python code runs here).
        unsafe {
            (
                std::slice::from_raw_parts(arr.dimensions, ndim),
                std::slice::from_raw_parts(arr.strides, ndim),
            )
        }
    }
}

/// The bytes `arr` reaches either side of element 0 (`None` inside for an
/// empty array), or `None` where the generic path decides: a negative
/// extent, byte strides that are not whole elements of `item` bytes, an
/// overflow, or a span that is not addressable.
#[inline(always)]
fn byte_extent(
    arr: &PyArrayObject,
    dims: &[isize],
    byte_strides: &[isize],
    item: isize,
) -> Option<Option<ByteExtent>> {
    // First pass, reading only: the element count and the bytes reached
    // either side of element 0 (NumPy's strides are in bytes already). An
    // overflow matters only for a non-empty array; either way the generic
    // path decides.
    let (mut count, mut lo, mut hi) = (1usize, 0isize, 0isize);
    let (mut empty, mut overflow) = (false, false);
    for (&n, &s) in dims.iter().zip(byte_strides) {
        if n < 0 || s & (item - 1) != 0 {
            // Byte strides that are not whole elements: NumPy's __dlpack__
            // refuses them with its own message.
            return None;
        }
        empty |= n == 0;
        let (c, o1) = count.overflowing_mul(n as usize);
        let (step, o2) = (n - 1).overflowing_mul(s);
        let o3 = if step < 0 {
            let (v, o) = lo.overflowing_add(step);
            lo = v;
            o
        } else {
            let (v, o) = hi.overflowing_add(step);
            hi = v;
            o
        };
        count = c;
        overflow |= o1 | o2 | o3;
    }
    if empty {
        return Some(None);
    }
    let hi = hi.checked_add(item)?;
    // The whole span must be addressable, as `make_raw` checks.
    let base = arr.data as usize;
    match (base.checked_add_signed(lo), base.checked_add_signed(hi)) {
        (Some(l), Some(h)) if !overflow && !arr.data.is_null() && l != 0 => {
            if h - l > isize::MAX as usize {
                return None;
            }
        }
        _ => return None,
    }
    Some(Some(ByteExtent { lo, hi }))
}

pub(crate) use super::fast_read::{NpRead, FAST_DIMS};

/// The call driver's fast read of an exact `numpy.ndarray` whose dtype is
/// `want`: `None` for anything [`read_fields`] would describe otherwise or
/// not at all, and for everything the fast path leaves to it (0-d and empty
/// arrays, more than [`FAST_DIMS`] dimensions, negative strides, `bool`
/// arrays, whose values a Rust `bool` must check). Where it returns a read,
/// [`read_fields`] gives the same data, shape, strides, dtype, read-only
/// mark and extent (`lo` 0). Runs no Python code.
#[inline(always)]
pub(crate) fn read_fast(obj: &Bound<'_, PyAny>, want: DType, itemsize: usize) -> Option<NpRead> {
    if !is_ndarray(obj) || want == DType::BOOL {
        return None;
    }
    // SAFETY: as in `read_fields`: an exact `numpy.ndarray`, live, the GIL
    // held, no Python code runs while its fields are read.
    let arr = unsafe { &*obj.as_ptr().cast::<PyArrayObject>() };
    // SAFETY: every array has a descr, live while the array is.
    let descr = unsafe { &*arr.descr };
    if numpy_dtype(descr.type_num) != Some(want) {
        return None;
    }
    let native = if cfg!(target_endian = "little") {
        b'<'
    } else {
        b'>'
    };
    let order = descr.byteorder as u8;
    if order != b'=' && order != b'|' && order != native {
        return None;
    }
    let ndim = usize::try_from(arr.nd).ok()?;
    if ndim == 0 || ndim > FAST_DIMS || arr.data.is_null() {
        return None;
    }
    // The view type's element size: the dtype's (the size `read_fields`
    // divides strides by), a power of two.
    if !itemsize.is_power_of_two() || usize::from(want.bits) != itemsize * 8 || want.lanes != 1 {
        return None;
    }
    let item = itemsize as isize;
    let shift = item.trailing_zeros();
    // SAFETY: `dimensions` and `strides` of an array with `nd` > 0 are
    // non-NULL, aligned and hold `nd` values each, valid while we hold `obj`
    // and the GIL (no Python code runs here).
    let (dims, byte_strides) = unsafe {
        (
            std::slice::from_raw_parts(arr.dimensions, ndim),
            std::slice::from_raw_parts(arr.strides, ndim),
        )
    };
    let mut read = NpRead {
        data: arr.data.cast(),
        ndim,
        dims: [0; FAST_DIMS],
        strides: [0; FAST_DIMS],
        dtype: want,
        read_only: arr.flags & NPY_ARRAY_WRITEABLE == 0,
        hi: item,
        torch: None,
    };
    let mut count = 1usize;
    for (k, (&n, &s)) in dims.iter().zip(byte_strides).enumerate() {
        // Empty, negative and partial-element strides: the general path.
        if n <= 0 || s < 0 || s & (item - 1) != 0 {
            return None;
        }
        count = count.checked_mul(n as usize)?;
        read.hi = read.hi.checked_add((n - 1).checked_mul(s)?)?;
        read.dims[k] = n as usize;
        read.strides[k] = s >> shift;
    }
    // The span must be addressable (as `read_fields` checks), and an
    // `ndarray` view holds at most `isize::MAX` elements.
    (arr.data as usize).checked_add(read.hi as usize)?;
    (count <= isize::MAX as usize).then_some(read)
}

/// Whether `obj` is exactly NumPy's array type, by identity checks Python
/// code cannot fake (see [`crate::trust`]): its type is a static type (so
/// not a class made by Python code, nor a subclass of one) named
/// `numpy.ndarray`. Unlike [`is_ndarray`], trusts no module attribute.
pub(crate) fn is_exact_ndarray(obj: &Bound<'_, PyAny>) -> bool {
    let tp = obj.get_type();
    crate::trust::is_static_type(tp.as_any(), std::ptr::null())
        && crate::trust::static_type_name(tp.as_any()).as_deref() == Some("numpy.ndarray")
}

/// The bytes `[lo, hi)` an exact `numpy.ndarray` reaches, from its own
/// fields (data pointer, shape, byte strides) and its dtype's `elsize`
/// (read from the C struct, in the layout of the NumPy whose C API table
/// was verified), for any dtype, byte order or stride,
/// those DLPack cannot describe included. `None` unless
/// [`is_exact_ndarray`] holds, or when the span overflows; `Some(None)` for
/// an empty array (it touches no memory). Runs no Python code once NumPy's
/// C API table was verified (the first call may import NumPy to verify it).
pub(crate) fn byte_bounds(obj: &Bound<'_, PyAny>) -> Option<Option<(usize, usize)>> {
    if !is_exact_ndarray(obj) {
        return None;
    }
    let numpy2 = crate::npapi::table(obj.py())?.numpy2();
    // SAFETY: `obj` is exactly NumPy's array type (checked above), whose
    // objects start with the fields of `PyArrayObject`; we hold the GIL and a
    // reference to `obj`, so the fields stay valid while we read.
    let arr = unsafe { &*obj.as_ptr().cast::<PyArrayObject>() };
    // SAFETY: every array has a live descr, of the NumPy the verified C API
    // table belongs to.
    let item = unsafe { crate::npyffi::descr_elsize(arr.descr, numpy2) };
    if item < 0 {
        return None;
    }
    let ndim = usize::try_from(arr.nd).ok()?;
    let (dims, strides): (&[isize], &[isize]) = if ndim == 0 {
        (&[], &[])
    } else {
        // SAFETY: `dimensions` and `strides` of an array with `nd` > 0 are
        // non-NULL, aligned and hold `nd` values each, valid while we hold
        // `obj` and the GIL (no Python code runs here).
        unsafe {
            (
                std::slice::from_raw_parts(arr.dimensions, ndim),
                std::slice::from_raw_parts(arr.strides, ndim),
            )
        }
    };
    if dims.iter().any(|&n| n < 0) {
        return None;
    }
    if dims.contains(&0) || item == 0 {
        return Some(None);
    }
    let (mut lo, mut hi) = (0isize, 0isize);
    for (&n, &s) in dims.iter().zip(strides) {
        let step = (n - 1).checked_mul(s)?;
        if step < 0 {
            lo = lo.checked_add(step)?;
        } else {
            hi = hi.checked_add(step)?;
        }
    }
    let hi = hi.checked_add(item)?;
    let base = arr.data as usize;
    Some(Some((
        base.checked_add_signed(lo)?,
        base.checked_add_signed(hi)?,
    )))
}

/// `ndim` zeros (inline up to [`INLINE_DIMS`]: a fixed-size fill,
/// no `memset` call of variable length).
#[inline(always)]
pub(crate) fn zeros<T: Copy + Default>(ndim: usize) -> Dims<T> {
    if ndim <= INLINE_DIMS {
        SmallVec::from_buf_and_len([T::default(); INLINE_DIMS], ndim)
    } else {
        smallvec::smallvec![T::default(); ndim]
    }
}

/// `ndim` zeros for a count a producer chose (a capsule's or a buffer's
/// `ndim`, up to `i32::MAX`): `None` when the memory cannot be had, where
/// [`zeros`] would abort the process.
pub(crate) fn try_zeros<T: Copy + Default>(ndim: usize) -> Option<Dims<T>> {
    if ndim <= INLINE_DIMS {
        return Some(zeros(ndim));
    }
    let mut v: Dims<T> = SmallVec::new();
    v.try_reserve_exact(ndim).ok()?;
    v.resize(ndim, T::default());
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facts::npy_type;

    #[test]
    fn fast_self_overlap_answers_as_the_layout_module() {
        let extents = [1usize, 2, 3, 5];
        let strides = [0isize, 1, 2, 3, 4, 6, 15, isize::MAX];
        let mut checked = 0;
        for ndim in 1..=FAST_DIMS {
            let cases = (extents.len() * strides.len()).pow(ndim as u32);
            for mut c in 0..cases {
                let mut read = NpRead {
                    data: std::ptr::null_mut(),
                    ndim,
                    dims: [0; FAST_DIMS],
                    strides: [0; FAST_DIMS],
                    dtype: DType::FLOAT64,
                    read_only: false,
                    hi: 0,
                    torch: None,
                };
                for k in 0..ndim {
                    read.dims[k] = extents[c % extents.len()];
                    c /= extents.len();
                    read.strides[k] = strides[c % strides.len()];
                    c /= strides.len();
                }
                let want = crate::layout::may_self_overlap(read.shape(), read.elem_strides());
                assert_eq!(
                    read.may_self_overlap(),
                    want,
                    "{:?} {:?}",
                    read.shape(),
                    read.elem_strides()
                );
                checked += 1;
            }
        }
        assert!(checked > 1000);
    }

    #[test]
    fn numpy_type_numbers_read_as_their_rows() {
        for d in DTYPES {
            for &num in d.numpy {
                assert_eq!(numpy_dtype(num), Some(DType::new(d.code, d.bits, 1)));
            }
        }
        // C `long` is the platform's: 64 bits on LP64, 32 on Windows.
        let long = DType::new(
            crate::dtype::code::INT,
            (std::mem::size_of::<std::ffi::c_long>() * 8) as u8,
            1,
        );
        assert_eq!(numpy_dtype(npy_type::LONG), Some(long));
        assert_eq!(numpy_dtype(npy_type::LONGLONG), Some(DType::INT64));
        assert_eq!(numpy_dtype(npy_type::HALF), Some(DType::FLOAT16));
        // long double, its complex, objects, strings, datetimes: none.
        for num in [13, 16, 17, 18, 19, 20, 21, 22, 24, 31, 32, 256, -1] {
            assert_eq!(numpy_dtype(num), None, "{num}");
        }
    }
}
