#![doc = include_str!("../README.md")]
//!
//! ## How the crate works
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
#![cfg_attr(docsrs, feature(doc_cfg))]

// The stable ABI of free-threaded CPython (PyO3's `abi3t` features, Python
// 3.15+) hides the object header, whose size differs between the
// interpreters such an extension loads in; dlcast reads NumPy's array
// fields at fixed offsets after it (the NumPy fast path, rust-numpy's
// borrow registry), so it refuses to build rather than guess them.
#[cfg(all(Py_LIMITED_API, Py_GIL_DISABLED))]
compile_error!(
    "dlcast does not support PyO3's `abi3t` (free-threaded stable ABI) features yet; \
     use an `abi3-py3*` feature or a version-specific build"
);

// The modules in the order data flows; each uses only modules above it.
// Facts: dtypes, devices, layouts, frameworks, function specs, streams.
#[cfg(feature = "cudarc")]
mod cuda;
pub mod device;
pub mod dtype;
#[doc(hidden)]
pub mod facts;
mod framework;
#[cfg(feature = "inspect")]
mod inspect;
pub mod layout;
mod npapi;
mod npyffi;
pub mod spec;
pub mod stream;
mod trust;
// Every refusal as a typed value, one file per area (call, import, view,
// export): each variant's message and Python exception type, written once.
mod error;
// The borrow registry, then import (one module per source of arrays,
// PyTorch's own rules inside).
pub mod borrow;
mod import;
// Conversions (a framework's own, for arguments that do not fit).
pub mod convert;

// The views: dlcast's, with the `View` trait through which the call driver
// makes every view and what a view keeps (before the driver, which uses
// them), then Rust's own (slices and ndarray views, in view::native); their
// errors are in `error`.
mod view;

// The per-call driver: the two phases, the checks, and the release of what
// a call holds back while its body runs.
mod call;

// Arrays kept beyond the call (`ArrayHandle`): each borrow a one-argument
// call of the driver above.
mod handle;

// Export: arrays handed back to Python (`ArrayBuffer` inside, public as
// `buffer`).
pub mod export;
#[doc = include_str!("export/array_buffer.md")]
pub mod buffer {
    pub use crate::export::array_buffer::{ArrayBuffer, BufferRef};
}

pub use buffer::{ArrayBuffer, BufferRef};
pub use device::{Device, DeviceSpec};
#[doc = include_str!("dlpack_fn.md")]
#[doc(inline)]
pub use dlcast_macros::dlpack_fn;
#[doc(inline)]
pub use dlcast_macros::{pyfunction, pymethods};
pub use dtype::{DType, Element};
pub use export::{Array, Framework, ShapeError, Tensor};
pub use handle::ArrayHandle;
pub use import::{ImportPath, INLINE_DIMS, MAX_VERSION};
/// The `ndarray` crate dlcast's `ArrayView` / `ArrayViewMut` parameters
/// are of (feature `ndarray`): depend on the same version, or use this.
#[cfg(feature = "ndarray")]
pub use ndarray;
pub use stream::StreamRequest;
pub use view::{TensorDynMut, ViewError};

// Examples for the view types, on their re-exports (rustdoc shows them
// before each type's own documentation; `Tensor`'s are in `export`).

/// An array argument, read-only: `x: TensorRef<'_, T>` in a `#[dlpack_fn]`
/// function.
///
/// ```
/// # use dlcast_runtime::prelude::*;
/// # use pyo3::prelude::*;
/// /// The largest element, `None` for an empty array.
/// #[dlpack_fn]
/// #[pyfunction]
/// fn max(x: TensorRef<'_, f32>) -> PyResult<Option<f32>> {
///     // Any strides, negative ones included, through `ndarray`.
///     Ok(x.as_ndarray()?.iter().copied().reduce(f32::max))
/// }
///
/// /// The transpose: a view of the input, returned without a copy.
/// #[dlpack_fn(returns = like(x))]
/// #[pyfunction]
/// fn transposed(#[shape(_, _)] x: TensorRef<'_, f32>) -> TensorRef<'_, f32> {
///     x.t()
/// }
/// ```
pub use view::TensorRef;

/// An array argument, writable: `x: TensorMut<'_, T>` in a `#[dlpack_fn]`
/// function; it also reads like a [`TensorRef`].
///
/// ```
/// # use dlcast_runtime::prelude::*;
/// # use pyo3::prelude::*;
/// /// Sets the diagonal of a square matrix, in place.
/// #[dlpack_fn]
/// #[pyfunction]
/// fn fill_diagonal(#[shape(n, n)] mut a: TensorMut<'_, f64>, value: f64) {
///     for i in 0..a.shape()[0] {
///         a.set(&[i, i], value);
///     }
/// }
///
/// /// Clamps every element to `[lo, hi]`, in place, whatever the strides.
/// #[dlpack_fn]
/// #[pyfunction]
/// fn clamp(mut x: TensorMut<'_, f32>, lo: f32, hi: f32) -> PyResult<()> {
///     x.as_ndarray_mut()?.mapv_inplace(|v| v.clamp(lo, hi));
///     Ok(())
/// }
/// ```
pub use view::TensorMut;

/// An array argument of any dtype, read-only: `x: TensorDyn<'_>` in a
/// `#[dlpack_fn]` function; [`TensorDyn::into_typed`] gives the typed view.
///
/// ```
/// # use dlcast_runtime::prelude::*;
/// # use pyo3::exceptions::PyTypeError;
/// # use pyo3::prelude::*;
/// /// The bytes the elements take, whatever the dtype.
/// #[dlpack_fn]
/// #[pyfunction]
/// fn nbytes(x: TensorDyn<'_>) -> Option<usize> {
///     x.dtype().itemsize()?.checked_mul(x.len())
/// }
///
/// /// The elements of a float32 or float64 array, as float64.
/// #[dlpack_fn]
/// #[pyfunction]
/// fn as_f64(x: TensorDyn<'_>) -> PyResult<Vec<f64>> {
///     let x = match x.into_typed::<f32>() {
///         Ok(x) => return Ok(x.to_vec()?.into_iter().map(f64::from).collect()),
///         Err(x) => x,
///     };
///     match x.into_typed::<f64>() {
///         Ok(x) => Ok(x.to_vec()?),
///         Err(x) => Err(PyTypeError::new_err(format!("expected a float array, got {}", x.dtype()))),
///     }
/// }
/// ```
pub use view::TensorDyn;
pub use view::{Iter, MayLeaveTheGil, ViewErrorKind, DYN};

/// Everything a `#[dlpack_fn]` author needs: `use dlcast_runtime::prelude::*;`.
///
/// It names this crate `dlcast`, so that `#[dlcast::pyfunction]` and
/// `#[dlcast::pymethods]` need no other import (a plain `pyfunction` here
/// would clash with `pyo3::prelude::*`).
pub mod prelude {
    pub use crate as dlcast;
    pub use crate::{
        dlpack_fn, ArrayBuffer, ArrayHandle, DType, Device, Element, Tensor, TensorDyn,
        TensorDynMut, TensorMut, TensorRef, ViewError, ViewErrorKind, DYN,
    };
}

/// Used by the code `#[dlpack_fn]` generates; not a stable API.
#[doc(hidden)]
pub mod __private {
    pub use crate::call::{
        numpy_fast_path, raw_reads_in_progress, CallContext, FastArg, FastCallContext, Peeked,
    };
    pub use crate::device::DeviceSpec;
    pub use crate::dtype::{DType, Element};
    pub use crate::export::{into_py_default, into_py_result, Framework};
    pub use crate::import::torch::direct::state as torch_direct_state;
    pub use crate::spec::{Dim, FnSpec, Order, ParamSpec, SharedDType};
    pub use crate::stream::{StreamArg, StreamRequest};
    pub use crate::view::View;
    // Element types named by `#[dtype(..)]`: an alias per row of the dtype
    // table that names one (aliases, not re-exports, so that diagnostics
    // keep the crates' own paths).
    macro_rules! element_aliases {
        ($({$name:literal $rust:ident $const:ident [$ty:ty] $(as $alias:ident)?
           $(if $($feature:literal)+)? $(aka $($aka:ident)+)? $(($by:ident by hand))?;
           $($rest:tt)*})*) => {$(
            element_aliases!(@row $name [$ty] $($alias)? ; $($($feature)+)?);
        )*};
        (@row $name:literal [$ty:ty] ; $($feature:literal)*) => {};
        (@row $name:literal [$ty:ty] $alias:ident ; $($feature:literal)*) => {
            #[doc = concat!("`", $name, "`'s element type.")]
            #[cfg(all($(feature = $feature),*))]
            pub type $alias = $ty;
        };
    }
    crate::facts::dtype_table!(element_aliases);
    /// Type hints for PyO3's introspection (the `inspect` feature).
    #[cfg(feature = "inspect")]
    pub use crate::inspect::{Hint, In, Out};
    pub use pyo3;
}

// The guide's chapters (`guide/src/*.md`, the book `make guide` builds) as
// doctests: `cargo test` compiles every Rust block of the guide, as it does
// the README's (the crate documentation above). Doctest builds only: they
// are no part of the API documentation, and a packaged crate has no guide.
// tests/python/test_guide.py checks that every chapter is listed here.
#[cfg(doctest)]
mod guide {
    #[doc = include_str!("../../guide/src/introduction.md")]
    mod introduction {}
    #[doc = include_str!("../../guide/src/parameter-types.md")]
    mod parameter_types {}
    #[doc = include_str!("../../guide/src/annotations.md")]
    mod annotations {}
    #[doc = include_str!("../../guide/src/methods.md")]
    mod methods {}
    #[doc = include_str!("../../guide/src/returning-arrays.md")]
    mod returning_arrays {}
    #[doc = include_str!("../../guide/src/ownership.md")]
    mod ownership {}
    #[doc = include_str!("../../guide/src/gpu-and-streams.md")]
    mod gpu_and_streams {}
    #[doc = include_str!("../../guide/src/types-and-stubs.md")]
    mod types_and_stubs {}
    #[doc = include_str!("../../guide/src/calls.md")]
    mod calls {}
    #[doc = include_str!("../../guide/src/safety.md")]
    mod safety {}
    #[doc = include_str!("../../guide/src/performance.md")]
    mod performance {}
    #[doc = include_str!("../../guide/src/robustness.md")]
    mod robustness {}
    #[doc = include_str!("../../guide/src/troubleshooting.md")]
    mod troubleshooting {}
    #[doc = include_str!("../../guide/src/versions.md")]
    mod versions {}
    #[doc = include_str!("../../guide/src/contributing.md")]
    mod contributing {}
}
