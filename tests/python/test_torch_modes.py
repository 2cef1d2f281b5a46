"""PyTorch modes, overrides and Python dispatch never see the tensors dlcast
makes, nor the calls it makes on a caller's tensor: no `__torch_function__`,
`__torch_dispatch__` mode, finalizer or other thread can swap, flag or
keep the alias the body reads.
"""

import gc
import sys
import threading
import weakref

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import dlcast_testext as ext
import dlcast_testext as t
from conftest import run_py


def test_modes_and_overrides_never_see_dlcasts_pytorch_calls():
    # dlcast asks PyTorch (x.data, is_neg, is_conj, requires_grad,
    # is_inference) through TensorBase's own C attributes with torch-function
    # handling disabled: a mode or a subclass override neither sees the
    # private alias nor answers for PyTorch.
    from torch.overrides import TorchFunctionMode

    seen = []

    class Watches(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(getattr(func, "__name__", func))
            return func(*args, **(kwargs or {}))

    x = torch.ones(3, dtype=torch.float64)
    with Watches():
        assert ext.sum_f64(x) == 3.0
        ext.fill_f64(x, 2.0)
    assert seen == [] and x.tolist() == [2.0] * 3

    class Lies(torch.Tensor):
        def is_neg(self):
            raise AssertionError("not asked")

        @property
        def requires_grad(self):
            raise AssertionError("not asked")

    assert ext.sum_f64(torch.ones(2, dtype=torch.float64).as_subclass(Lies)) == 2.0

N = 2_000_000  # large enough that freed memory goes back to the OS


@pytest.mark.hostile
def test_a_mode_that_sees_the_requires_grad_lookup():
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


@pytest.mark.hostile
@pytest.mark.parametrize("kind", ["function", "dispatch"])
def test_a_converted_tensor_kept_by_a_mode_cannot_be_swapped(kind):
    # dlcast converts a float32 tensor (`.to(float64)`, on its private
    # alias) inside the disabled regions: a mode that would keep the alias
    # or the converted temporary (and swap its storage from the body's
    # callback, or `set_()` the alias so that the copy reads memory dlcast
    # never checked) sees none of it.
    kept = []

    class KeepsFunction(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            kept.append(out)
            return out

    class KeepsDispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kept.extend(a for a in args if isinstance(a, torch.Tensor))
            for a in args:
                if isinstance(a, torch.Tensor) and a.numel() == N:
                    a.set_(torch.zeros(1, dtype=a.dtype))
            return func(*args, **(kwargs or {}))

    x = torch.ones(N, dtype=torch.float32)
    with KeepsFunction() if kind == "function" else KeepsDispatch():
        before, after = ext.sum_around_call(
            x, lambda: [k.set_(torch.zeros(1, dtype=k.dtype)) for k in kept
                        if isinstance(k, torch.Tensor)])
    assert kept == []
    assert before == after == float(N)
    assert x.shape == (N,)


@pytest.mark.hostile
def test_the_alias_is_dlcasts_alone():
    # What makes the swaps of test_torch_tensors.py impossible: the alias
    # dlcast reads is referenced by nothing else when it is read. No mode or
    # override sees it (see test_modes_and_overrides_never_see_dlcasts_pytorch_calls);
    # should Python code reach it anyway (here through the garbage collector,
    # a documented limit), a reference it keeps gets the call refused.
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


# PyTorch alias privacy.

@pytest.mark.hostile
def test_mode_never_sees_the_alias():
    # dlcast's PyTorch calls run with torch-function handling disabled: a
    # mode that would keep the alias never sees it.
    keep = []

    class Keep(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            r = func(*args, **(kwargs or {}))
            if getattr(func, "__name__", "") == "is_neg" and not keep:
                keep.append(args[0][:])  # C++ holds the alias as the view's _base
            return r

    x = torch.arange(8, dtype=torch.float64)
    with Keep():
        assert ext.hold_ref_and_call(x, lambda: None) == (28.0, 28.0)
    assert keep == []


@pytest.mark.hostile
def test_mode_setting_the_neg_bit_on_the_alias_after_the_check():
    class SetNeg(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            r = func(*args, **(kwargs or {}))
            if getattr(func, "__name__", "") == "is_neg":
                torch._C._set_neg(args[0], True)
            return r

    x = torch.arange(1.0, 5.0, dtype=torch.float64)
    with SetNeg():
        # The view holds x's memory and x's values are unchanged.
        assert ext.sum_f64(x) == 10.0
    assert x.tolist() == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.hostile
def test_weakref_mode_never_sees_the_alias():
    import weakref

    refs = []

    class Weak(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            r = func(*args, **(kwargs or {}))
            if getattr(func, "__name__", "") == "is_neg":
                refs.append(weakref.ref(args[0]))
            return r

    with Weak():
        assert ext.sum_f64(torch.ones(3, dtype=torch.float64)) == 3.0
    assert refs == []


# Formerly a hole: Python code under a live `&mut [T]` when a PyTorch view
# drops inside a body. `RawTensor::drop` (import/mod.rs) defers only
# capsule/buffer owners; `Owner::Exchange` (the alias) is dropped at once on
# the belief that "dropping the alias runs no Python code". A dispatch mode
# chooses the alias (its `aten.detach` result) and can hang a finalizer in
# its `__dict__`; the alias's refcount is 1, so the privacy check passes.

@pytest.mark.hostile
def test_no_dispatch_mode_finalizer_runs_under_a_live_mut_slice():
    b = np.zeros(4)
    ran = []

    class Fin:
        def __del__(self):
            ran.append(True)
            b[:] = 5.0  # an ordinary NumPy write, from a finalizer

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.detach.default and not ran:
                out.fin = Fin()  # plain torch.Tensor alias, with a __dict__
            return out

    x = torch.arange(3, dtype=torch.float64)
    with Mode():
        try:
            got = ext.drop_a_then_sum_b(x, b)
        except BufferError:
            return  # refusing the mode's alias is a fix too
    # Fills b with 1.0 via &mut [f64], drops the view of x, sums the slice:
    # 4.0 unless Python wrote b under the &mut (today: 20.0).
    assert got == 4.0


# Formerly a hole: out-of-bounds read/write of a PyTorch storage, and
# Python code in phase 2. A tensor with the Python dispatch key and a
# custom sizes/strides policy (`_make_subclass(...,
# dispatch_sizes_strides_policy="sizes")`, real storage) whose class hides
# `__torch_dispatch__` from `type.__torch_dispatch__` (a descriptor that
# answers the default for class access, the real handler for instance
# access, which is what PyTorch uses) passes `has_own_torch_dispatch`
# (exchange.rs). Its `x.data` runs Python (detach), and the exchange-table
# read in phase 2 asks Python for sizes/strides: a 4-element storage is
# described as 4M elements.

_HIDDEN_DISPATCH = """
import torch, dlcast_testext as ext
N = 1 << 27
class Sneaky:
    def __get__(self, inst, owner):
        return torch.Tensor.__torch_dispatch__ if inst is None else handler
def handler(func, types, args=(), kwargs=None):
    name = str(func)
    if func is torch.ops.aten.detach.default:
        return make(args[0]._real)
    if "numel" in name: return N
    if "size" in name: return [N]
    if "stride" in name: return [1]
    if "storage_offset" in name: return 0
    if "dim" in name: return 1
    if "is_" in name: return True
    raise NotImplementedError(name)
class Hidden(torch.Tensor):
    __torch_dispatch__ = Sneaky()
def make(real):
    h = torch.Tensor._make_subclass(Hidden, real, dispatch_sizes_strides_policy="sizes")
    h._real = real
    return h
assert Hidden.__torch_dispatch__ is torch.Tensor.__torch_dispatch__
h = make(torch.zeros(4, dtype=torch.float64))
assert h.shape == (N,)  # the storage holds 4 elements
try:
    ext.{call}
except (BufferError, TypeError) as e:
    print("refused", e)
else:
    print("NOT REFUSED")
"""


@pytest.mark.slow
@pytest.mark.hostile
@pytest.mark.parametrize(
    "call", ["fill_f64(h, 1.0)", "sum_around_call(h, lambda: None)"]
)
def test_a_hidden_python_dispatch_tensor_is_refused(call):
    r = run_py(_HIDDEN_DISPATCH.replace("{call}", call))
    assert r.returncode == 0, f"crashed ({r.returncode}): {r.stderr[-800:]}"
    assert "refused" in r.stdout, r.stdout + r.stderr[-800:]


# Formerly a hole: Python code inside the DisableTorchFunction region (the dispatch mode's
# detach, run by `x.data`) re-enables torch function, and a
# __torch_function__ mode then answers is_neg()/is_conj() for the alias.

@pytest.mark.hostile
def test_a_mode_reenabling_torch_function_cannot_hide_the_negative_bit():
    class Liar(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in ("is_neg", "is_conj"):
                return False
            return func(*args, **(kwargs or {}))

    class Reenable(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.detach.default:
                torch._C.DisableTorchFunction().__exit__(None, None, None)
            return out

    z = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex128)
    x = z.conj().imag  # negative bit; values [-2, -4]
    with Liar(), Reenable():
        try:
            got = ext.values(x)
        except (BufferError, TypeError):
            return
    assert got == [-2.0, -4.0]



@pytest.mark.hostile
def test_dispatch_modes_never_see_the_alias():
    # dlcast's PyTorch calls run with
    # __torch_dispatch__ disabled as well: a dispatch mode that would keep
    # `out[:]` (whose `_base` is the alias) never runs. (Were it to run,
    # PyTorch 2.15 counts C++ holders of the TensorImpl in the PyObject's
    # refcount, and the call would be refused.)
    keep = []

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.detach.default:
                keep.append(out[:])
            return out

    x = torch.arange(4, dtype=torch.float64)
    with Mode():
        assert ext.sum_around_call(x, lambda: None) == (6.0, 6.0)
    assert keep == []


@pytest.mark.hostile
def test_dispatch_mode_returning_another_tensor_is_read_as_that_tensor():
    # The mode may substitute the alias; dlcast then reads the substitute's
    # own (live, private) memory: no unsoundness, just the mode's answer.
    class Swap(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.detach.default:
                return torch.full((2,), 9.0, dtype=torch.float64)
            return func(*args, **(kwargs or {}))

    x = torch.arange(3, dtype=torch.float64)
    with Swap():
        got = ext.values(x)
    assert got in ([0.0, 1.0, 2.0], [9.0, 9.0])


class Seen(torch.Tensor):
    seen = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        Seen.seen.append(func)
        return super().__torch_function__(func, types, args, kwargs)


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_class_reassigned_by_another_thread_while_is_inference_releases_the_gil():
    # `is_inference()` releases the GIL; another thread flips the caller's
    # tensor between `torch.Tensor` and a subclass with its own
    # `__torch_function__`. dlcast's calls must never reach that Python
    # code, and the values must be right.
    x = torch.zeros(64, dtype=torch.float64)
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            x.__class__ = Seen
            x.__class__ = torch.Tensor

    Seen.seen.clear()
    th = threading.Thread(target=flip)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    th.start()
    try:
        for i in range(3000):
            t.fill_f64(x, float(i))
            assert float(x[0]) == float(i)
    finally:
        stop.set()
        th.join()
        sys.setswitchinterval(old)
    x.__class__ = torch.Tensor
    assert Seen.seen == []


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_alias_mutated_through_gc_by_another_thread():
    # dlcast's private alias is reachable through gc.get_objects(); another
    # thread sets its negative bit, or points it elsewhere, whenever it can
    # (while is_neg()/is_conj() release the GIL). No crash; each call
    # refuses or reads the caller's values (the alias's memory).
    z = torch.tensor([1 + 2j, 3 - 4j] * 8, dtype=torch.complex128)
    x = torch.arange(16, dtype=torch.float64)
    ptrs = {x.data_ptr(), z.data_ptr()}
    stop = threading.Event()
    other = torch.full((16,), 7.0, dtype=torch.float64)

    def meddle():
        while not stop.is_set():
            for o in gc.get_objects():
                if isinstance(o, torch.Tensor) and o is not x and o is not z:
                    try:
                        if o.data_ptr() in ptrs:
                            torch._C._set_neg(o, True)
                    except Exception:
                        pass

    th = threading.Thread(target=meddle)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    th.start()
    try:
        for _ in range(300):
            for arg, want in ((x, x.numpy()), (z, z.numpy())):
                try:
                    out = t.identity_numpy(arg)
                except BufferError:
                    continue
                np.testing.assert_array_equal(out, want)
    finally:
        stop.set()
        th.join()
        sys.setswitchinterval(old)
    assert not x.is_neg() and not z.is_neg()
    del other


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_mode_entered_by_a_finalizer_during_the_writable_checks():
    # A collection started during a writable parameter's phase 1 runs a
    # finalizer that enters a lying function mode (the writable checks
    # themselves are decided at the read, see test_torch_tensors.py).
    # `_python_dispatch` must not be answered by it: a tensor with the
    # Python key (an exact `torch.Tensor` by class reassignment) is refused
    # whatever the mode says.
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Disp(torch.Tensor):
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    seen = []

    class Liar(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    entered = []

    class Trap:
        def __del__(self):
            m = Liar()
            m.__enter__()
            entered.append(m)

    moved = torch.Tensor._make_subclass(Disp, torch.zeros(3, dtype=torch.float64))
    moved.__class__ = torch.Tensor
    t.fill_f64(torch.zeros(3, dtype=torch.float64), 1.0)  # set-up done
    threshold = gc.get_threshold()
    gc.collect()
    gc.disable()
    err = None
    try:
        trap = Trap()
        trap.cycle = trap
        del trap
        gc.set_threshold(1)
        gc.enable()
        try:
            t.fill_f64(moved, 1.0)
        except BufferError as e:
            err = e
    finally:
        gc.set_threshold(*threshold)
        for m in reversed(entered):
            m.__exit__(None, None, None)
    assert err is not None and "dispatch" in str(err)
    assert seen == []
