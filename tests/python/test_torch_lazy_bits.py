"""PyTorch tensors dlcast cannot read as plain memory are refused, whatever
their type, a mode or a table claims: conjugate and negative bits, zero
tensors, functional, batched, fake and meta tensors, subclasses with a
`__torch_dispatch__` of their own.
"""

import pytest
import torch
from torch.overrides import TorchFunctionMode

import dlcast_testext as ext
import dlcast_testext as t
from conftest import run_py


def test_torch_conjugate_and_negative_bits_are_refused():
    # PyTorch conjugates lazily: the memory of z.conj() holds z's values.
    # Reading it as is would give wrong numbers (its own __dlpack__ refuses).
    z = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex64)
    for lazy, bit in ((z.conj(), "conjugate"), (z.conj().imag, "negative")):
        with pytest.raises(BufferError, match=rf"argument 'x': the tensor has its {bit} bit set"):
            ext.values(lazy)
    assert ext.sum_c64(z.conj().resolve_conj()) == (4.0, -6.0)
    assert ext.values(z.conj().imag.resolve_neg()) == [-2.0, -4.0]


def test_tensor_subclasses_with_their_own_torch_dispatch_are_refused():
    # PyTorch runs a subclass's __torch_dispatch__ (Python code) even to
    # read its sizes ("sizes" policy), so neither its read nor the re-read
    # of the call's other tensors could be trusted: refused before the read.
    calls = []

    class Dispatching(torch.Tensor):
        @staticmethod
        def __new__(cls, data):
            r = torch.Tensor._make_subclass(cls, data, False, dispatch_sizes_strides_policy="sizes")
            r._elem = data
            return r

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            calls.append(func)
            args = [a._elem if isinstance(a, Dispatching) else a for a in args]
            return func(*args, **(kwargs or {}))

    with pytest.raises(BufferError, match="__torch_dispatch__"):
        ext.centroid(Dispatching(torch.ones(4, 3)), torch.ones(4))
    # Subclasses without their own __torch_dispatch__ are read as tensors.
    assert ext.centroid(torch.ones(4, 3).as_subclass(SubTensor), torch.ones(4)) == [1.0] * 3


class SubTensor(torch.Tensor):
    pass


def test_negative_bit_is_refused_whatever_table_the_type_publishes():
    class NoExchange(torch.Tensor):
        __dlpack_c_exchange_api__ = None

    x = torch._neg_view(torch.ones(3)).as_subclass(NoExchange)
    # Read through PyTorch's own table all the same (a private alias).
    assert ext.import_path(torch.ones(2).as_subclass(NoExchange)) == "exchange_api"
    with pytest.raises(BufferError, match="negative bit set"):
        ext.sum_f32(x)


@pytest.mark.hostile
def test_a_subclass_that_gains_torch_dispatch_later_is_refused():
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


# Formerly a hole: the negative / conjugate bits are asked through
# Python method calls (import/torch, torch_bit) that a __torch_function__ mode
# (or a subclass's __torch_function__) can answer: a lazily negated tensor
# is then read raw.

class _LieAboutBits(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("is_neg", "is_conj"):
            return False
        return func(*args, **(kwargs or {}))


@pytest.mark.hostile
def test_a_mode_cannot_hide_the_negative_bit():
    z = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex128)
    n = z.conj().imag  # negative bit set: values [-2, -4], memory [2, 4]
    with _LieAboutBits():
        try:
            got = ext.sum_f64(n)
        except BufferError:
            return  # refused: fine
    assert got == -6.0


@pytest.mark.hostile
def test_a_mode_cannot_hide_the_conjugate_bit():
    z = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex128).conj()
    with _LieAboutBits():
        try:
            got = ext.sum_c128(z)
        except BufferError:
            return
    assert got == (4.0, -6.0)


@pytest.mark.hostile
@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.empty(4, device="meta"),
        lambda: torch.eye(3).to_sparse(),
        lambda: torch.eye(3).to_sparse_csr(),
        lambda: torch.ones(3).to_mkldnn(),
    ],
    # (float8 tensors, once refused here, are element types: test_float8.py)
    ids=["meta", "sparse_coo", "sparse_csr", "mkldnn"],
)
def test_exotic_tensors_are_refused_cleanly(make):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = make()
    with pytest.raises((BufferError, TypeError)):
        ext.values(t)


# B. PyTorch inputs

@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_functional_and_batched_and_fake_and_meta_tensors_are_refused():
    x = torch.arange(4, dtype=torch.float64)
    f = torch._to_functional_tensor(x)
    for fn in (t.values, t.identity_numpy):
        with pytest.raises(BufferError):
            fn(f)
    with pytest.raises(BufferError):
        t.fill_f64(torch._to_functional_tensor(x.clone()), 2.0)
    with pytest.raises(BufferError):
        torch.vmap(lambda r: torch.tensor(t.values(r)))(x.reshape(2, 2))
    with pytest.raises(BufferError):
        torch.func.functionalize(lambda r: torch.tensor(t.values(r)))(x)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.ones(3, dtype=torch.float64)
        with pytest.raises(BufferError):
            t.values(fake)
    with pytest.raises(BufferError):
        t.values(fake)
    # The fake tensor's class reassigned: the Python key stays.
    fake.__class__ = torch.Tensor
    with pytest.raises(BufferError):
        t.values(fake)
    with pytest.raises(BufferError):
        t.values(torch.ones(3, dtype=torch.float64, device="meta"))


COMPLEX = [torch.complex32, torch.complex64, torch.complex128]


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("dtype", COMPLEX)
def test_lazy_bits_of_every_complex_dtype(dtype):
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=dtype)
    views = [z.conj(), z._neg_view(), z.conj()._neg_view(), z.conj()[1:]]
    if dtype != torch.complex32:
        views += [z.conj().imag, z.conj().real.unsqueeze(0).expand(2, 2)]
    for v in views:
        if not (v.is_neg() or v.is_conj()):
            continue
        for fn in (t.identity_numpy, t.identity_torch):
            with pytest.raises(BufferError, match="bit set"):
                fn(v)


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.float32, torch.float64, torch.int8, torch.int64, torch.uint8, torch.bool]
)
def test_negative_bit_of_every_real_dtype(dtype):
    v = torch.ones(3, dtype=dtype)
    torch._C._set_neg(v, True)
    for fn in (t.identity_numpy, t.identity_torch):
        with pytest.raises(BufferError, match="negative bit"):
            fn(v)
    # A real tensor cannot get the conjugate bit (PyTorch asserts).
    with pytest.raises(RuntimeError):
        torch._C._set_conj(torch.ones(2, dtype=dtype), True)


@pytest.mark.slow
@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_sliced_efficient_zero_tensor_is_refused_not_dereferenced():
    # Formerly a hole: `torch._efficientzerotensor` has no memory; its
    # data pointer is NULL plus the storage offset, so a slice of it has a
    # non-NULL bogus address (8 for `z[1:]`, anything for a larger offset)
    # that PyTorch's exchange API and `__dlpack__` hand out. dlcast read
    # (and, for a writable parameter, wrote) that address: a segfault, or
    # reads and writes of unrelated memory. Run in a child process so that
    # a regression fails this test instead of killing the session.
    r = run_py(
        """
        import torch, dlcast_testext as t
        z = torch._efficientzerotensor(1 << 20, dtype=torch.float64)
        outcomes = []
        for w in (z[1:], z[1000:1004], z.view(1024, 1024)[3], z[:0], z):
            for call in (lambda: t.values(w), lambda: t.identity_numpy(w),
                         lambda: t.fill_f64(w, 1.0)):
                try:
                    call()
                except (BufferError, TypeError) as e:
                    outcomes.append("zero tensor" in str(e) or "NULL" in str(e))
                else:
                    outcomes.append(w.numel() == 0)
        print(all(outcomes), len(outcomes))
        """
    )
    assert r.returncode == 0, f"the child crashed ({r.returncode}): {r.stderr[-1500:]}"
    assert r.stdout.split() == ["True", "15"], r.stdout + r.stderr[-1500:]
