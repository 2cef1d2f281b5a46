//! DLPack capsules, passed directly or returned by `__dlpack__()`.
//!
//! Phase 1 ([`take`], [`call_dlpack`], [`dlpack_device`]) runs the
//! producer's Python code and takes ownership of the managed tensor (the
//! capsule is renamed `used_*`); phase 2 ([`read`]) reads the
//! tensor it describes without running Python code.

use super::{from_dltensor, producer_error, type_name, ImportError, ImportPath, Owner, RawTensor};
use super::{FLAG_READ_ONLY, MAX_VERSION};
use crate::device::Device;
use dlpack_rs::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use pyo3::exceptions::{PyAttributeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyTuple;
use pyo3::{ffi, intern};
use std::ffi::CStr;
use std::ptr::NonNull;

const NAME_LEGACY: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";
const NAME_USED_LEGACY: &CStr = c"used_dltensor";
const NAME_USED_VERSIONED: &CStr = c"used_dltensor_versioned";

/// Takes ownership of the managed tensor in a DLPack capsule: the name
/// decides the struct, and the capsule is renamed `used_*` so that neither
/// its destructor nor a second consumer touches it again.
pub(crate) fn take(capsule: &Bound<'_, PyAny>) -> Result<Owner, ImportError> {
    let py = capsule.py();
    let cap = capsule.as_ptr();
    // SAFETY: `cap` is a live object; the check reads only its type.
    if unsafe { ffi::PyCapsule_CheckExact(cap) } == 0 {
        return Err(ImportError::NotACapsule(type_name(capsule)));
    }
    // SAFETY: `cap` is a capsule; the name pointer (maybe NULL) stays valid
    // while the capsule lives and its name is not changed.
    let name_ptr = unsafe { ffi::PyCapsule_GetName(cap) };
    if name_ptr.is_null() {
        // SAFETY: a capsule's name may be NULL without error; clear any
        // error state defensively.
        if let Some(e) = PyErr::take(py) {
            return Err(ImportError::Propagate(e));
        }
        return Err(ImportError::CapsuleName("NULL".into()));
    }
    // SAFETY: non-NULL capsule names are NUL-terminated C strings.
    let name = unsafe { CStr::from_ptr(name_ptr) };
    let (versioned, used_name) = if name == NAME_VERSIONED {
        (true, NAME_USED_VERSIONED)
    } else if name == NAME_LEGACY {
        (false, NAME_USED_LEGACY)
    } else if name == NAME_USED_LEGACY || name == NAME_USED_VERSIONED {
        return Err(ImportError::UsedCapsule);
    } else {
        return Err(ImportError::CapsuleName(
            name.to_string_lossy().into_owned(),
        ));
    };
    // SAFETY: `name_ptr` is this capsule's current name, so GetPointer
    // succeeds unless the stored pointer is NULL.
    let ptr = unsafe { ffi::PyCapsule_GetPointer(cap, name_ptr) };
    let Some(ptr) = NonNull::new(ptr) else {
        let err = PyErr::take(py);
        return Err(err.map_or_else(
            || ImportError::Invalid("the capsule holds a NULL pointer".into()),
            ImportError::Propagate,
        ));
    };
    // SAFETY: `used_name` is a 'static C string, as SetName requires.
    if unsafe { ffi::PyCapsule_SetName(cap, used_name.as_ptr()) } != 0 {
        return Err(ImportError::Propagate(PyErr::fetch(py)));
    }
    if versioned {
        let m = ptr.cast::<DLManagedTensorVersioned>();
        let owner = Owner::Versioned(m);
        // SAFETY: the producer handed us a DLManagedTensorVersioned; its
        // `version` field is at the same place in every major version.
        let version = unsafe { (*m.as_ptr()).version };
        if version.major != 1 {
            // Case C11: read nothing else; dropping `owner` calls the deleter.
            drop(owner);
            return Err(ImportError::Version(version.major, version.minor));
        }
        Ok(owner)
    } else {
        Ok(Owner::Legacy(ptr.cast::<DLManagedTensor>()))
    }
}

/// Reads the tensor a managed tensor from [`take`] (or an exchange API's
/// owning export) describes. Runs no Python code.
pub(crate) fn read(owner: &Owner, path: ImportPath) -> Result<RawTensor, ImportError> {
    match owner {
        Owner::Versioned(m) => {
            // SAFETY: `m` is a managed tensor we own (its deleter has not
            // run); `version` sits first in every major version.
            let version = unsafe { (*m.as_ptr()).version };
            if version.major != 1 {
                return Err(ImportError::Version(version.major, version.minor));
            }
            // SAFETY: major version 1, so the struct has the v1 layout; the
            // tensor lives until `owner` runs the deleter.
            let (tensor, flags) =
                unsafe { (&raw const (*m.as_ptr()).dl_tensor, (*m.as_ptr()).flags) };
            // SAFETY: `tensor` points into the managed tensor `owner` keeps.
            unsafe { from_dltensor(tensor, flags & FLAG_READ_ONLY != 0, path) }
        }
        Owner::Legacy(m) => {
            // SAFETY: a DLManagedTensor we own.
            let tensor = unsafe { &raw const (*m.as_ptr()).dl_tensor };
            // SAFETY: as above.
            unsafe { from_dltensor(tensor, false, path) }
        }
        _ => Err(ImportError::Invalid("not a managed tensor".into())),
    }
}

/// `obj.__dlpack_device__()` as a [`Device`]; `Ok(None)` when `obj` has no
/// such method (a producer older than the standard: it gets `stream=None`).
pub(crate) fn dlpack_device(obj: &Bound<'_, PyAny>) -> Result<Option<Device>, ImportError> {
    let py = obj.py();
    let name = intern!(py, "__dlpack_device__");
    let answer = match obj.call_method0(name) {
        Ok(a) => a,
        Err(e)
            if e.is_instance_of::<PyAttributeError>(py) && !obj.hasattr(name).unwrap_or(true) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(producer_error("__dlpack_device__", e, py)),
    };
    // Device types are IntEnums in some producers: `extract` takes them.
    let (device_type, device_id) = answer.extract::<(i32, i32)>().map_err(|_| {
        ImportError::Invalid(format!(
            "__dlpack_device__() returned {}, not a (device_type, device_id) pair of integers",
            answer
                .repr()
                .map(|r| r.to_string())
                .unwrap_or_else(|_| type_name(&answer))
        ))
    })?;
    Ok(Some(Device {
        device_type,
        device_id,
    }))
}

/// Calls `obj.__dlpack__(max_version=(1, 3))` (with `stream=` first when
/// `stream` is `Some`), retrying without `max_version` when the producer
/// raises `TypeError` (`stream` is older than `max_version` in the
/// standard, so it is kept). `Ok(None)` when `obj` has no `__dlpack__`.
pub(crate) fn call_dlpack<'py>(
    obj: &Bound<'py, PyAny>,
    stream: Option<i64>,
) -> Result<Option<Bound<'py, PyAny>>, ImportError> {
    static VERSION: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    let py = obj.py();
    let version = VERSION
        .get_or_try_init(py, || {
            PyTuple::new(py, [MAX_VERSION.0, MAX_VERSION.1]).map(Bound::unbind)
        })
        .map_err(ImportError::Propagate)?
        .bind(py);
    let stream_obj = match stream {
        Some(s) => Some(
            s.into_pyobject(py)
                .map_err(|e| ImportError::Propagate(e.into()))?
                .into_any(),
        ),
        None => None,
    };
    let call = |with_version: bool| -> Result<PyResult<Bound<'py, PyAny>>, ImportError> {
        call_dlpack_method(obj, stream_obj.as_ref(), version, with_version)
    };
    match call(true)? {
        Ok(capsule) => Ok(Some(capsule)),
        Err(e) if e.is_instance_of::<PyAttributeError>(py) && !has_dlpack(obj) => Ok(None),
        Err(e) if e.is_instance_of::<PyTypeError>(py) => call(false)?
            .map(Some)
            .map_err(|e| producer_error("__dlpack__", e, py)),
        Err(e) => Err(producer_error("__dlpack__", e, py)),
    }
}

/// One call of `obj.__dlpack__(stream=.., max_version=..)` through
/// vectorcall with interned keyword names (no per-call dict). The outer
/// `Err` is dlcast's own failure, the inner one the producer's.
#[cfg(any(Py_3_12, not(Py_LIMITED_API)))]
fn call_dlpack_method<'py>(
    obj: &Bound<'py, PyAny>,
    stream: Option<&Bound<'py, PyAny>>,
    version: &Bound<'py, PyTuple>,
    with_version: bool,
) -> Result<PyResult<Bound<'py, PyAny>>, ImportError> {
    static KW_VERSION: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    static KW_STREAM_VERSION: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    static KW_STREAM: PyOnceLock<Py<PyTuple>> = PyOnceLock::new();
    let py = obj.py();
    let name = intern!(py, "__dlpack__");
    let kwnames = |cell: &'static PyOnceLock<Py<PyTuple>>, names: &'static [&'static str]| {
        cell.get_or_try_init(py, || PyTuple::new(py, names).map(Bound::unbind))
            .map(|t| t.as_ptr())
            .map_err(ImportError::Propagate)
    };
    // `self`, then one value per keyword name.
    let (args, kw): ([*mut ffi::PyObject; 3], *mut ffi::PyObject) = match (stream, with_version) {
        (Some(s), true) => (
            [obj.as_ptr(), s.as_ptr(), version.as_ptr()],
            kwnames(&KW_STREAM_VERSION, &["stream", "max_version"])?,
        ),
        (Some(s), false) => (
            [obj.as_ptr(), s.as_ptr(), std::ptr::null_mut()],
            kwnames(&KW_STREAM, &["stream"])?,
        ),
        (None, true) => (
            [obj.as_ptr(), version.as_ptr(), std::ptr::null_mut()],
            kwnames(&KW_VERSION, &["max_version"])?,
        ),
        (None, false) => (
            [obj.as_ptr(), std::ptr::null_mut(), std::ptr::null_mut()],
            std::ptr::null_mut(),
        ),
    };
    // SAFETY: `args` holds `self` followed by one live value per name in
    // `kw` (a tuple of 2 or 1 names, or NULL for none); `nargsf` is 1
    // (`self` only positionally). The result is a new reference or NULL
    // with an exception set.
    Ok(unsafe {
        let r = ffi::PyObject_VectorcallMethod(name.as_ptr(), args.as_ptr(), 1, kw);
        Bound::from_owned_ptr_or_err(py, r)
    })
}

/// The same below Python 3.12 in abi3 builds, whose limited API has no
/// `PyObject_VectorcallMethod`: an ordinary method call with a keyword
/// dict (the same call, a little slower).
#[cfg(all(Py_LIMITED_API, not(Py_3_12)))]
fn call_dlpack_method<'py>(
    obj: &Bound<'py, PyAny>,
    stream: Option<&Bound<'py, PyAny>>,
    version: &Bound<'py, PyTuple>,
    with_version: bool,
) -> Result<PyResult<Bound<'py, PyAny>>, ImportError> {
    let py = obj.py();
    let kwargs = pyo3::types::PyDict::new(py);
    let fill = || -> PyResult<()> {
        if let Some(s) = stream {
            kwargs.set_item(intern!(py, "stream"), s)?;
        }
        if with_version {
            kwargs.set_item(intern!(py, "max_version"), version)?;
        }
        Ok(())
    };
    fill().map_err(ImportError::Propagate)?;
    Ok(obj.call_method(intern!(py, "__dlpack__"), (), Some(&kwargs)))
}

/// Whether `obj` has a `__dlpack__` attribute (asked only after a call
/// failed with `AttributeError`, to tell "none" from "it raised").
fn has_dlpack(obj: &Bound<'_, PyAny>) -> bool {
    obj.hasattr(intern!(obj.py(), "__dlpack__"))
        .unwrap_or(false)
}
