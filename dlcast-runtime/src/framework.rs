//! The array frameworks dlcast knows by name: where an argument comes from
//! (`returns = like(param)`, conversions) and where results go
//! (`returns = ...`).

use pyo3::intern;
use pyo3::prelude::*;

/// The framework a `#[dlpack_fn(returns = ...)]` function hands its arrays to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framework {
    /// `numpy.from_dlpack`.
    Numpy,
    /// `torch.from_dlpack`.
    Torch,
    /// `jax.numpy.from_dlpack`.
    Jax,
    /// `cupy.from_dlpack`.
    Cupy,
    /// `tensorflow.experimental.dlpack.from_dlpack` (takes a capsule).
    Tensorflow,
    /// `array_api_strict.from_dlpack`.
    ArrayApi,
    /// A built-in `memoryview` over the exported array (the buffer
    /// protocol: host memory, dtypes with a `struct` format).
    Memoryview,
    /// `mlx.core.from_dlpack` (MLX arrays are immutable).
    Mlx,
    /// `paddle.from_dlpack` (PaddlePaddle, which like PyTorch has no
    /// read-only tensors).
    Paddle,
}

impl Framework {
    /// The framework whose array `obj` is, judged by the top-level package
    /// of its type (`numpy`, `torch`, `jax`/`jaxlib`, `cupy`, `tensorflow`,
    /// `array_api_strict`, `mlx`, `paddle`); `None` for anything else (buffers, capsules,
    /// `dlcast.Array`). Used by `returns = like(param)`.
    pub fn of(obj: &Bound<'_, PyAny>) -> Option<Framework> {
        let py = obj.py();
        let module = obj.get_type().getattr(intern!(py, "__module__")).ok()?;
        let module = module.extract::<pyo3::pybacked::PyBackedStr>().ok()?;
        let top = module.split('.').next().unwrap_or("");
        Some(match top {
            "numpy" => Framework::Numpy,
            "torch" => Framework::Torch,
            "jax" | "jaxlib" => Framework::Jax,
            "cupy" => Framework::Cupy,
            "tensorflow" => Framework::Tensorflow,
            "array_api_strict" => Framework::ArrayApi,
            "mlx" => Framework::Mlx,
            "paddle" => Framework::Paddle,
            _ => return None,
        })
    }
}
