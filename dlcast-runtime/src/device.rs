//! Devices: DLPack's `DLDevice` as plain integers, and the device constraints
//! written in `#[device(..)]`.

use std::fmt;

/// A DLPack device: `(device_type, device_id)` as in `DLDevice` of the DLPack
/// header. The type stays an integer, so unknown codes are reported as they
/// are, never turned into a Rust enum.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Device {
    /// `DLDeviceType`: 1 CPU, 2 CUDA, 3 CUDA host, 10 ROCm, ... (see [`kind`]).
    pub device_type: i32,
    /// Device ordinal; 0 for CPU, pinned and managed memory.
    pub device_id: i32,
}

/// `DLDeviceType` values from the DLPack header (v1.3).
pub mod kind {
    /// Host memory.
    pub const CPU: i32 = 1;
    /// CUDA device memory.
    pub const CUDA: i32 = 2;
    /// Pinned host memory from `cudaMallocHost`.
    pub const CUDA_HOST: i32 = 3;
    /// OpenCL buffer.
    pub const OPENCL: i32 = 4;
    /// Vulkan buffer.
    pub const VULKAN: i32 = 7;
    /// Metal buffer.
    pub const METAL: i32 = 8;
    /// Verilog simulator buffer.
    pub const VPI: i32 = 9;
    /// ROCm device memory.
    pub const ROCM: i32 = 10;
    /// Pinned host memory from `hipMallocHost`.
    pub const ROCM_HOST: i32 = 11;
    /// Reserved extension device.
    pub const EXT_DEV: i32 = 12;
    /// CUDA managed (unified) memory.
    pub const CUDA_MANAGED: i32 = 13;
    /// oneAPI unified shared memory.
    pub const ONEAPI: i32 = 14;
    /// WebGPU.
    pub const WEBGPU: i32 = 15;
    /// Qualcomm Hexagon DSP.
    pub const HEXAGON: i32 = 16;
    /// Microsoft MAIA.
    pub const MAIA: i32 = 17;
    /// AWS Trainium.
    pub const TRN: i32 = 18;
    /// Google TPU.
    pub const TPU: i32 = 19;
    /// Google TPU host (pinned) memory.
    pub const TPU_HOST: i32 = 20;
}

/// The name dlcast uses for a device type code (the names of `#[device(..)]`),
/// or `None` for a code the DLPack header (v1.3) does not define.
pub fn device_type_name(device_type: i32) -> Option<&'static str> {
    Some(match device_type {
        kind::CPU => "cpu",
        kind::CUDA => "cuda",
        kind::CUDA_HOST => "cuda_host",
        kind::OPENCL => "opencl",
        kind::VULKAN => "vulkan",
        kind::METAL => "metal",
        kind::VPI => "vpi",
        kind::ROCM => "rocm",
        kind::ROCM_HOST => "rocm_host",
        kind::EXT_DEV => "ext_dev",
        kind::CUDA_MANAGED => "cuda_managed",
        kind::ONEAPI => "oneapi",
        kind::WEBGPU => "webgpu",
        kind::HEXAGON => "hexagon",
        kind::MAIA => "maia",
        kind::TRN => "trn",
        kind::TPU => "tpu",
        kind::TPU_HOST => "tpu_host",
        _ => return None,
    })
}

impl Device {
    /// The CPU, id 0.
    pub const CPU: Device = Device {
        device_type: kind::CPU,
        device_id: 0,
    };

    /// Whether the memory can be read and written by the CPU through plain
    /// pointers: CPU, CUDA/ROCm pinned host memory and CUDA managed memory.
    /// Element access (`get`, `as_slice`, ...) is offered only for these.
    pub fn is_host_accessible(&self) -> bool {
        matches!(
            self.device_type,
            kind::CPU | kind::CUDA_HOST | kind::ROCM_HOST | kind::CUDA_MANAGED
        )
    }

    /// Whether a DLPack `data` on this device is an opaque handle rather
    /// than an address: OpenCL (a `cl_mem`), Vulkan (a `VkBuffer`) and
    /// Metal (an `MTLBuffer`), as the DLPack header names them. There
    /// `data + byte_offset` means nothing: the byte offset stays a number
    /// of its own (a view's `byte_offset()`, the `byte_offset` of an
    /// export), and `data_ptr()` is the handle. Elsewhere dlcast folds the
    /// byte offset into the address of element 0.
    pub fn data_is_handle(&self) -> bool {
        matches!(self.device_type, kind::OPENCL | kind::VULKAN | kind::METAL)
    }
}

impl fmt::Display for Device {
    /// `cpu`, `cuda:1`, or `device(type=99, id=0)` for unknown codes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match device_type_name(self.device_type) {
            Some(name) if self.device_type == kind::CPU && self.device_id == 0 => f.write_str(name),
            Some(name) => write!(f, "{name}:{}", self.device_id),
            None => write!(
                f,
                "device(type={}, id={})",
                self.device_type, self.device_id
            ),
        }
    }
}

/// One entry of `#[device(..)]`: a device type (or any known one) and an
/// optional device id.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct DeviceSpec {
    /// Required device type, or `None` for `any` (any type the header defines).
    pub device_type: Option<i32>,
    /// Required device id, or `None` for any id.
    pub device_id: Option<i32>,
}

impl DeviceSpec {
    /// `#[device(cpu)]`, the default.
    pub const CPU: DeviceSpec = DeviceSpec {
        device_type: Some(kind::CPU),
        device_id: None,
    };

    /// Whether `device` satisfies this entry.
    pub fn matches(&self, device: Device) -> bool {
        let type_ok = match self.device_type {
            Some(t) => t == device.device_type,
            None => device_type_name(device.device_type).is_some(),
        };
        type_ok && self.device_id.is_none_or(|id| id == device.device_id)
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.device_type {
            Some(t) => device_type_name(t).unwrap_or("?"),
            None => "any",
        };
        match self.device_id {
            Some(id) => write!(f, "{name}:{id}"),
            None => f.write_str(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display() {
        assert_eq!(Device::CPU.to_string(), "cpu");
        let cuda1 = Device {
            device_type: kind::CUDA,
            device_id: 1,
        };
        assert_eq!(cuda1.to_string(), "cuda:1");
        let odd = Device {
            device_type: 99,
            device_id: 0,
        };
        assert_eq!(odd.to_string(), "device(type=99, id=0)");
    }

    #[test]
    fn spec_matching() {
        let cuda0 = DeviceSpec {
            device_type: Some(kind::CUDA),
            device_id: Some(0),
        };
        let any = DeviceSpec {
            device_type: None,
            device_id: None,
        };
        let dev = |t, i| Device {
            device_type: t,
            device_id: i,
        };
        assert!(cuda0.matches(dev(kind::CUDA, 0)));
        assert!(!cuda0.matches(dev(kind::CUDA, 1)));
        assert!(!cuda0.matches(dev(kind::ROCM, 0)));
        assert!(any.matches(dev(kind::METAL, 3)));
        assert!(!any.matches(dev(99, 0)));
        assert!(DeviceSpec::CPU.matches(Device::CPU));
    }
}
