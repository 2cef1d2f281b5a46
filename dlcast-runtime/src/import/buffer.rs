//! Objects with only the buffer protocol: `bytes`, `bytearray`,
//! `memoryview`, `array.array`, ...

use super::{make_raw, Dims, ImportError, ImportPath, Owner, RawTensor};
use crate::device::Device;
use crate::dtype::{code, DType};
use crate::layout;
use pyo3::ffi;
use pyo3::prelude::*;
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

/// Phase 1: `PyObject_GetBuffer` (an exporter written in Python runs its
/// `__buffer__` here). The returned owner releases the buffer.
pub(crate) fn acquire(obj: &Bound<'_, PyAny>) -> Result<Owner, ImportError> {
    let py = obj.py();
    // SAFETY: Py_buffer is a plain C struct; all-zero is a valid "empty"
    // value that PyObject_GetBuffer overwrites.
    let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: `obj` is live and `view` is a writable Py_buffer.
    if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, ffi::PyBUF_RECORDS_RO) } != 0 {
        return Err(ImportError::Buffer(PyErr::fetch(py)));
    }
    Ok(Owner::Buffer(view))
}

/// Phase 2: the array the held buffer describes (no Python code runs; the
/// exporter keeps the fields and the memory fixed while the buffer is held).
pub(crate) fn read(owner: &Owner) -> Result<RawTensor, ImportError> {
    let Owner::Buffer(view) = owner else {
        return Err(ImportError::Invalid("not a buffer".into()));
    };
    let v: &ffi::Py_buffer = view;
    let (data, ndim, itemsize, readonly) = (v.buf, v.ndim, v.itemsize, v.readonly != 0);
    let (fmt_ptr, shape_ptr, strides_ptr, sub) = (v.format, v.shape, v.strides, v.suboffsets);
    if !sub.is_null() {
        return Err(ImportError::Invalid(
            "the buffer uses suboffsets (an indirect array)".into(),
        ));
    }
    let itemsize = usize::try_from(itemsize)
        .map_err(|_| ImportError::Invalid(format!("buffer itemsize {itemsize}")))?;
    let format = if fmt_ptr.is_null() {
        c"B"
    } else {
        // SAFETY: the exporter's format is a NUL-terminated string valid
        // until the buffer is released.
        unsafe { CStr::from_ptr(fmt_ptr) }
    };
    let dtype = buffer_dtype(format, itemsize).ok_or_else(|| {
        ImportError::Invalid(format!(
            "unsupported buffer format {:?} (itemsize {itemsize})",
            format.to_string_lossy()
        ))
    })?;
    let ndim =
        usize::try_from(ndim).map_err(|_| ImportError::Invalid(format!("buffer ndim {ndim}")))?;
    let no_memory = || {
        ImportError::Propagate(pyo3::exceptions::PyMemoryError::new_err(format!(
            "no memory for the shape and strides of {ndim} dimensions"
        )))
    };
    let mut shape: Dims<usize> = SmallVec::new();
    shape.try_reserve_exact(ndim).map_err(|_| no_memory())?;
    let mut strides: Dims<isize> = super::numpy::try_zeros(ndim).ok_or_else(no_memory)?;
    if ndim > 0 && shape_ptr.is_null() {
        return Err(ImportError::Invalid("buffer shape is NULL".into()));
    }
    for i in 0..ndim {
        // SAFETY: with PyBUF_ND requested, `shape` holds `ndim` values.
        let n = unsafe { *shape_ptr.add(i) };
        shape.push(
            usize::try_from(n).map_err(|_| ImportError::Invalid(format!("buffer extent {n}")))?,
        );
    }
    if strides_ptr.is_null() {
        layout::fill_c_strides(&shape, &mut strides)
            .ok_or_else(|| ImportError::Invalid("the shape overflows".into()))?;
    } else {
        for (i, s) in strides.iter_mut().enumerate() {
            // SAFETY: with PyBUF_STRIDES requested, `strides` holds `ndim`
            // values (in bytes).
            let b = unsafe { *strides_ptr.add(i) };
            // Byte strides that are not whole elements cannot be expressed in
            // DLPack's element strides: refuse, never divide.
            if b % itemsize as isize != 0 {
                return Err(ImportError::Invalid(format!(
                    "buffer stride of {b} bytes is not a multiple of the item size {itemsize}"
                )));
            }
            *s = b / itemsize as isize;
        }
    }
    make_raw(
        data.cast(),
        0,
        shape,
        strides,
        dtype,
        Device::CPU,
        readonly,
        ImportPath::Buffer,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
