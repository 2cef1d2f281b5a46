//! CUDA through [`cudarc`] (feature `cudarc`; the driver library is loaded
//! at run time, so building needs no CUDA installation):
//!
//! - `Tensor::from_cuda_slice` (in the export module): a `CudaSlice<T>`
//!   returned to Python as a CUDA array, zero-copy; it is freed (on its own
//!   stream) when the last consumer lets go.
//! - `cuda_device_ptr()` and `cu_stream()` on views: the device address and
//!   stream handle to launch kernels with (`cudarc::driver::result` or
//!   `launch_builder` with `&ptr`).
//! - Returned CUDA arrays make a consumer's stream wait for their own (an
//!   event recorded on one, waited for on the other).

use crate::device::Device;
use cudarc::driver::{result, sys, CudaContext};
use std::sync::OnceLock;

/// Whether the CUDA driver library can be loaded (checked once). `cudarc`
/// panics on the first driver call when it cannot, so every entry point
/// asks this first.
pub(crate) fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: loads libcuda (or nothing); its initialisers are the CUDA
    // driver's own, which every CUDA program runs.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// The driver handle of a stream given as the standard's integer: `1` and
/// `2` are `CU_STREAM_LEGACY` and `CU_STREAM_PER_THREAD`, others are handles.
pub(crate) fn cu_stream(stream: i64) -> Option<sys::CUstream> {
    (stream >= 0).then_some(stream as usize as sys::CUstream)
}

/// Makes `consumer` wait for the work queued on `ready` (see the stream
/// module's `wait_for`).
pub(crate) fn wait_for(device: Device, ready: i64, consumer: i64) -> Result<(), String> {
    if !driver_present() {
        return Err("the CUDA driver library (libcuda) is not available".into());
    }
    let (Some(ready_s), Some(consumer_s)) = (cu_stream(ready), cu_stream(consumer)) else {
        return Ok(());
    };
    let ordinal =
        usize::try_from(device.device_id).map_err(|_| "negative device id".to_string())?;
    let err = |e: cudarc::driver::DriverError| e.to_string();
    // Retains the device's primary context (the one PyTorch, CuPy and JAX
    // use) and makes it current on this thread.
    let ctx = CudaContext::new(ordinal).map_err(err)?;
    let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).map_err(err)?;
    // SAFETY: `event` was just created in the current context; the two
    // streams are the producer's and the consumer's, alive for this call
    // (the consumer passed its stream to `__dlpack__`, the producer's is
    // the one the array was made ready on, which its owner keeps alive
    // while the array's memory lives); the event is destroyed once, after
    // both uses (destroying an event with pending waits is allowed).
    let r = unsafe {
        result::event::record(event, ready_s).and_then(|()| {
            result::stream::wait_event(
                consumer_s,
                event,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        })
    };
    // SAFETY: as above; `event` is not used after this.
    let d = unsafe { result::event::destroy(event) };
    drop(ctx);
    r.and(d).map_err(err)
}
