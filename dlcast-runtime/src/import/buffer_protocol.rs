//! Objects with only the buffer protocol: `bytes`, `bytearray`,
//! `memoryview`, `array.array`, ...

use super::{make_raw, Dims, ImportError, ImportPath, Owner, RawTensor};
use crate::device::Device;
use crate::dtype::{code, DType};
use crate::error::ImportFault;
use crate::layout;
#[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
use pyo3::{ffi, prelude::*};
use smallvec::SmallVec;
use std::ffi::CStr;

/// The element type of a buffer-protocol format string (PEP 3118 / `struct`).
fn buffer_dtype(format: &CStr, itemsize: usize) -> Option<DType> {
    let bytes = format.to_bytes();
    let (order, rest) = match bytes.first() {
        Some(c @ (b'@' | b'=' | b'<' | b'>' | b'!')) => (*c, &bytes[1..]),
        _ => (b'@', bytes),
    };
    let native_little = cfg!(target_endian = "little");
    let swapped = match order {
        b'<' => !native_little,
        b'>' | b'!' => native_little,
        _ => false,
    };
    if swapped {
        return None;
    }
    let bits = u8::try_from(itemsize.checked_mul(8)?).ok()?;
    let dtype = match rest {
        b"?" => DType::new(code::BOOL, bits, 1),
        [b'b' | b'h' | b'i' | b'l' | b'q' | b'n'] => DType::new(code::INT, bits, 1),
        [b'B' | b'H' | b'I' | b'L' | b'Q' | b'N'] => DType::new(code::UINT, bits, 1),
        [b'e' | b'f' | b'd'] => DType::new(code::FLOAT, bits, 1),
        [b'Z', b'f' | b'd'] => DType::new(code::COMPLEX, bits, 1),
        _ => return None,
    };
    // The sizes must be ones dlcast knows (e.g. `long double` is refused).
    (dtype.itemsize() == Some(itemsize)).then_some(dtype)
}

/// A buffer held for a view; boxed so its address stays fixed until
/// [`release`]. Below Python 3.11 in abi3 builds, whose limited API has no
/// buffer protocol, see [`fallback`].
#[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
pub(crate) type HeldBuffer = Box<ffi::Py_buffer>;

/// Releases a held buffer: called once, from `Owner`'s drop (with the GIL).
#[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
pub(crate) fn release(view: &mut HeldBuffer) {
    // SAFETY: `view` was filled by a successful `PyObject_GetBuffer`, kept
    // its address since (boxed), and is released only here, once, with the
    // GIL held (see `Owner`'s `Drop`).
    unsafe { ffi::PyBuffer_Release(&mut **view) }
}

/// Phase 1: `PyObject_GetBuffer` (an exporter written in Python runs its
/// `__buffer__` here). The returned owner releases the buffer.
/// `Ok(None)` when `obj` does not support the buffer protocol.
#[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
pub(crate) fn try_acquire(obj: &Bound<'_, PyAny>) -> Result<Option<Owner>, ImportError> {
    let py = obj.py();
    // SAFETY: `obj` is a live object.
    if unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 0 {
        return Ok(None);
    }
    // SAFETY: Py_buffer is a plain C struct; all-zero is a valid "empty"
    // value that PyObject_GetBuffer overwrites.
    let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: `obj` is live and `view` is a writable Py_buffer.
    if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, ffi::PyBUF_RECORDS_RO) } != 0 {
        return Err(ImportError::Buffer(PyErr::fetch(py)));
    }
    Ok(Some(Owner::Buffer(view)))
}

/// A memoryview over the very buffer `owner` holds, for NumPy to read it
/// where dlcast cannot (a conversion): the object is not asked for its
/// buffer again, so NumPy reads what dlcast holds and probed. The
/// memoryview does not keep the buffer: the caller keeps `owner` until it
/// has released the memoryview (`release()`). `None` for other owners.
#[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
pub(crate) fn memoryview_of<'py>(
    py: Python<'py>,
    owner: &Owner,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Owner::Buffer(view) = owner else {
        return Ok(None);
    };
    // SAFETY: `view` is a buffer filled by `PyObject_GetBuffer` and not
    // released (its owner is alive); the memoryview copies the struct,
    // with no exporter to release (so releasing it leaves ours held), and
    // reads the memory and fields it describes while `owner` lives (the
    // caller's duty, see above).
    let mv = unsafe { ffi::PyMemoryView_FromBuffer(&**view) };
    if mv.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference, just made.
    Ok(Some(unsafe { Bound::from_owned_ptr(py, mv) }))
}

/// Phase 2: the array the held buffer describes (no Python code runs; the
/// exporter keeps the fields and the memory fixed while the buffer is held).
#[cfg(any(Py_3_11, not(Py_LIMITED_API)))]
pub(crate) fn read(owner: &Owner) -> Result<RawTensor, ImportError> {
    let Owner::Buffer(view) = owner else {
        return Err(ImportError::Invalid("not a buffer".into()));
    };
    let v: &ffi::Py_buffer = view;
    let ndim = usize::try_from(v.ndim)
        .map_err(|_| ImportError::Invalid(format!("buffer ndim {}", v.ndim)))?;
    let format = if v.format.is_null() {
        c"B"
    } else {
        // SAFETY: the exporter's format is a NUL-terminated string valid
        // until the buffer is released.
        unsafe { CStr::from_ptr(v.format) }
    };
    if ndim > 0 && v.shape.is_null() {
        return Err(ImportError::Invalid("buffer shape is NULL".into()));
    }
    let shape: &[isize] = if ndim == 0 {
        &[]
    } else {
        // SAFETY: with PyBUF_ND requested, `shape` (non-NULL, checked)
        // holds `ndim` values, valid until the buffer is released.
        unsafe { std::slice::from_raw_parts(v.shape, ndim) }
    };
    let strides: Option<&[isize]> = if v.strides.is_null() || ndim == 0 {
        None
    } else {
        // SAFETY: with PyBUF_STRIDES requested, non-NULL `strides` hold
        // `ndim` values (in bytes), valid until the buffer is released.
        Some(unsafe { std::slice::from_raw_parts(v.strides, ndim) })
    };
    describe(Desc {
        data: v.buf.cast(),
        format,
        itemsize: v.itemsize,
        readonly: v.readonly != 0,
        shape,
        strides,
        suboffsets: !v.suboffsets.is_null(),
    })
}

/// What an exporter said about its buffer, borrowed from where it is held.
struct Desc<'a> {
    /// Address of element 0.
    data: *mut u8,
    format: &'a CStr,
    itemsize: isize,
    readonly: bool,
    shape: &'a [isize],
    /// In bytes; `None` for C-contiguous.
    strides: Option<&'a [isize]>,
    /// Whether the buffer has suboffsets (an indirect array).
    suboffsets: bool,
}

/// The element type of a buffer, or the error the caller sees.
fn checked_dtype(format: &CStr, itemsize: isize, suboffsets: bool) -> Result<DType, ImportError> {
    if suboffsets {
        return Err(ImportError::Invalid(
            "the buffer uses suboffsets (an indirect array)".into(),
        ));
    }
    let itemsize = usize::try_from(itemsize)
        .map_err(|_| ImportError::Invalid(format!("buffer itemsize {itemsize}")))?;
    buffer_dtype(format, itemsize).ok_or_else(|| {
        ImportError::Invalid(format!(
            "unsupported buffer format {:?} (itemsize {itemsize})",
            format.to_string_lossy()
        ))
    })
}

/// Validates a buffer's description into a [`RawTensor`] (no Python code).
fn describe(d: Desc<'_>) -> Result<RawTensor, ImportError> {
    let dtype = checked_dtype(d.format, d.itemsize, d.suboffsets)?;
    // `checked_dtype` refused negative item sizes.
    let itemsize = d.itemsize.unsigned_abs();
    let ndim = d.shape.len();
    let no_memory = || ImportError::from(ImportFault::NoMemoryForDims { ndim });
    let mut shape: Dims<usize> = SmallVec::new();
    shape.try_reserve_exact(ndim).map_err(|_| no_memory())?;
    let mut strides: Dims<isize> = super::numpy::try_zeros(ndim).ok_or_else(no_memory)?;
    for &n in d.shape {
        shape.push(
            usize::try_from(n).map_err(|_| ImportError::Invalid(format!("buffer extent {n}")))?,
        );
    }
    match d.strides {
        None => layout::fill_c_strides(&shape, &mut strides)
            .ok_or_else(|| ImportError::Invalid("the shape overflows".into()))?,
        Some(bytes) => {
            if bytes.len() != ndim {
                return Err(ImportError::Invalid(format!(
                    "the buffer has {} strides for {ndim} dimensions",
                    bytes.len()
                )));
            }
            for (s, &b) in strides.iter_mut().zip(bytes) {
                // Byte strides that are not whole elements cannot be
                // expressed in DLPack's element strides: refuse, never divide.
                if b % itemsize as isize != 0 {
                    return Err(ImportError::Invalid(format!(
                        "buffer stride of {b} bytes is not a multiple of the item size {itemsize}"
                    )));
                }
                *s = b / itemsize as isize;
            }
        }
    }
    make_raw(
        d.data,
        0,
        shape,
        strides,
        dtype,
        Device::CPU,
        d.readonly,
        ImportPath::Buffer,
    )
}

#[cfg(all(Py_LIMITED_API, not(Py_3_11)))]
pub(crate) use fallback::{memoryview_of, read, release, try_acquire, HeldBuffer};

/// The buffer protocol in abi3 builds for Python 3.9 and 3.10, whose
/// limited API has no `Py_buffer`, `PyObject_GetBuffer` or
/// `PyBuffer_Release`: there, dlcast reads exactly `bytes` and `bytearray`
/// objects (exact types) in place, and refuses other buffers with an error
/// that says what to pass instead (a NumPy array, which takes its own
/// path, or `bytes`) or to build for abi3-py311.
///
/// What decides safety comes from C: the address and length from
/// CPython's accessors (`PyBytes_AsString`, `PyByteArray_Size`, ...),
/// one dimension of bytes over the whole object, read-only for `bytes`.
/// A `bytearray` must not resize while dlcast reads it: phase 1 makes a
/// `memoryview` of it (`PyMemoryView_FromObject`, in the limited API at
/// every level), an export the `bytearray` refuses to resize under, held
/// until the read ends. That memoryview is never shown to Python code and
/// is taken off the garbage collector's lists at once, so that no Python
/// code can find it (`gc.get_objects()`, `gc.get_referrers`) and
/// `release()` it early (which would let the `bytearray` reallocate under
/// the read); it is put back on them just before it is freed, as its
/// deallocation expects.
///
/// Other buffers are not read in place here: the only way to their
/// address and layout in the limited API of 3.9/3.10 leads through Python
/// code (memoryview's getters and NumPy's array construction, which
/// consult attributes Python code can replace through a type's
/// dictionary).
#[cfg(all(Py_LIMITED_API, not(Py_3_11)))]
mod fallback {
    use super::{describe, Desc, ImportError, Owner, RawTensor};
    use pyo3::exceptions::PyTypeError;
    use pyo3::ffi;
    use pyo3::prelude::*;
    use pyo3::types::{PyByteArray, PyBytes};

    /// An exact `bytes` or `bytearray` held while it is read (see the
    /// module documentation).
    pub(crate) struct HeldBuffer {
        /// The memoryview that keeps a `bytearray` from resizing (owned:
        /// one strong reference), off the garbage collector's lists.
        view: *mut ffi::PyObject,
        /// `len` bytes at `data`.
        data: *mut u8,
        len: isize,
        readonly: bool,
    }

    // SAFETY: `view` is a strong reference, used (and released) only with
    // the GIL held, as every owner of a call's read (see `Owner`).
    unsafe impl Send for HeldBuffer {}

    impl Drop for HeldBuffer {
        fn drop(&mut self) {
            // SAFETY: `Owner`s drop with the GIL held; `view` is our strong
            // reference to a live memoryview, untracked by us (tracked
            // again, as memoryview's deallocation untracks without a check,
            // then released).
            unsafe {
                if ffi::PyObject_GC_IsTracked(self.view) == 0 {
                    ffi::PyObject_GC_Track(self.view.cast());
                }
                ffi::Py_DECREF(self.view);
            }
        }
    }

    /// Nothing to do before the drop: the memoryview is released when
    /// `HeldBuffer` drops (with the GIL, see `Owner`).
    pub(crate) fn release(_held: &mut HeldBuffer) {}

    /// No memoryview of a held buffer here (the limited API of 3.9/3.10
    /// cannot make one); the buffers read here (`bytes`, `bytearray`) are
    /// always described, so no conversion needs one.
    pub(crate) fn memoryview_of<'py>(
        _py: Python<'py>,
        _owner: &Owner,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        Ok(None)
    }

    /// Phase 1 (see the module documentation). `Ok(None)` when `obj` does
    /// not support the buffer protocol (`memoryview()` raises `TypeError`).
    pub(crate) fn try_acquire(obj: &Bound<'_, PyAny>) -> Result<Option<Owner>, ImportError> {
        let py = obj.py();
        let bytes = obj.is_exact_instance_of::<PyBytes>();
        let bytearray = obj.is_exact_instance_of::<PyByteArray>();
        // SAFETY: `obj` is live; a new reference or NULL with an exception.
        // For exact `bytes` and `bytearray`, their own C buffer functions
        // run, no Python code.
        let view = unsafe { ffi::PyMemoryView_FromObject(obj.as_ptr()) };
        if view.is_null() {
            let e = PyErr::fetch(py);
            if e.get_type(py).is(py.get_type::<PyTypeError>()) {
                return Ok(None);
            }
            return Err(ImportError::Buffer(e));
        }
        if !(bytes || bytearray) {
            // SAFETY: the new reference just made, released at once.
            unsafe { ffi::Py_DECREF(view) };
            return Err(ImportError::Unreadable(
                "dlcast was built for the stable ABI of Python 3.9/3.10, whose limited API has \
                 no buffer protocol: it reads bytes and bytearray directly, and other buffers \
                 not at all; pass numpy.asarray(x) or bytes(x), or build for abi3-py311 or \
                 later"
                    .into(),
            ));
        }
        // SAFETY: `view` is a live memoryview only we refer to (a GC type,
        // tracked since its creation): off the lists before any Python code
        // can run (see the module documentation).
        unsafe { ffi::PyObject_GC_UnTrack(view.cast()) };
        // SAFETY: `obj` is a live `bytes` / `bytearray`; these cannot fail
        // on one.
        let (data, len) = unsafe {
            if bytes {
                (
                    ffi::PyBytes_AsString(obj.as_ptr()),
                    ffi::PyBytes_Size(obj.as_ptr()),
                )
            } else {
                (
                    ffi::PyByteArray_AsString(obj.as_ptr()),
                    ffi::PyByteArray_Size(obj.as_ptr()),
                )
            }
        };
        Ok(Some(Owner::Buffer(HeldBuffer {
            view,
            data: data.cast(),
            len,
            readonly: bytes,
        })))
    }

    /// Phase 2: no Python code runs; see the module documentation.
    pub(crate) fn read(owner: &Owner) -> Result<RawTensor, ImportError> {
        let Owner::Buffer(h) = owner else {
            return Err(ImportError::Invalid("not a buffer".into()));
        };
        describe(Desc {
            data: h.data,
            format: c"B",
            itemsize: 1,
            readonly: h.readonly,
            shape: &[h.len],
            strides: None,
            suboffsets: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_exported_format_reads_back_as_its_dtype() {
        for d in crate::facts::DTYPES {
            let Some(format) = d.format else { continue };
            let dtype = DType::new(d.code, d.bits, 1);
            let item = usize::from(d.bits / 8);
            assert_eq!(buffer_dtype(format, item), Some(dtype), "{}", d.name);
            // Explicitly native byte order reads the same.
            let native = if cfg!(target_endian = "little") {
                "<"
            } else {
                ">"
            };
            let explicit =
                std::ffi::CString::new(format!("{native}{}", format.to_str().unwrap())).unwrap();
            assert_eq!(buffer_dtype(&explicit, item), Some(dtype), "{}", d.name);
        }
    }

    #[test]
    fn buffer_formats() {
        assert_eq!(buffer_dtype(c"d", 8), Some(DType::FLOAT64));
        assert_eq!(buffer_dtype(c"<f", 4), Some(DType::FLOAT32));
        assert_eq!(buffer_dtype(c"l", 8), Some(DType::INT64));
        assert_eq!(buffer_dtype(c"=l", 4), Some(DType::INT32));
        assert_eq!(buffer_dtype(c"B", 1), Some(DType::UINT8));
        assert_eq!(buffer_dtype(c"?", 1), Some(DType::BOOL));
        assert_eq!(buffer_dtype(c"Zd", 16), Some(DType::COMPLEX128));
        assert_eq!(buffer_dtype(c">d", 8), None);
        assert_eq!(buffer_dtype(c"g", 16), None);
        assert_eq!(buffer_dtype(c"d", 16), None);
        assert_eq!(buffer_dtype(c"T{d:x:}", 8), None);
    }
}
