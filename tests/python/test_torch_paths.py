"""PyTorch arguments with and without the disabled regions (the runtime's
torch module): on every path, the values are read right, each lazy bit and
the Python dispatch key are refused, writable checks hold and no mode sees
dlcast's calls.
"""

import contextlib

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import dlcast_testext as ext


SUB_SEEN = []


class Sub(torch.Tensor):
    """A subclass (not exactly `torch.Tensor`) whose `__torch_function__`
    records what it is asked."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        SUB_SEEN.append(func)
        return super().__torch_function__(func, types, args, kwargs)


class SeenFunction(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


class SeenDispatch(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def patched_torch_function(seen):
    """`torch.Tensor.__torch_function__` replaced by a recording one (PyTorch
    ignores it for exact tensors; dlcast must stay right either way)."""
    original = torch.Tensor.__dict__["__torch_function__"]

    def spy(cls, func, types, args=(), kwargs=None):
        seen.append(func)
        return original.__func__(cls, func, types, args, kwargs)

    torch.Tensor.__torch_function__ = classmethod(spy)
    try:
        yield
    finally:
        torch.Tensor.__torch_function__ = original


# Each way in: (make the argument from a plain tensor, context to call in).
WAYS = ["plain", "subclass", "function_mode", "dispatch_mode", "both_modes", "patched"]


@contextlib.contextmanager
def way(name, seen):
    if name == "function_mode":
        with SeenFunction() as m:
            yield
        seen.extend(m.seen)
    elif name == "dispatch_mode":
        with SeenDispatch() as m:
            yield
        seen.extend(m.seen)
    elif name == "both_modes":
        with SeenFunction() as f, SeenDispatch() as d:
            yield
        seen.extend(f.seen + d.seen)
    elif name == "subclass":
        SUB_SEEN.clear()
        yield
        seen.extend(SUB_SEEN)
    elif name == "patched":
        with patched_torch_function(seen):
            yield
    else:
        yield


def arg(name, t):
    return t.as_subclass(Sub) if name == "subclass" else t


@pytest.mark.parametrize("name", WAYS)
def test_reads_the_values_and_no_mode_sees_the_calls(name):
    x = arg(name, torch.arange(4, dtype=torch.float64) + 1.5)
    seen = []
    with way(name, seen):
        got = ext.first_f64(x), ext.values(x)
    assert got == (1.5, [1.5, 2.5, 3.5, 4.5])
    assert seen == []


def _lazy():
    z = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex64)
    return [
        ("negative", lambda: torch.arange(3, dtype=torch.float64)._neg_view(), ext.values),
        ("negative", lambda: z.conj().imag, ext.values),
        ("conjugate", lambda: z.conj(), ext.sum_c64),
        ("negative and conjugate", lambda: z.conj()._neg_view(), ext.sum_c64),
    ]


@pytest.mark.parametrize("name", WAYS)
@pytest.mark.parametrize("case", range(4))
def test_each_lazy_bit_is_refused_on_every_path(name, case):
    bit, make, fn = _lazy()[case]
    t = make()
    # The tensor really has the bit(s) PyTorch's own methods report.
    assert (t.is_neg(), t.is_conj()) == ("negative" in bit, "conjugate" in bit)
    x = arg(name, t)
    seen = []
    with way(name, seen):
        with pytest.raises(BufferError, match=rf"argument 'x': the tensor has its {bit} bit set"):
            fn(x)
    assert seen == []


def test_lazy_bits_of_an_alias_made_by_x_data_are_the_tensors():
    # dlcast reads the bits of its alias `x.data`: PyTorch's shallow copy
    # keeps them, so the caller's tensor is refused for its own bits.
    z = torch.tensor([1 + 2j], dtype=torch.complex128)
    for t in (z.conj(), z.conj().imag, z.conj()._neg_view(), torch.ones(2)):
        assert (t.data.is_neg(), t.data.is_conj()) == (t.is_neg(), t.is_conj())


@pytest.mark.parametrize("name", WAYS)
def test_python_dispatch_key_is_refused_on_every_path(name):
    class Disp(torch.Tensor):
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise AssertionError("dlcast ran the tensor's __torch_dispatch__")

    p = torch.Tensor._make_subclass(Disp, torch.arange(3, dtype=torch.float64))
    # Exactly a torch.Tensor by type, Python dispatch key still set.
    p.__class__ = torch.Tensor if name != "subclass" else Sub
    assert type(p) in (torch.Tensor, Sub)
    seen = []
    with way(name, seen):
        with pytest.raises(BufferError, match=r"__torch_dispatch__ \(PyTorch's Python dispatch key is set\)"):
            ext.first_f64(p)
    assert seen == []


@pytest.mark.parametrize("name", WAYS)
def test_writable_guards_on_every_path(name):
    seen = []
    # requires grad: refused.
    g = arg(name, torch.zeros(3, dtype=torch.float64, requires_grad=True))
    with way(name, seen):
        with pytest.raises(TypeError, match=r"argument 'out': the tensor requires grad"):
            ext.fill_f64(g, 1.0)
    # An inference tensor outside inference mode: refused.
    with torch.inference_mode():
        inf = torch.zeros(3, dtype=torch.float64)
    assert inf.is_inference()
    with way(name, seen):
        with pytest.raises(TypeError, match=r"argument 'out': the tensor is an inference tensor"):
            ext.fill_f64(arg(name, inf), 1.0)
    assert inf.tolist() == [0.0, 0.0, 0.0]
    # ... and written inside it (no version to bump).
    with torch.inference_mode():
        with way(name, seen):
            ext.fill_f64(arg(name, inf), 2.0)
    assert inf.tolist() == [2.0, 2.0, 2.0]
    # A tensor made under no_grad is an ordinary tensor: written, bumped.
    with torch.no_grad():
        t = torch.zeros(3, dtype=torch.float64)
    assert not t.is_inference()
    x = arg(name, t)
    before = x._version
    with way(name, seen):
        ext.fill_f64(x, 3.0)
    assert t.tolist() == [3.0, 3.0, 3.0]
    assert x._version == before + 1
    assert seen == []


def test_a_mode_entered_by_the_argument_itself_is_honoured():
    # A mode on the stack when the call starts takes the regions: a mode
    # that would lie about the bits or hand out another tensor for `x.data`
    # is never asked.
    class Liar(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.Tensor.is_neg, torch.Tensor.is_conj):
                return False
            if getattr(func, "__name__", "") == "__get__":
                return torch.full((2,), 7.0, dtype=torch.float64)
            return func(*args, **(kwargs or {}))

    x = torch.arange(3, dtype=torch.float64)
    n = torch.arange(3, dtype=torch.float64)._neg_view()
    with Liar():
        assert ext.values(x) == [0.0, 1.0, 2.0]
        with pytest.raises(BufferError, match="negative bit set"):
            ext.values(n)


def test_parameter_takes_the_regions_and_reads_right():
    p = torch.nn.Parameter(torch.arange(3, dtype=torch.float64), requires_grad=False)
    assert ext.values(p) == [0.0, 1.0, 2.0]
    q = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="requires grad"):
        ext.fill_f64(q, 1.0)


def test_pytorch_ignores_a_patched_tensor_torch_function_for_exact_tensors():
    # The premise of skipping the regions for an exact torch.Tensor whatever
    # `torch.Tensor.__torch_function__` is: PyTorch's C attributes do not
    # consult it for exact tensors, only for subclass instances.
    class Plain(torch.Tensor):
        pass

    seen = []
    x = torch.ones(2, dtype=torch.float64)
    with patched_torch_function(seen):
        x.data, x.requires_grad, x.is_inference(), x.is_neg()
        assert ext.values(x) == [1.0, 1.0]
    assert seen == []
    with patched_torch_function(seen):
        x.as_subclass(Plain).is_neg()
    assert seen


def _python_key_tensors():
    """Tensors with PyTorch's Python dispatch key, made every way PyTorch
    offers, and plain ones."""

    class Disp(torch.Tensor):
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise AssertionError("ran __torch_dispatch__")

    base = torch.arange(3, dtype=torch.float64)
    sub = torch.Tensor._make_subclass(Disp, base)
    wrapper = torch.Tensor._make_wrapper_subclass(Disp, (3,), dtype=torch.float64)
    moved = torch.Tensor._make_subclass(Disp, base.clone())
    moved.__class__ = torch.Tensor
    return [(sub, True), (wrapper, True), (moved, True), (base, False), (base.as_subclass(Sub), False)]


def test_python_dispatch_getter_is_the_python_keys_bit():
    # dlcast reads the Python dispatch key through `TensorBase._python_dispatch`
    # (`is_python_dispatch()`, which tests Python and PythonTLSSnapshot
    # together): for every tensor PyTorch makes, the same as the Python bit
    # of the whole key set.
    python = torch._C.DispatchKeySet(torch._C.DispatchKey.Python).raw_repr()
    get = torch._C.TensorBase.__dict__["_python_dispatch"].__get__
    for t, expected in _python_key_tensors():
        bit = torch._C._dispatch_keys(t).raw_repr() & python != 0
        assert get(t) is bit is expected


@pytest.mark.parametrize("kind", ["function", "dispatch"])
@pytest.mark.parametrize("case", range(4))
def test_a_mode_entered_by_a_finalizer_while_the_alias_is_made_is_never_asked(case, kind):
    # The fast path asks for the lazy bits of the alias after making it; the
    # alias's allocation can start a collection, whose finalizer can enter a
    # mode that would lie about the bits (and see the alias). dlcast asks
    # for the function modes again before asking the alias (`is_neg()` and
    # `is_conj()` dispatch no operator, so a dispatch mode never sees them).
    import gc

    bit, make, fn = _lazy()[case]
    t = make()
    seen = []

    class Liar(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            if func in (torch.Tensor.is_neg, torch.Tensor.is_conj):
                return False
            return func(*args, **(kwargs or {}))

    class DispatchLiar(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    entered = []

    class Trap:
        def __del__(self):
            m = Liar() if kind == "function" else DispatchLiar()
            m.__enter__()
            entered.append(m)

    fn(make().resolve_conj().resolve_neg())  # dlcast's first-call set-up, done
    threshold = gc.get_threshold()
    gc.collect()
    gc.disable()
    try:
        trap = Trap()
        trap.cycle = trap
        del trap
        err = None
        gc.set_threshold(1)
        gc.enable()
        # The first object the collector tracks that is allocated from here
        # is the alias (dlcast allocates no other before it).
        try:
            fn(t)
        except BufferError as e:
            err = e
    finally:
        gc.set_threshold(*threshold)
        gc.enable()
        for m in reversed(entered):
            m.__exit__(None, None, None)
    # The trap went off during the call, and the mode saw nothing of dlcast's.
    assert len(entered) == 1
    assert seen == []
    assert err is not None and f"argument 'x': the tensor has its {bit} bit set" in str(err)
