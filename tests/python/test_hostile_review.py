"""Adversarial review of dlcast's soundness promise (helper-b).

Each test is labelled:
- FINDING: an attack that breaks the promise today; the test asserts the
  sound behaviour, so it FAILS until the bug is fixed.
- HELD: an attack that was tried and that dlcast withstands (passes).

Crashing reproducers run in a subprocess.
"""

import gc

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import dlcast_testext as ext

from conftest import run_py  # noqa: E402


# ---------------------------------------------------------------------------
# FINDING 1: the borrow registry's overlap test swaps the two itemsizes
# (borrow.rs, may_overlap): views of different dtypes over the same bytes
# are called disjoint, so a `&mut [f64]` and a `&[u8]` coexist.


def test_finding1_registry_mixed_itemsize_same_call_single_elements():
    y = np.zeros(2)
    # out = y[0] (bytes 0..8, writable), other = byte 3 of y[0]
    with pytest.raises(TypeError, match="share memory"):
        ext.fill_then_len(y[:1], y.view(np.uint8)[3:4], 1.0)


def test_finding1_registry_mixed_itemsize_same_call_strided():
    x = np.zeros(8)
    # out = x[::2] (elements at bytes 0, 16, 32, 48), other = bytes 3, 19, 35, 51
    with pytest.raises(TypeError, match="share memory"):
        ext.fill_then_len(x[::2], x.view(np.uint8)[3::16], 1.0)


def test_finding1_registry_mixed_itemsize_nested_call():
    x = np.zeros(1)
    seen = []

    def cb():
        # A read of byte 3 of the element the outer body holds as &mut f64.
        seen.append(ext.sum_u8(x.view(np.uint8)[3:4]))

    with pytest.raises(BufferError, match="in use by another call"):
        ext.hold_mut_and_call(x, cb)
    assert seen == []


def test_held_registry_same_itemsize_interleaved_and_overlapping():
    x = np.zeros(8)
    # HELD: disjoint interleavings are allowed, real overlaps refused.
    assert ext.fill_then_len(x[::2], x[1::2], 1.0) == 4
    with pytest.raises(TypeError, match="share memory"):
        ext.fill_then_len(x[::2], x[2::4], 1.0)
    with pytest.raises(TypeError, match="share memory"):
        ext.fill_then_len(x[:1], x.view(np.uint8)[:16], 1.0)


def test_held_registry_aliases_through_other_producers():
    # HELD: the same memory through torch.from_numpy, a memoryview and a
    # capsule of NumPy's is seen by the registry.
    x = np.zeros(4)
    for other in (torch.from_numpy(x), memoryview(x), x.__dlpack__(), x[::-1]):
        with pytest.raises(TypeError, match="share memory"):
            ext.fill_then_len(x, other, 1.0)

    def cb():
        ext.fill_f64(torch.from_numpy(x), 7.0)

    with pytest.raises(BufferError, match="in use by another call"):
        ext.hold_ref_and_call(x, cb)


# ---------------------------------------------------------------------------
# FINDING 2: dropping a view inside a body runs the producer's deleter,
# which can run arbitrary Python code (here NumPy's own deleter freeing an
# array whose base has a __del__), while the body holds another view's
# `&mut [f64]`: Python writes under a live Rust `&mut`.


def test_finding2_view_drop_runs_python_under_a_live_mut_slice():
    b = np.zeros(4)

    class Holder:
        def __init__(self):
            self.keep = np.arange(3.0)
            self.__array_interface__ = self.keep.__array_interface__

        def __del__(self):
            b[:] = 5.0  # an ordinary NumPy write, from a finalizer

    a = np.asarray(Holder())
    cap = a.__dlpack__()
    del a
    gc.collect()
    # The body fills b with 1.0 through &mut [f64], drops the view of `cap`,
    # and sums the same slice: 4.0 unless Python wrote under the &mut.
    assert ext.drop_a_then_sum_b(cap, b) == 4.0


# ---------------------------------------------------------------------------
# FINDING 3: the exchange-API cache (exchange.rs, type_info) keeps a type's
# table pointer forever; replacing the type's `__dlpack_c_exchange_api__`
# is ignored (stale table read), and a replaced table that is freed is
# then called (use after free).

_SWAP_TABLE = """
import ctypes, gc, sys
import numpy as np
from conftest import ApiC, FROM_OBJ, owning_export
import dlcast_testext as ext
new = ctypes.pythonapi.PyCapsule_New
new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
NAME = b"dlpack_exchange_api"
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
    return new(ctypes.addressof(api), NAME, None), [api, data, sh, st, fill, dl]
capA, keepA = make_table([1.0, 2.0])
T = type("Swapped", (), {"__dlpack_c_exchange_api__": capA})
assert ext.values(T()) == [1.0, 2.0]
capB, keepB = make_table([7.0, 8.0, 9.0])
T.__dlpack_c_exchange_api__ = capB
if FREE:
    del capA, keepA
    gc.collect()
    junk = [ctypes.create_string_buffer(256) for _ in range(2000)]
got = ext.values(T())
assert got == [7.0, 8.0, 9.0], got
print("ok")
"""


def test_finding3_replaced_exchange_table_is_ignored():
    proc = run_py("FREE = False\n" + _SWAP_TABLE)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_finding3_replaced_and_freed_exchange_table_is_called():
    proc = run_py("FREE = True\n" + _SWAP_TABLE)
    assert proc.returncode == 0, f"rc={proc.returncode} {proc.stderr[-2000:]}"


# ---------------------------------------------------------------------------
# FINDING 4 (residual broader than documented): memory moved or freed by
# ordinary, flag-free APIs while a body holds a view. torch.rs promises a
# PyTorch view "stays valid whatever Python code does to the caller's
# tensor during the call ... with one exception: resizing the storage";
# `share_memory_()` (also run implicitly by torch.multiprocessing when a
# tensor is sent to another process) swaps the storage's data pointer and
# frees the old memory. NumPy's `__setstate__` frees an array's data with
# no refcheck at all (the README names only `resize(refcheck=False)`).


def test_finding4_is_documented_as_a_residual():
    # Neither can be prevented by holding references (PyTorch and NumPy free
    # the memory under every view of it, their own included): the README's
    # safety section names both, next to resize(refcheck=False).
    import pathlib

    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    safety = readme[readme.index("## Safety"):readme.index("## Performance")]
    assert "share_memory_()" in safety and "__setstate__" in safety


# ---------------------------------------------------------------------------
# FINDING 5 (wrong values): the negative / conjugate bits are asked through
# Python method calls (torch.rs, torch_bit) that a __torch_function__ mode
# (or a subclass's __torch_function__) can answer: a lazily negated tensor
# is then read raw.


class _LieAboutBits(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("is_neg", "is_conj"):
            return False
        return func(*args, **(kwargs or {}))


def test_finding5_mode_hides_the_negative_bit():
    z = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex128)
    n = z.conj().imag  # negative bit set: values [-2, -4], memory [2, 4]
    with _LieAboutBits():
        try:
            got = ext.sum_f64(n)
        except BufferError:
            return  # refused: fine
    assert got == -6.0


def test_finding5_mode_hides_the_conjugate_bit():
    z = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex128).conj()
    with _LieAboutBits():
        try:
            got = ext.sum_c128(z)
        except BufferError:
            return
    assert got == (4.0, -6.0)


# ---------------------------------------------------------------------------
# HELD: PyTorch alias privacy.


def test_held_mode_never_sees_the_alias():
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


def test_held_mode_setting_the_neg_bit_on_the_alias_after_the_check():
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


def test_held_later_argument_swaps_and_resizes_an_earlier_tensor():
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


def test_held_callback_swapping_the_tensor_during_the_body():
    x = torch.ones(1 << 12, dtype=torch.float64)

    def cb():
        x.set_(torch.zeros(1, dtype=torch.float64))
        gc.collect()
        global _junk
        _junk = [torch.full((1 << 12,), 5.0, dtype=torch.float64) for _ in range(20)]

    before, after = ext.hold_ref_and_call(x, cb)
    assert before == after == float(1 << 12)


def test_held_weakref_mode_never_sees_the_alias():
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


def test_held_subclass_data_property_returning_a_shared_tensor():
    shared = torch.ones(3, dtype=torch.float64)

    class Sub(torch.Tensor):
        @property
        def data(self):
            return shared  # a tensor the caller keeps: not private

    # TensorBase's own `data` getter is used, not the subclass's property:
    # the tensor's own values are read.
    s = torch.zeros(3, dtype=torch.float64).as_subclass(Sub)
    assert ext.sum_f64(s) == 0.0


def test_held_dtype_generic_peek_then_dtype_change_in_a_later_argument():
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
