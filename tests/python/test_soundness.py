"""The kinds of input that broke dlcast's soundness (the soundness issue,
kinds 1-4, 10, 11; kind 8 is in test_borrows.py, kinds 5, 6, 7, 9 in
test_soundness_export.py). Each test names its kind; every call ends with
correct values or a Python exception, never a crash or freed memory.
"""

import gc
import weakref

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import dlcast_testext as ext

N = 2_000_000  # large enough that freed memory goes back to the OS


class Exports:
    """An array whose `__dlpack__` first runs `hook()` (Python code run
    while a later argument is prepared)."""

    def __init__(self, hook, arr=None):
        self.hook, self.arr = hook, np.ones(3) if arr is None else arr

    def __dlpack__(self, **kw):
        self.hook()
        return self.arr.__dlpack__(**kw)


def test_kind1_a_tensor_shrunk_in_place_by_a_later_argument():
    # `p.data = p.data.half()`-style: the storage is replaced by one 8x
    # smaller, possibly at the same address, after dlcast took the argument.
    x = torch.ones(N, dtype=torch.float64)

    def shrink():
        x.data = x.data.to(torch.int8)

    assert ext.sum_f64_and_len(x, Exports(shrink)) == (float(N), 3)
    assert x.dtype == torch.int8
    # Writable: the writes go to the storage the tensor had (kept alive by
    # dlcast's alias), never past the new, smaller one.
    y = torch.zeros(N, dtype=torch.float64)

    def shrink_y():
        y.data = y.data.to(torch.int8)

    assert ext.fill_then_len(y, Exports(shrink_y), 7.0) == 3
    assert y.dtype == torch.int8 and int(y.sum()) == 0


def test_kind1_a_mode_that_sees_the_requires_grad_lookup():
    # A TorchFunctionMode sees dlcast's `requires_grad` lookup (writable
    # parameters) and swaps the dtype there: the alias is taken after it,
    # so the call sees an int8 tensor and refuses it (writable parameters
    # never convert).
    x = torch.zeros(N, dtype=torch.float64)

    class Swaps(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") == "__get__" and "requires_grad" in repr(func):
                x.data = torch.zeros(N, dtype=torch.int8)
            return func(*args, **(kwargs or {}))

    with Swaps():
        try:
            ext.fill_f64(x, 1.0)
        except TypeError as e:
            assert "expected dtype float64, got int8" in str(e)
        else:
            assert x.dtype == torch.float64 and float(x.sum()) == N


def test_kind2_a_returned_view_keeps_the_memory_it_was_made_of():
    # The body runs Python code that changes the caller's tensor (dtype,
    # size, storage) before the view is exported: the export describes the
    # memory of the view, which the alias keeps alive.
    for change in (lambda t: setattr(t, "data", t.data.to(torch.int8)),
                   lambda t: t.resize_(1),
                   lambda t: t.set_(torch.zeros(1, dtype=torch.float64))):
        x = torch.arange(6, dtype=torch.float64)
        out = ext.view_after_call(x, lambda: change(x))
        assert out.dtype == np.float64 and out.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        del x
        gc.collect()
        assert out.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_kind3_a_converted_tensor_kept_by_a_mode_cannot_be_swapped():
    # dlcast converts a float32 tensor (`.to(float64)`); a mode keeps the
    # converted temporary and the body's callback swaps its storage: the
    # view reads the alias of the temporary, whose storage it holds.
    kept = []

    class Keeps(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if getattr(func, "__name__", "") == "to":
                kept.append(out)
            return out

    x = torch.ones(N, dtype=torch.float32)
    with Keeps():
        before, after = ext.sum_around_call(
            x, lambda: [k.set_(torch.zeros(1, dtype=k.dtype)) for k in kept])
    assert kept, "the mode saw the conversion"
    assert before == after == float(N)


def test_kind3_a_converted_tensor_swapped_by_a_later_argument():
    x = torch.ones(N, dtype=torch.float32)  # converted to float64
    y = torch.ones(4, dtype=torch.float64)

    def swap():
        x.set_(torch.zeros(1, dtype=torch.float32))

    assert ext.sum_f64_and_len(x, Exports(swap)) == (float(N), 3)
    assert ext.sum_f64_and_len(y, x) == (4.0, 1)


def test_kind4_a_subclass_that_gains_torch_dispatch_later_is_refused():
    class Late(torch.Tensor):
        pass

    assert ext.sum_f32(torch.ones(3).as_subclass(Late)) == 3.0  # type now cached

    def dispatch(cls, func, types, args=(), kwargs=None):
        unwrap = [a.as_subclass(torch.Tensor) if isinstance(a, Late) else a for a in args]
        return func(*unwrap, **(kwargs or {}))

    Late.__torch_dispatch__ = classmethod(dispatch)
    with pytest.raises(BufferError, match="__torch_dispatch__"):
        ext.sum_f32(torch.ones(3).as_subclass(Late))
    del Late.__torch_dispatch__
    assert ext.sum_f32(torch.ones(3).as_subclass(Late)) == 3.0


def test_kind11_inference_tensors_are_not_written_outside_inference_mode():
    with torch.inference_mode():
        t = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"^fill_f64\(\): argument 'out': the tensor is an "
                                        r"inference tensor"):
        ext.fill_f64(t, 1.0)
    assert t.tolist() == [0.0, 0.0, 0.0]
    # Read-only views are fine, and inside inference_mode PyTorch allows
    # the write (an inference tensor has no version counter to bump).
    assert ext.sum_f64(t) == 0.0
    with torch.inference_mode():
        ext.fill_f64(t, 1.0)
    assert t.tolist() == [1.0, 1.0, 1.0]


def test_the_alias_is_dlcasts_alone():
    # What makes kinds 1-3 impossible: the alias dlcast reads is referenced
    # by nothing else when it is read. No mode or override sees it (see
    # test_frameworks.py); should Python code reach it anyway (here through
    # the garbage collector, a documented limit), a reference it keeps gets
    # the call refused.
    kept = []

    class FindsIt:
        def __dlpack__(self, **kw):
            kept.extend(o for o in gc.get_objects()
                        if isinstance(o, torch.Tensor) and o.shape == (12345,))
            return np.ones(3).__dlpack__(**kw)

    x = torch.ones(12345, dtype=torch.float64)
    with pytest.raises(BufferError, match="private alias"):
        ext.sum_f64_and_len(x, FindsIt())
    assert len(kept) >= 2  # the caller's tensor and the alias
    kept.clear()
    assert ext.sum_f64_and_len(x, np.ones(2)) == (12345.0, 2)
