//! The per-call checks that rust-numpy's table is still the one dlcast
//! published or adopted: phase 1 ([`check`], and [`settle`] recording the
//! look-ups it made), phase 2 ([`in_place`], after the last step of the
//! call that can run Python code), and their uses outside a call
//! ([`foreign_in_use`], [`set_up`]). Only the slow path ([`check_slow`],
//! on to [`super::recheck`]) may run Python code.

use super::place::{look, EXPECTED, PLACE};
use super::recheck::recheck;
use super::table::foreign;
use super::{refusal, seen};
use pyo3::ffi;
use pyo3::prelude::*;
use std::sync::atomic::Ordering;

/// Checks, in phase 1 of every call that reads an exact `numpy.ndarray`
/// from its fields, that rust-numpy's table is still the one dlcast
/// published or adopted, wherever a rust-numpy extension may look for it
/// ([`look`]); otherwise (and the first time) [`recheck`] decides: the
/// table is put back where it was deleted, a valid table rust-numpy
/// published in its place is adopted (views are acquired there too), and
/// anything else refuses the argument.
///
/// On `Ok`, the last step was [`look`]'s C-level look-ups, after any Python
/// code this ran. Phase 2, which must not trust what Python code ran since
/// (a later argument's `__dlpack__`, say), asks [`in_place`] again.
#[inline(always)]
pub(crate) fn check(py: Python<'_>) -> PyResult<()> {
    if unchanged(py) {
        return Ok(());
    }
    check_slow(py)
}

/// [`check`] when the dictionaries changed since the last look-up (or
/// where the build has no version tags to tell).
#[cold]
#[inline(never)]
fn check_slow(py: Python<'_>) -> PyResult<()> {
    if settle(py) {
        return Ok(());
    }
    recheck(py)?;
    // `recheck` may have run Python code (the first time, or an import
    // hook): the look-ups again, after it.
    if settle(py) {
        return Ok(());
    }
    Err(refusal(format_args!(
        "rust-numpy's table kept changing while dlcast checked it"
    )))
}

/// For Rust code about to touch memory that NumPy arrays may share (an
/// `ArrayBuffer`'s exports), before it registers its borrow: `Ok(false)`
/// when every rust-numpy borrow of a NumPy array is entered in dlcast's
/// registry (or NumPy is not imported, and dlcast never met it: no
/// rust-numpy borrow of a NumPy array exists), `Ok(true)` when rust-numpy
/// extensions keep registries of their own too ([`foreign`]), `Err` when
/// rust-numpy's table cannot be followed. May run Python code ([`check`]);
/// on `Ok` its last step was [`check`]'s C-level look-ups.
pub(crate) fn foreign_in_use(py: Python<'_>) -> PyResult<bool> {
    if PLACE.get(py).is_none() {
        let name = pyo3::types::PyString::new(py, "numpy");
        // SAFETY: the GIL is held; a look-up in the interpreter's module
        // dictionary: a new reference or NULL (Python code may run).
        let numpy = unsafe { ffi::PyImport_GetModule(name.as_ptr()) };
        if numpy.is_null() {
            drop(PyErr::take(py));
            return Ok(false);
        }
        // SAFETY: the new reference just taken.
        unsafe { ffi::Py_DecRef(numpy) };
    }
    check(py)?;
    Ok(foreign().is_some())
}

/// Phase 1 and phase 2 of a call with nothing in between (the NumPy
/// fast path's straight-line call, on an earlier call's check): whether
/// rust-numpy's table is in place. With version tags, [`in_place`] alone
/// (`false` when a dictionary changed: the general path then checks and
/// reports); without them [`check`] first, which in abi3 builds also looks
/// for a shadowing descriptor with a plain attribute look-up (Python code,
/// see [`super::place::shadowed`]), and [`in_place`] after it.
#[inline(always)]
pub(crate) fn ready(py: Python<'_>) -> bool {
    if !seen::AVAILABLE && check(py).is_err() {
        return false;
    }
    in_place(py)
}

/// Phase 2 (no Python code): whether everything [`check`] established
/// still holds, re-established after the last step of the call that could
/// run Python code. With version tags (see `seen`), a few loads and
/// compares, and `false` (phase 1 then looks up, [`check`]) whenever one
/// of the dictionaries changed: phase 2 never looks anything up in a
/// dictionary there. Without them, [`look`]'s look-ups (see it for the
/// one thing they cannot rule out).
#[inline(always)]
pub(crate) fn in_place(py: Python<'_>) -> bool {
    if unchanged(py) {
        return true;
    }
    if seen::AVAILABLE {
        return false;
    }
    let expected = EXPECTED.load(Ordering::Acquire);
    match PLACE.get(py) {
        // SAFETY: the GIL is held; the interpreter's module dictionary.
        Some(place) if !expected.is_null() => unsafe {
            let ok = look(place, ffi::PyImport_GetModuleDict(), expected, true).is_some();
            if !ffi::PyErr_Occurred().is_null() {
                ffi::PyErr_Clear();
            }
            ok
        },
        _ => false,
    }
}

/// Whether nothing changed since the last [`look`] that found everything
/// in place (`seen`: the version tags of every dictionary looked in, the
/// module types compared again). Always `false` without version tags.
#[inline(always)]
fn unchanged(py: Python<'_>) -> bool {
    let expected = EXPECTED.load(Ordering::Acquire);
    let Some(place) = PLACE.get(py) else {
        return false;
    };
    if expected.is_null() {
        return false;
    }
    let module = place.module.as_ptr();
    // The interpreter's module dictionary, where `PyImport_Import` (which
    // rust-numpy's `PyModule::import` calls) takes the module from after
    // the import.
    // SAFETY: the GIL is held: a borrowed reference to the interpreter's
    // dictionary (C-level state; rebinding `sys.modules` does not change
    // it), alive as long as the interpreter.
    let modules = unsafe { ffi::PyImport_GetModuleDict() };
    // SAFETY: `module` is live (kept by `PLACE`); its type pointer is only
    // compared (the module's dictionary does not hold its class).
    seen::unchanged(modules, place.dict)
        && unsafe { ffi::Py_TYPE(module) } == std::ptr::addr_of_mut!(ffi::PyModule_Type)
}

/// Phase 1: [`look`], and on success the record that lets [`unchanged`]
/// skip the look-ups until a dictionary changes.
fn settle(py: Python<'_>) -> bool {
    let expected = EXPECTED.load(Ordering::Acquire);
    let Some(place) = PLACE.get(py) else {
        return false;
    };
    if expected.is_null() {
        return false;
    }
    // SAFETY: the GIL is held; the interpreter's module dictionary.
    let modules = unsafe { ffi::PyImport_GetModuleDict() };
    // The tags before the look-ups: recorded only if no dictionary changed
    // while they ran (a key's `__eq__` may run Python code, see `look`),
    // so what is recorded is what was found.
    let before = seen::snapshot(modules, place.dict);
    // SAFETY: as above.
    let found = unsafe { look(place, modules, expected, false) };
    // SAFETY: the GIL is held.
    unsafe {
        if !ffi::PyErr_Occurred().is_null() {
            ffi::PyErr_Clear();
        }
    }
    match found {
        Some(other) => {
            seen::record(before, modules, place.dict, other);
            true
        }
        None => false,
    }
}

/// At the registry's set-up (the first time an extension needs it in the
/// process, in phase 1 of a call), when NumPy is already imported: the first
/// check now ([`recheck`]: dlcast's table is published in rust-numpy's
/// place, or the one there adopted), rather than at the first exact
/// `numpy.ndarray` argument. A rust-numpy extension that borrows before
/// dlcast meets its first NumPy array then finds dlcast's table instead of
/// publishing its own, in which every later dlcast view of a NumPy array
/// would also have to be acquired. NumPy is never imported for this, and
/// whatever goes wrong is left to [`check`], which refuses NumPy arrays
/// with the reason.
#[cold]
#[inline(never)]
pub(crate) fn set_up(py: Python<'_>) {
    let name = pyo3::types::PyString::new(py, "numpy");
    // SAFETY: the GIL is held; a look-up in `sys.modules` (phase 1: Python
    // code may run if it was replaced) that returns a new reference or NULL
    // (with an error only if the look-up itself failed).
    let numpy = unsafe { ffi::PyImport_GetModule(name.as_ptr()) };
    if numpy.is_null() {
        drop(PyErr::take(py));
        return;
    }
    // SAFETY: the new reference just taken.
    unsafe { ffi::Py_DecRef(numpy) };
    if let Err(e) = check(py) {
        drop(e);
    }
}
