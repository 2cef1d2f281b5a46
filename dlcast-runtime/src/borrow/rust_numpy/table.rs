//! rust-numpy's table: the C struct its capsule holds, the check that a
//! capsule holds one dlcast may call ([`verify`]), and the foreign tables
//! (rust-numpy's own registries) dlcast adopted and acquires its views in
//! too ([`foreign`], [`adopt`]).
//!
//! dlcast calls a foreign table's functions itself (in phase 1 and when a
//! view's borrow ends, see [`super::hold`]), so a table is used only when
//! its four functions lie in one loaded library's image (see [`verify`]): a
//! table made with `ctypes`, whose functions would run Python code, is
//! never called.

use super::{refusal, ATTR};
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

/// rust-numpy's shared table, version 1 (the fields every version starts
/// with). The arrays are passed as `PyObject*` (the same pointer).
#[repr(C)]
pub(crate) struct Shared {
    pub(super) version: u64,
    pub(super) flags: *mut c_void,
    pub(super) acquire:
        unsafe extern "C" fn(flags: *mut c_void, array: *mut ffi::PyObject) -> c_int,
    pub(super) acquire_mut:
        unsafe extern "C" fn(flags: *mut c_void, array: *mut ffi::PyObject) -> c_int,
    pub(super) release: unsafe extern "C" fn(flags: *mut c_void, array: *mut ffi::PyObject),
    pub(super) release_mut: unsafe extern "C" fn(flags: *mut c_void, array: *mut ffi::PyObject),
}

/// The most rust-numpy tables dlcast acquires its views in at once (one,
/// unless Python code deleted the table and rust-numpy extensions published
/// others since; more are refused).
const MAX_FOREIGN: usize = 4;

/// rust-numpy's own registries that views of NumPy arrays are also acquired
/// in: tables rust-numpy extensions published (each keeps the first it
/// found), verified, in the order dlcast adopted them.
pub(crate) struct Foreign {
    tables: [*const Shared; MAX_FOREIGN],
    len: usize,
}

impl Foreign {
    pub(super) fn tables(&self) -> &[*const Shared] {
        &self.tables[..self.len.min(MAX_FOREIGN)]
    }
}

/// The foreign tables, once there is one (a leaked [`Foreign`], replaced
/// by a longer one when another is adopted; never freed: a reader may hold
/// the old one).
static FOREIGN: AtomicPtr<Foreign> = AtomicPtr::new(std::ptr::null_mut());

/// rust-numpy's own registries, if views of NumPy arrays must be acquired
/// there too (one atomic load).
#[inline(always)]
pub(crate) fn foreign() -> Option<&'static Foreign> {
    let p = FOREIGN.load(Ordering::Acquire);
    // SAFETY: only leaked lists of tables that are kept alive for the
    // process (a strong reference to each capsule is leaked) are stored.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// The table in `cap` if it is rust-numpy's (or a dlcast build's in its
/// place): a capsule named [`ATTR`], a version of at least 1, and its four
/// functions in the image of one loaded library, which no table made with
/// `ctypes` has (its callbacks lie in memory `libffi` maps outside any
/// library's image). The table itself is heap memory in both crates, so
/// its functions are the anchor. Runs no Python code.
pub(super) fn verify(cap: &Bound<'_, PyAny>) -> Option<&'static Shared> {
    use crate::trust::image_base;
    // SAFETY: `cap` is a live object; CheckExact reads only its type.
    if unsafe { ffi::PyCapsule_CheckExact(cap.as_ptr()) } == 0 {
        return None;
    }
    // SAFETY: a capsule; GetPointer checks its exact name (else NULL with an
    // error set).
    let ptr = unsafe { ffi::PyCapsule_GetPointer(cap.as_ptr(), ATTR.as_ptr()) };
    if ptr.is_null() {
        drop(PyErr::take(cap.py()));
        return None;
    }
    // SAFETY: a capsule of this name holds rust-numpy's table (or a
    // `ctypes` imitation of it, which has at least these fields to be
    // usable by rust-numpy at all); every version starts with the fields of
    // `Shared`. Only the fields are read here, nothing is called.
    let shared = unsafe { &*ptr.cast::<Shared>() };
    let functions = [
        shared.acquire as *const c_void,
        shared.acquire_mut as *const c_void,
        shared.release as *const c_void,
        shared.release_mut as *const c_void,
    ];
    let image = image_base(functions[0])?;
    let one_image = functions.iter().all(|&f| image_base(f) == Some(image));
    (one_image && shared.version >= 1).then_some(shared)
}

/// Adds `shared` to the tables views are also acquired in.
pub(super) fn adopt(shared: &'static Shared) -> PyResult<()> {
    let old = foreign();
    let mut list = Foreign {
        tables: [std::ptr::null(); MAX_FOREIGN],
        len: 0,
    };
    for &t in old.map_or(&[][..], Foreign::tables) {
        if std::ptr::eq(t, shared) {
            return Ok(());
        }
        list.tables[list.len] = t;
        list.len += 1;
    }
    if list.len == MAX_FOREIGN {
        return Err(refusal(format_args!(
            "rust-numpy's table was replaced more than {MAX_FOREIGN} times"
        )));
    }
    list.tables[list.len] = shared;
    list.len += 1;
    // Leaked: a reader may still hold the previous list (also leaked).
    FOREIGN.store(Box::leak(Box::new(list)), Ordering::Release);
    Ok(())
}
