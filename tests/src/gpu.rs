//! GPU arrays and streams without a GPU: a fake CUDA/ROCm producer that
//! records the `stream` it is asked for (its pointer is never
//! dereferenced), and functions that report what dlcast chose. With the
//! `cudarc` feature, functions that touch real CUDA memory (tests/gpu).

use crate::producer;
use dlcast_runtime::prelude::*;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;

/// A strict fake producer of `n` float32 elements on `(device_type,
/// device_id)`: records every `stream` passed to `__dlpack__` and counts
/// `__dlpack_device__` calls; refuses streams the array API standard
/// forbids for its device, as PyTorch does.
#[pyclass(module = "dlcast_testext")]
pub struct FakeGpuArray {
    device: (i32, i32),
    n: usize,
    /// What `__dlpack_device__` answers, if not the real device (a liar).
    claims: Option<(i32, i32)>,
    #[pyo3(get)]
    streams: Vec<Option<i64>>,
    #[pyo3(get)]
    device_calls: usize,
}

#[pymethods]
impl FakeGpuArray {
    #[new]
    #[pyo3(signature = (device_type, device_id=0, n=4, claims=None))]
    fn new(device_type: i32, device_id: i32, n: usize, claims: Option<(i32, i32)>) -> Self {
        FakeGpuArray {
            device: (device_type, device_id),
            n,
            claims,
            streams: Vec::new(),
            device_calls: 0,
        }
    }

    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &mut self,
        py: Python<'_>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let _ = (dl_device, copy);
        self.streams.push(stream);
        let bad = match (self.device.0, stream) {
            (_, None | Some(-1)) => false,
            // CUDA and CUDA managed memory: 0 is ambiguous, below -1 invalid.
            (2 | 13, Some(s)) => s == 0 || s < -1,
            // ROCm: 1 and 2 are CUDA-only values.
            (10, Some(s)) => s == 1 || s == 2 || s < -1,
            // Everything else: None only.
            (_, Some(_)) => true,
        };
        if bad {
            return Err(PyBufferError::new_err(format!(
                "stream={stream:?} is not allowed for device {:?}",
                self.device
            )));
        }
        producer::make_capsule(
            py,
            vec![0u8; self.n * 4],
            vec![self.n as i64],
            Some(vec![1]),
            (2, 32, 1),
            (self.device.0 as u32, self.device.1),
            0,
            0,
            max_version.is_some(),
            (1, 3),
            0,
            false,
            false,
            None,
            None,
        )
    }

    fn __dlpack_device__(&mut self) -> (i32, i32) {
        self.device_calls += 1;
        self.claims.unwrap_or(self.device)
    }
}

/// The stream dlcast chose for an input on CPU, CUDA, ROCm, pinned or
/// managed memory.
#[dlpack_fn]
#[pyfunction]
fn chosen_stream(
    #[device(cpu, cuda, rocm, cuda_host, rocm_host, cuda_managed)] x: TensorDyn<'_>,
) -> Option<i64> {
    x.stream()
}

/// The same, for a parameter that accepts CPU memory only.
#[dlpack_fn]
#[pyfunction]
fn chosen_stream_cpu(x: TensorDyn<'_>) -> Option<i64> {
    x.stream()
}

/// `stream = per_thread` (2).
#[dlpack_fn(stream = per_thread)]
#[pyfunction]
fn stream_per_thread(#[device(cuda, rocm, cpu)] x: TensorDyn<'_>) -> Option<i64> {
    x.stream()
}

/// `stream = no_sync` (-1).
#[dlpack_fn(stream = no_sync)]
#[pyfunction]
fn stream_no_sync(#[device(cuda, rocm)] x: TensorDyn<'_>) -> Option<i64> {
    x.stream()
}

/// `stream = legacy` (1 for CUDA, 0 for ROCm), whatever the producer's
/// current stream.
#[dlpack_fn(stream = legacy)]
#[pyfunction]
fn stream_legacy(#[device(cuda, rocm)] x: TensorDyn<'_>) -> Option<i64> {
    x.stream()
}

/// A `#[stream]` parameter: a `cudaStream_t` per call (`None`: the
/// default rule); two inputs, both asked for that stream.
#[dlpack_fn]
#[pyfunction]
#[pyo3(signature = (x, y, stream=None))]
fn stream_param(
    #[device(cuda, rocm)] x: TensorDyn<'_>,
    #[device(cuda, rocm, cpu)] y: TensorDyn<'_>,
    #[stream] stream: Option<i64>,
) -> (Option<i64>, Option<i64>, Option<i64>) {
    (x.stream(), y.stream(), stream)
}

/// A `#[stream]` parameter combined with a function-level choice: the
/// parameter wins unless it is `None`.
#[dlpack_fn(stream = per_thread)]
#[pyfunction]
#[pyo3(signature = (x, stream=None))]
fn stream_param_over_option(
    #[device(cuda)] x: TensorDyn<'_>,
    #[stream] stream: Option<usize>,
) -> Option<i64> {
    let _ = stream;
    x.stream()
}

/// CUDA device 0 only.
#[dlpack_fn]
#[pyfunction]
fn cuda0_only(#[device(cuda(0))] x: TensorDyn<'_>) -> (i32, i32) {
    (x.device().device_type, x.device().device_id)
}

/// Every host accessor on a CUDA float32 view, and what it gave:
/// `(as_slice is None, get is None, to_vec error, as_ndarray error,
/// data_ptr)`.
#[dlpack_fn]
#[pyfunction]
fn gpu_accessors(
    #[device(cuda, rocm)] x: TensorRef<'_, f32>,
) -> (bool, bool, String, String, usize) {
    let to_vec = x.to_vec().err().map(|e| e.to_string()).unwrap_or_default();
    let nd = x
        .as_ndarray()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    (
        x.as_slice().is_none(),
        x.get(&[0]).is_err(),
        to_vec,
        nd,
        x.data_ptr() as usize,
    )
}

/// The writable accessors on a CUDA float32 view: `(as_slice_mut is None,
/// set refused, fill error, as_ndarray_mut error)`.
#[dlpack_fn]
#[pyfunction]
fn gpu_accessors_mut(
    #[device(cuda, rocm)] mut x: TensorMut<'_, f32>,
) -> (bool, bool, String, String) {
    let slice_none = x.as_slice_mut().is_none();
    let set_refused = x.set(&[0], 1.0).is_err();
    let fill = x.fill(1.0).err().map(|e| e.to_string()).unwrap_or_default();
    let nd = x
        .as_ndarray_mut()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    (slice_none, set_refused, fill, nd)
}

/// Returns the GPU input itself (exported zero-copy, with its stream).
#[dlpack_fn(returns = dlcast)]
#[pyfunction]
fn gpu_identity(#[device(cuda, rocm, cpu)] x: TensorDyn<'_>) -> TensorDyn<'_> {
    x
}

/// Returns the GPU input, imported on the stream given per call.
#[dlpack_fn(returns = dlcast)]
#[pyfunction]
fn gpu_identity_on(
    #[device(cuda, rocm, cpu)] x: TensorDyn<'_>,
    #[stream] stream: i64,
) -> TensorDyn<'_> {
    let _ = stream;
    x
}

/// Returns the GPU input to PyTorch (`torch.from_dlpack`).
#[dlpack_fn(returns = torch)]
#[pyfunction]
fn gpu_identity_torch(#[device(cuda, cpu)] x: TensorRef<'_, f32>) -> TensorRef<'_, f32> {
    x
}

/// A CUDA float32 input copied with cudarc (device to device, ordered
/// after the input's stream) into a new `CudaSlice` on the legacy default
/// stream, returned as a CUDA tensor ready on that stream (`1`).
#[cfg(feature = "cudarc")]
#[dlpack_fn]
#[pyfunction]
fn cudarc_copy(
    #[device(cuda)]
    #[order(c)]
    x: TensorRef<'_, f32>,
) -> PyResult<Tensor<f32>> {
    use cudarc::driver::{result, CudaContext, DevicePtrMut};
    let err =
        |e: cudarc::driver::DriverError| pyo3::exceptions::PyRuntimeError::new_err(e.to_string());
    let ordinal = usize::try_from(x.device().device_id)
        .map_err(|_| pyo3::exceptions::PyValueError::new_err("negative device id"))?;
    let ctx = CudaContext::new(ordinal).map_err(err)?;
    let src = x.cuda_device_ptr()?;
    let handle = x
        .cu_stream()
        .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("the input has no stream"))?;
    // SAFETY: `handle` is the stream the input was made ready on, a stream
    // of this device's primary context that its owner keeps alive for the
    // call; the wrapper is dropped before the call returns (nothing below
    // keeps it).
    let input_stream = unsafe { ctx.wrap_borrowed_stream(handle) };
    let out_stream = ctx.default_stream();
    let n = x.len();
    // SAFETY: uninitialised device memory, fully written by the copy below
    // before anything reads it (the copy is ordered after the allocation
    // and every later use is ordered after the copy).
    let mut out = unsafe { out_stream.alloc::<f32>(n) }.map_err(err)?;
    input_stream.join(&out_stream).map_err(err)?;
    {
        let (dst, _sync) = out.device_ptr_mut(&input_stream);
        // SAFETY: `src` addresses `n` contiguous f32 (C order checked) on
        // this device, alive for the call and ready on `input_stream`;
        // `dst` is a fresh allocation of `n` f32, ordered before this copy.
        unsafe { result::memcpy_dtod_async(dst, src, n * 4, input_stream.cu_stream()) }
            .map_err(err)?;
    }
    out_stream.join(&input_stream).map_err(err)?;
    Ok(Tensor::from_cuda_slice(out, x.shape())?)
}

/// Registers the GPU and stream functions.
pub fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<FakeGpuArray>()?;
    macro_rules! add {
        ($($f:ident),* $(,)?) => {$( m.add_function(wrap_pyfunction!($f, m)?)?; )*};
    }
    add!(
        chosen_stream,
        chosen_stream_cpu,
        stream_per_thread,
        stream_no_sync,
        stream_legacy,
        stream_param,
        stream_param_over_option,
        cuda0_only,
        gpu_accessors,
        gpu_accessors_mut,
        gpu_identity,
        gpu_identity_on,
        gpu_identity_torch,
    );
    #[cfg(feature = "cudarc")]
    add!(cudarc_copy);
    m.add("HAS_CUDARC", cfg!(feature = "cudarc"))?;
    Ok(())
}
