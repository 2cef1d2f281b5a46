"""Every producer the issue names, every element type, zero-copy reads and
writes seen on both sides."""

import array
import os
import subprocess
import sys

import array_api_strict as xp
import jax
import jax.numpy as jnp
import ml_dtypes  # ships with JAX; gives NumPy a bfloat16 dtype
import numpy as np
import pytest
import torch

import dlcast_testext as ext

# (NumPy dtype, typed function, torch dtype)
DTYPES = [
    ("int8", ext.sum_i8, torch.int8),
    ("int16", ext.sum_i16, torch.int16),
    ("int32", ext.sum_i32, torch.int32),
    ("int64", ext.sum_i64, torch.int64),
    ("uint8", ext.sum_u8, torch.uint8),
    ("uint16", ext.sum_u16, torch.uint16),
    ("uint32", ext.sum_u32, torch.uint32),
    ("uint64", ext.sum_u64, torch.uint64),
    ("float16", ext.sum_f16, torch.float16),
    ("float32", ext.sum_f32, torch.float32),
    ("float64", ext.sum_f64, torch.float64),
]


def numpy_of(name, values):
    return np.asarray(values, dtype=name)


@pytest.mark.parametrize("name,fn,tdt", DTYPES, ids=[d[0] for d in DTYPES])
def test_typed_views_every_real_dtype(name, fn, tdt):
    vals = [1, 2, 3, 4, 5, 6]
    a = numpy_of(name, vals).reshape(2, 3)
    expected = float(sum(vals))
    assert fn(a) == expected
    assert fn(torch.tensor(vals, dtype=tdt).reshape(2, 3)) == expected
    assert fn(jnp.asarray(a)) == expected
    if name != "float16":  # the array API standard has no float16
        assert fn(xp.asarray(a)) == expected
    assert ext.describe(a)[2] == name
    assert ext.values(a) == a.ravel().tolist()
    # A dtype that does not convert (a different kind, down the ladder) is
    # refused with both names.
    other = "complex128" if name.startswith("float") else "float64"
    with pytest.raises(TypeError, match=rf"argument 'x': expected dtype {name}, got {other}"):
        fn(np.zeros(3, other))


def test_bool_views():
    a = np.array([True, False, True, True])
    assert ext.count_true(a) == 3
    assert ext.count_true(torch.tensor([True, False])) == 1
    assert ext.count_true(jnp.asarray(a)) == 3
    assert ext.values(a) == [True, False, True, True]
    assert ext.bool_slice_ok(a)


def test_bool_bytes_other_than_0_and_1_never_become_rust_bools():
    # A hostile producer sends bytes 0, 1, 2, 255 with dtype bool.
    c = ext.make_capsule(bytes([0, 1, 2, 255]), [4], [1], dtype=(6, 8, 1))
    assert ext.count_true(c) == 3
    c = ext.make_capsule(bytes([0, 1, 2, 255]), [4], [1], dtype=(6, 8, 1))
    assert not ext.bool_slice_ok(c)


def test_bfloat16_and_complex():
    t = torch.tensor([1.5, 2.5, -1.0], dtype=torch.bfloat16)
    assert ext.sum_bf16(t) == 3.0
    assert ext.describe(t)[2] == "bfloat16"
    j = jnp.asarray([1.5, 2.5], dtype=jnp.bfloat16)
    assert ext.sum_bf16(j) == 4.0
    c = np.array([1 + 2j, 3 - 1j], np.complex64)
    assert ext.sum_c64(c) == (4.0, 1.0)
    assert ext.sum_c128(c.astype(np.complex128)) == (4.0, 1.0)
    assert ext.sum_c64(torch.from_numpy(c)) == (4.0, 1.0)
    assert ext.values(c) == [1 + 2j, 3 - 1j]
    assert ml_dtypes.bfloat16 is not None


def test_numpy_is_zero_copy_both_ways():
    a = np.arange(6.0)
    assert ext.data_ptr(a) == a.__array_interface__["data"][0]
    assert ext.data_ptr(a[2:]) == a.__array_interface__["data"][0] + 16
    ext.fill_f64(a[::2], -1.0)
    assert a.tolist() == [-1, 1, -1, 3, -1, 5]


def test_torch_is_zero_copy_both_ways():
    t = torch.arange(6, dtype=torch.float32)
    assert ext.data_ptr(t) == t.data_ptr()
    ext.add_one_f32(t[1:4])
    assert t.tolist() == [0, 2, 3, 4, 4, 5]
    t64 = torch.zeros(2, 3, dtype=torch.float64)
    assert ext.double_slice_f64(t64)
    assert ext.set_f64(t64.T, [2, 1], 9.0)
    assert t64[1, 2].item() == 9.0


def test_jax_arrays_are_read_only():
    j = jnp.zeros(3)
    assert ext.describe(j)[4] is True
    with pytest.raises(TypeError, match="argument 'out': the array is read-only"):
        ext.fill_f64(j, 1.0)
    assert jnp.all(j == 0)


def test_jax_is_zero_copy():
    j = jnp.arange(8.0, dtype=jnp.float32)
    assert ext.data_ptr(j) == j.unsafe_buffer_pointer()
    assert ext.sum_f32(j) == 28.0
    assert ext.describe(j)[0] == [8]


def test_array_api_strict():
    a = xp.reshape(xp.arange(6, dtype=xp.float64), (2, 3))
    assert ext.values(a) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert ext.needs_c(a) == [2, 3]
    assert ext.values(xp.permute_dims(a, (1, 0))) == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]


def test_buffer_protocol_objects():
    assert ext.values(b"\x01\x02") == [1, 2]
    ba = bytearray(b"\x00\x00\x00")
    assert ext.zero_bytes(ba) == 3
    ba[:] = b"\x05\x06\x07"
    ext.zero_bytes(ba)
    assert ba == bytearray(3)
    arr = array.array("d", [1.0, 2.0, 3.0])
    assert ext.sum_f64(arr) == 6.0
    ext.fill_f64(arr, 4.0)
    assert arr.tolist() == [4.0, 4.0, 4.0]
    assert ext.sum_i32(array.array("i", [1, 2, 3])) == 6
    assert ext.sum_i64(array.array("q", [1, 2, 3])) == 6
    mv = memoryview(np.arange(12.0).reshape(3, 4)[::2, ::-1])
    assert ext.values(mv) == np.arange(12.0).reshape(3, 4)[::2, ::-1].ravel().tolist()
    assert ext.describe(mv)[1] == [8, -1]


def test_buffer_strides_not_multiple_of_itemsize_are_refused():
    # A structured dtype's field view has a byte stride (12) that is not a
    # multiple of the field's itemsize (8): refused, never divided.
    rec = np.zeros(4, dtype=[("a", "<f8"), ("b", "<i4")])
    mv = memoryview(rec["a"])
    assert mv.strides == (12,)
    with pytest.raises(BufferError, match="not a multiple of the item size"):
        ext.values(mv)


def test_unsupported_buffer_formats():
    with pytest.raises(BufferError, match="unsupported buffer format"):
        ext.values(memoryview(np.zeros(2, np.longdouble)))
    with pytest.raises(TypeError, match=r"values\(\): argument 'x': expected an array .* got str"):
        ext.values("not an array")
    with pytest.raises(TypeError, match="got NoneType"):
        ext.values(None)


def test_optional_views():
    assert ext.maybe_len() is None
    assert ext.maybe_len(None) is None
    assert ext.maybe_len(np.zeros((2, 3))) == 6
    a = np.zeros(2)
    assert ext.maybe_fill(a) is True
    assert a.tolist() == [7.0, 7.0]
    assert ext.maybe_fill(None) is False


def test_keyword_arguments_keep_python_names():
    pts = np.ones((2, 3), np.float32)
    assert ext.centroid(points=pts, weights=np.ones(2, np.float32)) == [1.0, 1.0, 1.0]


def test_jax_on_cpu_only():
    assert jax.devices()[0].platform == "cpu"


def test_functions_returning_nothing_return_none():
    a = np.zeros(3)
    assert ext.fill_f64(a, 1.0) is None  # -> PyResult<()>
    assert ext.copy_into(np.ones(3), a) is None
    assert ext.add_one_f32(np.zeros(2, np.float32)) is None


def test_torch_conjugate_and_negative_bits_are_refused():
    # PyTorch conjugates lazily: the memory of z.conj() holds z's values.
    # Reading it as is would give wrong numbers (its own __dlpack__ refuses).
    z = torch.tensor([1 + 2j, 3 + 4j], dtype=torch.complex64)
    for lazy, bit in ((z.conj(), "conjugate"), (z.conj().imag, "negative")):
        with pytest.raises(BufferError, match=rf"argument 'x': the tensor has its {bit} bit set"):
            ext.values(lazy)
    assert ext.sum_c64(z.conj().resolve_conj()) == (4.0, -6.0)
    assert ext.values(z.conj().imag.resolve_neg()) == [-2.0, -4.0]


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


def test_producer_errors_keep_one_line_and_the_cause():
    # PyTorch's refusal of a sparse tensor carries a C++ backtrace: the
    # message keeps its first line, the exception itself is the cause.
    s = torch.eye(2).to_sparse()
    with pytest.raises(BufferError) as info:
        ext.values(s)
    msg = str(info.value)
    assert msg.startswith("values(): argument 'x': the producer's ")
    assert "\n" not in msg
    assert info.value.__cause__ is not None


def test_a_tensor_changed_while_other_arguments_are_read_keeps_its_view():
    # PyTorch tensors are mutable containers: Python code run while a later
    # argument is prepared (here its __dlpack__) may swap the first tensor's
    # storage, which frees the memory a view of the tensor itself would be
    # made of. dlcast reads a private alias taken before (x.data), which
    # holds the old storage: the call sees the tensor as it was when its
    # argument was taken, and no freed memory (kinds 1 and 3 of the
    # soundness issue).
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
    # PyTorch has no read-only tensors: returning it there is refused.
    with pytest.raises(BufferError, match="read-only"):
        ext.transposed(w)
    # Without requires_grad the view stays writable (zero-copy both ways).
    d = w.detach()
    np.asarray(ext.identity(d))[0, 0] = 5.0
    assert d[0, 0] == 5.0


def test_negative_bit_is_refused_whatever_table_the_type_publishes():
    class NoExchange(torch.Tensor):
        __dlpack_c_exchange_api__ = None

    x = torch._neg_view(torch.ones(3)).as_subclass(NoExchange)
    # Read through PyTorch's own table all the same (a private alias).
    assert ext.import_path(torch.ones(2).as_subclass(NoExchange)) == "exchange_api"
    with pytest.raises(BufferError, match="negative bit set"):
        ext.sum_f32(x)


def test_a_refused_call_leaves_version_counters_alone():
    x = torch.ones(3, dtype=torch.float64)
    with pytest.raises(TypeError, match="share memory"):
        ext.add_one_into(x, x)
    assert x._version == 0
    ext.add_one_into(torch.zeros(3, dtype=torch.float64), x)
    assert x._version == 1


def test_interrupts_from_a_later_argument_propagate():
    class Interrupts:
        def __dlpack__(self, **kw):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ext.sum_f64_and_len(torch.ones(3, dtype=torch.float64), Interrupts())
