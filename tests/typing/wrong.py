"""Calls the stub must reject (each line's expected mypy error code after
`# E:`), so that the stubs are shown to carry types, not just `Any`."""

import numpy as np
import torch

import dlcast_testext as ext

ext.centroid("not an array", np.ones(3, np.float32))  # E: arg-type
label: str = ext.sum_f64(np.ones(3))  # E: assignment
ext.Accumulator().weighted(np.ones(2), np.ones(2))  # E: call-arg
ext.with_signature(x=np.ones(2, np.float32))  # E: call-arg
ext.scale(np.ones(3, np.float32))  # E: call-arg
wrong_dtype: "np.ndarray[tuple[int, ...], np.dtype[np.float64]]" = ext.static_table_numpy()  # E: assignment
not_a_paddle_tensor: str = ext.a2_static_paddle()  # E: assignment
not_an_array_api_array: str = ext.identity_array_api(np.ones(2))  # E: assignment
ext.centroid([[1.0, 2.0, 3.0]], np.ones(1, np.float32))  # E: arg-type
not_torch: torch.Tensor = ext.st_row_sums(np.ones((2, 2), np.float32))  # E: assignment
one_d: "np.ndarray[tuple[int], np.dtype[np.float64]]" = ext.st_same_matrix(np.ones((2, 2)))  # E: assignment
ext.StScaler("two")  # E: arg-type
scaled: str = ext.StScaler().scale(1.0)  # E: assignment
ext.StScaler().apply(np.ones(2), 3)  # E: call-arg
ext.st_row_sums(None)  # E: call-overload
ext.st_row_sums(3)  # E: call-overload
ext.FhLayer(2.0)("x")  # E: call-overload
ext.FhLayer(2.0) @ "x"  # E: operator
"x" @ ext.FhLayer(2.0)  # E: operator
ext.FhLayer(2.0) * np.ones(2, np.float32)  # E: operator
2.0 * ext.FhLayer(2.0)  # E: operator
"x" in ext.FhLayer(2.0)  # E: operator
called: str = ext.Bag()(np.ones(2))  # E: assignment
a, b, c = ext.rk_first_rows_flipped(np.ones((2, 2)), 1).shape  # E: misc
p, q, r = ext.st_same_matrix_dlcast(np.ones((2, 2))).shape  # E: misc
u, v, w = ext.st_same_matrix_like(b"\0" * 32).shape  # E: misc
not_dlcast: str = ext.st_same_matrix_like(b"\0" * 32)  # E: assignment
ext.StScaler().k = 3.0  # E: misc
ext.Bag().total = 3.0  # E: misc
ext.fh_handle_sum(None)  # E: arg-type
ext.FhLayer(2.0, weights="x")  # E: arg-type
ext.StoredMatrix([[1.0]])  # E: arg-type
