//! A test-only DLPack producer: builds capsules from fields given in Python,
//! legal or not, over a backing buffer it owns, with a deleter that counts
//! its calls.

use dlpack_rs::ffi::{
    DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor,
};
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

static DELETER_CALLS: AtomicUsize = AtomicUsize::new(0);
static CREATED: AtomicUsize = AtomicUsize::new(0);

/// What a managed tensor owns: the bytes, the shape and strides arrays.
struct Backing {
    /// 16-byte aligned storage.
    words: Vec<u128>,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

const LEGACY: &CStr = c"dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";

unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    // SAFETY: `m` and its `manager_ctx` were made by `Box::into_raw` in
    // `make_capsule`; dlcast (or the capsule destructor) calls this once.
    unsafe {
        let m = Box::from_raw(m);
        drop(Box::from_raw(m.manager_ctx.cast::<Backing>()));
    }
    DELETER_CALLS.fetch_add(1, Ordering::SeqCst);
}

unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    // SAFETY: as in `delete_legacy`.
    unsafe {
        let m = Box::from_raw(m);
        drop(Box::from_raw(m.manager_ctx.cast::<Backing>()));
    }
    DELETER_CALLS.fetch_add(1, Ordering::SeqCst);
}

/// What the capsule destructor needs to know: the struct kind, the name
/// the capsule was made with (a consumer renames it to its own "used_*"
/// string when it takes the tensor), and the custom name
/// (`make_capsule(name=...)`), kept alive here as long as the capsule.
struct CapsuleCtx {
    versioned: bool,
    made_as: *const std::ffi::c_char,
    /// Only kept alive: the capsule's name points into it.
    #[allow(dead_code)]
    name: Option<std::ffi::CString>,
}

/// Capsules made with `null_deleter=True`: their backing is leaked on
/// purpose, but stays reachable from here (so valgrind, `make sanitize`,
/// sees no lost memory).
static LEAKED_ON_PURPOSE: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// Capsule destructor: frees the tensor if nobody consumed the capsule
/// (whatever its name, custom names included), as real producers do.
unsafe extern "C" fn capsule_destructor(cap: *mut ffi::PyObject) {
    // SAFETY: called by CPython with the dying capsule. The context was set
    // by `make_capsule` from `Box::into_raw` and is freed only here; while
    // the capsule keeps the name it was made with, nobody took the tensor,
    // whose struct kind the context records.
    unsafe {
        let ctx = ffi::PyCapsule_GetContext(cap).cast::<CapsuleCtx>();
        if ctx.is_null() {
            return;
        }
        let ctx = Box::from_raw(ctx);
        let name = ffi::PyCapsule_GetName(cap);
        if name == ctx.made_as {
            let p = ffi::PyCapsule_GetPointer(cap, name);
            if ctx.versioned {
                let m = p.cast::<DLManagedTensorVersioned>();
                if let Some(d) = (*m).deleter {
                    d(m);
                }
            } else {
                let m = p.cast::<DLManagedTensor>();
                if let Some(d) = (*m).deleter {
                    d(m);
                }
            }
        }
        // `ctx` (and the custom name) drops here, after the last use of
        // the capsule's name.
        drop(ctx);
    }
}

/// Builds a DLPack capsule over a copy of `data`.
///
/// `data_offset` moves the `data` pointer into the copy (bytes);
/// `strides=None` sends NULL strides; `null_data` sends a NULL pointer;
/// `null_deleter` sends no deleter (the backing then leaks, on purpose);
/// `name` overrides the capsule name.
#[pyfunction]
#[pyo3(signature = (data, shape, strides=None, *, dtype=(2, 64, 1), device=(1, 0),
                    byte_offset=0, data_offset=0, versioned=true, version=(1, 3),
                    flags=0, null_data=false, null_deleter=false, ndim=None, name=None))]
#[allow(clippy::too_many_arguments)]
pub fn make_capsule(
    py: Python<'_>,
    data: Vec<u8>,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    dtype: (u8, u8, u16),
    device: (u32, i32),
    byte_offset: u64,
    data_offset: usize,
    versioned: bool,
    version: (u32, u32),
    flags: u64,
    null_data: bool,
    null_deleter: bool,
    ndim: Option<i32>,
    name: Option<String>,
) -> PyResult<Py<PyAny>> {
    let name = name.map(std::ffi::CString::new).transpose()?;
    let mut words = vec![0u128; data.len().div_ceil(16).max(1)];
    // SAFETY: `words` has at least `data.len()` bytes; u128 has no invalid
    // bit patterns, so writing bytes into it is sound.
    unsafe {
        std::ptr::copy_nonoverlapping(data.as_ptr(), words.as_mut_ptr().cast::<u8>(), data.len())
    };
    let has_strides = strides.is_some();
    let mut backing = Box::new(Backing {
        words,
        shape: shape.clone(),
        strides: strides.unwrap_or_default(),
    });
    let data_ptr = if null_data {
        std::ptr::null_mut()
    } else {
        backing
            .words
            .as_mut_ptr()
            .cast::<u8>()
            .wrapping_add(data_offset)
            .cast::<c_void>()
    };
    let tensor = DLTensor {
        data: data_ptr,
        device: DLDevice {
            device_type: device.0,
            device_id: device.1,
        },
        ndim: ndim.unwrap_or(shape.len() as i32),
        dtype: DLDataType {
            code: dtype.0,
            bits: dtype.1,
            lanes: dtype.2,
        },
        shape: if backing.shape.is_empty() {
            std::ptr::null_mut()
        } else {
            backing.shape.as_mut_ptr()
        },
        strides: if has_strides {
            backing.strides.as_mut_ptr()
        } else {
            std::ptr::null_mut()
        },
        byte_offset,
    };
    let ctx = Box::into_raw(backing).cast::<c_void>();
    let ptr: *mut c_void = if versioned {
        Box::into_raw(Box::new(DLManagedTensorVersioned {
            version: DLPackVersion {
                major: version.0,
                minor: version.1,
            },
            manager_ctx: ctx,
            deleter: (!null_deleter).then_some(delete_versioned as _),
            flags,
            dl_tensor: tensor,
        }))
        .cast()
    } else {
        Box::into_raw(Box::new(DLManagedTensor {
            dl_tensor: tensor,
            manager_ctx: ctx,
            deleter: (!null_deleter).then_some(delete_legacy as _),
        }))
        .cast()
    };
    CREATED.fetch_add(1, Ordering::SeqCst);
    if null_deleter {
        LEAKED_ON_PURPOSE
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ptr as usize);
    }
    let name_ptr = match &name {
        // Lives in the context, which the destructor frees last.
        Some(n) => n.as_ptr(),
        None if versioned => VERSIONED.as_ptr(),
        None => LEGACY.as_ptr(),
    };
    let ctx = Box::new(CapsuleCtx {
        versioned,
        made_as: name_ptr,
        name,
    });
    // SAFETY: `ptr` is non-NULL; the name lives as long as the capsule (in
    // `ctx`, or 'static); the destructor handles both struct kinds.
    let cap = unsafe { ffi::PyCapsule_New(ptr, name_ptr, Some(capsule_destructor)) };
    // SAFETY: PyCapsule_New returns a new reference or NULL with an error set.
    let cap = unsafe { Bound::from_owned_ptr_or_err(py, cap) }?;
    // SAFETY: `cap` is a capsule; the context is ours, freed by the destructor.
    if unsafe { ffi::PyCapsule_SetContext(cap.as_ptr(), Box::into_raw(ctx).cast()) } != 0 {
        return Err(PyErr::fetch(py));
    }
    Ok(cap.unbind())
}

/// `(capsules created, deleter calls)` since the process started.
#[pyfunction]
pub fn producer_counts() -> (usize, usize) {
    (
        CREATED.load(Ordering::SeqCst),
        DELETER_CALLS.load(Ordering::SeqCst),
    )
}
