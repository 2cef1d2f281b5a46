"""PyTorch's rules for a caller's tensor: autograd and views of tensors that
require grad, version counters (bumped once for a write, never for a refused
call), inference tensors, and tensors swapped, resized or retyped by a later
argument or a callback while they are read.
"""

import gc
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import dlcast_testext as ext
import dlcast_testext as t


def test_writable_torch_tensors_keep_autograd_right():
    # A tensor that requires grad is refused: autograd cannot see the write.
    a = torch.ones(3, requires_grad=True)
    b = a.exp()
    for t in (a, b):
        with pytest.raises(TypeError, match=r"^add_one_f32\(\): argument 'x': the tensor requires grad"):
            ext.add_one_f32(t)
    # A tensor saved for backward by another op: the write bumps its version,
    # so backward raises instead of using the changed values.
    w = torch.ones(3)
    y = (a * w).sum()
    before = w._version
    ext.add_one_f32(w)
    assert w._version > before and w.tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    # detach() gives a tensor that may be written (sharing memory).
    d = b.detach()
    ext.add_one_f32(d)
    assert torch.allclose(b, d)


@pytest.mark.slow
def test_a_tensor_changed_while_other_arguments_are_read_keeps_its_view():
    # PyTorch tensors are mutable containers: Python code run while a later
    # argument is prepared (here its __dlpack__) may swap the first tensor's
    # storage, which frees the memory a view of the tensor itself would be
    # made of. dlcast reads a private alias taken before (x.data), which
    # holds the old storage: the call sees the tensor as it was when its
    # argument was taken, and no freed memory.
    n = 2_000_000  # large enough that freed memory goes back to the OS
    pts = torch.ones(n, 3)

    class SwapsFirst:
        def __init__(self):
            self.a = np.ones(n, np.float32)

        def __dlpack__(self, **kw):
            pts.set_(torch.zeros(1, 3))
            return self.a.__dlpack__(**kw)

    assert ext.centroid(pts, SwapsFirst()) == [1.0, 1.0, 1.0]
    assert pts.shape == (1, 3)
    # The same with a swap to a smaller dtype at the same address (the
    # `p.data = p.data.half()` idiom), before the read.
    x = torch.ones(n, dtype=torch.float64)

    class ShrinksFirst:
        def __dlpack__(self, **kw):
            x.data = x.data.to(torch.int8)
            return np.ones(3, np.float64).__dlpack__(**kw)

    assert ext.sum_f64_and_len(x, ShrinksFirst()) == (float(n), 3)
    # The tensor's own is_neg (asked of the alias) cannot swap the alias:
    # PyTorch refuses to change a `.data` tensor's storage... or the alias
    # is kept by the subclass and the call refused. Either way, no view of
    # freed memory: the call raises or reads the original values.
    class SwapsItself(torch.Tensor):
        def is_neg(self):
            self.set_(torch.zeros(1, 3))
            return False

    own = torch.ones(n, 3).as_subclass(SwapsItself)
    try:
        got = ext.centroid(own, np.ones(n, np.float32))
    except (TypeError, BufferError):
        pass
    else:
        assert got == [1.0, 1.0, 1.0]
    # A dtype-generic function: a later argument's __dlpack__ that swaps the
    # deciding one changes nothing the call reads.
    a = torch.ones(n, dtype=torch.float32)

    class SwapsDecider:
        def __dlpack__(self, **kw):
            a.set_(torch.zeros(1))
            return np.ones(3, np.float64).__dlpack__(**kw)

    ext.instance_pair(a, None, SwapsDecider())
    # A writable parameter: the version counter of the caller's tensor is
    # bumped, and the writes land in the memory the tensor had.
    g = torch.zeros(4, dtype=torch.float64)
    ext.fill_f64(g, 2.0)
    assert g.tolist() == [2.0] * 4 and g._version == 1


# A separate process: it fills the type cache (8 slots) on purpose, so that
# every import looks its type up again (Python code: a descriptor that swaps
# another argument).
_LOOKUP_SWAPS = """
import torch, dlcast_testext as ext
ext.sum_f32(torch.ones(2))
for i in range(8):
    try:
        ext.sum_f32(type(f"Junk{i}", (), {})())
    except TypeError:
        pass
state = {"calls": 0, "arm": None, "victim": None}
class Hook:
    def __get__(self, inst, owner):
        state["calls"] += 1
        if state["calls"] == state["arm"]:
            state["victim"].set_(torch.zeros(1, 3))
        return None
class W(torch.Tensor):
    __dlpack_c_exchange_api__ = Hook()
def run(arm):
    pts = torch.ones(1000, 3)
    state.update(calls=0, arm=arm, victim=pts)
    try:
        return str(ext.centroid(pts, torch.ones(1000).as_subclass(W))), state["calls"]
    except BufferError as e:
        return str(e), state["calls"]
_, k = run(None)
print(k)
for arm in range(1, k + 2):
    print(arm, run(arm)[0])
"""


@pytest.mark.slow
def test_a_type_lookup_cannot_swap_a_tensor_under_its_view():
    # Each lookup (at any point of the call's Python steps) swaps the first
    # tensor's storage; its view reads the private alias taken before, so
    # every call gives the values the tensor had.
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", _LOOKUP_SWAPS], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    k, *lines = out.stdout.splitlines()
    assert int(k) > 0 and len(lines) == int(k) + 1, out.stdout
    for line in lines:
        assert line.endswith("[1.0, 1.0, 1.0]"), line


def test_views_of_tensors_that_require_grad_are_exported_read_only():
    w = torch.ones(2, 3, dtype=torch.float64, requires_grad=True)
    out = np.asarray(ext.identity(w))
    assert not out.flags.writeable
    with pytest.raises(ValueError):
        out[0, 0] = 5.0
    # PyTorch has no read-only tensors: returning it there is refused, and
    # the message names the cause (requires_grad) and the fix (x.detach()),
    # for `returns = like(x)` too.
    for f in (ext.transposed, ext.passthrough_f64):
        with pytest.raises(BufferError, match=r"^returns = torch: .*requires grad.*x\.detach\(\)"):
            f(w)
    # Without requires_grad the view stays writable (zero-copy both ways).
    d = w.detach()
    np.asarray(ext.identity(d))[0, 0] = 5.0
    assert d[0, 0] == 5.0


GRAD_REFUSAL = r"requires grad \(x\.requires_grad is True\).*Pass x\.detach\(\)"

# Every way a view of a tensor that requires grad would come back as a
# torch.Tensor: (call, how the message begins).
TO_TORCH = {
    "default return": (lambda x: t.acc_reshape(x, [6]), "the default return"),
    "default return, in a tuple": (lambda x: ext.view_and_copy(x), "the default return"),
    "returns = like(x), in a list": (lambda x: ext.views_like(x), "returns = torch"),
    "returns = like(x)": (lambda x: ext.passthrough_f64(x), "returns = torch"),
    "returns = torch": (lambda x: ext.passthrough_f64_torch(x), "returns = torch"),
}


@pytest.mark.parametrize("corner", sorted(TO_TORCH))
def test_a_view_of_a_tensor_that_requires_grad_never_comes_back_as_a_tensor(corner):
    """torch in, torch out, or an error at the call naming x.detach(): a view
    of a tensor that requires grad is refused in every corner that would
    make it a torch.Tensor (PyTorch has no read-only tensors, and writes
    through it would bypass autograd), the default return included, where a
    read-only dlcast.Array failed only at its first `.add_()`."""
    call, how = TO_TORCH[corner]
    w = torch.ones(2, 3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(BufferError, match=rf"^{how}.*{GRAD_REFUSAL}"):
        call(w)
    # The fix: x.detach() comes back as a writable tensor over w's memory.
    out = call(w.detach())
    view = [o for o in (out if isinstance(out, (tuple, list)) else [out])][-1]
    assert type(view) is torch.Tensor and not view.requires_grad
    view.add_(1.0)
    assert (w.detach() == 2.0).all()
    assert w.grad is None and w.requires_grad


def test_frameworks_with_read_only_arrays_get_a_read_only_view_of_a_tensor_that_requires_grad():
    """The rule is PyTorch's (and PaddlePaddle's): a framework with read-only
    arrays gets the view read-only, never a copy."""
    w = torch.ones(2, 3, dtype=torch.float64, requires_grad=True)
    out = ext.passthrough_f64_numpy(w)
    assert not out.flags.writeable and out.ctypes.data == w.data_ptr()
    assert ext.identity(w).read_only


@pytest.mark.hostile
def test_a_subclass_hiding_requires_grad_is_refused_by_pytorchs_own_flag():
    """Whether the view requires grad is read through TensorBase's own
    getter: a subclass (of PyTorch's module, so the default return is
    PyTorch) whose `requires_grad` property says False is refused all the
    same."""

    class Hiding(torch.Tensor):
        @property
        def requires_grad(self):
            return False

    Hiding.__module__ = "torch.hiding"
    w = torch.ones(2, 3, dtype=torch.float64, requires_grad=True).as_subclass(Hiding)
    assert torch._C.TensorBase.requires_grad.__get__(w) and not w.requires_grad
    for call, how in TO_TORCH.values():
        with pytest.raises(BufferError, match=rf"^{how}.*{GRAD_REFUSAL}"):
            call(w)


def test_a_refused_call_leaves_version_counters_alone():
    x = torch.ones(3, dtype=torch.float64)
    with pytest.raises(TypeError, match="share memory"):
        ext.add_one_into(x, x)
    assert x._version == 0
    ext.add_one_into(torch.zeros(3, dtype=torch.float64), x)
    assert x._version == 1

N = 2_000_000  # large enough that freed memory goes back to the OS


class Exports:
    """An array whose `__dlpack__` first runs `hook()` (Python code run
    while a later argument is prepared)."""

    def __init__(self, hook, arr=None):
        self.hook, self.arr = hook, np.ones(3) if arr is None else arr

    def __dlpack__(self, **kw):
        self.hook()
        return self.arr.__dlpack__(**kw)


@pytest.mark.hostile
def test_a_tensor_shrunk_in_place_by_a_later_argument():
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


@pytest.mark.hostile
def test_a_converted_tensor_swapped_by_a_later_argument():
    x = torch.ones(N, dtype=torch.float32)  # converted to float64
    y = torch.ones(4, dtype=torch.float64)

    def swap():
        x.set_(torch.zeros(1, dtype=torch.float32))

    assert ext.sum_f64_and_len(x, Exports(swap)) == (float(N), 3)
    assert ext.sum_f64_and_len(y, x) == (4.0, 1)


@pytest.mark.hostile
def test_inference_tensors_are_not_written_outside_inference_mode():
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


# A residual the guide (Safety) documents: memory moved or freed by
# ordinary, flag-free APIs while a body holds a view. import/torch promises a
# PyTorch view "stays valid whatever Python code does to the caller's
# tensor during the call ... with one exception: resizing the storage";
# `share_memory_()` (also run implicitly by torch.multiprocessing when a
# tensor is sent to another process) swaps the storage's data pointer and
# frees the old memory. NumPy's `__setstate__` frees an array's data with
# no refcheck at all (the guide names only `resize(refcheck=False)`).

@pytest.mark.hostile
def test_shared_memory_tensors_are_documented_as_a_residual():
    # Neither can be prevented by holding references (PyTorch and NumPy free
    # the memory under every view of it, their own included): the guide's
    # safety chapter names both, next to resize(refcheck=False).
    from doc_text import chapter

    safety = chapter("safety")
    assert "share_memory_()" in safety and "__setstate__" in safety


@pytest.mark.hostile
def test_later_argument_swaps_and_resizes_an_earlier_tensor():
    x = torch.ones(4, dtype=torch.float64)
    keep = torch.zeros(2, dtype=torch.float64)

    class Evil:
        def __dlpack__(self, **kw):
            x.set_(torch.zeros(1, dtype=torch.float64))
            x.resize_(1)
            gc.collect()
            return keep.__dlpack__(**kw)

        def __dlpack_device__(self):
            return (1, 0)

    # The write goes to the storage the alias holds; nothing dangles.
    assert ext.fill_then_len(x, Evil(), 3.0) == 2
    assert x.tolist() == [0.0]


@pytest.mark.hostile
def test_callback_swapping_the_tensor_during_the_body():
    x = torch.ones(1 << 12, dtype=torch.float64)

    def cb():
        x.set_(torch.zeros(1, dtype=torch.float64))
        gc.collect()
        global _junk
        _junk = [torch.full((1 << 12,), 5.0, dtype=torch.float64) for _ in range(20)]

    before, after = ext.hold_ref_and_call(x, cb)
    assert before == after == float(1 << 12)


@pytest.mark.hostile
def test_subclass_data_property_returning_a_shared_tensor():
    shared = torch.ones(3, dtype=torch.float64)

    class Sub(torch.Tensor):
        @property
        def data(self):
            return shared  # a tensor the caller keeps: not private

    # TensorBase's own `data` getter is used, not the subclass's property:
    # the tensor's own values are read.
    s = torch.zeros(3, dtype=torch.float64).as_subclass(Sub)
    assert ext.sum_f64(s) == 0.0


@pytest.mark.hostile
def test_dtype_generic_peek_then_dtype_change_in_a_later_argument():
    # `instance_pair` decides A from `a` in phase 1 (peek); the later
    # argument's __dlpack__ re-types `a` in place (float32 -> int32, NumPy
    # `a.dtype = ...`); phase 2 re-reads and re-checks `a` against A = f32
    # (here: a same-kind conversion of the re-typed array, or a TypeError).
    a = np.ones(4, dtype=np.float32)
    c_src = np.zeros(4, dtype=np.float64)

    class Later:
        def __dlpack__(self, **kw):
            a.dtype = np.int32
            return c_src.__dlpack__(**kw)

        def __dlpack_device__(self):
            return (1, 0)

    try:
        got = ext.instance_pair(a, None, Later())
    except TypeError:
        return
    assert got == ("f32", "f64", False)


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_a_later_arguments_dlpack_changes_an_earlier_tensor_dtype():
    # `x.data = ...` (a complex conjugate view) from a later argument's
    # __dlpack__: the alias taken in x's phase 1 is unchanged, so the call
    # reads x's old values (or refuses), never the new lazy view's memory.
    x = torch.arange(4, dtype=torch.float64)

    class Later:
        def __init__(self):
            self.arr = np.ones(4)

        def __dlpack__(self, **kw):
            x.data = torch.tensor([1 + 2j] * 4, dtype=torch.complex128).conj()
            return self.arr.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.arr.__dlpack_device__()

    try:
        total, n = t.sum_f64_and_len(x, Later())
    except (BufferError, TypeError, ValueError):
        pass
    else:
        assert (total, n) == (6.0, 4)
    assert x.is_conj() and x.dtype == torch.complex128


class _Changer:
    """float64 data behind `__dlpack__`, whose export first runs `during()`
    (phase 1 of a later argument: before any read)."""

    def __init__(self, during, n=4):
        self.data = np.ones(n)
        self.during = during

    def __dlpack__(self, **kw):
        self.during()
        return self.data.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.data.__dlpack_device__()


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("change", ["dtype", "shape", "resize"])
def test_peeked_argument_changed_by_a_later_argument(change):
    """`add_into<T>(a, b, out)` decides `T` by peeking at `a`'s dtype in
    phase 1; `b`'s `__dlpack__` then changes `a` (its dtype, its shape, or
    frees its memory). Phase 2 reads `a` again: an error, or the right sum
    of what `a` holds when the body runs -- never a read as the old dtype."""
    a = np.arange(4.0)

    def during():
        if change == "dtype":
            a.dtype = np.int64  # the same bytes, reinterpreted
        elif change == "shape":
            a.shape = (2, 2)
        else:
            a.resize(8, refcheck=False)
            a[:] = 10.0

    out = np.zeros(4)
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t.add_into(a, _Changer(during), out)
    except (TypeError, BufferError):
        assert (out == 0).all()
        return
    assert out.tolist() == (np.asarray(a, dtype=np.float64).ravel()[:4] + 1).tolist()


# The writable refusals are decided at the read (phase 2), after the last
# Python code of the call: each way in below takes a different path there
# (an exact tensor asks PyTorch's getters directly; a subclass, a
# `Parameter` and a function mode ask them inside DisableTorchFunction).

class _Sub(torch.Tensor):
    """A subclass with a `__torch_function__` of its own."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs)


class _Mode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _way_in(way, base):
    import contextlib

    if way == "subclass":
        return base.as_subclass(_Sub), contextlib.nullcontext()
    if way == "parameter":
        return torch.nn.Parameter(base, requires_grad=False), contextlib.nullcontext()
    if way == "function_mode":
        return base, _Mode()
    return base, contextlib.nullcontext()


WAYS_IN = ["plain", "subclass", "parameter", "function_mode"]


@pytest.mark.hostile
@pytest.mark.parametrize("way", WAYS_IN)
def test_requires_grad_set_by_a_later_argument_is_refused(way):
    base = torch.zeros(3, dtype=torch.float64)
    x, ctx = _way_in(way, base)

    def set_grad():
        x.requires_grad_(True)

    with ctx:
        with pytest.raises(TypeError, match=r"^fill_then_len\(\): argument 'out': the tensor "
                                            r"requires grad"):
            ext.fill_then_len(x, Exports(set_grad), 7.0)
    assert base.tolist() == [0.0, 0.0, 0.0] and x._version == 0
    # Without the hook the same way in is written (and bumped once).
    y, ctx = _way_in(way, torch.zeros(3, dtype=torch.float64))
    with ctx:
        assert ext.fill_then_len(y, Exports(lambda: None), 7.0) == 3
    assert y.tolist() == [7.0, 7.0, 7.0] and y._version == 1


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_requires_grad_set_by_a_finalizer_while_the_alias_is_made_is_refused():
    # The alias is the first object the call allocates that the collector
    # tracks: a collection started there runs a finalizer that sets
    # requires_grad after phase 1 looked at the tensor.
    x = torch.zeros(3, dtype=torch.float64)
    t.fill_f64(torch.zeros(3, dtype=torch.float64), 1.0)  # set-up done
    fired = []

    class Trap:
        def __del__(self):
            x.requires_grad_(True)
            fired.append(True)

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
        # Nothing the collector tracks is allocated from here to the call.
        try:
            t.fill_f64(x, 1.0)
        except TypeError as e:
            err = e
    finally:
        gc.set_threshold(*threshold)
        gc.enable()
    gc.collect()
    assert fired and x.requires_grad
    if err is None:
        # Read directly (no allocation, so no collection during the call):
        # written while it did not require grad; the finalizer ran after.
        assert t.torch_direct() == "on"
        assert x.detach().tolist() == [1.0, 1.0, 1.0]
    else:
        assert "the tensor requires grad" in str(err)
        assert x.detach().tolist() == [0.0, 0.0, 0.0]


@pytest.mark.hostile
@pytest.mark.parametrize("way", WAYS_IN)
def test_inference_mode_left_by_a_later_argument_is_refused(way):
    with torch.inference_mode():
        base = torch.zeros(3, dtype=torch.float64)
    x, ctx = _way_in(way, base) if way != "parameter" else (base, _way_in("plain", base)[1])
    mode = torch.inference_mode()
    with ctx:
        mode.__enter__()
        try:
            with pytest.raises(TypeError, match=r"argument 'out': the tensor is an inference "
                                                r"tensor"):
                ext.fill_then_len(x, Exports(lambda: mode.__exit__(None, None, None)), 7.0)
        finally:
            if torch.is_inference_mode_enabled():
                mode.__exit__(None, None, None)
    assert base.tolist() == [0.0, 0.0, 0.0]
    # Entered by the later argument instead: the write happens inside it.
    mode = torch.inference_mode()
    try:
        with ctx:
            assert ext.fill_then_len(x, Exports(mode.__enter__), 7.0) == 3
    finally:
        mode.__exit__(None, None, None)
    assert base.tolist() == [7.0, 7.0, 7.0]


@pytest.mark.hostile
@pytest.mark.parametrize("way", ["plain", "subclass"])
def test_a_tensor_swapped_by_a_later_argument_is_not_written(way):
    # `swap_tensors` moves the TensorImpl (its storage, requires_grad and
    # version counter) to the other Python object: the memory dlcast holds
    # is no longer the caller's tensor's, and the other object may require
    # grad by the time the body writes. Refused, whatever it requires.
    base = torch.zeros(3, dtype=torch.float64)
    x, _ = _way_in(way, base)
    other, _ = _way_in(way, torch.ones(3, dtype=torch.float64))

    def swap():
        torch.utils.swap_tensors(x, other)
        other.requires_grad_(True)  # now the TensorImpl of the memory read

    with pytest.raises(BufferError, match=r"argument 'out': Python code swapped the tensor"):
        ext.fill_then_len(x, Exports(swap), 7.0)
    assert other.detach().tolist() == [0.0, 0.0, 0.0]
    assert x.tolist() == [1.0, 1.0, 1.0]


# A producer's read-only declaration holds for writable parameters on every
# path: PyTorch's ReadOnlyTensorWrapper (its class publishes PyTorch's
# read-only exchange table), and a class that exports read-only through
# its own `__dlpack__` or exchange table.

RO_MESSAGE = r"argument 'out': the array is read-only, but the parameter is writable"


def _needs_read_only_dlpack():
    """PyTorch 2.15+'s `__dlpack__(read_only=...)`: skipped outside CI on an
    older PyTorch; in CI (which installs the newest) the test runs, and fails
    there if it is missing: no framework test skips in CI."""
    if "read_only" not in torch.Tensor.__dlpack__.__code__.co_varnames:
        if os.environ.get("CI") != "true":
            pytest.skip("PyTorch's __dlpack__ has no read_only (2.15+)")


def _read_only_wrapper():
    wrapper = getattr(getattr(torch.utils, "dlpack", None), "ReadOnlyTensorWrapper", None)
    if wrapper is None and os.environ.get("CI") != "true":
        pytest.skip("PyTorch without torch.utils.dlpack.ReadOnlyTensorWrapper (2.15+)")
    return wrapper


def test_read_only_tensor_wrappers_are_never_written():
    ro = _read_only_wrapper()
    x = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(TypeError, match=RO_MESSAGE):
        ext.fill_f64(ro(x), 1.0)
    assert x.tolist() == [0.0, 0.0, 0.0] and x._version == 0
    with torch.inference_mode():
        ext_fill_refused_in_mode = False
        try:
            ext.fill_f64(ro(x), 1.0)
        except TypeError:
            ext_fill_refused_in_mode = True
    assert ext_fill_refused_in_mode and x.tolist() == [0.0, 0.0, 0.0]
    # Read-only parameters take it, and a view of it goes back read-only.
    assert ext.sum_f64(ro(torch.ones(3, dtype=torch.float64))) == 3.0
    assert ext.values(ro(torch.arange(3, dtype=torch.float64))) == [0.0, 1.0, 2.0]
    out = np.asarray(ext.identity(ro(x)))
    assert not out.flags.writeable
    # Its own export says the same (what dlcast honours).
    assert not np.from_dlpack(ro(x)).flags.writeable


@pytest.mark.hostile
def test_a_subclass_of_a_read_only_wrapper_cannot_declare_itself_writable():
    ro = _read_only_wrapper()

    class Writable(ro):
        __dlpack_c_exchange_api__ = torch._C._dlpack_exchange_api()
        __dlpack__ = torch.Tensor.__dlpack__

    x = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(TypeError, match=RO_MESSAGE):
        ext.fill_f64(Writable(x), 1.0)
    with pytest.raises(TypeError, match=RO_MESSAGE):
        ext.fill_then_len(Writable(x), Exports(lambda: None), 1.0)
    assert x.tolist() == [0.0, 0.0, 0.0]


@pytest.mark.hostile
def test_a_read_only_table_planted_on_tensor_makes_every_tensor_read_only():
    # Declarations only ever add the mark: PyTorch's read-only table set on
    # torch.Tensor itself declares every tensor read-only.
    _read_only_wrapper()
    x = torch.zeros(3, dtype=torch.float64)
    saved = torch.Tensor.__dict__["__dlpack_c_exchange_api__"]
    torch.Tensor.__dlpack_c_exchange_api__ = torch._C._const_dlpack_exchange_api()
    try:
        with pytest.raises(TypeError, match=RO_MESSAGE):
            ext.fill_f64(x, 1.0)
        assert ext.sum_f64(x) == 0.0
    finally:
        torch.Tensor.__dlpack_c_exchange_api__ = saved
    ext.fill_f64(x, 1.0)
    assert x.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.hostile
def test_a_subclass_declaring_read_only_through_its_own_dlpack_is_never_written():
    class ReadOnlyExport(torch.Tensor):
        def __dlpack__(self, **kw):
            return super().__dlpack__(**{**kw, "read_only": True})

    class WritableExport(torch.Tensor):
        def __dlpack__(self, **kw):
            return super().__dlpack__(**kw)

    x = torch.zeros(3, dtype=torch.float64)
    _needs_read_only_dlpack()
    with pytest.raises(TypeError, match=RO_MESSAGE):
        ext.fill_f64(x.as_subclass(ReadOnlyExport), 1.0)
    assert x.tolist() == [0.0, 0.0, 0.0]
    ext.fill_f64(x.as_subclass(WritableExport), 2.0)
    assert x.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.hostile
def test_a_view_of_a_tensor_declared_read_only_by_its_own_dlpack_goes_back_read_only():
    """Hostile (review 2 of #32): `declared_by_class` is asked only for
    writable parameters, so a read-only parameter's view of a tensor whose
    class exports read-only through its own `__dlpack__` keeps the alias's
    writable mark, and a returned view of it is writable: `dlcast.Array`
    says `read_only == False`, `returns = numpy` gives a writable NumPy
    array over the tensor's memory (written below). PyTorch's
    ReadOnlyTensorWrapper, recognised by its type, goes back read-only."""

    class ReadOnlyExport(torch.Tensor):
        def __dlpack__(self, **kw):
            return super().__dlpack__(**{**kw, "read_only": True})

    _needs_read_only_dlpack()
    x = torch.zeros(3, dtype=torch.float64)
    assert ext.identity(x.as_subclass(ReadOnlyExport)).read_only
    out = ext.identity_numpy(x.as_subclass(ReadOnlyExport))
    assert not out.flags.writeable
    with pytest.raises(ValueError):
        out[0] = 5.0
    assert x.tolist() == [0.0, 0.0, 0.0]


# Tables, callbacks and data of the table below: alive for the process (the
# type cache keeps the address of a type's table).
_KEEP = []


@pytest.mark.hostile
def test_a_subclass_declaring_read_only_through_its_own_exchange_table_is_never_written():
    import ctypes

    from conftest import DELETER, MANAGED_FROM_OBJ, ApiC, ManagedC

    live, deleted = {}, []

    @DELETER
    def deleter(m):
        deleted.append(live.pop(ctypes.addressof(m.contents), None) is not None)

    scalar = ctypes.c_double(0.0)

    def export(obj, out):
        m = ManagedC()
        m.major, m.minor, m.deleter, m.flags = 1, 3, deleter, 1  # READ_ONLY
        d = m.dl_tensor
        d.data, d.device_type, d.device_id, d.ndim = ctypes.addressof(scalar), 1, 0, 0
        d.code, d.bits, d.lanes = 2, 64, 1
        live[ctypes.addressof(m)] = m
        out[0] = ctypes.pointer(m)
        return 0

    api = ApiC()
    api.header.major, api.header.minor = 1, 3
    api.managed_from_obj = MANAGED_FROM_OBJ(export)
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    name = b"dlpack_exchange_api"
    _KEEP.extend([api, name, deleter, scalar, export])

    class Foreign(torch.Tensor):
        __dlpack_c_exchange_api__ = new(ctypes.addressof(api), name, None)

    x = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(TypeError, match=RO_MESSAGE):
        ext.fill_f64(x.as_subclass(Foreign), 1.0)
    assert x.tolist() == [0.0, 0.0, 0.0]
    assert deleted == [True]
    # Read-only parameters still read the tensor through PyTorch's alias.
    assert ext.sum_f64(torch.ones(3, dtype=torch.float64).as_subclass(Foreign)) == 3.0


@pytest.mark.hostile
@pytest.mark.parametrize("declaring", ["ReadOnlyTensorWrapper", "own __dlpack__"])
def test_a_read_only_declaration_made_by_a_later_argument_is_decided_at_the_read(declaring):
    """Hostile (review 2 of #32): whether the tensor's class declares it
    read-only is decided in phase 1 (`declared_by_class`, the type flags),
    and not re-established at the read like requires_grad, inference and
    swaps (`check_write`). A later argument's `__dlpack__` changes the
    tensor's class to one that declares it read-only (`__class__`
    assignment, allowed between tensor classes): the body then writes a
    tensor its class declares read-only."""
    if declaring == "ReadOnlyTensorWrapper":
        declares = _read_only_wrapper()
    else:
        _needs_read_only_dlpack()

        class declares(torch.Tensor):
            def __dlpack__(self, **kw):
                return super().__dlpack__(**{**kw, "read_only": True})

    x = torch.zeros(3, dtype=torch.float64)

    def declare_read_only():
        x.__class__ = declares

    with pytest.raises(TypeError, match=RO_MESSAGE):
        ext.fill_then_len(x, Exports(declare_read_only), 7.0)
    assert type(x) is declares
    assert x.as_subclass(torch.Tensor).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.hostile
def test_a_read_only_declaration_set_on_the_class_by_a_later_argument_is_decided_at_the_read():
    """Hostile (#32): as above, but the tensor keeps its class and a later
    argument's `__dlpack__` gives the class a `__dlpack__` that exports
    read-only (a class attribute set, which phase 1 decided without). The
    class's entries are compared at the read: the tensor is read read-only."""
    _needs_read_only_dlpack()

    class Sub(torch.Tensor):
        pass

    def read_only_export(self, **kw):
        return torch.Tensor.__dlpack__(self, **{**kw, "read_only": True})

    x = torch.zeros(3, dtype=torch.float64).as_subclass(Sub)
    assert ext.fill_then_len(x, np.ones(2), 1.0) == 2

    def declare_read_only():
        Sub.__dlpack__ = read_only_export

    with pytest.raises(TypeError, match=RO_MESSAGE):
        ext.fill_then_len(x, Exports(declare_read_only), 7.0)
    assert x.as_subclass(torch.Tensor).tolist() == [1.0, 1.0, 1.0]


@pytest.mark.hostile
def test_a_subclass_of_a_read_only_wrapper_cannot_hide_the_declaration_behind_its_metaclass():
    """Hostile (review of #32): `declares_read_only` walks the MRO as
    `type(obj).__mro__` answers it, an attribute look-up that a metaclass
    can answer with a property: a subclass of ReadOnlyTensorWrapper whose
    metaclass leaves the wrapper out of `__mro__` undoes the declaration
    (the real MRO, `tp_mro`, still has it)."""
    ro = _read_only_wrapper()

    class HidingMeta(type(torch.Tensor)):
        @property
        def __mro__(cls):
            return (cls, torch.Tensor, torch._C.TensorBase, object)

    class Writable(ro, metaclass=HidingMeta):
        __dlpack_c_exchange_api__ = torch._C._dlpack_exchange_api()
        __dlpack__ = torch.Tensor.__dlpack__

    assert ro in type.__dict__["__mro__"].__get__(Writable)
    x = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(TypeError, match=RO_MESSAGE):
        ext.fill_f64(Writable(x), 1.0)
    assert x.tolist() == [0.0, 0.0, 0.0]


@pytest.mark.hostile
def test_a_tensor_swapped_for_one_at_the_same_address_is_not_written_unbumped():
    """Hostile (review of #32): the swap check compares the `TensorImpl`'s
    address noted in phase 1 with the one the caller's tensor has in
    phase 2. A later argument swaps the tensor away, frees the TensorImpl
    that was read, and swaps in a new tensor allocated at the same
    address: the check passes, the body writes the storage read, and the
    version bump goes to the new TensorImpl, not to the version counter of
    that storage (shared with `x.detach()`, saved for backward here), so
    backward silently uses the written values instead of raising."""
    x = torch.zeros(3, dtype=torch.float64)
    d = x.detach()  # shares x's version counter (not its TensorImpl)
    w = torch.ones(3, dtype=torch.float64, requires_grad=True)
    loss = (w * d).sum()  # saves d for backward
    reused = []

    def swap_to_the_same_address():
        address = x._cdata
        other = torch.empty(3, dtype=torch.float64)
        torch.utils.swap_tensors(x, other)
        del other  # frees the TensorImpl dlcast read
        keep = []
        for _ in range(1000):
            c = torch.empty(3, dtype=torch.float64)
            if c._cdata == address:
                torch.utils.swap_tensors(x, c)
                reused.append(True)
                return
            keep.append(c)

    try:
        ext.fill_then_len(x, Exports(swap_to_the_same_address), 7.0)
    except BufferError:
        return  # refused: what the guarantee asks
    assert reused, "the allocator did not reuse the address (the attack needs it)"
    # Written: then the storage's version counter must have moved.
    assert d._version > 0, (d.tolist(), d._version)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.hostile
def test_a_subclass_of_a_read_only_export_cannot_hide_its_dlpack_behind_its_metaclass():
    """Hostile: whether a class has a `__dlpack__` of its own (which then
    says whether it exports read-only) is decided by what its instances
    find (the real MRO's dictionaries), not by `type(obj).__dlpack__`,
    which a metaclass property can answer with `torch.Tensor`'s."""
    _needs_read_only_dlpack()

    class ReadOnlyExport(torch.Tensor):
        def __dlpack__(self, **kw):
            return super().__dlpack__(**{**kw, "read_only": True})

    class HidingMeta(type(torch.Tensor)):
        @property
        def __dlpack__(cls):
            return torch.Tensor.__dlpack__

    class Hidden(ReadOnlyExport, metaclass=HidingMeta):
        pass

    assert Hidden.__dlpack__ is torch.Tensor.__dlpack__
    x = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(TypeError, match=RO_MESSAGE):
        ext.fill_f64(x.as_subclass(Hidden), 1.0)
    assert x.tolist() == [0.0, 0.0, 0.0]


@pytest.mark.hostile
def test_a_subclass_hiding_torch_from_its_mro_still_gets_pytorchs_rules():
    """Hostile: a tensor is known as PyTorch's by the real MRO (`tp_mro`,
    which holds `torch._C.TensorBase`), not by `type(obj).__mro__`, which a
    metaclass property can answer without PyTorch's classes: taken as any
    producer's, the tensor would be read through its own `__dlpack__`
    (whose memory `x.set_()` frees during the call), its version counter
    left alone and its grad never checked."""

    class HidingMeta(type(torch.Tensor)):
        @property
        def __mro__(cls):
            return (cls, object)

    class Hidden(torch.Tensor, metaclass=HidingMeta):
        pass

    assert torch.Tensor not in Hidden.__mro__
    x = torch.zeros(3, dtype=torch.float64)
    ext.fill_f64(x.as_subclass(Hidden), 1.0)
    assert x.tolist() == [1.0, 1.0, 1.0]
    assert x._version > 0  # bumped: read by PyTorch's rules
    g = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(TypeError, match="requires grad"):
        ext.fill_f64(g.as_subclass(Hidden), 1.0)


@pytest.mark.hostile
def test_the_read_only_declarations_check_at_the_read_runs_no_python_code():
    """Hostile (review 3 of #32): `ClassEntries::unchanged` looks the names
    up in each class's dictionary in phase 2 with `PyDict_GetItemWithError`,
    which calls `__eq__` of a key whose hash collides with the name's. Its
    documentation counts only a look-up that fails as a change; one that
    answers runs Python code in phase 2, after an earlier argument was read
    and checked: here it makes the writable `out` read-only, and the body
    then writes an array that is read-only."""
    out = np.zeros(3)
    ran = []

    class Collides:
        def __hash__(self):
            return hash("__dlpack__")

        def __eq__(self, other):
            if ext.raw_reads_in_progress():
                ran.append(True)
                out.flags.writeable = False
            return NotImplemented

    Sub = type("Sub", (torch.Tensor,), {Collides(): 1})
    x = torch.zeros(2, dtype=torch.float64).as_subclass(Sub)
    try:
        ext.fill_then_len(out, x, 7.0)
    except (TypeError, BufferError):
        pass
    assert ext.raw_reads_in_progress() is not None, "needs a debug build"
    assert not ran, "a class's dictionary key ran Python code at the read (phase 2)"
    assert out.flags.writeable or out.tolist() == [0.0, 0.0, 0.0]
