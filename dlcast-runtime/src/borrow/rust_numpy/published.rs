//! dlcast's own table, published in rust-numpy's place when there was none
//! ([`publish`]): its functions enter rust-numpy's borrows in dlcast's
//! registry, so that one registry serves both, with `flags` pointing to
//! that registry's [`BorrowApi`], by which every dlcast build recognises
//! the table as one of its own.

use super::super::{BorrowApi, BorrowReq, LockGuard, OneWordLock};
use super::place::NUMPY2;
use super::table::Shared;
use super::{ATTR, RUST_NUMPY};
// NumPy's array object (as rust-numpy's functions are passed it) and dtype.
use crate::npyffi::{PyArrayObject as ArrayHead, NPY_ARRAY_WRITEABLE};
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicPtr, Ordering};

/// The capsule of the table this build published, if it did (kept alive).
static PUBLISHED: AtomicPtr<ffi::PyObject> = AtomicPtr::new(std::ptr::null_mut());

/// Publishes dlcast's registry as rust-numpy's table (once per build):
/// returns its capsule, kept alive for the process.
pub(super) fn publish(
    py: Python<'_>,
    registry: &'static BorrowApi,
) -> PyResult<*mut ffi::PyObject> {
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
            modulus = super::super::gcd(modulus, s.unsigned_abs());
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
    let (itemsize, modulus) = super::super::compact(itemsize, modulus);
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
        function_len: super::super::name_len(RUST_NUMPY.len()),
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
