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
//! dlcast looks there once, when it first meets a `numpy.ndarray` (phase 1
//! of that call, see [`learn`]):
//!
//! - **No capsule yet**: dlcast publishes one whose functions enter
//!   rust-numpy's borrows in dlcast's own registry (see [`super`]), with
//!   `flags` pointing to that registry's [`BorrowApi`], by which every
//!   dlcast build recognises it. From then on there is one registry for
//!   both, and a dlcast call pays nothing for it.
//! - **A capsule of rust-numpy's**: every view dlcast makes of an exact
//!   `numpy.ndarray` is also acquired there ([`hold`]), read or write as the
//!   view, and released when the view's borrow ends ([`release`]). The
//!   holds sit in a table of this extension keyed by the dlcast borrow's id
//!   (the view's own layout is unchanged: the NumPy path pays one atomic
//!   load when it reads and one when it drops).
//!
//! Either way the answer holds for the process (a rust-numpy extension
//! keeps the first table it found, and finds dlcast's if dlcast published
//! first), so nothing is looked up again: no watching for extensions
//! imported later, and no Python code for this in phase 2 (rust-numpy's
//! functions are C calls; they rely on their extension's NumPy C API, which
//! its own first borrow loaded).
//!
//! Not covered in the second case: subclasses of `numpy.ndarray`, arrays
//! read through `__dlpack__`, and memory reached through other producers
//! (rust-numpy does not see those either). In the first case rust-numpy's
//! borrows are compared by memory with every view in the registry.

use super::{BorrowApi, BorrowReq, EMPTY};
use pyo3::ffi;
use pyo3::prelude::*;
use smallvec::SmallVec;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, Ordering};
use std::sync::Mutex;

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

/// Not looked yet.
const UNKNOWN: u8 = 0;
/// One registry for both (published by a dlcast build), or no working
/// together (the attribute holds something rust-numpy cannot use either).
const SETTLED: u8 = 1;
/// rust-numpy's own registry, in [`FOREIGN`].
const FOREIGN_REGISTRY: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
/// rust-numpy's table when [`STATE`] is [`FOREIGN_REGISTRY`], else NULL.
static FOREIGN: AtomicPtr<Shared> = AtomicPtr::new(std::ptr::null_mut());
/// The table this build published as rust-numpy's, if it did.
static PUBLISHED: AtomicPtr<Shared> = AtomicPtr::new(std::ptr::null_mut());
/// Whether NumPy is 2.x (the layout of a dtype's `elsize`); set before this
/// build publishes its table.
static NUMPY2: AtomicBool = AtomicBool::new(true);

/// rust-numpy's own registry, if views of NumPy arrays must be acquired
/// there too (one atomic load).
#[inline(always)]
pub(crate) fn foreign() -> Option<&'static Shared> {
    let p = FOREIGN.load(Ordering::Acquire);
    // SAFETY: only tables read from a capsule that is kept alive for the
    // process (a strong reference is leaked) are stored.
    (!p.is_null()).then(|| unsafe { &*p })
}

/// Finds rust-numpy's registry, or publishes dlcast's in its place, the
/// first time dlcast meets a `numpy.ndarray` (Python code: phase 1 only).
/// `false` if that failed for now (the array then takes the generic path,
/// and the next one tries again).
pub(crate) fn learn(py: Python<'_>) -> bool {
    if STATE.load(Ordering::Acquire) != UNKNOWN {
        return true;
    }
    match look_up_or_publish(py) {
        Ok(state) => {
            STATE.store(state, Ordering::Release);
            true
        }
        Err(_) => false,
    }
}

#[cold]
fn look_up_or_publish(py: Python<'_>) -> PyResult<u8> {
    let registry = super::api(py)?;
    let version = py.import("numpy")?.getattr("__version__")?;
    let version = version.str()?;
    let major: u32 = version
        .to_cow()?
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .ok_or_else(|| {
            pyo3::exceptions::PyRuntimeError::new_err("numpy.__version__ is not a version")
        })?;
    let name = if major >= 2 {
        "numpy._core.multiarray"
    } else {
        "numpy.core.multiarray"
    };
    let module = py.import(name)?;
    match module.getattr(ATTR_NAME) {
        Ok(cap) => {
            // SAFETY: GetPointer checks the object is a capsule of this
            // exact name (else NULL with an error set).
            let ptr = unsafe { ffi::PyCapsule_GetPointer(cap.as_ptr(), ATTR.as_ptr()) };
            if ptr.is_null() {
                // Not rust-numpy's table: its extensions fail on it too.
                drop(PyErr::take(py));
                return Ok(SETTLED);
            }
            // SAFETY: a capsule of this name holds rust-numpy's table,
            // whose every version starts with the fields of `Shared`.
            let shared = unsafe { &*ptr.cast::<Shared>() };
            if shared.version < 1 {
                return Ok(SETTLED);
            }
            if std::ptr::eq(shared.flags.cast_const().cast::<BorrowApi>(), registry) {
                // Published by a dlcast build: already one registry.
                return Ok(SETTLED);
            }
            // Kept for the process, as rust-numpy does: the table stays valid.
            std::mem::forget(cap.unbind());
            FOREIGN.store(ptr.cast(), Ordering::Release);
            Ok(FOREIGN_REGISTRY)
        }
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(py) => {
            NUMPY2.store(major >= 2, Ordering::Relaxed);
            let table = Box::leak(Box::new(Shared {
                version: 1,
                flags: (registry as *const BorrowApi).cast_mut().cast(),
                acquire: np_acquire,
                acquire_mut: np_acquire_mut,
                release: np_release,
                release_mut: np_release_mut,
            }));
            // Kept for the process (the capsule is freed with NumPy's module
            // at exit; the table must outlive every rust-numpy extension).
            PUBLISHED.store(table, Ordering::Release);
            // SAFETY: the table is leaked (valid for the process), the name
            // is a static C string, and there is no destructor.
            let cap = unsafe {
                Bound::from_owned_ptr_or_err(
                    py,
                    ffi::PyCapsule_New((table as *mut Shared).cast(), ATTR.as_ptr(), None),
                )?
            };
            // No Python code ran since the look-up (the GIL is held), so no
            // rust-numpy extension published in between.
            module.setattr(ATTR_NAME, cap)?;
            Ok(SETTLED)
        }
        Err(e) => Err(e),
    }
}

/// The leading fields of NumPy's `PyArrayObject_fields` (1.x and 2.x), and
/// the struct passed to rust-numpy's functions (with `weakreflist`, the
/// last field its bindings declare).
#[repr(C)]
struct ArrayHead {
    ob_base: ffi::PyObject,
    data: *mut c_char,
    nd: c_int,
    dimensions: *const isize,
    strides: *const isize,
    base: *mut ffi::PyObject,
    descr: *mut ffi::PyObject,
    flags: c_int,
    weakreflist: *mut ffi::PyObject,
}

/// `NPY_ARRAY_WRITEABLE`.
const NPY_WRITEABLE: c_int = 0x0400;

/// The leading fields of NumPy's `PyArray_Descr`.
#[repr(C)]
struct DescrHead {
    ob_base: ffi::PyObject,
    typeobj: *mut ffi::PyTypeObject,
    kind: c_char,
    type_char: c_char,
    byteorder: c_char,
    flags_or_former: c_char,
    type_num: c_int,
}

/// NumPy 2's `PyArray_Descr` up to `elsize`.
#[repr(C)]
struct Descr2 {
    head: DescrHead,
    flags: u64,
    elsize: isize,
}

/// NumPy 1's `PyArray_Descr` up to `elsize`.
#[repr(C)]
struct Descr1 {
    head: DescrHead,
    elsize: c_int,
}

// ---- dlcast's table, published when rust-numpy had none -----------------

/// rust-numpy's live borrows entered in dlcast's registry: the array (which
/// rust-numpy keeps alive until it releases it), whether writable, and the
/// registry's id (0 for an empty array, not entered).
static HELD: Mutex<Vec<(usize, bool, u64)>> = Mutex::new(Vec::new());

fn held() -> std::sync::MutexGuard<'static, Vec<(usize, bool, u64)>> {
    HELD.lock().unwrap_or_else(|e| e.into_inner())
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
    let itemsize = if NUMPY2.load(Ordering::Relaxed) {
        // SAFETY: every array has a live descr, laid out as NumPy 2's.
        unsafe { (*descr.cast::<Descr2>()).elsize }
    } else {
        // SAFETY: as above, NumPy 1's layout.
        unsafe { (*descr.cast::<Descr1>()).elsize as isize }
    };
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
    Some(BorrowReq {
        device_type: cpu.device_type,
        device_id: cpu.device_id,
        lo,
        hi,
        start,
        modulus,
        itemsize,
        writable: writable as u8,
        call: 0,
        function: RUST_NUMPY.as_ptr(),
        function_len: RUST_NUMPY.len(),
        param: "".as_ptr(),
        param_len: 0,
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
            let mut conflict = EMPTY;
            // SAFETY: the registry's function, with a valid request and slot.
            match unsafe { (registry.acquire)(&req, &mut conflict) } {
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
    if unsafe { (*a.cast::<ArrayHead>()).flags } & NPY_WRITEABLE == 0 {
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
static HOLDS: Mutex<Vec<(u64, Hold)>> = Mutex::new(Vec::new());

fn holds() -> std::sync::MutexGuard<'static, Vec<(u64, Hold)>> {
    HOLDS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Ends the hold in rust-numpy's registry of the dlcast borrow `id`, if
/// there is one.
pub(crate) fn release(id: u64) {
    let hold = {
        let mut list = holds();
        match list.iter().rposition(|(i, _)| *i == id) {
            Some(i) => list.swap_remove(i).1,
            None => return,
        }
    };
    // Released (by `Hold::drop`) outside the lock: rust-numpy's function
    // takes its own.
    drop(hold);
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
    /// The dimensions, then the byte strides.
    dims: SmallVec<[isize; 8]>,
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
            descr: self.descr.as_ptr(),
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

/// Acquires the exact `numpy.ndarray` `arr` in rust-numpy's registry
/// `shared` (C calls only: phase 2) for as long as the dlcast borrow
/// `borrow` lives; `Err` with rust-numpy's code (-1: in use, -2: not
/// writeable) if refused.
pub(crate) fn hold(
    shared: &'static Shared,
    arr: &Bound<'_, PyAny>,
    writable: bool,
    borrow: &super::Borrow,
) -> Result<(), c_int> {
    let p = arr.as_ptr();
    // SAFETY: `arr` is a live exact `numpy.ndarray` and the GIL is held; its
    // fields up to `flags` are those of `ArrayHead`.
    let h = unsafe { &*p.cast::<ArrayHead>() };
    let nd = usize::try_from(h.nd).unwrap_or(0);
    let mut dims: SmallVec<[isize; 8]> = SmallVec::new();
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
        descr: unsafe { Bound::from_borrowed_ptr(py, h.descr) }.unbind(),
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
    let mut list = holds();
    if list.try_reserve(1).is_err() {
        drop(list);
        // Released by its drop; the view is refused like a conflict.
        drop(hold);
        return Err(-1);
    }
    list.push((borrow.id, hold));
    Ok(())
}
