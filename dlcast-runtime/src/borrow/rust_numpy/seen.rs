//! The state of the dictionaries [`super::place::look`] looks in (and of
//! those where [`super::place::shadowed`] looks) when it last found them as
//! expected, by their version tags (PEP 509: CPython gives a dict a new tag
//! whenever an entry is added, removed or replaced). While every tag is the
//! same, so is every entry, and [`super::checks::unchanged`] skips the
//! look-ups. The tag field is deprecated in CPython 3.12 (it stays until
//! 3.14, which removes it) and absent from the limited API and from other
//! interpreters: there every call looks up.

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
