"""Calls the inline-module extension's stubs must reject: `# E: <code>` for
both stubs (PyO3's and dlcast's), `# E-dlcast: <code>` where only dlcast's
generator can say it (PyO3's stubs type array parameters `Any` and have no
type variable for `like(x)`; README, "Signatures, `help()` and stubs")."""

import numpy as np
import torch

import dlcast_inspect_ext as ext

one_d: "np.ndarray[tuple[int], np.dtype[np.float64]]" = ext.same_matrix(np.ones((2, 2)))  # E: assignment
wrong_dtype: "np.ndarray[tuple[int, int], np.dtype[np.float32]]" = ext.same_matrix(np.ones((2, 2)))  # E: assignment
not_numpy: "np.ndarray[tuple[int], np.dtype[np.float32]]" = ext.ones_torch(None)  # E: assignment
label: str = ext.weighted_total(np.ones((2, 3), np.float32), np.ones(2, np.float32))  # E: assignment
ext.ones_torch(None, k="two")  # E: arg-type
ext.Scaler("two")  # E: arg-type
scaled: str = ext.Scaler(1.0).scale(1.0)  # E: assignment
ext.weighted_total([[1.0, 2.0, 3.0]], np.ones(1, np.float32))  # E-dlcast: arg-type
not_torch: torch.Tensor = ext.row_sums(np.ones((2, 2), np.float32))  # E-dlcast: assignment
called_2d: "np.ndarray[tuple[int, int], np.dtype[np.float64]]" = ext.Scaler(1.0)(np.ones(2))  # E: assignment
doubled_torch: torch.Tensor = ext.doubled(np.ones(2, np.float32))  # E: assignment
ext.row_sums(None)  # E-dlcast: call-overload
ext.row_sums("1 2 3")  # E-dlcast: call-overload
