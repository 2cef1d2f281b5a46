"""A typed caller of the test extension, type-checked where only NumPy and
PyTorch are installed (tests/typing/check.py): `returns = like(x)` still
gives back the caller's NumPy or PyTorch type, though the stub's other
frameworks are `Any` there."""

import numpy as np
import numpy.typing as npt
import torch

import dlcast_testext as ext


def row_sums(x: npt.NDArray[np.float32], t: torch.Tensor, b: bytes) -> float:
    sums: npt.NDArray[np.float32] = ext.st_row_sums(x)
    tsums: torch.Tensor = ext.st_row_sums(t)
    other = ext.st_row_sums(b)  # a buffer: a dlcast.Array
    assert other.ndim == 1
    return float(sums.sum()) + float(tsums.sum())


def layer(x: npt.NDArray[np.float32], t: torch.Tensor) -> torch.Tensor:
    fh = ext.FhLayer(2.0)
    same: npt.NDArray[np.float32] = fh(x)
    assert same.shape == x.shape
    scaled: torch.Tensor = fh.__rmul__(t)
    return scaled


def matrix(b: bytes) -> int:
    rows, cols = ext.st_same_matrix_like(b).shape
    return rows * cols
