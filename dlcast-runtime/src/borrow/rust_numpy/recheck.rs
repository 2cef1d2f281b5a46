//! [`super::check`]'s slow path, in phase 1 (it may run Python code): when
//! a dictionary changed since the last look-up, or the first time, it
//! decides what to do with what is in rust-numpy's place ([`recheck`]) and
//! in the other major version's module ([`recheck_other`]).
//!
//! **When Python code changes the attribute.** A rust-numpy extension keeps
//! the first table it found, so tables already in use stay in use; what
//! Python code can change is which table the *next* rust-numpy extension
//! finds. At each check:
//!
//! - **deleted**: dlcast puts back the capsule that was there (its own, or
//!   the one it adopted), so later rust-numpy extensions join the same
//!   registry;
//! - **another valid table** (a rust-numpy extension published its own
//!   after a deletion): adopted, views are acquired in it too, besides the
//!   tables already in use (up to [`super::table::MAX_FOREIGN`]);
//! - **anything else** (an object that is no table, a `ctypes` table, a
//!   replaced `sys.modules` entry or module class, which redirect
//!   rust-numpy's own look-up): exact `numpy.ndarray` arguments are
//!   refused (`RuntimeError`) until it is put right, since dlcast could not
//!   see the borrows of rust-numpy extensions that use it.
//!
//! The window that remains: a dlcast view that is **already live** when the
//! attribute is deleted (in a callback of its body) is not in a table a
//! rust-numpy extension publishes afterwards, so that extension's first
//! borrows, until the view drops, do not see it (the next dlcast call
//! adopts the new table, and from then on both see each other). dlcast
//! cannot close it: nothing tells it when a module attribute is deleted,
//! and rust-numpy looks its table up with plain Python attribute access.

use super::super::BorrowApi;
use super::place::{learn_place, shadowed, Place, EXPECTED, OTHER_OK, OTHER_TABLE, PLACE};
use super::published::publish;
use super::table::{adopt, foreign, verify};
use super::{refusal, seen, ATTR_NAME};
use pyo3::ffi;
use pyo3::prelude::*;
use std::sync::atomic::Ordering;

/// [`super::check`]'s slow path (phase 1: may run Python code, the first
/// time).
#[cold]
#[inline(never)]
pub(super) fn recheck(py: Python<'_>) -> PyResult<()> {
    let registry = super::super::api(py)?;
    let place = PLACE.get_or_try_init(py, || learn_place(py))?;
    let module = place.module.bind(py);
    // SAFETY: the GIL is held; a look-up in the interpreter's module
    // dictionary that returns a new reference or NULL (with an error only
    // if the look-up failed). It may run Python code (the module's
    // `__spec__` is read): `check` looks again after this.
    let current = unsafe { ffi::PyImport_GetModule(place.name.as_ptr()) };
    let current = if current.is_null() {
        drop(PyErr::take(py));
        None
    } else {
        // SAFETY: a new reference.
        Some(unsafe { Bound::from_owned_ptr(py, current) })
    };
    if current.as_ref().map(|m| m.as_ptr()) != Some(module.as_ptr()) {
        return Err(refusal(format_args!(
            "sys.modules[{:?}] is not NumPy's module, where rust-numpy looks for its table",
            place.name.bind(py)
        )));
    }
    // SAFETY: `module` is live; comparing its type pointer reads nothing else.
    if unsafe { ffi::Py_TYPE(module.as_ptr()) } != std::ptr::addr_of_mut!(ffi::PyModule_Type) {
        return Err(refusal(format_args!(
            "the class of NumPy's module {:?} was replaced",
            place.name.bind(py)
        )));
    }
    let key = place.key.as_ptr();
    // SAFETY: as in `look`: a borrowed reference or NULL.
    let found = unsafe { ffi::PyDict_GetItem(place.dict, key) };
    let expected = EXPECTED.load(Ordering::Acquire);
    if shadowed(place, found, false) {
        return Err(refusal(format_args!(
            "an attribute {ATTR_NAME} of the class `module` or `object` shadows the entry of \
             {:?}'s dictionary that rust-numpy looks up (Python code put it there)",
            place.name.bind(py)
        )));
    }
    if found.is_null() {
        // Missing: put back the table rust-numpy extensions found there, or
        // publish dlcast's the first time.
        let table = if expected.is_null() {
            publish(py, registry)?
        } else {
            expected
        };
        // SAFETY: an exact dict, an exact str key and a live value: no
        // Python code (nothing is replaced, so nothing is freed).
        if unsafe { ffi::PyDict_SetItem(place.dict, key, table) } < 0 {
            return Err(PyErr::fetch(py));
        }
        EXPECTED.store(table, Ordering::Release);
        seen::forget();
        return recheck_other(py, place, registry);
    }
    if found == expected {
        return recheck_other(py, place, registry);
    }
    // SAFETY: a borrowed reference from the dictionary; a new strong one
    // (no Python code).
    let found = unsafe { Bound::from_borrowed_ptr(py, found) };
    let Some(shared) = verify(&found) else {
        return Err(refusal(format_args!(
            "{}.{ATTR_NAME} is not rust-numpy's borrow-checking table (a capsule of that name \
             whose functions lie in one loaded library)",
            place.name.bind(py)
        )));
    };
    if !std::ptr::eq(shared.flags.cast_const().cast::<BorrowApi>(), registry) {
        adopt(shared)?;
    }
    // Kept for the process, as rust-numpy does: the table stays valid.
    EXPECTED.store(found.into_ptr(), Ordering::Release);
    seen::forget();
    recheck_other(py, place, registry)
}

/// [`recheck`] for the other NumPy major version's `multiarray` module
/// (phase 1). rust-numpy chooses its module from `numpy.__version__` (a
/// Python attribute: a 1.x string under NumPy 2 sends it to the
/// `numpy.core` shim), once per extension, and takes its table from that
/// module with a plain attribute look-up, publishing its own there if the
/// look-up fails (the shim's `__getattr__` forwards to NumPy's module, and
/// fails when the table is missing there or warnings are errors). A table
/// found there is accepted only if dlcast uses it (dlcast's registry's, or
/// one adopted); any other valid table refuses NumPy arrays for the rest
/// of the process ([`OTHER_TABLE`]: its extension keeps it even if it is
/// deleted), and anything else that is no table refuses them until it is
/// gone. The module itself must be a plain module, if present.
fn recheck_other(py: Python<'_>, place: &Place, registry: &'static BorrowApi) -> PyResult<()> {
    let name = place.other.bind(py);
    let unseen = || {
        refusal(format_args!(
            "{name}.{ATTR_NAME} holds a rust-numpy table that dlcast does not use (a rust-numpy \
             extension that read a NumPy version of the other major version from \
             `numpy.__version__` published it there); NumPy arrays stay refused in this process"
        ))
    };
    if OTHER_TABLE.load(Ordering::Relaxed) {
        return Err(unseen());
    }
    // SAFETY: as in `recheck`: a new reference or NULL (Python code may run).
    let other = unsafe { ffi::PyImport_GetModule(name.as_ptr()) };
    if other.is_null() {
        drop(PyErr::take(py));
        return Ok(());
    }
    // SAFETY: a new reference.
    let other = unsafe { Bound::from_owned_ptr(py, other) };
    // SAFETY: `other` is live; its type pointer is only compared.
    if unsafe { ffi::Py_TYPE(other.as_ptr()) } != std::ptr::addr_of_mut!(ffi::PyModule_Type) {
        return Err(refusal(format_args!(
            "sys.modules[{name:?}] is not a plain module (a rust-numpy extension that read a \
             NumPy version of the other major version from `numpy.__version__` looks for its \
             table there)"
        )));
    }
    // SAFETY: a plain module: its dictionary, borrowed (alive with
    // `other`); then a look-up as in `look`, a borrowed reference or NULL.
    let entry = unsafe {
        let dict = ffi::PyModule_GetDict(other.as_ptr());
        if dict.is_null() {
            return Err(PyErr::fetch(py));
        }
        ffi::PyDict_GetItem(dict, place.key.as_ptr())
    };
    if entry.is_null()
        || entry == EXPECTED.load(Ordering::Acquire)
        || entry == OTHER_OK.load(Ordering::Acquire)
    {
        return Ok(());
    }
    // SAFETY: a borrowed reference from the dictionary: a new strong one.
    let entry = unsafe { Bound::from_borrowed_ptr(py, entry) };
    let Some(shared) = verify(&entry) else {
        return Err(refusal(format_args!(
            "{name}.{ATTR_NAME} is not rust-numpy's borrow-checking table (a rust-numpy \
             extension that read a NumPy version of the other major version from \
             `numpy.__version__` looks for its table there)"
        )));
    };
    let ours = std::ptr::eq(shared.flags.cast_const().cast::<BorrowApi>(), registry);
    let adopted = foreign().is_some_and(|f| f.tables().iter().any(|&t| std::ptr::eq(t, shared)));
    if !(ours || adopted) {
        OTHER_TABLE.store(true, Ordering::Relaxed);
        return Err(unseen());
    }
    // Kept for the process (the previous one, if any, stays kept too).
    OTHER_OK.store(entry.into_ptr(), Ordering::Release);
    seen::forget();
    Ok(())
}
