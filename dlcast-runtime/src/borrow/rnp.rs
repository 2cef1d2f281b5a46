//! Working together with rust-numpy's borrow checking.
//!
//! rust-numpy (the `numpy` crate) checks its `PyReadonlyArray` and
//! `PyReadwriteArray` borrows at run time, in a registry that its
//! extensions share through a capsule named [`ATTR`], in the attribute of
//! the same name of NumPy's `multiarray` module (`numpy._core.multiarray`
//! under NumPy 2, `numpy.core.multiarray` before). The capsule holds a C
//! struct ([`Shared`]): its version first (1; later versions may only append
//! fields), an opaque `flags` pointer and four functions, `acquire`,
//! `acquire_mut`, `release` and `release_mut`, each passed `flags` and a
//! `PyArrayObject*`, called with the GIL held; the acquiring ones return 0
//! (granted), -1 (in use) or -2 (not writeable). Each rust-numpy extension
//! uses the first capsule it finds there, and publishes its own if there is
//! none, when it first borrows an array.
//!
//! dlcast looks there in phase 1 of every call that reads an exact
//! `numpy.ndarray` from its fields ([`check`]: look-ups in `sys.modules`,
//! in the module's dictionary and in the classes `module` and `object`,
//! each compared by identity, skipped while no dictionary changed since
//! the last look-up by its PEP 509 version tag; no Python code), and again
//! in phase 2, after the last step of the call that can run Python code
//! ([`in_place`]: with version tags only loads and compares, and back to
//! phase 1 when a dictionary changed), as every `ArrayBuffer` access does
//! before it touches memory exported arrays share ([`foreign_in_use`]). The
//! module is NumPy's `multiarray` of NumPy's ABI version, read from
//! NumPy's verified C API table ([`crate::npapi::table`]), never from
//! `numpy.__version__`, which also decides the dtype layout dlcast's table
//! //! reads. The first time (already when the registry is set up, at the first
//! call of any dlcast function in the process, if NumPy is imported by
//! then: [`set_up`]):
//!
//! - **No capsule yet**: dlcast publishes one whose functions enter
//!   rust-numpy's borrows in dlcast's own registry (see [`super`]), with
//!   `flags` pointing to that registry's [`BorrowApi`], by which every
//!   dlcast build recognises it. From then on there is one registry for
//!   both, and a dlcast call pays only the check.
//! - **A capsule of rust-numpy's**: every view dlcast makes of an exact
//!   `numpy.ndarray` is also acquired there ([`hold`]), read or write as the
//!   view, and released when the view's borrow ends ([`release`]). The
//!   holds sit in a table of this extension keyed by the dlcast borrow's id
//!   (the view's own layout is unchanged: the NumPy path pays one atomic
//!   load when it reads and one when it drops).
//!
//! rust-numpy's functions are called in phase 2, so a table is used only
//! when its four functions lie in one loaded library's image (see
//! [`verify`]): a table made with `ctypes`, whose functions would run
//! Python code, is never called.
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
//!   tables already in use (up to [`MAX_FOREIGN`]);
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
//!
//! **Where rust-numpy looks.** rust-numpy picks its module once per
//! extension, at its first use of NumPy, from `numpy.__version__` (a
//! Python attribute: a 1.x string under NumPy 2 sends it to the
//! `numpy.core.multiarray` shim, whose `__getattr__` forwards a missing
//! attribute to `numpy._core.multiarray`), imports it (the module is what
//! `sys.modules` holds under that name then), and takes the table with a
//! plain attribute look-up, publishing its own in that module if the
//! look-up fails. dlcast also checks the other major version's module
//! ([`recheck_other`]): while it is in `sys.modules` it must be a plain
//! module whose attribute is missing (the shim then forwards to NumPy's
//! module, where dlcast's table is) or a table dlcast uses; a valid table
//! dlcast does not use there refuses NumPy arrays for the rest of the
//! process. What stays unseen: a module swapped into `sys.modules` only
//! around a rust-numpy extension's first borrow, and Python code that
//! redirects the shim's forwarding (its `__getattr__`, or the `multiarray`
//! attribute of `numpy._core` it reads) while that module's own attribute
//! is missing (README, *Safety*).
//!
//! Not covered in the second case: subclasses of `numpy.ndarray`, arrays
//! read through `__dlpack__`, and memory reached through other producers
//! (rust-numpy does not see those either). In the first case rust-numpy's
//! borrows are compared by memory with every view in the registry.

use super::{BorrowApi, BorrowReq, LockGuard, OneWordLock};
// NumPy's array object (as rust-numpy's functions are passed it) and dtype.
use crate::npyffi::{PyArrayObject as ArrayHead, NPY_ARRAY_WRITEABLE};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use smallvec::SmallVec;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

/// The capsule's name, and the attribute of NumPy's `multiarray` module
/// that holds it.
const ATTR: &CStr = c"_RUST_NUMPY_BORROW_CHECKING_API";
/// [`ATTR`] as text.
const ATTR_NAME: &str = "_RUST_NUMPY_BORROW_CHECKING_API";

/// The function name recorded for rust-numpy's borrows in dlcast's
/// registry (no Rust function has this name).
pub(crate) const RUST_NUMPY: &str = "<rust-numpy>";

/// rust-numpy's shared table, version 1 (the fields every version starts
/// with). The arrays are passed as `PyObject*` (the same pointer).
#[repr(C)]
pub(crate) struct Shared {
    version: u64,
    flags: *mut c_void,
    acquire: unsafe extern "C" fn(flags: *mut c_void, array: *mut ffi::PyObject) -> c_int,
    acquire_mut: unsafe extern "C" fn(flags: *mut c_void, array: *mut ffi::PyObject) -> c_int,
    release: unsafe extern "C" fn(flags: *mut c_void, array: *mut ffi::PyObject),
    release_mut: unsafe extern "C" fn(flags: *mut c_void, array: *mut ffi::PyObject),
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
    fn tables(&self) -> &[*const Shared] {
        &self.tables[..self.len.min(MAX_FOREIGN)]
    }
}

/// The foreign tables, once there is one (a leaked [`Foreign`], replaced
/// by a longer one when another is adopted; never freed: a reader may hold
/// the old one).
static FOREIGN: AtomicPtr<Foreign> = AtomicPtr::new(std::ptr::null_mut());

/// Whether NumPy is 2.x (the layout of a dtype's `elsize`), from NumPy's
/// ABI version; set before this build publishes its table.
static NUMPY2: AtomicBool = AtomicBool::new(true);

/// Where rust-numpy looks for its table, learned once: NumPy's `multiarray`
/// module (kept alive), its name as rust-numpy imports it, its `__dict__`
/// (a module's dictionary cannot be replaced), [`ATTR`] as a `str`, and
/// the name of the other NumPy major version's `multiarray` module
/// (`numpy.core.multiarray` under NumPy 2, `numpy._core.multiarray` under
/// NumPy 1), where a rust-numpy extension looks that read the other major
/// version from `numpy.__version__` (see [`OTHER_OK`]).
struct Place {
    module: Py<PyAny>,
    name: Py<PyAny>,
    dict: *mut ffi::PyObject,
    key: Py<PyAny>,
    other: Py<PyAny>,
}

// SAFETY: `dict` is the dictionary of `module`, which `Place` keeps alive;
// it is only used with the GIL held.
unsafe impl Send for Place {}
// SAFETY: as above; never mutated.
unsafe impl Sync for Place {}

static PLACE: PyOnceLock<Place> = PyOnceLock::new();
/// The capsule [`check`] expects in the attribute: the one dlcast published
/// or last adopted (a strong reference kept for the process), or NULL.
static EXPECTED: AtomicPtr<ffi::PyObject> = AtomicPtr::new(std::ptr::null_mut());
/// The capsule of the table this build published, if it did (kept alive).
static PUBLISHED: AtomicPtr<ffi::PyObject> = AtomicPtr::new(std::ptr::null_mut());
/// A capsule found in the other major version's module ([`Place`]'s
/// `other`) whose table dlcast uses (its own registry's, or one it adopted),
/// kept alive for the process; NULL if none was found there. That module's
/// entry must be missing, [`EXPECTED`] or this: anything else is a table a
/// rust-numpy extension may use where dlcast does not look.
static OTHER_OK: AtomicPtr<ffi::PyObject> = AtomicPtr::new(std::ptr::null_mut());
/// Set for the rest of the process once a valid rust-numpy table that
/// dlcast does not use was found in the other major version's module: a
/// rust-numpy extension that published it keeps using it even if it is
/// deleted again, so NumPy arrays stay refused.
static OTHER_TABLE: AtomicBool = AtomicBool::new(false);

/// rust-numpy's own registries, if views of NumPy arrays must be acquired
/// there too (one atomic load).
#[inline(always)]
pub(crate) fn foreign() -> Option<&'static Foreign> {
    let p = FOREIGN.load(Ordering::Acquire);
    // SAFETY: only leaked lists of tables that are kept alive for the
    // process (a strong reference to each capsule is leaked) are stored.
    (!p.is_null()).then(|| unsafe { &*p })
}

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
/// see [`shadowed`]), and [`in_place`] after it.
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

/// The look-ups: every place a rust-numpy extension may take its table
/// from holds one dlcast uses. That is:
///
/// - `sys.modules[name]` (the interpreter's dictionary) is NumPy's
///   `multiarray` module, of the plain module type, and its dictionary's
///   [`ATTR`] is [`EXPECTED`];
/// - no attribute of that name on the classes `module` or `object`
///   shadows the dictionary's entry ([`shadowed`]; in abi3 builds only in
///   phase 1, `phase2` false);
/// - the other major version's module (where an extension that read the
///   other major version from `numpy.__version__` looks) is not in
///   `sys.modules`, or is a plain module whose [`ATTR`] is missing,
///   [`EXPECTED`] or [`OTHER_OK`] (its `__getattr__` forwards a missing
///   one to NumPy's module);
/// - no table dlcast does not use was ever found there ([`OTHER_TABLE`]).
///
/// Returns that other module (NULL when absent) when all holds. No Python
/// code runs, but for one case no C API can rule out: a dictionary
/// look-up compares keys of the same hash with `__eq__`, so a key Python
/// code put in `sys.modules` or a module's dictionary with the hash of one
/// of these names runs its `__eq__`. [`settle`] records only when no
/// dictionary changed meanwhile; phase 2 looks up only in builds without
/// version tags ([`in_place`]). An error the look-ups set (none is
/// expected) is left for the caller to clear.
///
/// # Safety
/// The GIL is held and `modules` is the interpreter's module dictionary.
unsafe fn look(
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
fn shadowed(place: &Place, entry: *mut ffi::PyObject, phase2: bool) -> bool {
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

/// The state of the dictionaries [`look`] looks in (and of those where
/// [`shadowed`] looks) when it last found them as expected, by their version
/// tags (PEP 509: CPython gives a dict a new tag whenever an entry is added,
/// removed or replaced). While every tag is the same, so is every entry,
/// and [`unchanged`] skips the look-ups. The tag field is deprecated in
/// CPython 3.12 (it stays until 3.14, which removes it) and absent from the
/// limited API and from other interpreters: there every call looks up.
mod seen {
    use pyo3::ffi;

    #[cfg(not(any(Py_LIMITED_API, Py_3_14, Py_GIL_DISABLED, PyPy, GraalPy)))]
    mod tags {
        use super::ffi;
        use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

        /// The interpreter's module dictionary, the other major version's
        /// module found in it (NULL if none) and that module's dictionary,
        /// and the tags of the module dictionary, of NumPy's module
        /// dictionary, of the dictionaries of the classes `module` and
        /// `object` (where a shadowing attribute would sit, see `shadowed`)
        /// and of the other module's dictionary, when `VALID`. (Atomics for
        /// `static`s: only read and written with the GIL held, which orders
        /// them.) `OTHER` is a borrowed reference: it is only read while
        /// the module dictionary, which holds it, keeps its tag.
        static MODULES: AtomicPtr<ffi::PyObject> = AtomicPtr::new(std::ptr::null_mut());
        static OTHER: AtomicPtr<ffi::PyObject> = AtomicPtr::new(std::ptr::null_mut());
        static OTHER_DICT: AtomicPtr<ffi::PyObject> = AtomicPtr::new(std::ptr::null_mut());
        static TAGS: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
        static VALID: AtomicBool = AtomicBool::new(false);

        /// Version tags are read here.
        pub(in super::super) const AVAILABLE: bool = true;

        /// A dict's version tag.
        ///
        /// # Safety
        /// `dict` is a live exact dict and the GIL is held.
        #[inline(always)]
        #[allow(deprecated)]
        unsafe fn tag(dict: *mut ffi::PyObject) -> u64 {
            // SAFETY: an exact dict starts with `PyDictObject`'s fields; the
            // GIL is held, so no thread changes it while it is read.
            unsafe { (*dict.cast::<ffi::PyDictObject>()).ma_version_tag }
        }

        /// The dictionaries of the static classes `module` and `object`
        /// (`tp_dict` before 3.12; since, the interpreter keeps them and
        /// `PyType_GetDict` hands out a new reference, dropped here: they
        /// live as long as the interpreter).
        #[inline(always)]
        fn class_dicts() -> [*mut ffi::PyObject; 2] {
            [
                std::ptr::addr_of_mut!(ffi::PyModule_Type),
                std::ptr::addr_of_mut!(ffi::PyBaseObject_Type),
            ]
            .map(|tp| {
                // SAFETY: static built-in types, with the GIL held; their
                // dictionaries are exact dicts, never NULL once the
                // interpreter runs.
                unsafe {
                    #[cfg(not(Py_3_12))]
                    let dict = (*tp).tp_dict;
                    #[cfg(Py_3_12)]
                    let dict = {
                        let d = ffi::PyType_GetDict(tp);
                        ffi::Py_XDECREF(d);
                        d
                    };
                    dict
                }
            })
        }

        /// The first four tags (see `TAGS`), or `None` if a class has no
        /// dictionary.
        #[inline(always)]
        fn tags(modules: *mut ffi::PyObject, attrs: *mut ffi::PyObject) -> Option<[u64; 4]> {
            let [m, o] = class_dicts();
            if m.is_null() || o.is_null() {
                return None;
            }
            // SAFETY: live exact dicts (the callers pass the interpreter's
            // module dictionary, tested by `look`, and NumPy's module
            // dictionary, which `PLACE` keeps; see `class_dicts`), with the
            // GIL held.
            Some(unsafe { [tag(modules), tag(attrs), tag(m), tag(o)] })
        }

        /// The tags before `look` (see `record`).
        #[inline(always)]
        pub(in super::super) fn snapshot(
            modules: *mut ffi::PyObject,
            attrs: *mut ffi::PyObject,
        ) -> Option<[u64; 4]> {
            // (`modules` may not be an exact dict: `look` then fails, and
            // nothing is recorded.)
            // SAFETY: `modules` is live (the interpreter's); only its type
            // is read here.
            if modules.is_null() || unsafe { ffi::PyDict_CheckExact(modules) } == 0 {
                return None;
            }
            tags(modules, attrs)
        }

        /// Records the tags after a `look` that found everything in place
        /// (`modules`: the interpreter's module dictionary; `attrs`:
        /// NumPy's module dictionary; `other`: what `look` returned), if
        /// they are still `before`, the tags from before the look-ups: no
        /// dictionary changed while they ran.
        #[inline(always)]
        pub(in super::super) fn record(
            before: Option<[u64; 4]>,
            modules: *mut ffi::PyObject,
            attrs: *mut ffi::PyObject,
            other: *mut ffi::PyObject,
        ) {
            forget();
            let (Some(before), Some(now)) = (before, tags(modules, attrs)) else {
                return;
            };
            if before != now {
                return;
            }
            // The module dictionary kept its tag since before the look-ups,
            // so it still holds `other` (alive), whose class `look`
            // compared and is compared again.
            let other_dict = if other.is_null() {
                std::ptr::null_mut()
            } else {
                // SAFETY: `other` is alive (above); its type pointer is
                // read, and for a plain module its dictionary, borrowed,
                // alive with it.
                unsafe {
                    if ffi::Py_TYPE(other) != std::ptr::addr_of_mut!(ffi::PyModule_Type) {
                        return;
                    }
                    ffi::PyModule_GetDict(other)
                }
            };
            let other_tag = if other_dict.is_null() {
                0
            } else {
                // SAFETY: a module's dictionary, an exact dict, alive with
                // the module; the GIL is held.
                unsafe { tag(other_dict) }
            };
            MODULES.store(modules, Ordering::Relaxed);
            OTHER.store(other, Ordering::Relaxed);
            OTHER_DICT.store(other_dict, Ordering::Relaxed);
            for (t, v) in TAGS.iter().zip(now.into_iter().chain([other_tag])) {
                t.store(v, Ordering::Relaxed);
            }
            VALID.store(true, Ordering::Relaxed);
        }

        /// Whether no dict changed since the last `record` (the same
        /// module dictionary, all with the tags recorded) and the other
        /// major version's module, if there was one, is still a plain
        /// module.
        #[inline(always)]
        pub(in super::super) fn unchanged(
            modules: *mut ffi::PyObject,
            attrs: *mut ffi::PyObject,
        ) -> bool {
            // (`modules` is the pointer recorded, the interpreter's module
            // dictionary, which lives as long as the interpreter.)
            if !(VALID.load(Ordering::Relaxed)
                && MODULES.load(Ordering::Relaxed) == modules
                && tags(modules, attrs).is_some_and(|now| {
                    TAGS.iter()
                        .zip(now)
                        .all(|(t, v)| t.load(Ordering::Relaxed) == v)
                }))
            {
                return false;
            }
            let other = OTHER.load(Ordering::Relaxed);
            if other.is_null() {
                return true;
            }
            // SAFETY: the module dictionary kept its tag since `record`, so
            // it still holds `other`, and `other` its dictionary (a
            // module's dictionary cannot be replaced); the GIL is held.
            unsafe {
                ffi::Py_TYPE(other) == std::ptr::addr_of_mut!(ffi::PyModule_Type)
                    && tag(OTHER_DICT.load(Ordering::Relaxed)) == TAGS[4].load(Ordering::Relaxed)
            }
        }

        /// Forgets the record (the expected table changed).
        pub(in super::super) fn forget() {
            VALID.store(false, Ordering::Relaxed);
        }
    }
    #[cfg(not(any(Py_LIMITED_API, Py_3_14, Py_GIL_DISABLED, PyPy, GraalPy)))]
    pub(super) use tags::{forget, record, snapshot, unchanged, AVAILABLE};

    /// Without version tags: every check looks up.
    #[cfg(any(Py_LIMITED_API, Py_3_14, Py_GIL_DISABLED, PyPy, GraalPy))]
    pub(super) const AVAILABLE: bool = false;

    /// Without version tags: nothing to take.
    #[cfg(any(Py_LIMITED_API, Py_3_14, Py_GIL_DISABLED, PyPy, GraalPy))]
    #[inline(always)]
    pub(super) fn snapshot(
        _modules: *mut ffi::PyObject,
        _attrs: *mut ffi::PyObject,
    ) -> Option<[u64; 4]> {
        None
    }

    /// Without version tags: nothing recorded.
    #[cfg(any(Py_LIMITED_API, Py_3_14, Py_GIL_DISABLED, PyPy, GraalPy))]
    #[inline(always)]
    pub(super) fn record(
        _before: Option<[u64; 4]>,
        _modules: *mut ffi::PyObject,
        _attrs: *mut ffi::PyObject,
        _other: *mut ffi::PyObject,
    ) {
    }

    /// Without version tags: always looked up.
    #[cfg(any(Py_LIMITED_API, Py_3_14, Py_GIL_DISABLED, PyPy, GraalPy))]
    #[inline(always)]
    pub(super) fn unchanged(_modules: *mut ffi::PyObject, _attrs: *mut ffi::PyObject) -> bool {
        false
    }

    /// Without version tags: nothing to forget.
    #[cfg(any(Py_LIMITED_API, Py_3_14, Py_GIL_DISABLED, PyPy, GraalPy))]
    pub(super) fn forget() {}
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

/// The error for NumPy arrays while rust-numpy's table cannot be followed.
fn refusal(why: std::fmt::Arguments<'_>) -> PyErr {
    crate::error::RegistryError::RustNumpyUnseen(why.to_string()).into()
}

/// [`check`]'s slow path (phase 1: may run Python code, the first time).
#[cold]
#[inline(never)]
fn recheck(py: Python<'_>) -> PyResult<()> {
    let registry = super::api(py)?;
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

/// NumPy's `multiarray` module, from NumPy's ABI version (its verified C
/// API table, never `numpy.__version__`).
fn learn_place(py: Python<'_>) -> PyResult<Place> {
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

/// The table in `cap` if it is rust-numpy's (or a dlcast build's in its
/// place): a capsule named [`ATTR`], a version of at least 1, and its four
/// functions in the image of one loaded library, which no table made with
/// `ctypes` has (its callbacks lie in memory `libffi` maps outside any
/// library's image). The table itself is heap memory in both crates, so
/// its functions are the anchor. Runs no Python code.
fn verify(cap: &Bound<'_, PyAny>) -> Option<&'static Shared> {
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
fn adopt(shared: &'static Shared) -> PyResult<()> {
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

/// Publishes dlcast's registry as rust-numpy's table (once per build):
/// returns its capsule, kept alive for the process.
fn publish(py: Python<'_>, registry: &'static BorrowApi) -> PyResult<*mut ffi::PyObject> {
    let done = PUBLISHED.load(Ordering::Acquire);
    if !done.is_null() {
        return Ok(done);
    }
    let table = Box::leak(Box::new(Shared {
        version: 1,
        flags: (registry as *const BorrowApi).cast_mut().cast(),
        acquire: np_acquire,
        acquire_mut: np_acquire_mut,
        release: np_release,
        release_mut: np_release_mut,
    }));
    // SAFETY: the table is leaked (valid for the process), the name is a
    // static C string, and there is no destructor.
    let cap = unsafe {
        Bound::from_owned_ptr_or_err(
            py,
            ffi::PyCapsule_New((table as *mut Shared).cast(), ATTR.as_ptr(), None),
        )?
    };
    let cap = cap.into_ptr();
    PUBLISHED.store(cap, Ordering::Release);
    Ok(cap)
}

// ---- dlcast's table, published when rust-numpy had none -----------------

/// rust-numpy's live borrows entered in dlcast's registry: the array (which
/// rust-numpy keeps alive until it releases it), whether writable, and the
/// registry's id (0 for an empty array, not entered).
static HELD: OneWordLock<Vec<(usize, bool, u64)>> = OneWordLock::new(Vec::new());

fn held() -> LockGuard<'static, Vec<(usize, bool, u64)>> {
    HELD.lock()
}

/// The registry request for the array `a` (all of its bytes), or `None`
/// for one that touches no memory.
///
/// # Safety
/// `a` is a live `numpy.ndarray` (or subclass) and the GIL is held.
unsafe fn array_request(a: *mut ffi::PyObject, writable: bool) -> Option<BorrowReq> {
    // SAFETY: (caller) a live array starts with `ArrayHead`'s fields up to
    // `flags`; `weakreflist` is not read.
    let (data, nd, dims, strides, descr) = unsafe {
        let h = a.cast::<ArrayHead>();
        (
            (*h).data,
            (*h).nd,
            (*h).dimensions,
            (*h).strides,
            (*h).descr,
        )
    };
    // SAFETY: every array has a live descr.
    let itemsize = unsafe { crate::npyffi::descr_elsize(descr, NUMPY2.load(Ordering::Relaxed)) };
    let itemsize = usize::try_from(itemsize).ok().filter(|&i| i > 0)?;
    let nd = usize::try_from(nd).unwrap_or(0);
    let (dims, strides): (&[isize], &[isize]) = if nd == 0 {
        (&[], &[])
    } else {
        // SAFETY: an array with `nd` > 0 has `nd` dimensions and strides.
        unsafe {
            (
                std::slice::from_raw_parts(dims, nd),
                std::slice::from_raw_parts(strides, nd),
            )
        }
    };
    let start = data as usize;
    let (mut lo, mut hi, mut modulus, mut exact) = (0isize, 0isize, 0usize, true);
    for (&n, &s) in dims.iter().zip(strides) {
        if n <= 0 {
            return None;
        }
        if n > 1 {
            modulus = super::gcd(modulus, s.unsigned_abs());
        }
        match (n - 1).checked_mul(s) {
            Some(step) if step < 0 => lo = lo.checked_add(step).unwrap_or(isize::MIN),
            Some(step) => hi = hi.checked_add(step).unwrap_or(isize::MAX),
            None => exact = false,
        }
    }
    let span = match (
        start.checked_add_signed(lo),
        hi.checked_add_unsigned(itemsize)
            .and_then(|h| start.checked_add_signed(h)),
    ) {
        (Some(l), Some(h)) if exact => Some((l, h)),
        _ => None,
    };
    // A span that does not fit in the address space: all of it, every byte.
    let (lo, hi, modulus) = span.map_or((0, usize::MAX, 1), |(l, h)| (l, h, modulus));
    let cpu = crate::device::Device::CPU;
    let (itemsize, modulus) = super::compact(itemsize, modulus);
    Some(BorrowReq {
        lo,
        hi,
        start,
        modulus,
        call: 0,
        function: RUST_NUMPY.as_ptr(),
        param: "".as_ptr(),
        device_type: cpu.device_type,
        device_id: cpu.device_id,
        itemsize,
        function_len: super::name_len(RUST_NUMPY.len()),
        param_len: 0,
        writable: writable as u8,
    })
}

/// rust-numpy's borrow of `a` in dlcast's registry `flags`: 0 or -1.
///
/// # Safety
/// As [`array_request`]; `flags` is the registry this table was made with.
unsafe fn enter(flags: *mut c_void, a: *mut ffi::PyObject, writable: bool) -> c_int {
    // SAFETY: `flags` is the `'static` registry the table was published with.
    let registry = unsafe { &*flags.cast_const().cast::<BorrowApi>() };
    let mut list = held();
    if list.try_reserve(1).is_err() {
        return -1;
    }
    // SAFETY: (caller).
    let id = match unsafe { array_request(a, writable) } {
        None => 0,
        Some(req) => {
            let mut conflict = MaybeUninit::<BorrowReq>::uninit();
            // SAFETY: the registry's function, with a valid request and slot
            // (read by no one: a refusal is all rust-numpy is told).
            match unsafe { (registry.acquire)(&req, conflict.as_mut_ptr()) } {
                0 => return -1,
                id => id,
            }
        }
    };
    list.push((a as usize, writable, id));
    0
}

/// Ends rust-numpy's latest borrow of `a` of this kind.
fn leave(flags: *mut c_void, a: *mut ffi::PyObject, writable: bool) {
    let id = {
        let mut list = held();
        match list
            .iter()
            .rposition(|&(p, w, _)| p == a as usize && w == writable)
        {
            Some(i) => list.swap_remove(i).2,
            None => return,
        }
    };
    if id != 0 {
        // SAFETY: `flags` is the `'static` registry the table was published
        // with, and `id` one it handed out.
        unsafe { ((*flags.cast_const().cast::<BorrowApi>()).release)(id) }
    }
}

unsafe extern "C" fn np_acquire(flags: *mut c_void, a: *mut ffi::PyObject) -> c_int {
    // SAFETY: rust-numpy passes a live array, with the GIL held.
    unsafe { enter(flags, a, false) }
}

unsafe extern "C" fn np_acquire_mut(flags: *mut c_void, a: *mut ffi::PyObject) -> c_int {
    // SAFETY: rust-numpy passes a live array, with the GIL held.
    if unsafe { (*a.cast::<ArrayHead>()).flags } & NPY_ARRAY_WRITEABLE == 0 {
        return -2;
    }
    // SAFETY: as above.
    unsafe { enter(flags, a, true) }
}

unsafe extern "C" fn np_release(flags: *mut c_void, a: *mut ffi::PyObject) {
    leave(flags, a, false)
}

unsafe extern "C" fn np_release_mut(flags: *mut c_void, a: *mut ffi::PyObject) {
    leave(flags, a, true)
}

// ---- dlcast's views in rust-numpy's registry -----------------------------

/// dlcast borrows (by id) whose views also hold the array in rust-numpy's
/// registry.
static HOLDS: OneWordLock<Vec<(u64, Hold)>> = OneWordLock::new(Vec::new());

fn holds() -> LockGuard<'static, Vec<(u64, Hold)>> {
    HOLDS.lock()
}

/// Ends the holds in rust-numpy's registries of the dlcast borrow `id`, if
/// there are any.
pub(crate) fn release(id: u64) {
    let mut mine: SmallVec<[Hold; 1]> = SmallVec::new();
    {
        let mut list = holds();
        while let Some(i) = list.iter().rposition(|(i, _)| *i == id) {
            mine.push(list.swap_remove(i).1);
        }
    }
    // Released (by `Hold::drop`) outside the lock: rust-numpy's function
    // takes its own.
    drop(mine);
}

/// A dlcast view's borrow in rust-numpy's registry, released on drop.
///
/// rust-numpy computes its key from the array's fields when it acquires and
/// again when it releases (and panics, aborting the process, if it finds no
/// entry). Python code may change an array's fields while a view is held
/// (`a.shape = ...` in a callback), so rust-numpy is passed a copy of the
/// fields as they were read, the same both times, not the array: its `base`
/// is the array's base (or the array itself), kept alive here like the
/// dtype, which rust-numpy reads too.
pub(crate) struct Hold {
    shared: &'static Shared,
    writable: bool,
    /// Whether rust-numpy granted it (else there is nothing to release).
    acquired: bool,
    tp: *mut ffi::PyTypeObject,
    data: *mut c_char,
    nd: c_int,
    flags: c_int,
    /// The dimensions, then the byte strides (inline up to two
    /// dimensions: a smaller `Hold`, moved several times per view).
    dims: SmallVec<[isize; 4]>,
    root: Py<PyAny>,
    descr: Py<PyAny>,
}

impl Hold {
    /// The copy of the array rust-numpy is passed.
    fn head(&self) -> ArrayHead {
        let nd = self.dims.len() / 2;
        let mut ob_base = ffi::PyObject_HEAD_INIT;
        ob_base.ob_type = self.tp;
        ArrayHead {
            ob_base,
            data: self.data,
            nd: self.nd,
            dimensions: self.dims.as_ptr(),
            strides: self.dims[nd..].as_ptr(),
            base: self.root.as_ptr(),
            descr: self.descr.as_ptr().cast(),
            flags: self.flags,
            weakreflist: std::ptr::null_mut(),
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.acquired {
            return;
        }
        let mut head = self.head();
        let release = if self.writable {
            self.shared.release_mut
        } else {
            self.shared.release
        };
        // SAFETY: rust-numpy's function, with the fields it was acquired
        // with; views are `!Send` and drop on the thread holding the GIL.
        unsafe { release(self.shared.flags, (&raw mut head).cast()) }
    }
}

// SAFETY: the raw pointers are copies of an array's fields, only passed to
// rust-numpy's functions, which run with the GIL held (views, whose borrows
// these are, are `!Send`); the objects they point to are kept alive by the
// `Py` fields.
unsafe impl Send for Hold {}

/// What phase 1 acquired for one exact `numpy.ndarray` argument in each of
/// rust-numpy's registries in use ([`foreign`]). rust-numpy's functions are
/// called only in phase 1 ([`pre_hold`]) and after the body (releases):
/// they are other code (a table Python code put in rust-numpy's place may
/// even run Python code), so never between the raw reads and the body.
/// Phase 2 only checks that the holds still describe the array as it is
/// read ([`PreHold::matches`]): else the reads stop and phase 1 acquires
/// again.
pub(crate) struct PreHold {
    holds: SmallVec<[Hold; 1]>,
    /// How many tables were in use when acquired.
    tables: usize,
}

/// Phase 1: acquires `arr` (a live exact `numpy.ndarray`) in each of
/// `foreign`'s tables; `Err` with rust-numpy's code (-1: in use, -2: not
/// writeable) if one refuses (those already granted are released).
pub(crate) fn pre_hold(
    foreign: &'static Foreign,
    arr: &Bound<'_, PyAny>,
    writable: bool,
) -> Result<PreHold, c_int> {
    let mut holds: SmallVec<[Hold; 1]> = SmallVec::new();
    for &table in foreign.tables() {
        // SAFETY: the lists hold only verified tables kept alive for the
        // process (see `foreign`).
        let shared = unsafe { &*table };
        holds.push(hold_in(shared, arr, writable)?);
    }
    Ok(PreHold {
        holds,
        tables: foreign.tables().len(),
    })
}

impl PreHold {
    /// Phase 2 (reads only, no call): whether these holds cover every table
    /// in use, for a view of that writability, and were acquired with the
    /// fields `arr` has now (its type, data, dimensions, strides, base,
    /// dtype and flags).
    pub(crate) fn matches(
        &self,
        arr: &Bound<'_, PyAny>,
        foreign: &Foreign,
        writable: bool,
    ) -> bool {
        let Some(first) = self.holds.first() else {
            return false;
        };
        if self.tables != foreign.tables().len() || first.writable != writable {
            return false;
        }
        let p = arr.as_ptr();
        // SAFETY: `arr` is a live exact `numpy.ndarray` and the GIL is held;
        // its fields up to `flags` are those of `ArrayHead`.
        let h = unsafe { &*p.cast::<ArrayHead>() };
        let nd = usize::try_from(h.nd).unwrap_or(0);
        let same_dims = nd * 2 == first.dims.len()
            && (nd == 0
                // SAFETY: an array with `nd` > 0 has `nd` dimensions and
                // strides, valid while the GIL is held and no Python code runs.
                || unsafe {
                    std::slice::from_raw_parts(h.dimensions, nd) == &first.dims[..nd]
                        && std::slice::from_raw_parts(h.strides, nd) == &first.dims[nd..]
                });
        let root = if h.base.is_null() { p } else { h.base };
        // SAFETY: `p` is a live object.
        let tp = unsafe { ffi::Py_TYPE(p) };
        same_dims
            && tp == first.tp
            && h.data == first.data
            && h.nd == first.nd
            && h.flags == first.flags
            && root == first.root.as_ptr()
            && h.descr.cast::<ffi::PyObject>() == first.descr.as_ptr()
    }

    /// After the last pass: the holds live as long as the dlcast borrow
    /// `borrow` ([`release`]); `false` (nothing moved: they stay here, and
    /// are released on drop, after the body) when there is no memory to
    /// note them.
    pub(crate) fn commit(&mut self, borrow: &super::Borrow) -> bool {
        let mut list = holds();
        if list.try_reserve(self.holds.len()).is_err() {
            return false;
        }
        list.extend(self.holds.drain(..).map(|h| (borrow.id, h)));
        true
    }
}

/// Acquires `arr` in the registry `shared` (see [`pre_hold`]).
fn hold_in(shared: &'static Shared, arr: &Bound<'_, PyAny>, writable: bool) -> Result<Hold, c_int> {
    let p = arr.as_ptr();
    // SAFETY: `arr` is a live exact `numpy.ndarray` and the GIL is held; its
    // fields up to `flags` are those of `ArrayHead`.
    let h = unsafe { &*p.cast::<ArrayHead>() };
    let nd = usize::try_from(h.nd).unwrap_or(0);
    let mut dims: SmallVec<[isize; 4]> = SmallVec::new();
    if nd > 0 {
        // SAFETY: an array with `nd` > 0 has `nd` dimensions and strides,
        // valid while we hold the GIL and no Python code runs.
        unsafe {
            dims.extend_from_slice(std::slice::from_raw_parts(h.dimensions, nd));
            dims.extend_from_slice(std::slice::from_raw_parts(h.strides, nd));
        }
    }
    let root = if h.base.is_null() { p } else { h.base };
    let py = arr.py();
    let mut hold = Hold {
        shared,
        writable,
        acquired: false,
        // SAFETY: `p` is a live object.
        tp: unsafe { ffi::Py_TYPE(p) },
        data: h.data,
        nd: h.nd,
        flags: h.flags,
        dims,
        // SAFETY: `root` (the array or its base) and the descr are live
        // objects: new strong references (an incref, no Python code).
        root: unsafe { Bound::from_borrowed_ptr(py, root) }.unbind(),
        // SAFETY: as above.
        descr: unsafe { Bound::from_borrowed_ptr(py, h.descr.cast()) }.unbind(),
    };
    let mut head = hold.head();
    let acquire = if writable {
        shared.acquire_mut
    } else {
        shared.acquire
    };
    // SAFETY: rust-numpy's function with its `flags` and a struct laid out
    // as an array, whose fields are the array's; the GIL is held.
    let rc = unsafe { acquire(shared.flags, (&raw mut head).cast()) };
    if rc != 0 {
        return Err(rc);
    }
    hold.acquired = true;
    Ok(hold)
}
