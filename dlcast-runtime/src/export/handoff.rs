//! Hand-off to a framework (`returns = numpy`, `torch`, `jax`, ...): each
//! framework's importer, and the conversion of a function's result
//! ([`convert_result`], [`into_py_result`]).

use super::array::{delete_versioned, make_capsule, make_managed, Array, BUFFER_PROTOCOL};
use super::tensor::Tensor;
use crate::device::Device;
use crate::error::ExportError;
pub use crate::framework::Framework;
use crate::import::Dims;
use crate::layout;
use dlpack_rs::ffi::DLManagedTensorVersioned;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyTuple};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

impl Framework {
    fn importer<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        // One slot per row of the framework table, indexed like it.
        static CACHE: [PyOnceLock<Py<PyAny>>; crate::facts::FRAMEWORKS.len()] =
            [const { PyOnceLock::new() }; crate::facts::FRAMEWORKS.len()];
        let (module, attr) = self.facts().importer;
        CACHE[self as usize]
            .get_or_try_init(py, || Ok(py.import(module)?.getattr(attr)?.unbind()))
            .map(|f| f.bind(py).clone())
    }

    /// Hands one exported array to the framework.
    fn convert<'py>(self, arr: &Bound<'py, Array>) -> PyResult<Bound<'py, PyAny>> {
        let py = arr.py();
        if self == Framework::Numpy {
            // NumPy's C API first; its `from_dlpack` only where that cannot
            // be used (looked up only then).
            if let Some(out) = numpy_from_array(arr)? {
                return Ok(out);
            }
            let device = arr.get().inner.device;
            if !device.is_host_accessible() {
                return Err(ExportError::HostOnly {
                    option: "numpy",
                    name: "NumPy",
                    device,
                }
                .into());
            }
            return self.importer(py)?.call1((arr,));
        }
        let from_dlpack = self.importer(py)?;
        match self {
            Framework::Jax => jax_from_array(py, &from_dlpack, arr),
            // TensorFlow takes a legacy capsule. Its tensors are immutable,
            // so read-only data may go to it although a legacy capsule
            // cannot carry READ_ONLY.
            Framework::Tensorflow => from_dlpack.call1((make_capsule(py, arr, false, None)?,)),
            Framework::Torch => torch_from_array(py, &from_dlpack, arr),
            // MLX arrays are immutable: read-only data goes to it like to JAX.
            Framework::Mlx => {
                let mut array = arr.clone();
                // MLX takes no negative strides: those go as a C-order copy.
                let e = &array.get().inner;
                if e.device.is_host_accessible() && e.strides.iter().any(|&s| s < 0) {
                    let copy = e.aligned_copy(py, "returns = mlx")?;
                    array = Array::new(py, copy)?;
                }
                if array.get().inner.read_only {
                    let consumer = ImmutableConsumer(array.clone().unbind());
                    from_dlpack.call1((Bound::new(py, consumer)?,))
                } else {
                    from_dlpack.call1((array,))
                }
            }
            Framework::Paddle => {
                refuse_for_mutable_only(arr, "paddle", "PaddlePaddle")?;
                from_dlpack.call1((arr,))
            }
            // Handled above.
            Framework::Numpy => from_dlpack.call1((arr,)),
            // Below abi3-py311 `dlcast.Array` has no buffer protocol: the
            // memoryview is NumPy's, over the same memory (NumPy keeps the
            // array alive as its base).
            Framework::Memoryview if !BUFFER_PROTOCOL => {
                let np = py.import(pyo3::intern!(py, "numpy"))?;
                let view = np.call_method1(pyo3::intern!(py, "asarray"), (arr,))?;
                from_dlpack.call1((view,))
            }
            _ => from_dlpack.call1((arr,)),
        }
    }
}

/// An `ndarray` over a host array's memory through NumPy's C API (see
/// [`crate::npapi`]); `None` where only `numpy.from_dlpack` applies.
fn numpy_from_array<'py>(array: &Bound<'py, Array>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let e = &array.get().inner;
    if e.device != Device::CPU {
        return Ok(None);
    }
    crate::npapi::ndarray(
        array.as_any(),
        &crate::npapi::HostArray {
            data: e.data,
            shape: &e.shape,
            byte_strides: &e.byte_strides,
            dtype: e.dtype,
            read_only: e.read_only,
        },
    )
}

/// For consumers without read-only tensors or negative strides (PyTorch,
/// PaddlePaddle): they ignore DLPack's `READ_ONLY` flag, so handing them
/// read-only memory would let Python write into it; say so, with what to do
/// instead, before anything is handed over (the export is then freed by the
/// caller, as for any error).
fn refuse_for_mutable_only(
    array: &Bound<'_, Array>,
    option: &'static str,
    name: &'static str,
) -> PyResult<()> {
    let e = &array.get().inner;
    if e.read_only {
        return Err(ExportError::ReadOnlyRefused { option, name }.into());
    }
    let negative = e.strides.iter().any(|&s| s < 0);
    let shape = if negative {
        e.shape_usize()
    } else {
        Dims::new()
    };
    if let Some(axis) = (0..shape.len())
        .find(|&d| e.strides.get(d).is_some_and(|&s| s < 0) && !layout::stride_unused(&shape, d))
    {
        return Err(ExportError::NegativeStride {
            option,
            name,
            stride: e.strides[axis],
            axis,
            strides: e.strides.to_vec(),
        }
        .into());
    }
    Ok(())
}

/// Hands an array to PyTorch through `torch.Tensor`'s DLPack C exchange API
/// (`managed_tensor_to_py_object_no_sync`: no capsule, no Python-level
/// `from_dlpack`), or `torch.from_dlpack` where the API is missing. Host
/// memory only: there is no stream to synchronise.
fn torch_from_array<'py>(
    py: Python<'py>,
    from_dlpack: &Bound<'py, PyAny>,
    array: &Bound<'py, Array>,
) -> PyResult<Bound<'py, PyAny>> {
    static TO_TORCH: PyOnceLock<usize> = PyOnceLock::new();
    // PyTorch's own table, checked to be its C code (whatever sits on
    // `torch.Tensor.__dlpack_c_exchange_api__`): the call below relies on
    // how PyTorch's function treats the tensor it is handed.
    let to_torch = *TO_TORCH.get_or_init(py, || {
        crate::import::exchange::torch_table(py)
            .and_then(|a| a.managed_tensor_to_py_object_no_sync)
            .map_or(0, |f| f as usize)
    });
    refuse_for_mutable_only(array, "torch", "PyTorch")?;
    let e = &array.get().inner;
    if to_torch == 0 || !e.device.is_host_accessible() {
        return from_dlpack.call1((array,));
    }
    // SAFETY: `to_torch` is the non-NULL `managed_tensor_to_py_object_no_sync`
    // of PyTorch's process-lifetime exchange table.
    let to_torch: unsafe extern "C" fn(*mut DLManagedTensorVersioned, *mut *mut c_void) -> c_int =
        unsafe { std::mem::transmute::<usize, _>(to_torch) };
    let deleted = Arc::new(AtomicBool::new(false));
    let managed =
        make_managed(array, true, None, Some(deleted.clone()))?.cast::<DLManagedTensorVersioned>();
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `managed` is an owning versioned tensor whose ownership the
    // call takes ("stolen", per the header); `out` receives a new reference,
    // or the call fails with an exception set.
    let rc = unsafe { to_torch(managed, &mut out) };
    if rc != 0 || out.is_null() {
        let err = PyErr::take(py).unwrap_or_else(|| ExportError::TorchNoTensor.into());
        if !deleted.load(Ordering::SeqCst) {
            // SAFETY: PyTorch's implementation (`ManagedTensorToPyObjectNoSync`
            // in torch/csrc/Module.cpp) is `at::fromDLPackVersioned` then
            // `THPVariable_Wrap`, inside a try block: once a tensor exists,
            // its storage calls our deleter when it is destroyed, which on
            // failure happens before the call returns (the flag is then
            // set). A failure before that point (a refused dtype, device or
            // layout) destroys the deleter closure without calling it, and
            // nothing in PyTorch refers to `managed` any more. So with the
            // flag unset the tensor is still ours, and freeing it here is
            // its one deleter call (without this, every refused call leaked
            // the export and the input it keeps alive).
            // SAFETY: as above, `managed` is ours and freed once, here.
            unsafe { delete_versioned(managed) };
        }
        return Err(err);
    }
    // SAFETY: `out` is a new reference to a torch.Tensor.
    Ok(unsafe { Bound::from_owned_ptr(py, out.cast()) })
}

/// Hands an array to `jax.numpy.from_dlpack`, working around three JAX
/// behaviours (jaxlib 0.10, CPU):
/// - JAX takes a buffer without a copy only if it is 64-byte aligned; it
///   copies others asynchronously yet calls the producer's deleter before
///   that copy has finished, so freeing the buffer then can crash.
/// - JAX refuses layouts that are not compact (slices with steps, negative
///   strides).
/// - JAX asks without `max_version` (a legacy capsule, which cannot carry
///   `READ_ONLY`); JAX arrays are immutable, so read-only data may go to it.
///
/// Buffers of the first two kinds are copied here, once, into an aligned
/// C-order buffer that JAX then takes without a copy.
fn jax_from_array<'py>(
    py: Python<'py>,
    from_dlpack: &Bound<'py, PyAny>,
    array: &Bound<'py, Array>,
) -> PyResult<Bound<'py, PyAny>> {
    let e = &array.get().inner;
    let mut array = array.clone();
    let (shape, strides) = (e.shape_usize(), e.strides_isize());
    let compact =
        layout::is_c_contiguous(&shape, strides) || layout::is_f_contiguous(&shape, strides);
    let aligned = (e.data as usize) % Tensor::<u8>::ALIGN == 0;
    // JAX arrays are immutable: memory an object may still write (an
    // `ArrayBuffer`'s) goes as a copy.
    let shared = e.py_owner.is_some();
    if e.device.is_host_accessible() && (shared || !(compact && aligned)) {
        array = Array::new(py, e.aligned_copy(py, "returns = jax")?)?;
    }
    if array.get().inner.read_only {
        from_dlpack.call1((Bound::new(py, ImmutableConsumer(array.unbind()))?,))
    } else {
        from_dlpack.call1((array,))
    }
}

/// Replaces every `dlcast.Array` in a function's result (the result
/// itself, or the items of a tuple or list) by `framework`'s array.
#[doc(hidden)]
pub fn convert_result(out: Bound<'_, PyAny>, framework: Option<Framework>) -> PyResult<Py<PyAny>> {
    let Some(fw) = framework else {
        return Ok(out.unbind());
    };
    let py = out.py();
    if let Ok(array) = out.cast::<Array>() {
        return Ok(fw.convert(array)?.unbind());
    }
    if let Ok(t) = out.cast::<PyTuple>() {
        let items = t
            .iter()
            .map(|x| convert_result(x, framework))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(PyTuple::new(py, items)?.into_any().unbind());
    }
    if let Ok(l) = out.cast::<PyList>() {
        let items = l
            .iter()
            .map(|x| convert_result(x, framework))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(PyList::new(py, items)?.into_any().unbind());
    }
    Ok(out.unbind())
}

/// Converts a `#[dlpack_fn]` function's result to Python, handing exported
/// arrays to `framework` when `returns = ...` names one.
#[doc(hidden)]
pub fn into_py_result<'py, R: IntoPyObject<'py>>(
    py: Python<'py>,
    result: R,
    framework: Option<Framework>,
) -> PyResult<Py<PyAny>> {
    let out = pyo3::IntoPyObjectExt::into_bound_py_any(result, py)?;
    convert_result(out, framework)
}

/// Hands a read-only [`Array`] to a consumer whose arrays are immutable
/// (JAX) through a legacy capsule, which the array itself refuses to give.
#[pyclass(module = "dlcast", frozen)]
struct ImmutableConsumer(Py<Array>);

#[pymethods]
impl ImmutableConsumer {
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<&Bound<'_, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = (stream, max_version, dl_device, copy);
        make_capsule(py, self.0.bind(py), false, None)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        let d = self.0.get().inner.device;
        (d.device_type, d.device_id)
    }
}
