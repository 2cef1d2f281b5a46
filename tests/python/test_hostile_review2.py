"""Second adversarial review of dlcast's soundness promise (helper-e).

Each test is labelled:
- FINDING: an attack that breaks the promise today; the test asserts the
  sound behaviour, so it FAILS until the bug is fixed.
- HELD: an attack that was tried and that dlcast withstands (passes).

Crashing reproducers run in a subprocess.

The common root of findings 1-3: `TensorBase.data.__get__(x)` (the private
alias, torch.rs `prepare`) is `variable_data()` -> `shallow_copy_and_detach`,
which PyTorch hands to Python (`aten.detach`) whenever a
`TorchDispatchMode` is active, or the tensor has the Python dispatch key.
`DisableTorchFunction` does not stop either, and dlcast's
`__torch_dispatch__` refusal looks at the *class* attribute, which a
descriptor can hide while PyTorch (instance lookup) still sets the key.
"""

import gc
import textwrap

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import dlcast_testext as ext

from conftest import run_py  # noqa: E402


# ---------------------------------------------------------------------------
# FINDING 1 (high): Python code under a live `&mut [T]` when a PyTorch view
# drops inside a body. `RawTensor::drop` (import/mod.rs) defers only
# capsule/buffer owners; `Owner::Exchange` (the alias) is dropped at once on
# the belief that "dropping the alias runs no Python code". A dispatch mode
# chooses the alias (its `aten.detach` result) and can hang a finalizer in
# its `__dict__`; the alias's refcount is 1, so the privacy check passes.


def test_finding1_dispatch_mode_alias_finalizer_runs_under_live_mut_slice():
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


# ---------------------------------------------------------------------------
# FINDING 2 (critical): out-of-bounds read/write of a PyTorch storage, and
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


@pytest.mark.parametrize(
    "call", ["fill_f64(h, 1.0)", "sum_around_call(h, lambda: None)"]
)
def test_finding2_hidden_python_dispatch_describes_memory_past_the_storage(call):
    r = run_py(_HIDDEN_DISPATCH.replace("{call}", call))
    assert r.returncode == 0, f"crashed ({r.returncode}): {r.stderr[-800:]}"
    assert "refused" in r.stdout, r.stdout + r.stderr[-800:]


# ---------------------------------------------------------------------------
# FINDING 3 (low, values only; the first review's finding 5 reopened):
# Python code inside the DisableTorchFunction region (the dispatch mode's
# detach, run by `x.data`) re-enables torch function, and a
# __torch_function__ mode then answers is_neg()/is_conj() for the alias.


def test_finding3_mode_reenables_torch_function_and_hides_the_negative_bit():
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


# ---------------------------------------------------------------------------
# FINDING 4 (medium; the first review's finding 3 reopened): the
# exchange-table cache (exchange.rs `type_info`) trusts the class's version
# tag, but `type(x).__dlpack_c_exchange_api__` may come from the metaclass
# (a property, or a metaclass attribute whose change bumps only the
# metaclass's tag). The class's tag never changes: a stale table is used,
# and once freed, read (FREE=True today: the freed table's slots read as
# NULL from the zeroed junk, so the call fails with "expected an array").

_META_TABLE = """
import ctypes, gc
import numpy as np
from conftest import ApiC, FROM_OBJ, owning_export
import dlcast_testext as ext
new = ctypes.pythonapi.PyCapsule_New
new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
def make_table(values):
    data = np.array(values, dtype=np.float64)
    sh = (ctypes.c_int64 * 1)(len(values)); st = (ctypes.c_int64 * 1)(1)
    def fill(t):
        t.data = data.ctypes.data; t.device_type = 1; t.device_id = 0; t.ndim = 1
        t.code, t.bits, t.lanes = 2, 64, 1; t.shape = sh; t.strides = st; t.byte_offset = 0
    def dl(obj, out):
        fill(out.contents); return 0
    api = ApiC(); api.header.major, api.header.minor = 1, 3
    api.managed_from_obj = owning_export(fill); api.dltensor_from_obj = FROM_OBJ(dl)
    return new(ctypes.addressof(api), b"dlpack_exchange_api", None), [api, data, sh, st, fill, dl]
class Meta(type):
    pass
class T(metaclass=Meta):
    pass
Meta.__dlpack_c_exchange_api__, keepA = make_table([1.0, 2.0])
assert ext.values(T()) == [1.0, 2.0]
Meta.__dlpack_c_exchange_api__, keepB = make_table([7.0, 8.0, 9.0])
if FREE:
    del keepA
    gc.collect()
    junk = [ctypes.create_string_buffer(256) for _ in range(2000)]
got = ext.values(T())
assert got == [7.0, 8.0, 9.0], got
print("ok")
"""


@pytest.mark.parametrize("free", [False, True])
def test_finding4_metaclass_exchange_table_bypasses_the_version_tag(free):
    r = run_py(f"FREE = {free}\n" + textwrap.dedent(_META_TABLE))
    assert r.returncode == 0 and "ok" in r.stdout, (
        f"rc={r.returncode}\n{r.stdout}\n{r.stderr[-800:]}"
    )


# ---------------------------------------------------------------------------
# HELD: attacks tried that dlcast withstands.


def test_held_dispatch_modes_never_see_the_alias():
    # After the fix of findings 1-3, dlcast's PyTorch calls run with
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


def test_held_dispatch_mode_returning_another_tensor_is_read_as_that_tensor():
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


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.empty(4, device="meta"),
        lambda: torch.eye(3).to_sparse(),
        lambda: torch.eye(3).to_sparse_csr(),
        lambda: torch.ones(3).to_mkldnn(),
        lambda: torch.ones(3).to(torch.float8_e4m3fn),
    ],
    ids=["meta", "sparse_coo", "sparse_csr", "mkldnn", "float8"],
)
def test_held_exotic_tensors_are_refused_cleanly(make):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = make()
    with pytest.raises((BufferError, TypeError)):
        ext.values(t)


def test_held_deferred_deleter_calling_back_into_dlcast():
    # A capsule whose deleter runs Python (NumPy array over a Holder with
    # __del__) that calls dlcast again, writing the body's own argument:
    # the release comes after the body, with its borrows gone.
    b = np.zeros(4)
    seen = []

    class Holder:
        def __init__(self):
            self.keep = np.arange(3.0)
            self.__array_interface__ = self.keep.__array_interface__

        def __del__(self):
            ext.fill_f64(b, 7.0)
            seen.append(ext.live_borrows())

    a = np.asarray(Holder())
    cap = a.__dlpack__()
    del a
    gc.collect()
    assert ext.drop_a_then_sum_b(cap, b) == 4.0
    assert seen == [0]
    assert (b == 7.0).all()


def test_held_nested_bodies_release_every_capsule_once():
    before = ext.producer_counts()
    b = np.zeros(3)

    def cb():
        for _ in range(50):
            c = ext.make_capsule(np.arange(4.0).tobytes(), [4])
            ext.drop_a_then_sum_b(c, np.zeros(2))

    def boom():
        cb()
        raise RuntimeError("boom")

    for _ in range(20):
        ext.sum_around_call(b, cb)
        with pytest.raises(RuntimeError, match="boom"):
            ext.sum_around_call(b, boom)
    gc.collect()
    after = ext.producer_counts()
    assert after[0] - before[0] == 2000
    assert after[1] - before[1] == 2000  # every deleter ran, once
    assert ext.live_borrows() == 0


def test_held_exported_writable_view_then_dlcast_write_is_refused():
    x = np.zeros(4, dtype=np.float32)
    y = ext.identity_mut(x)  # writable NumPy view of x; its borrow ended at export
    x64 = x.view(np.float64)  # the same bytes, another dtype
    with pytest.raises(BufferError, match="in use by another call"):
        ext.hold_ref_and_call(x64, lambda: ext.add_one_f32(y))
    assert ext.live_borrows() == 0
