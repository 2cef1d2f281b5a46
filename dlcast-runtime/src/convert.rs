//! Implicit conversion of read-only arguments whose dtype or memory order
//! does not fit, done by the argument's own framework.
//!
//! The rules (nanobind's `ndarray` and NumPy's casting rules):
//! - only read-only parameters convert (`TensorRef`, `TensorDyn`); a
//!   writable one would write into a temporary and the caller would never
//!   see it;
//! - only "same kind" casts: NumPy's `can_cast(from, to, "same_kind")`,
//!   i.e. the kind never goes down the ladder bool < unsigned int < signed
//!   int < float < complex (`int -> float`, `f64 -> f32`, `bool -> int`
//!   convert; `float -> int`, `complex -> float` never do);
//! - shape, device and read-only constraints never convert;
//! - `#[noconvert]` on a parameter, or `#[dlpack_fn(noconvert)]`, turns it
//!   off.
//!
//! The converted array is a temporary that the view owns: it lives exactly
//! as long as the view, i.e. for the call.
//!
//! What is converted is what phase 2 read, never the argument asked again:
//! host memory in a dtype NumPy has goes through a private NumPy array over
//! exactly that read (`numpy_view`; a capsule's, a buffer's, another
//! producer's memory, and a NumPy array's own), a PyTorch tensor through
//! dlcast's private alias; only device memory and dtypes NumPy lacks are
//! converted by the argument's own framework (`convert`). The driver
//! holds the read in the borrow registry until the copy has finished.

use crate::dtype::DType;
use crate::facts::Convert;
use crate::framework::Framework;
use crate::import::{Owner, RawTensor};
use crate::spec::Order;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use smallvec::SmallVec;

/// Whether `from` converts implicitly to `to`: NumPy's
/// `can_cast(from, to, casting="same_kind")`, i.e. the kind (the dtype
/// table's `kind` column: bfloat16 and the float8 types count as floats)
/// never goes down the ladder. `false` for dtypes dlcast does not convert
/// (vector lanes, opaque handles, unknown codes).
pub fn same_kind(from: DType, to: DType) -> bool {
    matches!((from.facts(), to.facts()), (Some(a), Some(b)) if a.kind <= b.kind)
}

/// What a conversion must produce.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Target {
    pub dtype: DType,
    /// `Order::Any` keeps the layout as far as the framework allows.
    pub order: Order,
    /// Whether the result must be a fresh copy even where dtype and order
    /// already fit (misaligned data: a fresh allocation is aligned).
    pub copy: bool,
}

pub(crate) use crate::error::ConvertError;
use crate::error::Unconvertible;

/// Converts `obj` (a private NumPy array of [`numpy_view`], dlcast's
/// private alias of a PyTorch tensor, or the argument itself: device memory
/// or a dtype NumPy lacks) to `target` by asking its framework (its
/// `convert` column of the framework table; the README's table of
/// conversions).
pub(crate) fn convert<'py>(
    obj: &Bound<'py, PyAny>,
    host: bool,
    ndim: usize,
    target: Target,
) -> Result<Bound<'py, PyAny>, ConvertError> {
    let Some(name) = target.dtype.name() else {
        return Err(ConvertError::Unsupported(Unconvertible::Target(
            target.dtype,
        )));
    };
    // SAFETY: `obj` is a live object; PyCapsule_CheckExact only reads its type.
    if unsafe { pyo3::ffi::PyCapsule_CheckExact(obj.as_ptr()) } != 0 {
        return Err(ConvertError::Unsupported(Unconvertible::Capsule));
    }
    let how = Framework::of(obj).map(|f| f.facts().convert);
    // bfloat16 and the float8 types: NumPy's own dtypes have none (those
    // of `ml_dtypes` are not exported through DLPack).
    if numpy_dtypes_only(how) && target.dtype.facts().is_some_and(|f| f.numpy.is_empty()) {
        return Err(ConvertError::Unsupported(Unconvertible::NumpyLacks(
            target.dtype,
        )));
    }
    // F order is only a different layout from C for two or more dimensions.
    let wants_f = target.order == Order::F && ndim >= 2;
    // JAX without `jax_enable_x64` silently keeps 32 bits: 64-bit targets
    // of host arrays go through NumPy.
    let jax_via_numpy = host && (target.dtype.bits == 64 || target.dtype == DType::COMPLEX128);
    let raised = |what: &'static str| move |e: PyErr| ConvertError::Raised(what, e);
    let py = obj.py();
    match how {
        Some(Convert::NumpyAstype) => {
            numpy_like_astype(obj, name, target.order).map_err(raised("x.astype"))
        }
        // Inside the disabled regions: no mode sees (or changes) the
        // private alias it converts.
        Some(Convert::TorchTo) => crate::import::torch::in_disabled_regions(py, || {
            torch_convert(obj, name, target.order, ndim, target.copy)
        })
        .map_err(raised("x.to")),
        // These frameworks' arrays are always C-contiguous (row-major): a
        // dtype change keeps that; F order needs NumPy.
        Some(Convert::JaxAstype) if !wants_f && !jax_via_numpy => obj
            .call_method1(intern!(py, "astype"), (name,))
            .map_err(raised("x.astype")),
        Some(Convert::NamespaceAstype) if !wants_f => {
            let xp = obj
                .call_method0(intern!(py, "__array_namespace__"))
                .map_err(raised("x.__array_namespace__"))?;
            let dtype = xp.getattr(name).map_err(raised("xp.astype"))?;
            xp.call_method1(intern!(py, "astype"), (obj, dtype))
                .map_err(raised("xp.astype"))
        }
        Some(Convert::TensorflowCast) if !wants_f => py
            .import(intern!(py, "tensorflow"))
            .and_then(|tf| tf.call_method1(intern!(py, "cast"), (obj, name)))
            .map_err(raised("tensorflow.cast")),
        // Host memory of any other producer is converted by NumPy from a
        // view of what dlcast read (see `numpy_view`), never from the
        // producer again; where NumPy cannot view it, it is not converted.
        Some(
            Convert::JaxAstype
            | Convert::NamespaceAstype
            | Convert::TensorflowCast
            | Convert::NumpyOnly,
        )
        | None => Err(ConvertError::Unsupported(if host {
            Unconvertible::NotViewable
        } else {
            Unconvertible::Device
        })),
    }
}

/// Whether a conversion by `how` (`None`: an unknown producer's) takes only
/// dtypes NumPy has: NumPy's (and CuPy's) `astype`, and an unknown
/// producer's memory, which only NumPy converts.
fn numpy_dtypes_only(how: Option<Convert>) -> bool {
    match how {
        Some(Convert::NumpyAstype) | None => true,
        Some(
            Convert::TorchTo
            | Convert::JaxAstype
            | Convert::NamespaceAstype
            | Convert::TensorflowCast
            | Convert::NumpyOnly,
        ) => false,
    }
}

fn order_letter(order: Order) -> &'static str {
    match order {
        Order::Any => "K",
        Order::C | Order::Contiguous => "C",
        Order::F => "F",
    }
}

/// NumPy's (and CuPy's) `a.astype(dtype, order=...)`.
fn numpy_like_astype<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    order: Order,
) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item(intern!(py, "order"), order_letter(order))?;
    obj.call_method(intern!(py, "astype"), (name,), Some(&kwargs))
}

/// `x.detach().to(torch.<name>)` (with `copy=True` where asked), then
/// `.contiguous()` for C order, or the same under a reversed permutation for
/// F order (which really yields column-major strides), through
/// `TensorBase`'s own methods (see `import::torch::methods`).
fn torch_convert<'py>(
    obj: &Bound<'py, PyAny>,
    name: &str,
    order: Order,
    ndim: usize,
    copy: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    let torch = py.import(intern!(py, "torch"))?;
    let dtype = torch.getattr(name)?;
    let kwargs = PyDict::new(py);
    if copy {
        kwargs.set_item(intern!(py, "copy"), true)?;
    }
    // `TensorBase`'s own C methods, never `torch.Tensor`'s attributes.
    let m = crate::import::torch::methods(py)?;
    let detached = m.detach.bind(py).call1((obj,))?;
    let t = m.to.bind(py).call((detached, dtype), Some(&kwargs))?;
    match order {
        Order::Any => Ok(t),
        Order::C | Order::Contiguous => m.contiguous.bind(py).call1((t,)),
        Order::F => {
            let rev: Vec<usize> = (0..ndim).rev().collect();
            let t = m.permute.bind(py).call1((t, rev.clone()))?;
            let t = m.contiguous.bind(py).call1((t,))?;
            m.permute.bind(py).call1((t, rev))
        }
    }
}

/// Whether [`numpy_view`] can view `raw` for a conversion to `target`:
/// host memory, in a dtype NumPy has, converted to one NumPy has. Call
/// before the read that [`numpy_view`] is given: the first call finds
/// NumPy's C API (Python code: imports).
pub(crate) fn numpy_can_convert(py: Python<'_>, raw: &RawTensor, target: DType) -> bool {
    raw.device.is_host_accessible()
        && target.facts().is_some_and(|f| !f.numpy.is_empty())
        && crate::npapi::can_view(py, raw.dtype, raw.shape.len())
}

/// The name of the capsule that keeps a converted argument's memory alive
/// (the `base` of [`numpy_view`]'s array).
const SOURCE_CAPSULE: &std::ffi::CStr = c"dlcast.conversion_source";

/// A read-only NumPy array over exactly the memory `raw` describes, owning
/// `owner` (what keeps that memory alive), for NumPy to convert: the
/// memory dlcast read and holds in the borrow registry, never a second
/// request to the producer (`numpy.from_dlpack(x)` would call
/// `x.__dlpack__()` again, and a producer may then hand out other memory).
/// The array is new and dlcast holds its only reference, so no Python code
/// can change its fields before NumPy reads them. `None` where NumPy
/// cannot view it after all (see [`numpy_can_convert`]); `owner` is then
/// released.
pub(crate) fn numpy_view<'py>(
    py: Python<'py>,
    raw: &RawTensor,
    owner: Owner,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let Some(item) = raw.dtype.itemsize().and_then(|b| isize::try_from(b).ok()) else {
        return Ok(None);
    };
    let shape: Option<SmallVec<[isize; 4]>> =
        raw.shape.iter().map(|&n| isize::try_from(n).ok()).collect();
    let strides: Option<SmallVec<[isize; 4]>> =
        raw.strides.iter().map(|&s| s.checked_mul(item)).collect();
    let (Some(shape), Some(byte_strides)) = (shape, strides) else {
        return Ok(None);
    };
    // An empty array touches no memory and may have a NULL `data`, which
    // NumPy's C API does not take: any aligned address, never read.
    let data = if raw.data.is_null() {
        std::ptr::NonNull::<u128>::dangling().as_ptr().cast()
    } else {
        raw.data
    };
    let base = keep_alive(py, owner)?;
    crate::npapi::ndarray(
        &base,
        &crate::npapi::HostArray {
            data,
            shape: &shape,
            byte_strides: &byte_strides,
            dtype: raw.dtype,
            read_only: true,
        },
    )
}

/// `owner` as a Python object: a capsule that releases it when freed
/// (which CPython does with the GIL held, as [`Owner`]'s drop needs).
fn keep_alive(py: Python<'_>, owner: Owner) -> PyResult<Bound<'_, PyAny>> {
    unsafe extern "C" fn release(capsule: *mut pyo3::ffi::PyObject) {
        // SAFETY: called by CPython once, when the capsule made below is
        // freed, with the GIL held; its pointer is the `Box<Owner>` made
        // below under this name, reclaimed only here.
        unsafe {
            let p = pyo3::ffi::PyCapsule_GetPointer(capsule, SOURCE_CAPSULE.as_ptr());
            if p.is_null() {
                pyo3::ffi::PyErr_Clear();
                return;
            }
            drop(Box::from_raw(p.cast::<Owner>()));
        }
    }
    let boxed = Box::into_raw(Box::new(owner));
    // SAFETY: `boxed` is a valid, non-NULL pointer that the capsule owns
    // from here (released by `release`); the name is a static C string.
    let capsule =
        unsafe { pyo3::ffi::PyCapsule_New(boxed.cast(), SOURCE_CAPSULE.as_ptr(), Some(release)) };
    if capsule.is_null() {
        // SAFETY: no capsule took `boxed`: it is still ours alone.
        drop(unsafe { Box::from_raw(boxed) });
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference, just made.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::code;

    #[test]
    fn same_kind_follows_the_ladder() {
        assert!(same_kind(DType::INT64, DType::FLOAT32));
        assert!(same_kind(DType::FLOAT64, DType::FLOAT32));
        assert!(same_kind(DType::BOOL, DType::INT8));
        assert!(same_kind(DType::UINT8, DType::INT8));
        assert!(same_kind(DType::FLOAT32, DType::BFLOAT16));
        assert!(same_kind(DType::FLOAT8_E4M3FN, DType::FLOAT32));
        assert!(same_kind(DType::FLOAT32, DType::FLOAT8_E5M2));
        assert!(same_kind(DType::INT8, DType::FLOAT8_E4M3FN));
        assert!(!same_kind(DType::FLOAT8_E4M3FN, DType::INT32));
        assert!(!same_kind(DType::COMPLEX64, DType::FLOAT8_E5M2));
        assert!(!same_kind(DType::FLOAT32, DType::INT32));
        assert!(!same_kind(DType::INT8, DType::UINT64));
        assert!(!same_kind(DType::COMPLEX64, DType::FLOAT64));
        assert!(!same_kind(DType::INT8, DType::BOOL));
        assert!(!same_kind(DType::new(code::FLOAT, 32, 4), DType::FLOAT32));
        assert!(!same_kind(
            DType::new(code::OPAQUE_HANDLE, 64, 1),
            DType::INT64
        ));
    }
}
