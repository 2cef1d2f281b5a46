//! `returns = numpy` through NumPy's C API: an `ndarray` over the exported
//! memory, built with `PyArray_NewFromDescr` and owning a reference to the
//! `dlcast.Array` as its `base` (what rust-numpy and nanobind do), instead
//! of `numpy.from_dlpack` → `__dlpack__` → capsule → NumPy.
//!
//! The API table is NumPy's `_ARRAY_API` capsule; the entries used (the
//! `ndarray` type at index 2, `PyArray_DescrFromType` at 45,
//! `PyArray_NewFromDescr` at 94, `PyArray_SetBaseObject` at 282) have kept
//! their indices since NumPy 1.7, in NumPy 2 too (`__multiarray_api.h`).
//! The table is used only once it is verified to be NumPy's own (see
//! [`table`]): it, its `ndarray` type entry (a static type named
//! `numpy.ndarray`) and the functions called lie in one loaded library's
//! image, which no table made by Python code (with `ctypes`) does; anything
//! unexpected falls back to `numpy.from_dlpack`. The same verified table
//! gives the rest of dlcast NumPy's ABI version (entry 0,
//! `PyArray_GetNDArrayCVersion`) and the `ndarray` type, never
//! `numpy.__version__` or the `numpy.ndarray` attribute, which Python code
//! can replace.

use crate::dtype::DType;
use crate::npyffi::{
    api, DescrFromType, NewFromDescr, SetBaseObject, NPY_2_0_ABI_VERSION, NPY_ARRAY_WRITEABLE,
    NPY_MAXDIMS,
};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use std::ffi::{c_int, c_void};

/// NumPy's `_ARRAY_API` table, verified (see [`table`]).
pub(crate) struct Table {
    /// `&PyArray_Type` (entry 2): `numpy.ndarray` itself.
    pub ndarray: *mut ffi::PyTypeObject,
    /// `PyArray_GetNDArrayCVersion()` (entry 0): NumPy's ABI version,
    /// `0x01000009` for NumPy 1.x, `0x02000000` for 2.x.
    pub abi: u32,
    /// The entries `returns = numpy` calls, if they lie in NumPy's image.
    api: Option<Api>,
}

impl Table {
    /// Whether NumPy is 2.x or later (its ABI version says so).
    pub(crate) fn numpy2(&self) -> bool {
        self.abi >= NPY_2_0_ABI_VERSION
    }
}

/// The entries of NumPy's C API that dlcast calls.
struct Api {
    descr_from_type: DescrFromType,
    new_from_descr: NewFromDescr,
    set_base_object: SetBaseObject,
}

// SAFETY: plain function and type pointers into NumPy's module, which lives
// for the process once imported; they are only called with the GIL held.
unsafe impl Send for Table {}
// SAFETY: as above; never mutated after construction.
unsafe impl Sync for Table {}

/// The modules whose `_ARRAY_API` attribute may hold NumPy's table, the
/// extension module's own first (NumPy 2, then 1.x); any of them may have
/// been replaced by Python code, so each is verified.
const MODULES: [&str; 4] = [
    "numpy._core._multiarray_umath",
    "numpy.core._multiarray_umath",
    "numpy._core.multiarray",
    "numpy.core.multiarray",
];

/// NumPy's C API table, or `None` where no `_ARRAY_API` capsule passes
/// [`verify`] (NumPy is not installed, Python code replaced every one of
/// them, or the platform cannot tell images apart). Found once per process
/// (Python code: imports; call it in phase 1).
pub(crate) fn table(py: Python<'_>) -> Option<&'static Table> {
    static TABLE: PyOnceLock<Option<Table>> = PyOnceLock::new();
    TABLE
        .get_or_init(py, || {
            MODULES.iter().find_map(|name| {
                let capsule = py.import(*name).ok()?.getattr("_ARRAY_API").ok()?;
                verify(&capsule)
            })
        })
        .as_ref()
}

/// The table of `capsule` if it is NumPy's: a capsule (NULL name, as NumPy
/// publishes it) whose table lies in the image of a loaded library, whose
/// entry 2 is a static type of that same image named `numpy.ndarray`, and
/// whose entry 0 is a function of that image. Python code cannot place a
/// table, a static type or code in a library's image (a ctypes table and
/// its callbacks lie in heap or anonymous memory), so the table is the one
/// NumPy's extension module defines, and its entries are NumPy's C
/// functions. Runs no Python code but `static_type_name`'s getters of a
/// static type.
fn verify(capsule: &Bound<'_, PyAny>) -> Option<Table> {
    let py = capsule.py();
    // SAFETY: `capsule` is a live object; CheckExact only reads its type.
    if unsafe { ffi::PyCapsule_CheckExact(capsule.as_ptr()) } == 0 {
        return None;
    }
    // SAFETY: a capsule; NumPy's `_ARRAY_API` has a NULL name (its
    // `import_array` asks the same way). NULL with an error on mismatch.
    let table = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), std::ptr::null()) }
        .cast::<*mut c_void>();
    if table.is_null() {
        let _ = PyErr::take(py);
        return None;
    }
    // Only a table inside a library's image is read past its first entry.
    let image = crate::trust::image_base(table.cast())?;
    let in_image = |p: *const c_void| crate::trust::image_base(p) == Some(image);
    // SAFETY: `table` lies in a loaded library's image, where only that
    // library's own data is (see above): NumPy's API array, whose entries
    // 0..=282 exist in every NumPy since 1.7. Entry 2 is `&PyArray_Type`.
    let (version_fn, ndarray) = unsafe {
        (
            *table.add(api::GET_NDARRAY_C_VERSION),
            *table.add(api::ARRAY_TYPE),
        )
    };
    if !in_image(ndarray) || !in_image(version_fn) {
        return None;
    }
    // SAFETY: entry 2 of NumPy's table points to its static type object,
    // live for the process (a borrowed reference, turned into an owned one).
    let ty = unsafe { Bound::from_borrowed_ptr(py, ndarray.cast()) };
    if !crate::trust::is_static_type(&ty, table.cast())
        || crate::trust::static_type_name(&ty).as_deref() != Some("numpy.ndarray")
    {
        return None;
    }
    // SAFETY: entry 0 is `PyArray_GetNDArrayCVersion`, `unsigned int (void)`,
    // a C function of NumPy's image (checked above): no Python code.
    let abi =
        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> u32>(version_fn)() };
    // SAFETY: as above; the entries at these indices have the signatures in
    // `__multiarray_api.h` in every NumPy version that has them.
    let api = unsafe {
        let (d, n, s) = (
            *table.add(api::DESCR_FROM_TYPE),
            *table.add(api::NEW_FROM_DESCR),
            *table.add(api::SET_BASE_OBJECT),
        );
        (in_image(d) && in_image(n) && in_image(s)).then(|| Api {
            descr_from_type: std::mem::transmute::<*mut c_void, DescrFromType>(d),
            new_from_descr: std::mem::transmute::<*mut c_void, NewFromDescr>(n),
            set_base_object: std::mem::transmute::<*mut c_void, SetBaseObject>(s),
        })
    };
    Some(Table {
        ndarray: ndarray.cast(),
        abi,
        api,
    })
}

/// NumPy's type number for a dtype (`NPY_TYPES`), where NumPy has the type:
/// the first of the dtype table's NumPy column.
fn type_num(d: DType) -> Option<c_int> {
    d.facts()?.numpy.first().copied()
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

/// Whether [`ndarray`] can view host memory of `dtype` in `nd` dimensions
/// (NumPy's C API found and verified, a dtype NumPy has, few enough
/// dimensions). Finds the table the first time (Python code: imports).
pub(crate) fn can_view(py: Python<'_>, dtype: DType, nd: usize) -> bool {
    table(py).is_some_and(|t| t.api.is_some()) && type_num(dtype).is_some() && nd <= NPY_MAXDIMS
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
    let Some(table) = table(py) else {
        return Ok(None);
    };
    let (Some(api), Some(num)) = (table.api.as_ref(), type_num(arr.dtype)) else {
        return Ok(None);
    };
    let nd = arr.shape.len();
    if arr.data.is_null() || nd > NPY_MAXDIMS || arr.byte_strides.len() != nd {
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
    // SAFETY: NumPy's verified API (see `verify`), called with the GIL held.
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
            table.ndarray,
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
