//! Where rust-numpy looks for its table, learned once ([`learn_place`]),
//! and the C-level look-ups there that tell whether every such place holds
//! a table dlcast uses ([`look`], [`shadowed`]).
//!
//! **Where rust-numpy looks.** rust-numpy picks its module once per
//! extension, at its first use of NumPy, from `numpy.__version__` (a Python
//! attribute: a 1.x string under NumPy 2 sends it to the
//! `numpy.core.multiarray` shim, whose `__getattr__` forwards a missing
//! attribute to `numpy._core.multiarray`), imports it (the module is what
//! `sys.modules` holds under that name then), and takes the table with a
//! plain attribute look-up, publishing its own in that module if the look-up
//! fails. dlcast also checks the other major version's module
//! ([`super::recheck::recheck_other`]): while it is in `sys.modules` it must
//! be a plain module whose attribute is missing (the shim then forwards to
//! NumPy's module, where dlcast's table is) or a table dlcast uses; a valid
//! table dlcast does not use there refuses NumPy arrays for the rest of the
//! process. What stays unseen: a module swapped into `sys.modules` only
//! around a rust-numpy extension's first borrow, and Python code that
//! redirects the shim's forwarding (its `__getattr__`, or the `multiarray`
//! attribute of `numpy._core` it reads) while that module's own attribute is
//! missing (README, *Safety*).

use super::{refusal, ATTR_NAME};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

/// Whether NumPy is 2.x (the layout of a dtype's `elsize`), from NumPy's
/// ABI version; set before this build publishes its table.
pub(super) static NUMPY2: AtomicBool = AtomicBool::new(true);

/// Where rust-numpy looks for its table, learned once: NumPy's `multiarray`
/// module (kept alive), its name as rust-numpy imports it, its `__dict__` (a
/// module's dictionary cannot be replaced), [`super::ATTR`] as a `str`, and
/// the name of the other NumPy major version's `multiarray` module
/// (`numpy.core.multiarray` under NumPy 2, `numpy._core.multiarray` under
/// NumPy 1), where a rust-numpy extension looks that read the other major
/// version from `numpy.__version__` (see [`OTHER_OK`]).
pub(super) struct Place {
    pub(super) module: Py<PyAny>,
    pub(super) name: Py<PyAny>,
    pub(super) dict: *mut ffi::PyObject,
    pub(super) key: Py<PyAny>,
    pub(super) other: Py<PyAny>,
}

// SAFETY: `dict` is the dictionary of `module`, which `Place` keeps alive;
// it is only used with the GIL held.
unsafe impl Send for Place {}
// SAFETY: as above; never mutated.
unsafe impl Sync for Place {}

pub(super) static PLACE: PyOnceLock<Place> = PyOnceLock::new();
/// The capsule [`super::check`] expects in the attribute: the one dlcast
/// published or last adopted (a strong reference kept for the process), or
/// NULL.
pub(super) static EXPECTED: AtomicPtr<ffi::PyObject> = AtomicPtr::new(std::ptr::null_mut());

/// A capsule found in the other major version's module ([`Place`]'s
/// `other`) whose table dlcast uses (its own registry's, or one it adopted),
/// kept alive for the process; NULL if none was found there. That module's
/// entry must be missing, [`EXPECTED`] or this: anything else is a table a
/// rust-numpy extension may use where dlcast does not look.
pub(super) static OTHER_OK: AtomicPtr<ffi::PyObject> = AtomicPtr::new(std::ptr::null_mut());
/// Set for the rest of the process once a valid rust-numpy table that
/// dlcast does not use was found in the other major version's module: a
/// rust-numpy extension that published it keeps using it even if it is
/// deleted again, so NumPy arrays stay refused.
pub(super) static OTHER_TABLE: AtomicBool = AtomicBool::new(false);

/// The look-ups: every place a rust-numpy extension may take its table
/// from holds one dlcast uses. That is:
///
/// - `sys.modules[name]` (the interpreter's dictionary) is NumPy's
///   `multiarray` module, of the plain module type, and its dictionary's
///   [`super::ATTR`] is [`EXPECTED`];
/// - no attribute of that name on the classes `module` or `object`
///   shadows the dictionary's entry ([`shadowed`]; in abi3 builds only in
///   phase 1, `phase2` false);
/// - the other major version's module (where an extension that read the
///   other major version from `numpy.__version__` looks) is not in
///   `sys.modules`, or is a plain module whose [`super::ATTR`] is missing,
///   [`EXPECTED`] or [`OTHER_OK`] (its `__getattr__` forwards a missing one
///   to NumPy's module);
/// - no table dlcast does not use was ever found there ([`OTHER_TABLE`]).
///
/// Returns that other module (NULL when absent) when all holds. No Python
/// code runs, but for one case no C API can rule out: a dictionary look-up
/// compares keys of the same hash with `__eq__`, so a key Python code put in
/// `sys.modules` or a module's dictionary with the hash of one of these
/// names runs its `__eq__`. [`super::checks::settle`] records only when no
/// dictionary changed meanwhile; phase 2 looks up only in builds without
/// version tags ([`super::in_place`]). An error the look-ups set (none is
/// expected) is left for the caller to clear.
///
/// # Safety
/// The GIL is held and `modules` is the interpreter's module dictionary.
pub(super) unsafe fn look(
    place: &Place,
    modules: *mut ffi::PyObject,
    expected: *mut ffi::PyObject,
    phase2: bool,
) -> Option<*mut ffi::PyObject> {
    let module = place.module.as_ptr();
    let module_type = std::ptr::addr_of_mut!(ffi::PyModule_Type);
    let key = place.key.as_ptr();
    // The GIL is held (the caller's contract). The pointers found are only
    // compared, never read through, but for the type checks of live
    // objects: `modules`, `module` (kept by `PLACE`), and `other` right
    // after its look-up returned it (a borrowed reference the dictionary
    // holds). In an exact dict, with an exact str key (its hash cached), a
    // look-up returns a borrowed reference or NULL (see above for `__eq__`);
    // `place.dict` is `module`'s dictionary and the keys are exact strs.
    // (`PyDict_GetItemWithError`: no saving and restoring of the error
    // state around the look-up, as `PyDict_GetItem` does.)
    // SAFETY: the GIL is held, and every pointer is live or only compared
    // (above).
    unsafe {
        // `shadowed` first: in abi3 builds (phase 1) its attribute look-up
        // may run Python code, which the look-ups below then see the
        // effects of.
        if shadowed(place, expected, phase2)
            || modules.is_null()
            || ffi::PyDict_CheckExact(modules) == 0
            || ffi::PyDict_GetItemWithError(modules, place.name.as_ptr()) != module
            || ffi::PyDict_GetItemWithError(place.dict, key) != expected
        {
            return None;
        }
        let other = ffi::PyDict_GetItemWithError(modules, place.other.as_ptr());
        if !other.is_null() {
            // Not a plain module: its class decides what an attribute
            // look-up returns.
            if ffi::Py_TYPE(other) != module_type {
                return None;
            }
            let dict = ffi::PyModule_GetDict(other);
            if dict.is_null() {
                return None;
            }
            // (`other` is not read after this look-up.)
            let entry = ffi::PyDict_GetItemWithError(dict, key);
            if !(entry.is_null() || entry == expected || entry == OTHER_OK.load(Ordering::Acquire))
            {
                return None;
            }
        }
        // The module's class last, after any `__eq__`; the other module's
        // is compared again where the look-ups are recorded (`seen`).
        if ffi::Py_TYPE(module) != module_type || OTHER_TABLE.load(Ordering::Relaxed) {
            return None;
        }
        Some(other)
    }
}

/// Whether rust-numpy's attribute look-up on NumPy's module could give
/// something other than the module dictionary's entry `entry`: the look-up
/// (`getattr(module, name)`) consults the module's class and `object`
/// before the module's dictionary, and a data descriptor of that name there
/// (Python code can put one in a built-in type's dictionary through the
/// garbage collector) would hand rust-numpy a table of its own, which
/// dlcast would never see. Where the build can read those classes'
/// dictionaries at C level, any entry of that name counts; in abi3 builds,
/// the look-up itself must give `entry` (the dictionary's entry, or
/// nothing when it is NULL; Python code may run: phase 1 only, `phase2`
/// false; in phase 2 nothing is looked up there).
///
/// A descriptor removed again before dlcast's next call, after rust-numpy
/// took a table of its own through it, cannot be seen: the README's Safety
/// section lists this limit (as it does one added between an abi3 build's
/// phase 1 and phase 2).
pub(super) fn shadowed(place: &Place, entry: *mut ffi::PyObject, phase2: bool) -> bool {
    let key = place.key.as_ptr();
    #[cfg(not(Py_LIMITED_API))]
    {
        let _ = (entry, phase2);
        let classes = [
            std::ptr::addr_of_mut!(ffi::PyModule_Type),
            std::ptr::addr_of_mut!(ffi::PyBaseObject_Type),
        ];
        classes.into_iter().any(|tp| {
            // SAFETY: the GIL is held; static built-in types, whose
            // dictionary (an exact dict: `tp_dict` before 3.12, a new
            // reference from `PyType_GetDict` since, which the interpreter
            // also holds, so dropping it frees nothing) a look-up with an
            // exact str key reads without running Python code (see `look`
            // for `__eq__`); an error (none is expected) counts as
            // shadowed, and is cleared.
            unsafe {
                #[cfg(not(Py_3_12))]
                let dict = (*tp).tp_dict;
                #[cfg(Py_3_12)]
                let dict = ffi::PyType_GetDict(tp);
                let hit = dict.is_null() || !ffi::PyDict_GetItemWithError(dict, key).is_null();
                if !ffi::PyErr_Occurred().is_null() {
                    ffi::PyErr_Clear();
                }
                #[cfg(Py_3_12)]
                ffi::Py_XDECREF(dict);
                hit
            }
        })
    }
    #[cfg(Py_LIMITED_API)]
    {
        if phase2 {
            return false;
        }
        // SAFETY: the GIL is held; `module` is live; a new reference or
        // NULL with an error (cleared), compared by address only.
        unsafe {
            let got = ffi::PyObject_GetAttr(place.module.as_ptr(), key);
            if got.is_null() {
                ffi::PyErr_Clear();
                return !entry.is_null();
            }
            // (A value where the dictionary has none is shadowed too.)
            ffi::Py_DECREF(got);
            got != entry
        }
    }
}

/// NumPy's `multiarray` module, from NumPy's ABI version (its verified C
/// API table, never `numpy.__version__`).
pub(super) fn learn_place(py: Python<'_>) -> PyResult<Place> {
    let Some(table) = crate::npapi::table(py) else {
        return Err(refusal(format_args!(
            "NumPy's C API table (`_ARRAY_API`) could not be verified to be NumPy's"
        )));
    };
    NUMPY2.store(table.numpy2(), Ordering::Relaxed);
    let (name, other) = if table.numpy2() {
        ("numpy._core.multiarray", "numpy.core.multiarray")
    } else {
        ("numpy.core.multiarray", "numpy._core.multiarray")
    };
    let module = py.import(name)?.into_any();
    // SAFETY: `module` is a live module object; its dictionary is borrowed,
    // alive as long as the module (which `Place` keeps).
    let dict = unsafe { ffi::PyModule_GetDict(module.as_ptr()) };
    if dict.is_null() {
        return Err(
            PyErr::take(py).unwrap_or_else(|| refusal(format_args!("{name} has no dictionary")))
        );
    }
    Ok(Place {
        module: module.unbind(),
        // Interned: the keys a dictionary holds for these names are often
        // the interned strings, which a look-up then finds by identity.
        name: pyo3::types::PyString::intern(py, name).into_any().unbind(),
        dict,
        key: pyo3::types::PyString::intern(py, ATTR_NAME)
            .into_any()
            .unbind(),
        other: pyo3::types::PyString::intern(py, other).into_any().unbind(),
    })
}
