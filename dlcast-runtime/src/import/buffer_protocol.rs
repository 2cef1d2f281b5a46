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
/// released only when every memoryview sharing it is. Phase 1 then reads
/// the memoryview's description (`format`, `itemsize`, `shape`,
/// `strides`, `suboffsets`, `readonly`: getters of the built-in type) and
/// the address of element 0 into Rust values: for an exact `bytes` or
/// `bytearray` with `PyBytes_AsString` / `PyByteArray_AsString` (the
/// pointer their own buffer hands out), otherwise through NumPy:
/// `numpy.asarray(memoryview)` builds an array over the memoryview's own
/// buffer (checked: exactly NumPy's array type, no copy, a memoryview of
/// the same object as its base, same shape, strides and writability),
/// whose `__array_interface__` gives the address. `numpy.asarray` and
/// `numpy.ndarray` are module attributes Python code can replace, so both
/// are checked by identity first (NumPy's builtin and static type, see
/// `crate::trust`); a replaced one is refused, never called. Without
/// NumPy, other buffer objects are refused with an error that says so.
/// Phase 2 validates these values as the C path does, running no Python
/// code.
///
/// The one way around this is Python code that finds dlcast's private
/// memoryview through the garbage collector's introspection
/// (`gc.get_objects()`) and calls its `release()`; NumPy's own arrays over
/// buffers have the same exposure.
#[cfg(all(Py_LIMITED_API, not(Py_3_11)))]
mod fallback {
    use super::{checked_dtype, describe, Desc, Dims, ImportError, Owner, RawTensor};
    use crate::error::ImportFault;
    use pyo3::exceptions::PyTypeError;
    use pyo3::prelude::*;
    use pyo3::sync::PyOnceLock;
    use pyo3::types::{PyByteArray, PyBytes, PyMemoryView, PyTuple};
    use pyo3::{ffi, intern};
    use smallvec::SmallVec;
    use std::ffi::CString;

    /// A buffer held through a private memoryview, and its description
    /// read in phase 1 (see the module documentation).
    pub(crate) struct HeldBuffer {
        /// The memoryview: holds the exporter's buffer until it drops.
        _view: Py<PyAny>,
        /// The array NumPy built over the memoryview, if it was asked.
        _array: Option<Py<PyAny>>,
        data: *mut u8,
        format: CString,
        itemsize: isize,
        readonly: bool,
        shape: Dims<isize>,
        strides: Dims<isize>,
        suboffsets: bool,
    }

    /// Nothing to do before the drop: the buffer is released when the
    /// memoryview drops with the rest of `HeldBuffer` (with the GIL, see `Owner`).
    pub(crate) fn release(_held: &mut HeldBuffer) {}

    /// A tuple of integers (a memoryview's `shape` or `strides`).
    fn dims(t: &Bound<'_, PyAny>) -> PyResult<Dims<isize>> {
        let t = t.cast::<PyTuple>()?;
        let mut d: Dims<isize> = SmallVec::new();
        d.try_reserve_exact(t.len())
            .map_err(|_| ImportFault::NoMemoryForBufferShape)?;
        for x in t.iter() {
            d.push(x.extract()?);
        }
        Ok(d)
    }

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
        let held = (|| -> PyResult<HeldBuffer> {
            let format: String = view.getattr(intern!(py, "format"))?.extract()?;
            let suboffsets = view.getattr(intern!(py, "suboffsets"))?;
            Ok(HeldBuffer {
                data: std::ptr::null_mut(),
                format: CString::new(format).map_err(|_| ImportFault::FormatNul)?,
                itemsize: view.getattr(intern!(py, "itemsize"))?.extract()?,
                readonly: view.getattr(intern!(py, "readonly"))?.extract()?,
                shape: dims(&view.getattr(intern!(py, "shape"))?)?,
                strides: dims(&view.getattr(intern!(py, "strides"))?)?,
                suboffsets: suboffsets.len()? != 0,
                _view: view.clone().unbind(),
                _array: None,
            })
        })();
        let mut held = held.map_err(ImportError::Buffer)?;
        // Refuse what phase 2 would refuse before asking NumPy anything.
        checked_dtype(&held.format, held.itemsize, held.suboffsets)?;
        address(obj, &view, &mut held)?;
        Ok(Some(Owner::Buffer(held)))
    }

    /// `numpy.asarray` and `numpy.ndarray`, once they are known to be
    /// NumPy's own (kept for the process then; a failed check is not kept,
    /// so restoring a replaced attribute works): the array type is a static
    /// type named `numpy.ndarray` (Python code cannot make one), and
    /// `asarray` is exactly a builtin named `asarray` whose C function lies
    /// in the library that defines that type (see [`crate::trust`]). A
    /// function Python code put in their place could hand back an array
    /// over other memory (an immutable `bytes`), which a `&mut` view would
    /// then write.
    fn numpy(py: Python<'_>) -> Result<&'static (Py<PyAny>, Py<PyAny>), String> {
        static NUMPY: PyOnceLock<(Py<PyAny>, Py<PyAny>)> = PyOnceLock::new();
        NUMPY.get_or_try_init(py, || {
            let np = py
                .import("numpy")
                .map_err(|e| format!("importing NumPy failed ({e})"))?;
            let attr = |name: &str| {
                np.getattr(name)
                    .map_err(|e| format!("numpy.{name} is missing ({e})"))
            };
            let (asarray, ndarray) = (attr("asarray")?, attr("ndarray")?);
            let numpys_type = crate::trust::is_static_type(&ndarray, std::ptr::null())
                && crate::trust::static_type_name(&ndarray).as_deref() == Some("numpy.ndarray");
            if !numpys_type {
                return Err(
                    "numpy.ndarray is not NumPy's array type (Python code replaced it)".into(),
                );
            }
            if !crate::trust::is_builtin(&asarray, "asarray", ndarray.as_ptr().cast()) {
                return Err(
                    "numpy.asarray is not NumPy's own builtin function (Python code replaced \
                     it, or this NumPy's is written in Python)"
                        .into(),
                );
            }
            Ok((asarray.unbind(), ndarray.unbind()))
        })
    }

    /// Sets `held.data` (and `held._array`): see the module documentation.
    fn address(
        obj: &Bound<'_, PyAny>,
        view: &Bound<'_, PyAny>,
        held: &mut HeldBuffer,
    ) -> Result<(), ImportError> {
        let py = obj.py();
        // Exact `bytes` and `bytearray`: their buffer is CPython's own,
        // one-dimensional over the whole object, at the address the
        // accessors give (for a `bytearray`, fixed while the memoryview
        // holds it: it cannot resize with an export).
        let whole = |len: isize| held.shape.as_slice() == [len] && held.itemsize == 1;
        if obj.is_exact_instance_of::<PyBytes>() {
            // SAFETY: `obj` is a live `bytes`; these cannot fail on one.
            let (p, len) = unsafe {
                (
                    ffi::PyBytes_AsString(obj.as_ptr()),
                    ffi::PyBytes_Size(obj.as_ptr()),
                )
            };
            if whole(len) {
                held.data = p.cast();
                return Ok(());
            }
        } else if obj.is_exact_instance_of::<PyByteArray>() {
            // SAFETY: `obj` is a live `bytearray`; these cannot fail on one.
            let (p, len) = unsafe {
                (
                    ffi::PyByteArray_AsString(obj.as_ptr()),
                    ffi::PyByteArray_Size(obj.as_ptr()),
                )
            };
            if whole(len) {
                held.data = p.cast();
                return Ok(());
            }
        }
        let needs_numpy = |why: String| {
            ImportError::Unreadable(format!(
                "dlcast was built for the stable ABI of Python 3.9/3.10, whose limited API has \
                 no buffer protocol: it reads buffers other than bytes and bytearray through \
                 NumPy, and {why}; install NumPy, pass a NumPy array, or build for abi3-py311 \
                 or later"
            ))
        };
        let (asarray, ndarray) = numpy(py).map_err(needs_numpy)?;
        let (asarray, ndarray) = (asarray.bind(py), ndarray.bind(py));
        let array = asarray
            .call1((view,))
            .map_err(|e| needs_numpy(format!("NumPy refused the buffer ({e})")))?;
        // NumPy's own `asarray` builds its array over a memoryview of ours,
        // which shares our memoryview's buffer (a memoryview of a
        // memoryview asks the exporter nothing): the array must be exactly
        // NumPy's type (a static type: its getters are C code), not own its
        // data, have that memoryview as its base (exactly a memoryview, of
        // the object ours is of), and our view's layout and writability;
        // only then is its address that of our element 0.
        let same = (|| -> PyResult<bool> {
            if !array.get_type().is(ndarray) {
                return Ok(false);
            }
            let base = array.getattr(intern!(py, "base"))?;
            if !base.get_type().is(py.get_type::<PyMemoryView>()) {
                return Ok(false);
            }
            let obj_attr = intern!(py, "obj");
            let flags = array.getattr(intern!(py, "flags"))?;
            let owndata: bool = flags.getattr(intern!(py, "owndata"))?.extract()?;
            let writeable: bool = flags.getattr(intern!(py, "writeable"))?.extract()?;
            Ok(base.getattr(obj_attr)?.is(&view.getattr(obj_attr)?)
                && !owndata
                && writeable != held.readonly
                && dims(&array.getattr(intern!(py, "shape"))?)? == held.shape
                && dims(&array.getattr(intern!(py, "strides"))?)? == held.strides
                && array.getattr(intern!(py, "itemsize"))?.extract::<isize>()? == held.itemsize)
        })()
        .map_err(ImportError::Buffer)?;
        if !same {
            return Err(needs_numpy(
                "NumPy's array does not share the buffer's memory and layout".into(),
            ));
        }
        let address: usize = array
            .getattr(intern!(py, "__array_interface__"))
            .and_then(|i| i.get_item("data"))
            .and_then(|d| d.get_item(0))
            .and_then(|a| a.extract())
            .map_err(ImportError::Buffer)?;
        held.data = address as *mut u8;
        held._array = Some(array.unbind());
        Ok(())
    }

    /// Phase 2: the array described in phase 1 (no Python code runs: the
    /// values were read then, and the held memoryview keeps them true).
    pub(crate) fn read(owner: &Owner) -> Result<RawTensor, ImportError> {
        let Owner::Buffer(h) = owner else {
            return Err(ImportError::Invalid("not a buffer".into()));
        };
        describe(Desc {
            data: h.data,
            format: &h.format,
            itemsize: h.itemsize,
            readonly: h.readonly,
            shape: &h.shape,
            strides: Some(&h.strides),
            suboffsets: h.suboffsets,
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
