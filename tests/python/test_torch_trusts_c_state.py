"""dlcast trusts PyTorch's C-level state, never a Python attribute that Python
code can replace (import/torch `handles`, exchange.rs `torch_table`).

Each test replaces one attribute dlcast relies on — before dlcast's first
use of PyTorch in the process, and after a first call — and checks that the
guarantee the attribute stood for still holds (a mode kept out of dlcast's
reads, the version counter bumped, an inference tensor left alone, no
Python code called in phase 2), or that the call is refused with a Python
exception. Each runs in a fresh interpreter (`run_py`): the replacements
are process-wide.
"""

import json

import pytest

from conftest import run_py

WHEN = ["before_first_use", "after_a_first_call"]

_PRELUDE = """
import json, os, torch, dlcast_testext as ext
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
if {after}:
    # dlcast's first use of PyTorch: its attributes found and cached.
    ext.sum_f64(torch.ones(3, dtype=torch.float64))
    ext.fill_f64(torch.zeros(3, dtype=torch.float64), 1.0)
def outcome(f):
    try:
        return {{"value": f()}}
    except (BufferError, TypeError, RuntimeError) as e:
        return {{"refused": type(e).__name__ + ": " + str(e)}}
"""


def run(code, when):
    """Runs the prelude then `code`, which prints one JSON line last."""
    prelude = _PRELUDE.format(after=when == "after_a_first_call")
    r = run_py(prelude + code)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


_FUNCTION_MODE = """
seen = []
class Spy(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        seen.append(str(func))
        return func(*args, **(kwargs or {}))
"""

_DISPATCH_MODE = """
seen = []
class Spy(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        seen.append(str(func))
        return func(*args, **(kwargs or {}))
"""


def assert_kept_out(got):
    """The call gave the right sum with no Python code of the mode seeing
    dlcast's reads, or was refused."""
    if "refused" in got:
        assert "not PyTorch's own" in got["refused"], got
        return
    assert got["value"] == 6.0, got
    assert got["seen"] == [], got


@pytest.mark.hostile
@pytest.mark.parametrize("when", WHEN)
def test_a_planted_exchange_table_is_never_called(when):
    # A table of ctypes callbacks (Python code) on the class attribute,
    # each forwarding to PyTorch's own function and counting its calls.
    got = run(
        """
import ctypes
from conftest import ApiC, FROM_OBJ, MANAGED_FROM_OBJ, WORK_STREAM
get = ctypes.pythonapi.PyCapsule_GetPointer
get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
real = ApiC.from_address(get(torch._C._dlpack_exchange_api(), b"dlpack_exchange_api"))
calls = []
def read(obj, out):
    calls.append("dltensor")
    return real.dltensor_from_obj(obj, out)
def managed(obj, out):
    calls.append("managed")
    return real.managed_from_obj(obj, out)
def stream(kind, index, out):
    calls.append("stream")
    return real.current_work_stream(kind, index, out)
fake = ApiC()
fake.header.major, fake.header.minor = real.header.major, real.header.minor
fake.allocator, fake.managed_to_obj = real.allocator, real.managed_to_obj
keep = [FROM_OBJ(read), MANAGED_FROM_OBJ(managed), WORK_STREAM(stream)]
fake.dltensor_from_obj, fake.managed_from_obj, fake.current_work_stream = keep
make = ctypes.pythonapi.PyCapsule_New
make.restype, make.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
torch.Tensor.__dlpack_c_exchange_api__ = make(ctypes.addressof(fake), b"dlpack_exchange_api", None)
t = torch.arange(4, dtype=torch.float64)
w = torch.zeros(3, dtype=torch.float64)
got = outcome(lambda: [ext.sum_f64(t), ext.fill_f64(w, 2.0), w.tolist()])
got["calls"] = calls
print(json.dumps(got))
""",
        when,
    )
    assert got["calls"] == [], got
    assert got.get("value") == [6.0, None, [2.0, 2.0, 2.0]], got


@pytest.mark.hostile
@pytest.mark.parametrize("when", WHEN)
@pytest.mark.parametrize(
    "stack,mode",
    [("_len_torch_function_stack", _FUNCTION_MODE), ("_len_torch_dispatch_stack", _DISPATCH_MODE)],
)
def test_a_replaced_mode_stack_length_keeps_modes_out(when, stack, mode):
    got = run(
        mode
        + f"""
torch._C.{stack} = lambda: 0
t = torch.arange(4, dtype=torch.float64)
with Spy():
    got = outcome(lambda: ext.sum_f64(t))
got["seen"] = seen
print(json.dumps(got))
""",
        when,
    )
    assert_kept_out(got)


_NO_OP_CONTEXT = """
class NoOp:
    def __init__(self, *a): pass
    def __enter__(self): return self
    def __exit__(self, *a): return False
"""


@pytest.mark.hostile
@pytest.mark.parametrize("when", WHEN)
def test_a_replaced_disable_torch_function_keeps_function_modes_out(when):
    got = run(
        _FUNCTION_MODE
        + _NO_OP_CONTEXT
        + """
torch._C.DisableTorchFunction = NoOp
t = torch.arange(4, dtype=torch.float64)
with Spy():
    got = outcome(lambda: ext.sum_f64(t))
got["seen"] = seen
print(json.dumps(got))
""",
        when,
    )
    assert_kept_out(got)


@pytest.mark.hostile
@pytest.mark.parametrize("when", WHEN)
@pytest.mark.parametrize(
    "replace",
    [
        "torch._C._DisableTorchDispatch = NoOp",
        "torch._C._DisableTorchDispatch.__enter__ = lambda self: None",
        "torch._C._DisableTorchDispatch.__init__ = lambda self: None",
        "torch._C._DisableTorchDispatch = torch._C._DisableFuncTorch",
        "torch._C._DisableTorchDispatch.__new__ = staticmethod(lambda cls, *a: NoOp())",
    ],
)
def test_a_replaced_disable_torch_dispatch_keeps_dispatch_modes_out(when, replace):
    got = run(
        _DISPATCH_MODE
        + _NO_OP_CONTEXT
        + f"""
{replace}
t = torch.arange(4, dtype=torch.float64)
with Spy():
    got = outcome(lambda: ext.sum_f64(t))
got["seen"] = seen
print(json.dumps(got))
""",
        when,
    )
    assert_kept_out(got)


@pytest.mark.hostile
@pytest.mark.parametrize("when", WHEN)
def test_a_replaced_increment_version_still_bumps_the_version(when):
    got = run(
        """
torch._C._increment_version = lambda tensors: None
t = torch.zeros(3, dtype=torch.float64)
before = t._version
got = outcome(lambda: ext.fill_f64(t, 2.0))
got["bumped"] = t._version > before
got["values"] = t.tolist()
print(json.dumps(got))
""",
        when,
    )
    if "refused" in got:
        assert "not PyTorch's own" in got["refused"], got
        assert got["values"] == [0.0, 0.0, 0.0], got
    else:
        assert got["bumped"], got
        assert got["values"] == [2.0, 2.0, 2.0], got


@pytest.mark.hostile
@pytest.mark.parametrize("when", WHEN)
def test_a_replaced_is_inference_mode_enabled_keeps_inference_tensors_unwritten(when):
    got = run(
        """
with torch.inference_mode():
    t = torch.zeros(3, dtype=torch.float64)
torch.is_inference_mode_enabled = lambda: True
got = outcome(lambda: ext.fill_f64(t, 2.0))
got["values"] = t.tolist()
print(json.dumps(got))
""",
        when,
    )
    assert "refused" in got, got
    assert got["values"] == [0.0, 0.0, 0.0], got


@pytest.mark.hostile
@pytest.mark.parametrize("when", WHEN)
def test_a_replaced_torch_tensor_keeps_subclass_overrides_out(when):
    # `torch.Tensor` named a subclass: its instances are still not PyTorch's
    # plain tensors, so dlcast's reads stay inside the disabled regions.
    got = run(
        """
seen = []
class Spy(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        seen.append(str(func))
        return super().__torch_function__(func, types, args, kwargs)
real = torch.Tensor
torch.Tensor = Spy
t = real.as_subclass(torch.arange(4, dtype=torch.float64), Spy)
seen.clear()
got = outcome(lambda: ext.sum_f64(t))
got["seen"] = seen
print(json.dumps(got))
""",
        when,
    )
    assert_kept_out(got)


@pytest.mark.hostile
@pytest.mark.parametrize("when", WHEN)
def test_a_replaced_getweakrefcount_is_never_called(when):
    # Only the limited API (the abi3 build) asks `_weakref` whether the
    # private alias has weak references; the function must be CPython's.
    got = run(
        """
import _weakref
real = _weakref.getweakrefcount
calls = []
def count(obj):
    calls.append(1)
    return real(obj)
_weakref.getweakrefcount = count
t = torch.arange(4, dtype=torch.float64)
w = torch.zeros(3, dtype=torch.float64)
got = outcome(lambda: [ext.sum_f64(t), ext.fill_f64(w, 2.0), w.tolist()])
got["calls"] = len(calls)
print(json.dumps(got))
""",
        when,
    )
    assert got["calls"] == 0, got
    if "refused" in got:
        assert "getweakrefcount is not CPython's own" in got["refused"], got
    else:
        assert got["value"] == [6.0, None, [2.0, 2.0, 2.0]], got


@pytest.mark.hostile
def test_a_static_types_dict_changed_through_gc_keeps_lazy_negation_refused():
    # `torch._C.TensorBase` is a static type, so `TensorBase.is_neg = f`
    # fails; but the real dict behind `TensorBase.__dict__` is one
    # `gc.get_referents` away, and dlcast takes its handles from that dict
    # the first time (later replacements change nothing: they are cached).
    got = run(
        """
import gc
real = gc.get_referents(torch._C.TensorBase.__dict__)[0]
real["is_neg"] = lambda self: False
x = torch.tensor([1.0, 2.0], dtype=torch.float64)._neg_view()
print(json.dumps(outcome(lambda: ext.sum_f64(x))))
""",
        "before_first_use",
    )
    assert "refused" in got or got.get("value") == -3.0, got


def test_pytorch_imported_after_another_pybind11_library_is_still_its_own():
    # pybind11's classes inherit `tp_new`/`tp_dealloc` from pybind11's base
    # type, made by the first pybind11 module loaded: here TensorFlow's,
    # not PyTorch's. PyTorch's dispatch guard is still PyTorch's own.
    r = run_py("""
        import tensorflow
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        import dlcast_testext as ext

        class Seen(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                raise AssertionError(f"the mode saw {func}")

        t = torch.arange(4.0, dtype=torch.float64)
        print(ext.sum_f64(t))
        with Seen():
            print(ext.sum_f64(t))
    """, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["6.0", "6.0"], r.stdout + r.stderr[-2000:]


_LAZY_OUTCOMES = """
z = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex128)
with torch.inference_mode():
    inf = torch.zeros(3, dtype=torch.float64)
cases = {
    "negative": lambda: ext.sum_f64(z.conj().imag),
    "conjugate": lambda: ext.sum_c128(z.conj()),
    "zero": lambda: ext.sum_f64(torch._efficientzerotensor(3, dtype=torch.float64)[1:]),
    "inference": lambda: ext.fill_f64(inf, 1.0),
    "plain": lambda: ext.sum_f64(torch.ones(3, dtype=torch.float64)),
    "written": lambda: ext.fill_f64(torch.zeros(3, dtype=torch.float64), 1.0),
}
got = {k: outcome(f) for k, f in cases.items()}
got["abi3"] = any(".abi3." in f for f in os.listdir(os.path.dirname(ext.__file__)))
print(json.dumps(got))
"""


def assert_lazy_outcomes(got, writes_refused_for=None):
    """Every lazy bit refused, plain reads and writes kept; with
    `writes_refused_for`, the writable cases are refused as a BufferError
    naming that attribute instead."""
    write = ("inference", "inference tensor")
    for case, what in (("negative", "negative bit"), ("conjugate", "conjugate bit"),
                       ("zero", "zero tensor"), write):
        if writes_refused_for and case == "inference":
            what = f"BufferError: fill_f64(): argument 'out': {writes_refused_for} is not PyTorch's own"
        assert what in got[case].get("refused", ""), (case, got)
    assert got["plain"] == {"value": 3.0}, got
    if writes_refused_for:
        assert writes_refused_for in got["written"].get("refused", ""), got
    else:
        assert got["written"] == {"value": None}, got


def test_the_lazy_bits_are_asked_of_pytorchs_methods_not_a_learnt_key_set():
    # Phase 1 learns no key-set layout from tensors Python code can choose
    # (they could teach it a size word): every lazy bit is asked of
    # PyTorch's own `is_neg()`, `is_conj()`, `_is_zerotensor()` and
    # `is_inference()`, and each is refused (the direct read only compares
    # the whole key set with a verified plain tensor's).
    got = run(_LAZY_OUTCOMES, "before_first_use")
    assert_lazy_outcomes(got)


@pytest.mark.hostile
@pytest.mark.parametrize(
    "doubt",
    [
        "torch._neg_view = lambda t: t.clone()",
        "torch._efficientzerotensor = torch.zeros",
        "torch.inference_mode = torch.no_grad",
        "import gc; gc.get_referents(torch._C.TensorBase.__dict__)[0]['_cdata'] = property(lambda s: 0)",
    ],
    ids=["neg_view", "zero_tensor", "inference_mode", "cdata_getter"],
)
def test_a_key_set_probe_in_doubt_falls_back_to_pytorchs_methods(doubt):
    # The tensors a key-set probe would use, or the `_cdata` getter,
    # replaced before first use: the methods are asked, and every lazy bit is
    # still refused. Without PyTorch's own `_cdata` getter, writable
    # parameters cannot tell a tensor swapped during the call (review of
    # #32): they refuse every tensor, naming the getter, while read-only
    # parameters, which never ask it, keep working.
    got = run(
        f"""
_real = (torch._neg_view, torch._efficientzerotensor, torch.inference_mode)
{doubt}
ext.sum_f64(torch.ones(3, dtype=torch.float64))
torch._neg_view, torch._efficientzerotensor, torch.inference_mode = _real
"""
        + _LAZY_OUTCOMES,
        "before_first_use",
    )
    cdata = "torch._C.TensorBase._cdata" if doubt.endswith("property(lambda s: 0)") else None
    assert_lazy_outcomes(got, writes_refused_for=cdata)


# A key-set probe's tensors came from `torch.ones`, `torch._neg_view` and
# `torch._efficientzerotensor` as Python code finds them at first use. Real
# tensors (so PyTorch's own answers are true), chosen so that one other
# `TensorImpl` word, the first inline size, carries the differences the
# probe looks for (sizes 9, 9+16, 9+32, 9+16+32, 9+64 and 1: bit 4 for the
# negative views, bit 5 for the conjugates, bit 6 for the zero tensor, bit 3
# missing in the inference tensor), while the key-set word fails the probe's
# test (the zero tensor is a meta tensor: more than one key differs).
_PROBE_TAUGHT_SIZES = """
_real = (torch.ones, torch._neg_view, torch._efficientzerotensor)
_ones, _neg, _zero = _real

def ones(*size, dtype=None, **kw):
    if dtype is torch.complex64:
        return _ones(9 + 32, 3, dtype=dtype)
    return _ones((1 if torch.is_inference_mode_enabled() else 9), 3)

def neg_view(t):
    if t.is_complex():
        return _neg(_ones(9 + 16 + 32, 3, dtype=torch.complex64).conj())
    return _neg(_ones(9 + 16, 3))

torch.ones = ones
torch._neg_view = neg_view
torch._efficientzerotensor = lambda *a, **k: _zero(9 + 64, 3, device="meta")
ext.sum_f64(_ones(3, dtype=torch.float64))
torch.ones, torch._neg_view, torch._efficientzerotensor = _real
"""


@pytest.mark.hostile
def test_a_key_set_probe_taught_by_chosen_tensors_does_not_read_sizes_as_keys():
    # Once (when phase 1 still probed a key-set layout) this taught it the
    # first inline size as the key set: a negative view summed as plain, a sliced zero
    # tensor dereferenced (segfault). Now every lazy bit is still refused.
    got = run(_PROBE_TAUGHT_SIZES + _LAZY_OUTCOMES, "before_first_use")
    assert_lazy_outcomes(got)


@pytest.mark.hostile
def test_a_replaced_cdata_getter_never_lets_a_swapped_tensor_be_written():
    """Hostile (review of #32): `TensorBase._cdata` replaced (through the
    garbage collector) before dlcast's first use leaves `cdata_def` unset,
    and `check_write` then skips the swap check silently (README: a failed
    check of PyTorch's own attributes refuses, `BufferError` naming the
    attribute). A later argument swaps the caller's tensor with one that
    then requires grad: the body writes that requires-grad leaf's memory."""
    got = run(
        """
import gc, numpy as np
_d = gc.get_referents(torch._C.TensorBase.__dict__)[0]
_real = _d["_cdata"]
_d["_cdata"] = property(lambda s: _real.__get__(s))
x = torch.zeros(3, dtype=torch.float64)
other = torch.ones(3, dtype=torch.float64)
class Exports:
    def __dlpack__(self, **kw):
        torch.utils.swap_tensors(x, other)
        other.requires_grad_(True)
        return np.ones(3).__dlpack__(**kw)
got = outcome(lambda: ext.fill_then_len(x, Exports(), 7.0))
got["other"] = other.detach().tolist()
print(json.dumps(got))
""",
        "before_first_use",
    )
    # Refused as the README says (BufferError naming the attribute), at the
    # first argument already: a writable parameter cannot work without the
    # getter, so the later argument's swap never runs and `other` keeps its
    # ones. Either way neither tensor was written.
    assert "BufferError" in got.get("refused", "") and "TensorBase._cdata" in got["refused"], got
    assert got["other"] in ([0.0, 0.0, 0.0], [1.0, 1.0, 1.0]), got
