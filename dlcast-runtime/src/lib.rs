//! # dlcast
//!
//! Take arrays from any DLPack producer (NumPy, PyTorch, JAX, CuPy,
//! TensorFlow, array-api-strict, buffer objects, raw capsules) into checked,
//! zero-copy Rust views in functions exported with PyO3:
//!
//! ```ignore
//! use dlcast_runtime::prelude::*;
//! use pyo3::prelude::*;
//!
//! #[dlpack_fn]
//! #[pyfunction]
//! fn centroid(#[shape(n, 3)] points: TensorRef<'_, f32>,
//!             #[shape(n)] weights: TensorRef<'_, f32>) -> [f32; 3] {
//!     # unimplemented!()
//! }
//! ```
//!
//! The attribute macro [`dlpack_fn`] reads `#[shape(..)]`, `#[device(..)]`
//! and `#[order(..)]` on view parameters, plus the element type and
//! mutability from the view type, and folds them into one static
//! [`spec::FnSpec`]. Each call runs in two phases: first every step that
//! may run Python code, for every array argument (see
//! [`import`](crate#import-paths)); then, with no Python code up to the
//! body, the raw reads, the checks (named extents across parameters
//! included) and each view's entry in the process-wide [`borrow`]
//! registry, which refuses views that would alias a writable one, in this
//! call or any other. Constraint failures raise `TypeError` naming the function, the
//! parameter, the constraint and what was seen.
//!
//! ## Import paths
//! 1. a DLPack capsule passed directly (`"dltensor"` or
//!    `"dltensor_versioned"`, renamed `used_*` when taken);
//! 2. `x.__dlpack__(max_version=(1, 3))`, retried without keywords when the
//!    producer raises `TypeError`;
//! 3. the buffer protocol (`bytes`, `bytearray`, `memoryview`, `array.array`);
//! 4. TensorFlow tensors via `tf.experimental.dlpack.to_dlpack`.
//!
//! The producer's deleter runs exactly once, when the view drops (at the
//! latest when the call returns), on error paths too.

// The modules in the order data flows; each uses only modules above it.
// Facts: dtypes, devices, layouts, frameworks, function specs, streams.
#[cfg(feature = "cudarc")]
mod cuda;
pub mod device;
pub mod dtype;
mod framework;
pub mod layout;
mod npapi;
pub mod spec;
pub mod stream;
// The borrow registry, then import (one module per source of arrays) and
// PyTorch's own rules.
pub mod borrow;
mod import;
mod torch;
// Conversions, the per-call driver, the views, export.
mod call;
pub mod convert;
pub mod export;
mod view;

pub use device::{Device, DeviceSpec};
pub use dlcast_macros::dlpack_fn;
pub use dtype::{DType, Element};
pub use export::{Array, Framework, ShapeError, Tensor};
pub use import::{ImportPath, INLINE_DIMS, MAX_VERSION};
pub use stream::StreamRequest;
pub use view::{
    Iter, TensorDyn, TensorDynMut, TensorMut, TensorRef, ViewError, ViewErrorKind, DYN,
};

/// Everything a `#[dlpack_fn]` author needs: `use dlcast_runtime::prelude::*;`.
pub mod prelude {
    pub use crate::{
        dlpack_fn, DType, Device, Element, Tensor, TensorDyn, TensorDynMut, TensorMut, TensorRef,
        ViewError, ViewErrorKind, DYN,
    };
}

/// Used by the code `#[dlpack_fn]` generates; not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use crate::call::{CallCx, Peeked, View};
    pub use crate::device::DeviceSpec;
    pub use crate::dtype::{DType, Element};
    pub use crate::export::{into_py_result, Framework};
    pub use crate::spec::{Dim, FnSpec, Order, ParamSpec, SharedDType};
    pub use crate::stream::{StreamArg, StreamRequest};
    /// Element types named by `#[dtype(..)]` (aliases, not re-exports,
    /// so that diagnostics keep the crates' own paths).
    #[cfg(feature = "half")]
    pub type F16 = half::f16;
    #[cfg(feature = "half")]
    pub type BF16 = half::bf16;
    #[cfg(feature = "complex")]
    pub type Complex64 = num_complex::Complex<f32>;
    #[cfg(feature = "complex")]
    pub type Complex128 = num_complex::Complex<f64>;
    pub use pyo3;
}
