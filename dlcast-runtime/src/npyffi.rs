//! NumPy's ABI, declared once: the leading fields of its array and dtype
//! objects (NumPy 1.x and 2.x), the array flags dlcast reads, the entries of
//! its `_ARRAY_API` table that dlcast calls, and its type numbers (declared
//! with the dtype table, [`crate::facts::npy_type`], whose NumPy column uses
//! them). Read by `import/numpy.rs` (an exact `numpy.ndarray`'s fields),
//! `borrow/rust_numpy/hold.rs` and `borrow/rust_numpy/published.rs` (the struct passed to
//! rust-numpy, and read when it passes one) and `npapi.rs` (`returns =
//! numpy` through the C API).
//!
//! Every layout here is a prefix of NumPy's own struct in both major
//! versions (`ndarraytypes.h`); nothing past it is declared, so nothing
//! past it is read.

use pyo3::ffi;
use std::ffi::{c_char, c_int, c_void};

/// The leading fields of NumPy's `PyArrayObject_fields`, the same in 1.x
/// and 2.x, up to `weakreflist`, the last field rust-numpy's bindings
/// declare (rust-numpy is passed a struct of this layout; dlcast reads up
/// to `flags`).
#[repr(C)]
pub(crate) struct PyArrayObject {
    pub ob_base: ffi::PyObject,
    /// Element 0 (not the lowest address for negative strides).
    pub data: *mut c_char,
    pub nd: c_int,
    /// `nd` extents (`npy_intp`); may be NULL when `nd` is 0.
    pub dimensions: *const isize,
    /// `nd` strides in bytes; may be NULL when `nd` is 0.
    pub strides: *const isize,
    pub base: *mut ffi::PyObject,
    pub descr: *mut PyArrayDescr,
    /// `NPY_ARRAY_*` flags, e.g. [`NPY_ARRAY_WRITEABLE`].
    pub flags: c_int,
    pub weakreflist: *mut ffi::PyObject,
}

/// The leading fields of NumPy's `PyArray_Descr`, the same in 1.x and 2.x
/// (the fourth `char` is `flags` in 1.x and `_former_flags` in 2.x), up to
/// `type_num`.
#[repr(C)]
pub(crate) struct PyArrayDescr {
    pub ob_base: ffi::PyObject,
    pub typeobj: *mut ffi::PyTypeObject,
    pub kind: c_char,
    pub type_char: c_char,
    /// `'='` native, `'<'`, `'>'`, `'|'` not applicable.
    pub byteorder: c_char,
    pub flags_or_former: c_char,
    /// NumPy's type number ([`crate::facts::npy_type`]).
    pub type_num: c_int,
}

/// NumPy 2's `PyArray_Descr` up to `elsize`.
#[repr(C)]
pub(crate) struct PyArrayDescr2 {
    pub head: PyArrayDescr,
    pub flags: u64,
    pub elsize: isize,
}

/// NumPy 1's `PyArray_Descr` up to `elsize`.
#[repr(C)]
pub(crate) struct PyArrayDescr1 {
    pub head: PyArrayDescr,
    pub elsize: c_int,
}

/// A dtype's `elsize`, read from its C struct in NumPy 2's or NumPy 1's
/// layout.
///
/// # Safety
/// `descr` is a live `PyArray_Descr` of the NumPy whose major version
/// `numpy2` says.
pub(crate) unsafe fn descr_elsize(descr: *const PyArrayDescr, numpy2: bool) -> isize {
    if numpy2 {
        // SAFETY: (caller) NumPy 2's layout.
        unsafe { (*descr.cast::<PyArrayDescr2>()).elsize }
    } else {
        // SAFETY: (caller) NumPy 1's layout.
        unsafe { (*descr.cast::<PyArrayDescr1>()).elsize as isize }
    }
}

/// `NPY_ARRAY_WRITEABLE`: the array's memory may be written.
pub(crate) const NPY_ARRAY_WRITEABLE: c_int = 0x0400;

/// The most dimensions NumPy 1.x accepts (`NPY_MAXDIMS`; NumPy 2 has 64).
pub(crate) const NPY_MAXDIMS: usize = 32;

/// The ABI version (`PyArray_GetNDArrayCVersion()`) from which NumPy is 2.x:
/// `0x01000009` for NumPy 1.x, `0x02000000` for 2.x.
pub(crate) const NPY_2_0_ABI_VERSION: u32 = 0x0200_0000;

/// Indices into NumPy's `_ARRAY_API` table (`__multiarray_api.h`), the same
/// since NumPy 1.7, in NumPy 2 too.
pub(crate) mod api {
    /// `unsigned int PyArray_GetNDArrayCVersion(void)`.
    pub(crate) const GET_NDARRAY_C_VERSION: usize = 0;
    /// `&PyArray_Type`: `numpy.ndarray`.
    pub(crate) const ARRAY_TYPE: usize = 2;
    /// [`super::DescrFromType`].
    pub(crate) const DESCR_FROM_TYPE: usize = 45;
    /// [`super::NewFromDescr`].
    pub(crate) const NEW_FROM_DESCR: usize = 94;
    /// [`super::SetBaseObject`].
    pub(crate) const SET_BASE_OBJECT: usize = 282;
}

/// `PyArray_DescrFromType(type_num)`: a new reference to the dtype.
pub(crate) type DescrFromType = unsafe extern "C" fn(c_int) -> *mut ffi::PyObject;
/// `PyArray_NewFromDescr(subtype, descr, nd, dims, strides, data, flags,
/// obj)`: steals `descr`.
pub(crate) type NewFromDescr = unsafe extern "C" fn(
    *mut ffi::PyTypeObject,
    *mut ffi::PyObject,
    c_int,
    *const ffi::Py_ssize_t,
    *const ffi::Py_ssize_t,
    *mut c_void,
    c_int,
    *mut ffi::PyObject,
) -> *mut ffi::PyObject;
/// `PyArray_SetBaseObject(arr, base)`: steals `base`, even on failure.
pub(crate) type SetBaseObject =
    unsafe extern "C" fn(*mut ffi::PyObject, *mut ffi::PyObject) -> c_int;
