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
pub(crate) use fallback::{read, release, try_acquire, HeldBuffer};

/// The buffer protocol in abi3 builds for Python 3.9 and 3.10, whose
/// limited API has no `Py_buffer`, `PyObject_GetBuffer` or
/// `PyBuffer_Release`.
///
/// Phase 1 makes a `memoryview` of the argument (`PyMemoryView_FromObject`,
/// in the limited API at every level). The memoryview acquires the
/// exporter's buffer with `PyBUF_FULL_RO` and holds it until the memoryview
/// is released or freed; dlcast holds the only reference to it, so the
/// exporter keeps the memory alive and its description fixed (a
/// `bytearray` cannot resize, ...) for as long as the view lives. The
/// caller releasing their own memoryview changes nothing: the buffer is
/// released only when every memoryview sharing it is.
///
/// What decides safety (the address, the item size, the shape, the strides
/// and whether the memory may be written) is never read through a Python
/// attribute: the memoryview's getters (`format`, `shape`, ...) belong to
/// a built-in type, but Python code can replace them all the same (through
/// the type's dictionary, reachable with `gc.get_referents`). Instead:
/// - an exact `bytes` or `bytearray` is read from CPython's own C accessors
///   (`PyBytes_AsString`, `PyBytes_Size`, ...): its buffer is always one
///   dimension of bytes over the whole object, read-only for `bytes`;
/// - any other buffer goes through NumPy: `numpy.asarray(memoryview)`
///   builds an array over the memoryview's own buffer, which must be
///   exactly NumPy's array type (the type from NumPy's verified C API
///   table, see `import::numpy::learn_ndarray`), not own its data and have
///   exactly a `memoryview` as its base (read from the array's C struct);
///   phase 2 then reads the array from its C fields, as any exact
///   `numpy.ndarray` is read. `numpy.asarray` is a module attribute Python
///   code can replace, so it is checked by identity first (NumPy's builtin,
///   see `crate::trust`); a replaced one is refused, never called.
///   Without NumPy, such buffers are refused with an error that says so.
///
/// The memoryview's getters are read only to refuse early, with dlcast's
/// own message, what the C path refuses (a format dlcast cannot hold,
/// suboffsets): a liar there can make dlcast refuse, never read.
///
/// The one way around this is Python code that finds dlcast's private
/// memoryview through the garbage collector's introspection
/// (`gc.get_objects()`) and calls its `release()`; NumPy's own arrays over
/// buffers have the same exposure.
#[cfg(all(Py_LIMITED_API, not(Py_3_11)))]
mod fallback {
    use super::{checked_dtype, describe, Desc, ImportError, Owner, RawTensor};
    use crate::error::ImportFault;
    use crate::import::{numpy as np_import, ImportPath};
    use crate::npyffi::PyArrayObject;
    use pyo3::exceptions::PyTypeError;
    use pyo3::prelude::*;
    use pyo3::sync::PyOnceLock;
    use pyo3::types::{PyByteArray, PyBytes};
    use pyo3::{ffi, intern};
    use std::ffi::{c_int, CString};

    /// NumPy's `NPY_ARRAY_OWNDATA` flag: the array allocated its memory.
    const NPY_ARRAY_OWNDATA: c_int = 0x0004;

    /// A buffer held through a private memoryview (see the module
    /// documentation).
    pub(crate) struct HeldBuffer {
        /// The memoryview: holds the exporter's buffer until it drops.
        _view: Py<PyAny>,
        what: Held,
    }

    /// Where phase 2 reads the buffer's description from.
    enum Held {
        /// An exact `bytes` (read-only) or `bytearray`: `len` bytes at
        /// `data`, from CPython's accessors.
        Bytes {
            data: *mut u8,
            len: isize,
            readonly: bool,
        },
        /// NumPy's array over the memoryview's buffer, read from its C
        /// fields in phase 2.
        Array(Py<PyAny>),
    }

    /// Nothing to do before the drop: the buffer is released when the
    /// memoryview drops with the rest of `HeldBuffer` (with the GIL, see `Owner`).
    pub(crate) fn release(_held: &mut HeldBuffer) {}

    /// Phase 1 (see the module documentation). `Ok(None)` when `obj` does
    /// not support the buffer protocol (`memoryview()` raises `TypeError`).
    pub(crate) fn try_acquire(obj: &Bound<'_, PyAny>) -> Result<Option<Owner>, ImportError> {
        let py = obj.py();
        // SAFETY: `obj` is live; a new reference or NULL with an exception.
        let view =
            unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyMemoryView_FromObject(obj.as_ptr())) };
        let view = match view {
            Ok(v) => v,
            Err(e) if e.get_type(py).is(py.get_type::<PyTypeError>()) => return Ok(None),
            Err(e) => return Err(ImportError::Buffer(e)),
        };
        // Refuse early, with dlcast's message, what phase 2 would refuse
        // (the getters decide nothing else: see the module documentation).
        let (format, itemsize, suboffsets) = (|| -> PyResult<(CString, isize, bool)> {
            let format: String = view.getattr(intern!(py, "format"))?.extract()?;
            Ok((
                CString::new(format).map_err(|_| ImportFault::FormatNul)?,
                view.getattr(intern!(py, "itemsize"))?.extract()?,
                view.getattr(intern!(py, "suboffsets"))?.len()? != 0,
            ))
        })()
        .map_err(ImportError::Buffer)?;
        checked_dtype(&format, itemsize, suboffsets)?;
        let what = held(obj, &view)?;
        Ok(Some(Owner::Buffer(HeldBuffer {
            _view: view.unbind(),
            what,
        })))
    }

    /// `numpy.asarray`, once it is known to be NumPy's own (kept for the
    /// process then; a failed check is not kept, so restoring a replaced
    /// attribute works): exactly a builtin named `asarray` whose C function
    /// lies in the library that defines NumPy's array type (see
    /// [`crate::trust`]). A function Python code put in its place could
    /// hand back an array over other memory (an immutable `bytes`), which
    /// a `&mut` view would then write.
    fn asarray(py: Python<'_>) -> Result<&'static Py<PyAny>, String> {
        static ASARRAY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
        ASARRAY.get_or_try_init(py, || {
            let np = py
                .import("numpy")
                .map_err(|e| format!("importing NumPy failed ({e})"))?;
            let asarray = np
                .getattr("asarray")
                .map_err(|e| format!("numpy.asarray is missing ({e})"))?;
            let table = crate::npapi::table(py)
                .ok_or_else(|| "NumPy's C API table could not be verified".to_string())?;
            if !crate::trust::is_builtin(&asarray, "asarray", table.ndarray.cast()) {
                return Err(
                    "numpy.asarray is not NumPy's own builtin function (Python code replaced \
                     it, or this NumPy's is written in Python)"
                        .into(),
                );
            }
            Ok(asarray.unbind())
        })
    }

    /// What phase 2 reads: see the module documentation.
    fn held(obj: &Bound<'_, PyAny>, view: &Bound<'_, PyAny>) -> Result<Held, ImportError> {
        let py = obj.py();
        // Exact `bytes` and `bytearray`: their buffer is CPython's own,
        // one-dimensional over the whole object, at the address the
        // accessors give (for a `bytearray`, fixed while the memoryview
        // holds it: it cannot resize with an export).
        if obj.is_exact_instance_of::<PyBytes>() {
            // SAFETY: `obj` is a live `bytes`; these cannot fail on one.
            let (data, len) = unsafe {
                (
                    ffi::PyBytes_AsString(obj.as_ptr()),
                    ffi::PyBytes_Size(obj.as_ptr()),
                )
            };
            return Ok(Held::Bytes {
                data: data.cast(),
                len,
                readonly: true,
            });
        }
        if obj.is_exact_instance_of::<PyByteArray>() {
            // SAFETY: `obj` is a live `bytearray`; these cannot fail on one.
            let (data, len) = unsafe {
                (
                    ffi::PyByteArray_AsString(obj.as_ptr()),
                    ffi::PyByteArray_Size(obj.as_ptr()),
                )
            };
            return Ok(Held::Bytes {
                data: data.cast(),
                len,
                readonly: false,
            });
        }
        let needs_numpy = |why: String| {
            ImportError::Unreadable(format!(
                "dlcast was built for the stable ABI of Python 3.9/3.10, whose limited API has \
                 no buffer protocol: it reads buffers other than bytes and bytearray through \
                 NumPy, and {why}; install NumPy, pass a NumPy array, or build for abi3-py311 \
                 or later"
            ))
        };
        let asarray = asarray(py).map_err(needs_numpy)?;
        let array = asarray
            .bind(py)
            .call1((view,))
            .map_err(|e| needs_numpy(format!("NumPy refused the buffer ({e})")))?;
        // NumPy's own `asarray` builds its array over a memoryview of ours,
        // which shares our memoryview's buffer (a memoryview of a
        // memoryview asks the exporter nothing). Checked from C-level
        // state: exactly NumPy's array type, not owning its data, with
        // exactly a memoryview as its base.
        let over_view = np_import::learn_ndarray(&array) && {
            // SAFETY: `array` is exactly NumPy's array type, whose objects
            // start with `PyArrayObject`'s fields; `base` is NULL or a live
            // object the array holds.
            let fields = unsafe { &*array.as_ptr().cast::<PyArrayObject>() };
            fields.flags & NPY_ARRAY_OWNDATA == 0
                && !fields.base.is_null()
                // SAFETY: `base` is a live object (above).
                && unsafe { ffi::PyMemoryView_Check(fields.base) } != 0
        };
        if !over_view {
            return Err(needs_numpy(
                "NumPy's array does not share the buffer's memory".into(),
            ));
        }
        Ok(Held::Array(array.unbind()))
    }

    /// Phase 2: no Python code runs; see the module documentation.
    pub(crate) fn read(owner: &Owner) -> Result<RawTensor, ImportError> {
        let Owner::Buffer(h) = owner else {
            return Err(ImportError::Invalid("not a buffer".into()));
        };
        match &h.what {
            Held::Bytes {
                data,
                len,
                readonly,
            } => describe(Desc {
                data: *data,
                format: c"B",
                itemsize: 1,
                readonly: *readonly,
                shape: &[*len],
                strides: None,
                suboffsets: false,
            }),
            Held::Array(array) => {
                // SAFETY: phase 2 runs with the GIL held (as every read of a
                // call's arguments); `assume_attached` creates no state.
                let py = unsafe { Python::assume_attached() };
                let mut out = None;
                if np_import::read_into(array.bind(py), &mut out) {
                    if let Some(mut raw) = out {
                        raw.path = ImportPath::Buffer;
                        return Ok(raw);
                    }
                }
                Err(ImportError::Unreadable(
                    "NumPy's array over the buffer has a data type or layout dlcast cannot \
                     read"
                        .into(),
                ))
            }
        }
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
