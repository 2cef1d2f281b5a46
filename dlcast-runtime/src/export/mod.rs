//! Export: arrays handed back to Python, zero-copy.
//!
//! - [`Tensor<T>`] owns Rust data (a `Vec<T>`, a `Box<[T]>`, an
//!   `ndarray::Array`); its allocation becomes the exported buffer.
//! - A view of an input (`TensorRef`, `TensorMut`, `TensorDyn`, ...) returned
//!   from a `#[dlpack_fn]` function keeps the input's producer alive until
//!   the last consumer lets go.
//!
//! Both become an [`Array`]: a small Python class (`dlcast.Array`) that
//! follows the array API standard's `__dlpack__` / `__dlpack_device__`
//! protocol to the letter and offers the buffer protocol for CPU data, so
//! every framework's `from_dlpack` and `numpy.asarray` take it. With
//! `#[dlpack_fn(returns = numpy)]` (or `torch`, `jax`, `cupy`, `tensorflow`,
//! `array_api`) the function hands that framework's array instead.
//!
//! One module each, in the order they build on each other: `alloc` (the
//! exported layout, the memory an export keeps alive, statistics),
//! `tensor` ([`Tensor`] and how it and returned views become Python
//! objects), `array` (the `dlcast.Array` class: capsules, the buffer
//! protocol), `handoff` (`returns = numpy`, `torch`, ...), `cuda`
//! (`Tensor::from_cuda_slice`), and `array_buffer` ([`ArrayBuffer`], a
//! `#[pyclass]`'s data handed out as arrays, also at
//! [`crate::buffer`]).
//!
//! [`ArrayBuffer`]: crate::ArrayBuffer

mod alloc;
mod array;
pub(crate) mod array_buffer;
#[cfg(feature = "cudarc")]
mod cuda;
mod handoff;
mod tensor;

pub use crate::framework::Framework;
pub use alloc::{stats, ExportStats, ShapeError};
pub use array::{Array, BUFFER_PROTOCOL};
#[doc(hidden)]
pub use handoff::{convert_result, into_py_default, into_py_result};
#[doc(hidden)]
pub use tensor::ExportedArray;
pub use tensor::Tensor;
