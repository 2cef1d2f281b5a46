//! `Tensor::from_cuda_slice` (feature `cudarc`): a `cudarc` `CudaSlice`
//! exported without a copy.

use super::{ShapeError, Tensor};
use crate::device::{kind, Device};
use crate::dtype::Element;
use cudarc::driver::{CudaSlice, DevicePtr};

/// Keeps a `CudaSlice` alive inside an exported array and frees it with
/// its context current on whatever thread the last consumer lets go.
struct CudaKeep<T>(Option<CudaSlice<T>>);

impl<T> Drop for CudaKeep<T> {
    fn drop(&mut self) {
        if let Some(slice) = self.0.take() {
            // Errors are recorded in the context by cudarc, never raised.
            let _ = slice.context().bind_to_thread();
            drop(slice);
        }
    }
}

impl<T: Element + cudarc::driver::DeviceRepr> Tensor<T> {
    /// A C-order CUDA array of `shape` over `slice` (its elements, not
    /// bytes), exported without a copy on the slice's device. The data is
    /// ready on the slice's stream (any write cudarc tracks is waited for
    /// first); consumers asking for another stream are made to wait for it.
    /// The slice is freed when the last Python object or consumer lets go.
    ///
    /// # Errors
    /// [`ShapeError::Length`] if `shape` does not hold `slice.len()` elements.
    pub fn from_cuda_slice(slice: CudaSlice<T>, shape: &[usize]) -> Result<Self, ShapeError> {
        let n = crate::layout::element_count(shape);
        if n != Some(slice.len()) {
            return Err(ShapeError::Length {
                shape: shape.to_vec(),
                expected: n.unwrap_or(usize::MAX),
                got: slice.len(),
            });
        }
        let stream = slice.stream().clone();
        // Makes the slice's own stream wait for cudarc-tracked writes from
        // other streams; then the data is ready on `stream`.
        let (ptr, sync) = slice.device_ptr(&stream);
        drop(sync);
        let handle = stream.cu_stream() as usize as i64;
        // The NULL stream is the legacy default stream, `1` in the standard.
        let stream_value = if handle == 0 { 1 } else { handle };
        let device = Device {
            device_type: kind::CUDA,
            device_id: slice.ordinal() as i32,
        };
        Tensor::from_device_parts(
            ptr as usize as *mut u8,
            shape,
            device,
            Some(stream_value),
            Box::new(CudaKeep(Some(slice))),
        )
    }
}
