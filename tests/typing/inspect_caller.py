"""A typed caller of the inline-module extension (tests/inspect): type-checked
with `mypy --strict` against the stub `maturin generate-stubs` writes from
PyO3's introspection and against dlcast's own (tests/typing/check.py)."""

import numpy as np
import numpy.typing as npt
import torch

import dlcast_inspect_ext as ext


def total(points: npt.NDArray[np.float32], weights: npt.NDArray[np.float32]) -> float:
    return ext.weighted_total(points, weights)


def matrix(x: npt.NDArray[np.float64]) -> float:
    # A 2-d float64 NumPy return: NumPy's shape type says it.
    m: "np.ndarray[tuple[int, int], np.dtype[np.float64]]" = ext.same_matrix(x)
    rows, cols = m.shape
    return float(m[0, 0]) + rows + cols


def ones(x: torch.Tensor | None) -> torch.Tensor:
    return ext.ones_torch(x, k=2.0) + ext.ones_torch(None)


def sums(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    # `returns = like(x)`: typed by dlcast's stub, `Any` in PyO3's.
    s: npt.NDArray[np.float32] = ext.row_sums(x)
    return s


def scaler(x: npt.NDArray[np.float64]) -> float:
    s = ext.Scaler(2.0)
    return s.scale(1.0) + s.apply(x)


def call(x: npt.NDArray[np.float64]) -> int:
    # `__call__` returning a view, `returns = numpy`: 1-d float64 NumPy.
    same: "np.ndarray[tuple[int], np.dtype[np.float64]]" = ext.Scaler(2.0)(x)
    (n,) = same.shape
    return n


def doubled(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    # `#[dlcast::pyfunction]` exported into the module by `#[pymodule_export] use`.
    d: npt.NDArray[np.float32] = ext.doubled(x)
    return d
