"""Calls the test extension's stub must reject where only NumPy and
PyTorch are installed (tests/typing/check.py): the `returns = like(x)`
functions' type variable must not take other frameworks' missing types as
`Any`, which would let anything through."""

import numpy as np
import torch

import dlcast_testext as ext

ext.st_row_sums(None)  # E: call-overload
ext.st_row_sums([[1.0, 2.0]])  # E: call-overload
ext.st_row_sums("[[1.0, 2.0]]")  # E: call-overload
ext.st_row_sums(3)  # E: call-overload
ext.doubled_like(2.5)  # E: call-overload
ext.fh_pair(None)  # E: call-overload
ext.FhScale(2.0).apply([1.0])  # E: call-overload
ext.FhLayer(2.0)("x")  # E: call-overload
ext.FhLayer(2.0)(None)  # E: call-overload
2.0 * ext.FhLayer(2.0)  # E: operator
not_torch: torch.Tensor = ext.st_row_sums(np.ones((2, 2), np.float32))  # E: assignment
not_numpy: "np.ndarray[tuple[int], np.dtype[np.float32]]" = ext.st_row_sums(torch.ones(2, 2))  # E: assignment
