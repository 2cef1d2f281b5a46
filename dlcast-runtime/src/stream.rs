//! Streams: which `stream` the consumer passes to a producer's `__dlpack__`
//! for GPU memory, and what a view records about it.
//!
//! The values are the array API standard's (`__dlpack__(stream=...)`),
//! integers as Python passes them:
//!
//! | device | value | meaning |
//! |---|---|---|
//! | CUDA (and CUDA managed memory) | `1` | the legacy default stream (`cudaStreamLegacy`) |
//! | | `2` | the per-thread default stream (`cudaStreamPerThread`) |
//! | | `> 2` | a `cudaStream_t`, as an integer |
//! | | `0` | forbidden by the standard (ambiguous) |
//! | ROCm | `0` | the default stream |
//! | | `> 2` | a `hipStream_t`, as an integer |
//! | | `1`, `2` | not supported by the standard |
//! | either | `-1` | "do not synchronise" |
//! | CPU, pinned host memory, others | `None` | the only value allowed |
//!
//! The CUDA values `1` and `2` are also the handles the CUDA runtime and
//! driver APIs use for those two streams (`cudaStreamLegacy ==
//! (cudaStream_t)0x1`, `CU_STREAM_PER_THREAD == 0x2`), so a recorded stream
//! can be handed to a kernel launch as it is (except `-1`, which names no
//! stream).
//!
//! Default rule (no annotation): for a CUDA or ROCm input, the producer's
//! current work stream where it says which (the DLPack C exchange API's
//! `current_work_stream`), else the default stream (`1` for CUDA, `0` for
//! ROCm); `None` for everything else. A function can choose instead:
//! `#[dlpack_fn(stream = legacy | per_thread | no_sync)]`, or a parameter
//! marked `#[stream]` holding a stream handle per call.

use crate::device::{kind, Device};

/// The stream a `#[dlpack_fn]` function asks its GPU inputs to be made
/// ready on. Set per function (`#[dlpack_fn(stream = ...)]`) or per call
/// (a `#[stream]` parameter); the default is [`StreamRequest::Producer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum StreamRequest {
    /// The producer's current work stream where the DLPack C exchange API
    /// tells it, else the device's default stream (`1` CUDA, `0` ROCm).
    #[default]
    Producer,
    /// The legacy default stream: `1` for CUDA, `0` (the default stream)
    /// for ROCm. `#[dlpack_fn(stream = legacy)]`.
    Legacy,
    /// CUDA's per-thread default stream, `2`; refused for ROCm inputs (the
    /// standard does not allow `2` there). `#[dlpack_fn(stream = per_thread)]`.
    PerThread,
    /// `-1`: the producer must not synchronise; the function takes care of
    /// ordering itself. `#[dlpack_fn(stream = no_sync)]`.
    NoSync,
    /// A stream handle (`cudaStream_t` / `hipStream_t` as an integer) from a
    /// `#[stream]` parameter. A CUDA handle of `0` (the NULL stream, which is
    /// the legacy default stream) is passed as `1`, as PyTorch does; `1` and
    /// `2` are CUDA's legacy and per-thread handles.
    Handle(u64),
}

/// A value a `#[stream]` parameter may hold: an integer stream handle, or
/// `None` for the default rule.
pub trait StreamArg {
    /// The request, or `Err(value)` for a negative value other than `-1`.
    fn to_request(&self) -> Result<StreamRequest, i128>;
}

fn from_int(v: i128) -> Result<StreamRequest, i128> {
    match v {
        -1 => Ok(StreamRequest::NoSync),
        v if v < 0 || v > u64::MAX as i128 => Err(v),
        v => Ok(StreamRequest::Handle(v as u64)),
    }
}

macro_rules! stream_arg_int {
    ($($t:ty),*) => {$(
        impl StreamArg for $t {
            fn to_request(&self) -> Result<StreamRequest, i128> {
                from_int(*self as i128)
            }
        }
    )*};
}
stream_arg_int!(i32, i64, isize, u32, u64, usize);

impl<T: StreamArg> StreamArg for Option<T> {
    fn to_request(&self) -> Result<StreamRequest, i128> {
        match self {
            Some(v) => v.to_request(),
            None => Ok(StreamRequest::Producer),
        }
    }
}

impl<T: StreamArg + ?Sized> StreamArg for &T {
    fn to_request(&self) -> Result<StreamRequest, i128> {
        (**self).to_request()
    }
}

/// Which stream rules apply to memory on `device`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamKind {
    /// No streams: `None` only (CPU, pinned host memory, other devices).
    None,
    /// CUDA device or managed memory.
    Cuda,
    /// ROCm device memory.
    Rocm,
}

/// The stream rules for a device type code.
pub(crate) fn stream_kind(device_type: i32) -> StreamKind {
    match device_type {
        kind::CUDA | kind::CUDA_MANAGED => StreamKind::Cuda,
        kind::ROCM => StreamKind::Rocm,
        _ => StreamKind::None,
    }
}

/// The `stream` to pass to `__dlpack__` for memory on `device`, given the
/// function's request and the producer's current work stream (from the
/// exchange API, as its raw handle) if known. `Ok(None)`: pass `None`.
///
/// # Errors
/// A message for requests the device's rules forbid (`per_thread` for ROCm).
pub(crate) fn resolve(
    device: Device,
    request: StreamRequest,
    current: Option<u64>,
) -> Result<Option<i64>, String> {
    let k = stream_kind(device.device_type);
    let handle = |h: u64| -> Result<i64, String> {
        i64::try_from(h).map_err(|_| format!("stream handle {h:#x} does not fit in 64 signed bits"))
    };
    Ok(match (k, request) {
        (StreamKind::None, _) => None,
        (_, StreamRequest::NoSync) => Some(-1),
        // CUDA: the NULL handle is the legacy default stream, which the
        // standard spells 1 (0 is forbidden).
        (StreamKind::Cuda, StreamRequest::Producer) => Some(match current {
            Some(0) | None => 1,
            Some(h) => handle(h)?,
        }),
        (StreamKind::Cuda, StreamRequest::Legacy) => Some(1),
        (StreamKind::Cuda, StreamRequest::PerThread) => Some(2),
        (StreamKind::Cuda, StreamRequest::Handle(0)) => Some(1),
        (StreamKind::Cuda, StreamRequest::Handle(h)) => Some(handle(h)?),
        // ROCm: 0 is the default stream; 1 and 2 are not allowed.
        (StreamKind::Rocm, StreamRequest::Producer) => Some(match current {
            Some(h) => handle(h)?,
            None => 0,
        }),
        (StreamKind::Rocm, StreamRequest::Legacy) => Some(0),
        (StreamKind::Rocm, StreamRequest::PerThread) => {
            return Err(format!(
                "stream = per_thread (2) is CUDA-only, but the array is on {device}"
            ))
        }
        (StreamKind::Rocm, StreamRequest::Handle(h @ (1 | 2))) => {
            return Err(format!(
                "stream {h} is a CUDA stream value, not allowed for an array on {device}"
            ))
        }
        (StreamKind::Rocm, StreamRequest::Handle(h)) => Some(handle(h)?),
    })
}

/// Whether a parameter whose `#[device(..)]` allows these devices may
/// receive memory with streams (so the producer's device must be known
/// before `__dlpack__` is called).
pub(crate) fn may_need_stream(devices: &[crate::device::DeviceSpec]) -> bool {
    devices.iter().any(|d| match d.device_type {
        None => true,
        Some(t) => stream_kind(t) != StreamKind::None,
    })
}

/// Makes stream `consumer` wait for the work pending on stream `ready`
/// (both the standard's integers, on `device`): an event recorded on
/// `ready`, waited for on `consumer`. Needs the CUDA driver, through the
/// `cudarc` feature.
///
/// # Errors
/// Why it could not be done, as a message.
pub(crate) fn wait_for(device: Device, ready: i64, consumer: i64) -> Result<(), String> {
    if stream_kind(device.device_type) != StreamKind::Cuda {
        return Err("synchronising streams is implemented for CUDA only".into());
    }
    #[cfg(feature = "cudarc")]
    {
        crate::cuda::wait_for(device, ready, consumer)
    }
    #[cfg(not(feature = "cudarc"))]
    {
        let _ = (ready, consumer);
        Err(
            "dlcast-runtime was built without its `cudarc` feature, which synchronises \
             CUDA streams; ask for the array's own stream or -1"
                .into(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(t: i32) -> Device {
        Device {
            device_type: t,
            device_id: 0,
        }
    }

    #[test]
    fn defaults() {
        let p = StreamRequest::Producer;
        assert_eq!(resolve(dev(kind::CUDA), p, None), Ok(Some(1)));
        assert_eq!(resolve(dev(kind::CUDA), p, Some(0)), Ok(Some(1)));
        assert_eq!(resolve(dev(kind::CUDA), p, Some(0x5000)), Ok(Some(0x5000)));
        assert_eq!(resolve(dev(kind::CUDA_MANAGED), p, None), Ok(Some(1)));
        assert_eq!(resolve(dev(kind::ROCM), p, None), Ok(Some(0)));
        assert_eq!(resolve(dev(kind::ROCM), p, Some(0x77)), Ok(Some(0x77)));
        for t in [kind::CPU, kind::CUDA_HOST, kind::ROCM_HOST, kind::METAL] {
            assert_eq!(resolve(dev(t), p, None), Ok(None));
            assert_eq!(resolve(dev(t), StreamRequest::Handle(9), None), Ok(None));
        }
    }

    #[test]
    fn requests() {
        let cuda = dev(kind::CUDA);
        let rocm = dev(kind::ROCM);
        assert_eq!(resolve(cuda, StreamRequest::Legacy, Some(9)), Ok(Some(1)));
        assert_eq!(resolve(cuda, StreamRequest::PerThread, None), Ok(Some(2)));
        assert_eq!(resolve(cuda, StreamRequest::NoSync, None), Ok(Some(-1)));
        assert_eq!(resolve(cuda, StreamRequest::Handle(0), None), Ok(Some(1)));
        assert_eq!(resolve(cuda, StreamRequest::Handle(77), None), Ok(Some(77)));
        assert_eq!(resolve(rocm, StreamRequest::Legacy, None), Ok(Some(0)));
        assert_eq!(resolve(rocm, StreamRequest::NoSync, None), Ok(Some(-1)));
        assert!(resolve(rocm, StreamRequest::PerThread, None).is_err());
        assert!(resolve(rocm, StreamRequest::Handle(2), None).is_err());
        assert!(resolve(cuda, StreamRequest::Handle(u64::MAX), None).is_err());
    }

    #[test]
    fn stream_args() {
        assert_eq!(7usize.to_request(), Ok(StreamRequest::Handle(7)));
        assert_eq!((-1i64).to_request(), Ok(StreamRequest::NoSync));
        assert_eq!((-2i64).to_request(), Err(-2));
        assert_eq!(None::<u64>.to_request(), Ok(StreamRequest::Producer));
        assert_eq!(Some(3u64).to_request(), Ok(StreamRequest::Handle(3)));
    }
}
