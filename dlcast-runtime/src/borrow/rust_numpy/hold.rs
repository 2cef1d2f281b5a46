//! dlcast's views held in rust-numpy's own registries (the foreign tables
//! dlcast adopted, [`super::foreign`]): acquired in phase 1 for each exact
//! `numpy.ndarray` argument ([`pre_hold`]), checked in phase 2
//! ([`PreHold::matches`]), kept with the dlcast borrow ([`PreHold::commit`])
//! and released when that borrow ends ([`release`]).

use super::super::{LockGuard, OneWordLock};
use super::table::{Foreign, Shared};
// NumPy's array object (as rust-numpy's functions are passed it).
use crate::npyffi::PyArrayObject as ArrayHead;
use pyo3::ffi;
use pyo3::prelude::*;
use smallvec::SmallVec;
use std::ffi::{c_char, c_int};

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
/// rust-numpy's registries in use ([`super::foreign`]). rust-numpy's
/// functions are called only in phase 1 ([`pre_hold`]) and after the body
/// (releases): they are other code (a table Python code put in rust-numpy's
/// place may even run Python code), so never between the raw reads and the
/// body. Phase 2 only checks that the holds still describe the array as it
/// is read ([`PreHold::matches`]): else the reads stop and phase 1 acquires
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
    pub(crate) fn commit(&mut self, borrow: &super::super::Borrow) -> bool {
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
