//! The sound limit: what a NumPy `&[f64]` / `&mut [f64]` parameter must
//! cost at least, written by hand for one dtype and rank, as the reference
//! row of the instruction table (bench/callgrind.py).
//!
//! It makes every check that soundness needs for an exact `numpy.ndarray`
//! and nothing else: the exact type (no Python code can run: the fields are
//! read directly), the dtype (`float64`, native byte order), the rank (1),
//! a contiguous stride, alignment, the writable flag for the writable
//! version, and an entry in a range registry behind a one-word lock, held
//! while the body runs. No error formatting beyond a static text, no
//! registry shared with other extensions, no rust-numpy interplay, no other
//! producer: a floor for the instruction count, not a design.

use numpy::npyffi::{self, NpyTypes, PyArrayObject, NPY_ARRAY_WRITEABLE, NPY_TYPES};
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::prelude::*;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Ranges held at once by this prototype (a bench never nests deeper).
const CAP: usize = 64;

/// One held byte range.
#[derive(Clone, Copy)]
struct Range {
    lo: usize,
    hi: usize,
    writable: bool,
}

/// The registry: a fixed array of ranges behind a one-word spin lock.
struct Registry {
    lock: AtomicBool,
    entries: UnsafeCell<([Range; CAP], usize)>,
}

// SAFETY: `entries` is only touched between a successful `lock` and its
// `unlock`, so by one thread at a time.
unsafe impl Sync for Registry {}

static REGISTRY: Registry = Registry {
    lock: AtomicBool::new(false),
    entries: UnsafeCell::new((
        [Range {
            lo: 0,
            hi: 0,
            writable: false,
        }; CAP],
        0,
    )),
};

impl Registry {
    fn with<R>(&self, f: impl FnOnce(&mut ([Range; CAP], usize)) -> R) -> R {
        while self
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: the lock is held (see `Sync` above).
        let r = f(unsafe { &mut *self.entries.get() });
        self.lock.store(false, Ordering::Release);
        r
    }
}

/// A held range, released on drop (last in, first out in the common case).
struct Held(Range);

fn acquire(lo: usize, hi: usize, writable: bool) -> PyResult<Held> {
    let r = Range { lo, hi, writable };
    let ok = REGISTRY.with(|(entries, len)| {
        let conflict = entries[..*len]
            .iter()
            .any(|e| (e.writable || writable) && e.lo < hi && lo < e.hi);
        if conflict || *len == CAP {
            return false;
        }
        entries[*len] = r;
        *len += 1;
        true
    });
    if ok {
        Ok(Held(r))
    } else {
        Err(PyBufferError::new_err("the array is borrowed"))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        REGISTRY.with(|(entries, len)| {
            let Some(i) = entries[..*len]
                .iter()
                .rposition(|e| e.lo == self.0.lo && e.hi == self.0.hi)
            else {
                return;
            };
            entries.copy_within(i + 1..*len, i);
            *len -= 1;
        });
    }
}

/// The checks of a 1-D float64 slice parameter; the data pointer and
/// length, and the held range.
fn slice_f64(x: &Bound<'_, PyAny>, writable: bool) -> PyResult<(*mut f64, usize, Held)> {
    let py = x.py();
    let p = x.as_ptr();
    // SAFETY: NumPy's API table is initialised by the call (rust-numpy
    // imports it); `p` is a live object.
    let exact = unsafe {
        pyo3::ffi::Py_TYPE(p) == npyffi::get_type_object(py, NpyTypes::PyArray_Type).cast()
    };
    if !exact {
        return Err(PyTypeError::new_err("expected a numpy.ndarray"));
    }
    // SAFETY: an exact ndarray is a `PyArrayObject`; its fields are read
    // with no Python code running until the body returns.
    let a = unsafe { &(*p.cast::<PyArrayObject>()).fields };
    // SAFETY: every array has a descriptor.
    let d = unsafe { &(*a.descr).fields };
    if a.nd != 1 || d.type_num != NPY_TYPES::NPY_DOUBLE as i32 || d.byteorder as u8 == b'>' {
        return Err(PyTypeError::new_err("expected a 1-D float64 array"));
    }
    // SAFETY: `nd == 1`: one dimension and one stride.
    let (n, s) = unsafe { (*a.dimensions as usize, *a.strides) };
    if n > 1 && s != 8 {
        return Err(PyTypeError::new_err("expected a contiguous array"));
    }
    let data = a.data as usize;
    if data % 8 != 0 {
        return Err(PyTypeError::new_err("expected aligned data"));
    }
    if writable && a.flags & NPY_ARRAY_WRITEABLE == 0 {
        return Err(PyTypeError::new_err("expected a writable array"));
    }
    let held = acquire(data, data + n * 8, writable)?;
    Ok((a.data.cast(), n, held))
}

/// `&[f64]`: the length of a 1-D contiguous float64 array.
#[pyfunction]
pub fn limit_slice_len(x: &Bound<'_, PyAny>) -> PyResult<usize> {
    let (data, n, _held) = slice_f64(x, false)?;
    // SAFETY: checked above; `_held` keeps writers out until the end.
    let s = unsafe { std::slice::from_raw_parts(data.cast_const(), n) };
    Ok(s.len())
}

/// `&mut [f64]`: the same, writable.
#[pyfunction]
pub fn limit_slice_len_mut(x: &Bound<'_, PyAny>) -> PyResult<usize> {
    let (data, n, _held) = slice_f64(x, true)?;
    // SAFETY: checked above; `_held` keeps every other view out.
    let s = unsafe { std::slice::from_raw_parts_mut(data, n) };
    Ok(s.len())
}
