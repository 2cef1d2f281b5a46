"""Property test of the rule "Python code runs wherever
Python code can run": Python code that swaps, resizes, re-types or
replaces an argument's memory, run from every hook a call offers (a later
argument's `__dlpack__`, a `TorchFunctionMode` that sees dlcast's own
PyTorch calls, a tensor subclass's methods, a callback inside the body),
at every argument position. Every call ends with values the argument had
(before or after the change) or a Python exception; never a crash, never
freed memory, never a `PanicException` (the suite runs a debug build).

Left out on purpose, as the README's safety section says: memory moved by
its owner while a body holds a view of it (the body callback hook):
growing a tensor past its storage's capacity, shrinking a storage, NumPy's
`resize(refcheck=False)`; no object reference keeps such memory alive.
"""

import math
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

import dlcast_testext as ext

N = 4096
EXAMPLES = int(os.environ.get("DLCAST_HYPOTHESIS_EXAMPLES", "5000")) // 25


def torch_mutations(t):
    """Changes to a tensor's memory that Python code can make."""
    return {
        "set_small": lambda: t.set_(torch.zeros(1, dtype=t.dtype)),
        "set_big": lambda: t.set_(torch.full((4 * N,), 3.0, dtype=t.dtype)),
        "resize_small": lambda: t.resize_(1),
        "resize_big": lambda: t.resize_(64 * N),
        "data_int8": lambda: setattr(t, "data", t.data.to(torch.int8)),
        "data_new": lambda: setattr(t, "data", torch.full((2,), 5.0, dtype=t.dtype)),
        "swap": lambda: torch.utils.swap_tensors(t, torch.full((3,), 7.0, dtype=t.dtype)),
        "add_": lambda: t.add_(1),
    }


def numpy_mutations(a):
    return {
        "resize_small": lambda: a.resize(1, refcheck=False),
        "resize_big": lambda: a.resize(64 * N, refcheck=False),
        "fill": lambda: a.fill(2.0),
        "reshape": lambda: setattr(a, "shape", (N // 2, 2)),
        "dtype": lambda: setattr(a, "dtype", np.int64),
    }


class Later:
    """An argument whose `__dlpack__` runs `hook` first."""

    def __init__(self, hook):
        self.hook = hook

    def __dlpack__(self, **kw):
        self.hook()
        return np.ones(3).__dlpack__(**kw)


class AtCall(TorchFunctionMode):
    """Runs `hook` at the k-th PyTorch call it sees (dlcast's own `.data`,
    `is_neg`, `requires_grad`, `.to`, ... among them)."""

    def __init__(self, k, hook):
        super().__init__()
        self.k, self.hook, self.n = k, hook, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += 1
        if self.n == self.k:
            self.hook()
        return func(*args, **(kwargs or {}))


def victim(kind, dtype):
    if kind == "torch":
        return torch.ones(N, dtype=dtype)
    return np.ones(N, dtype=np.float64 if dtype == torch.float64 else np.float32)


def mutations(kind, v):
    return torch_mutations(v) if kind == "torch" else numpy_mutations(v)


def allowed(v, s):
    """Whether `s` is the sum of the victim's values as dlcast took them
    (all ones, or after an in-place `add_`/`fill`) or as they are now."""
    # Summed as the extension's body sums (float64, one element after the
    # other), so that uninitialised memory after `resize_` (any values,
    # huge ones included) gives the same figure; a float32 or pairwise sum
    # of such values rounds differently.
    vals = v.to(torch.float64).tolist() if isinstance(v, torch.Tensor) else \
        np.asarray(v).astype(np.float64).ravel().tolist()
    now = sum(vals, 0.0)
    # `resize_` past the capacity leaves new elements uninitialised: they may
    # hold NaN patterns, and NaN equals nothing, itself included; or huge
    # values, whose sums in another order (or in float32, as `v.sum()` of a
    # float32 tensor) differ by rounding.
    scale = float(np.abs(vals).sum())
    rounded = math.isfinite(s) and math.isfinite(scale) and abs(s - now) <= 1e-9 * scale
    return s in (float(N), 2.0 * N, now) or (math.isnan(s) and math.isnan(now)) or rounded


@settings(max_examples=max(EXAMPLES, 40), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["torch", "numpy"]),
       dtype=st.sampled_from([torch.float64, torch.float32]),
       which=st.integers(0, 7),
       hook=st.sampled_from(["later", "mode", "writable_later", "writable_mode"]),
       k=st.integers(1, 12),
       first=st.booleans())
def test_python_code_at_every_hook_before_the_body(kind, dtype, which, hook, k, first):
    v = victim(kind, dtype)
    muts = mutations(kind, v)
    name = sorted(muts)[which % len(muts)]
    change = muts[name]
    try:
        if hook == "later":
            args = (v, Later(change)) if first else (torch.ones(3, dtype=torch.float64), v)
            if not first:
                # The victim is the second argument, changed by the first
                # one's hook: a mode on every call covers that position.
                with AtCall(k, change):
                    s, _ = ext.sum_f64_and_len(*args)
            else:
                s, _ = ext.sum_f64_and_len(*args)
            assert allowed(v, s) or s == 3.0, (name, s)
        elif hook == "mode":
            with AtCall(k, change):
                s, n = ext.sum_f64_and_len(v, torch.ones(2, dtype=torch.float64))
            assert allowed(v, s) and n == 2, (name, s)
        elif hook == "writable_later":
            n = ext.fill_then_len(v, Later(change), 2.0)
            assert n == 3
        else:
            with AtCall(k, change):
                n = ext.fill_then_len(v, torch.ones(5, dtype=torch.float64), 2.0)
            assert n == 5
    except (TypeError, BufferError, RuntimeError, ValueError) as e:
        # A refusal, PyTorch's own refusal of the change, or NumPy's.
        assert not type(e).__name__.endswith("PanicException")


@settings(max_examples=max(EXAMPLES // 2, 20), deadline=None)
@given(dtype=st.sampled_from([torch.float64, torch.float32]), which=st.integers(0, 7))
def test_python_code_inside_the_body_cannot_move_a_tensor_under_its_view(dtype, which):
    # The body holds a view and calls back into Python, which changes the
    # caller's tensor: the view's memory stays put (the alias holds it).
    v = torch.ones(N, dtype=dtype)
    muts = torch_mutations(v)
    # Growing the tensor past its storage's capacity moves the storage's
    # memory, under every view of it: a documented limit (README, Safety).
    muts.pop("resize_big")
    name = sorted(muts)[which % len(muts)]
    try:
        before, after = ext.sum_around_call(v, muts[name])
    except RuntimeError:
        return  # PyTorch refused the change itself
    # `add_` writes new values into the same memory, which the view sees
    # (unless the view reads a converted copy: float32 in, float64 read).
    seen = name == "add_" and dtype == torch.float64
    assert before == float(N) and after == (2.0 * N if seen else float(N)), name


def test_numpy_arrays_changed_before_the_reads():
    # NumPy arrays are read in phase 2, after every hook: the read sees the
    # array as it is then.
    for name in ("resize_small", "resize_big", "reshape", "dtype", "fill"):
        a = np.ones(N)
        change = numpy_mutations(a)[name]
        try:
            s, n = ext.sum_f64_and_len(a, Later(change))
        except TypeError as e:
            assert name == "dtype" and "int64" in str(e)
            continue
        assert n == 3 and s == float(a.astype(np.float64).sum()), name
