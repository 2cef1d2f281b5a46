"""A typed caller of the test extension: `make test` generates the
extension's stub with scripts/dlcast_stubgen.py and runs `mypy --strict` on
the stub and on this file (tests/typing/check.py)."""

from typing import Any

import array_api_strict._array_object
import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
import paddle
import torch

import dlcast_testext as ext


def centroid_of(points: npt.NDArray[np.float32], weights: npt.NDArray[np.float32]) -> list[float]:
    return ext.centroid(points, weights)


def accumulate(chunks: list[torch.Tensor]) -> float:
    acc = ext.Accumulator()
    total = 0.0
    for chunk in chunks:
        total = acc.add(chunk)
    return total + acc.weighted(jnp.ones(2), weights=None, scale=2.0)


def doubled_numpy(x: npt.NDArray[np.float64]) -> npt.NDArray[Any]:
    return ext.doubled(x)


def summed(x: torch.Tensor, scale: float) -> tuple[str, float]:
    return ext.with_signature(x, scale=scale, name="total")


def own_array_shape(x: npt.NDArray[np.float64]) -> tuple[int, ...]:
    arr = ext.identity(x)  # a dlcast.Array
    assert len(arr) == arr.shape[0]
    return arr.shape


def from_buffer(b: bytes) -> float:
    return ext.sum_f64(memoryview(b)) + ext.sum_u8(b)


ext.scale(np.ones(3, np.float32), 2.0)
norm: float = ext.Accumulator.norm(np.array([3.0, 4.0]))
started: ext.Accumulator = ext.Accumulator.starting_at(np.ones(2))


def matrix_data(m: ext.Matrix4f) -> npt.NDArray[np.float32]:
    # Return types carry the dtype the Rust element type fixes.
    table: npt.NDArray[np.uint16] = ext.static_table_numpy()
    assert table.dtype == np.uint16
    view: memoryview = ext.range_memoryview(3)
    assert view.readonly is False
    return m.data_ref()


def to_array_api(x: npt.NDArray[np.float64]) -> array_api_strict._array_object.Array:
    return ext.identity_array_api(x)  # returns = array_api


def static_paddle() -> paddle.Tensor:
    return ext.a2_static_paddle()  # returns = paddle


def row_sums_keep_framework(x: npt.NDArray[np.float32], t: torch.Tensor, b: bytes) -> float:
    # `returns = like(x)`: the caller's array type comes back; any other
    # producer (a buffer) gets a dlcast.Array.
    sums: npt.NDArray[np.float32] = ext.st_row_sums(x)
    tsums: torch.Tensor = ext.st_row_sums(t)
    other = ext.st_row_sums(b)
    assert other.ndim == 1
    return float(sums.sum()) + float(tsums.sum())


def same_matrix_of_a_buffer(b: bytes) -> int:
    # The default return: an argument of no framework (a buffer) gets NumPy,
    # as the call does (`returns = like(x)` gives a dlcast.Array).
    m: "np.ndarray[tuple[int, int], np.dtype[np.float64]]" = ext.st_same_matrix_like(b)
    rows, cols = m.shape
    return rows + cols


def bag_setter(x: npt.NDArray[np.float64]) -> float:
    # A `#[setter]` keeps its property's setter in the stub.
    bag = ext.Bag()
    bag.values = x
    total: float = bag.total
    return total


def same_matrix(x: npt.NDArray[np.float64]) -> float:
    # A 2-d float64 NumPy return: NumPy's shape type says it.
    m: "np.ndarray[tuple[int, int], np.dtype[np.float64]]" = ext.st_same_matrix(x)
    rows, cols = m.shape
    return float(m[0, 0]) + rows + cols


def scaler(x: npt.NDArray[np.float64]) -> float:
    s = ext.StScaler(2.0)
    k: float = s.k
    return s.scale(k) + s.apply(x) + ext.StScaler().scale(1.0)


def layer(x: npt.NDArray[np.float32], t: torch.Tensor) -> int:
    # Special methods typed from their kept lines; ranked dlcast.Array results.
    fh = ext.FhLayer(2.0)
    same: npt.NDArray[np.float32] = fh(x)
    product: npt.NDArray[np.float32] = fh @ t
    reflected: torch.Tensor = fh.__rmul__(t)
    assert x in fh and same is x and len(product) == len(reflected)
    rows, cols = ext.st_same_matrix_dlcast(np.ones((2, 2))).shape
    (n,) = ext.fh_plain(x).shape[:1]
    # `ArrayHandle` parameters, typed as the arrays they take.
    ext.FhLayer(2.0, weights=x).store(t)
    total: float = ext.fh_handle_sum(np.ones(3)) + ext.StoredMatrix(np.eye(2)).trace()
    return rows + cols + n + int(total)
