//! `returns = numpy` through NumPy's C API: an `ndarray` over the exported
//! memory, built with `PyArray_NewFromDescr` and owning a reference to the
//! `dlcast.Array` as its `base` (what rust-numpy and nanobind do), instead
//! of `numpy.from_dlpack` → `__dlpack__` → capsule → NumPy.
//!
//! The API table is NumPy's `_ARRAY_API` capsule; the entries used (the
//! `ndarray` type at index 2, `PyArray_DescrFromType` at 45,
//! `PyArray_NewFromDescr` at 94, `PyArray_SetBaseObject` at 282) have kept
//! their indices since NumPy 1.7, in NumPy 2 too (`__multiarray_api.h`).
//! The table is used only after its `ndarray` type entry is checked to be
//! `numpy.ndarray` itself; anything unexpected falls back to
//! `numpy.from_dlpack`.

use crate::dtype::{code, DType};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use std::ffi::{c_int, c_void};

/// `NPY_ARRAY_WRITEABLE` (ndarraytypes.h).
const NPY_ARRAY_WRITEABLE: c_int = 0x0400;
/// The most dimensions NumPy 1.x accepts (`NPY_MAXDIMS`; NumPy 2 has 64).
const MAX_DIMS: usize = 32;

type DescrFromType = unsafe extern "C" fn(c_int) -> *mut ffi::PyObject;
type NewFromDescr = unsafe extern "C" fn(
    *mut ffi::PyTypeObject,
    *mut ffi::PyObject,
    c_int,
    *const ffi::Py_ssize_t,
    *const ffi::Py_ssize_t,
    *mut c_void,
    c_int,
    *mut ffi::PyObject,
) -> *mut ffi::PyObject;
type SetBaseObject = unsafe extern "C" fn(*mut ffi::PyObject, *mut ffi::PyObject) -> c_int;

/// The entries of NumPy's C API that dlcast calls.
struct Api {
    ndarray: *mut ffi::PyTypeObject,
    descr_from_type: DescrFromType,
    new_from_descr: NewFromDescr,
    set_base_object: SetBaseObject,
}

// SAFETY: plain function and type pointers into NumPy's module, which lives
// for the process once imported; they are only called with the GIL held.
unsafe impl Send for Api {}
// SAFETY: as above; never mutated after construction.
unsafe impl Sync for Api {}

/// NumPy's C API, or `None` where it cannot be found or checked.
fn api(py: Python<'_>) -> Option<&'static Api> {
    static API: PyOnceLock<Option<Api>> = PyOnceLock::new();
    API.get_or_init(py, || load(py).ok().flatten()).as_ref()
}

fn load(py: Python<'_>) -> PyResult<Option<Api>> {
    let module = py
        .import("numpy._core._multiarray_umath")
        .or_else(|_| py.import("numpy.core._multiarray_umath"))?;
    let capsule = module.getattr("_ARRAY_API")?;
    // SAFETY: `capsule` is a live object; CheckExact only reads its type.
    if unsafe { ffi::PyCapsule_CheckExact(capsule.as_ptr()) } == 0 {
        return Ok(None);
    }
    // SAFETY: a capsule; NumPy's `_ARRAY_API` has a NULL name (its
    // `import_array` asks the same way). NULL with an error on mismatch.
    let table = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), std::ptr::null()) }
        .cast::<*mut c_void>();
    if table.is_null() {
        let _ = PyErr::take(py);
        return Ok(None);
    }
    let ndarray_type = py.import("numpy")?.getattr("ndarray")?;
    // SAFETY: `table` is NumPy's API array (hundreds of entries); entry 2 is
    // `&PyArray_Type`. Checked against `numpy.ndarray` before any call.
    let ndarray = unsafe { *table.add(2) }.cast::<ffi::PyTypeObject>();
    if ndarray != ndarray_type.as_ptr().cast() {
        return Ok(None);
    }
    // SAFETY: the table is NumPy's (its type entry matched); the entries at
    // these indices have the signatures in `__multiarray_api.h`, and are
    // non-NULL in every NumPy version that has them.
    unsafe {
        let entry = |i: usize| *table.add(i);
        let (d, n, s) = (entry(45), entry(94), entry(282));
        if d.is_null() || n.is_null() || s.is_null() {
            return Ok(None);
        }
        Ok(Some(Api {
            ndarray,
            descr_from_type: std::mem::transmute::<*mut c_void, DescrFromType>(d),
            new_from_descr: std::mem::transmute::<*mut c_void, NewFromDescr>(n),
            set_base_object: std::mem::transmute::<*mut c_void, SetBaseObject>(s),
        }))
    }
}

/// NumPy's type number for a dtype (`NPY_TYPES`), where NumPy has the type.
fn type_num(d: DType) -> Option<c_int> {
    let long_is_64 = std::mem::size_of::<std::ffi::c_long>() == 8;
    if d.lanes != 1 {
        return None;
    }
    Some(match (d.code, d.bits) {
        (code::BOOL, 8) => 0,
        (code::INT, 8) => 1,
        (code::UINT, 8) => 2,
        (code::INT, 16) => 3,
        (code::UINT, 16) => 4,
        (code::INT, 32) => 5,
        (code::UINT, 32) => 6,
        (code::INT, 64) => {
            if long_is_64 {
                7
            } else {
                9
            }
        }
        (code::UINT, 64) => {
            if long_is_64 {
                8
            } else {
                10
            }
        }
        (code::FLOAT, 16) => 23,
        (code::FLOAT, 32) => 11,
        (code::FLOAT, 64) => 12,
        (code::COMPLEX, 64) => 14,
        (code::COMPLEX, 128) => 15,
        _ => return None,
    })
}

/// Whether `byte_strides` are the very strides NumPy gives an array of
/// `shape` when it is passed none: C order, an extent of 0 counting as 1
/// (`_array_fill_strides`). NumPy then sets the contiguity flags as it
/// fills them, instead of deducing them from given strides afterwards.
fn numpy_default_strides(shape: &[isize], byte_strides: &[isize], itemsize: isize) -> bool {
    let mut expected = itemsize;
    for (&n, &s) in shape.iter().zip(byte_strides).rev() {
        if s != expected {
            return false;
        }
        let Some(next) = expected.checked_mul(n.max(1)) else {
            return false;
        };
        expected = next;
    }
    true
}

/// What an `ndarray` over exported host memory needs: element 0's address
/// (non-NULL), extents and strides in bytes, and whether it may be written.
pub(crate) struct HostArray<'a> {
    pub data: *mut u8,
    pub shape: &'a [isize],
    pub byte_strides: &'a [isize],
    pub dtype: DType,
    pub read_only: bool,
}

/// An `ndarray` viewing `arr`'s memory with `owner` (the `dlcast.Array`
/// that keeps the memory alive) as its `base`; `Ok(None)` where the C API
/// cannot be used (no NumPy C API found, a dtype NumPy lacks, too many
/// dimensions, NULL data), and the caller falls back to `numpy.from_dlpack`.
pub(crate) fn ndarray<'py>(
    owner: &Bound<'py, PyAny>,
    arr: &HostArray<'_>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = owner.py();
    let (Some(api), Some(num)) = (api(py), type_num(arr.dtype)) else {
        return Ok(None);
    };
    let nd = arr.shape.len();
    if arr.data.is_null() || nd > MAX_DIMS || arr.byte_strides.len() != nd {
        return Ok(None);
    }
    // C-order strides NumPy fills itself (the same values: it computes them
    // from the same extents); others are passed.
    let strides = match arr.dtype.itemsize().and_then(|b| isize::try_from(b).ok()) {
        Some(item) if numpy_default_strides(arr.shape, arr.byte_strides, item) => std::ptr::null(),
        _ => arr.byte_strides.as_ptr(),
    };
    let flags = if arr.read_only {
        0
    } else {
        NPY_ARRAY_WRITEABLE
    };
    // SAFETY: NumPy's checked API (see `load`), called with the GIL held.
    // `descr_from_type` returns a new reference that `new_from_descr`
    // steals; `shape`/`byte_strides` hold `nd` values each, describing
    // memory `owner` keeps alive (the export checked its extent); NumPy
    // copies both arrays (`strides` is `byte_strides` or NULL, for which
    // NumPy computes the same values itself). `set_base_object` steals the reference to `owner`
    // whether it succeeds or not.
    unsafe {
        let descr = (api.descr_from_type)(num);
        if descr.is_null() {
            return Err(PyErr::fetch(py));
        }
        let out = (api.new_from_descr)(
            api.ndarray,
            descr,
            nd as c_int,
            arr.shape.as_ptr(),
            strides,
            arr.data.cast(),
            flags,
            std::ptr::null_mut(),
        );
        if out.is_null() {
            return Err(PyErr::fetch(py));
        }
        let out = Bound::from_owned_ptr(py, out);
        if (api.set_base_object)(out.as_ptr(), owner.clone().into_ptr()) != 0 {
            return Err(PyErr::fetch(py));
        }
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::numpy_default_strides;

    #[test]
    fn default_strides_are_numpys_c_order() {
        assert!(numpy_default_strides(&[2, 3], &[12, 4], 4));
        assert!(numpy_default_strides(&[], &[], 8));
        // NumPy counts an extent of 0 as 1 when it fills strides.
        assert!(numpy_default_strides(&[0, 3], &[12, 4], 4));
        assert!(!numpy_default_strides(&[0, 3], &[0, 4], 4));
        // F order, a step, negative strides: passed as they are.
        assert!(!numpy_default_strides(&[2, 3], &[4, 8], 4));
        assert!(!numpy_default_strides(&[4], &[8], 4));
        assert!(!numpy_default_strides(&[4], &[-4], 4));
        // A product that overflows is never NumPy's.
        assert!(!numpy_default_strides(&[isize::MAX, 2, 2], &[16, 8, 4], 4));
    }
}
