"""Every framework's arrays are read zero-copy with every element type:
NumPy, PyTorch, JAX, array-api-strict, TensorFlow, CuPy (a stand-in), the
buffer protocol; results returned like an input; writability as each
framework defines it.
"""

import array
import re
import sys
import types

import array_api_strict as xp
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
import torch

import dlcast_testext as ext
import facts_table


# Every integer and float dtype NumPy has (the dtype table's rows,
# facts_table.py), as (name, the test extension's typed function
# `sum_<#[dtype] name>`, PyTorch's dtype).
DTYPES = [
    (name, getattr(ext, f"sum_{facts_table.RUST_NAMES[name]}"), getattr(torch, name))
    for name in facts_table.IN_NUMPY if facts_table.KINDS[name] in ("Int", "UInt", "Float")
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
    if "array_api" not in facts_table.ABSENT_FROM[name]:  # (no float16)
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


class LegacyAnswer:
    """A producer whose `__dlpack__` answers every request, a versioned one
    included, with a legacy capsule of `arr`'s memory (as producers older
    than DLPack 1.0 do); its class claims `module`."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, **kwargs):
        kwargs.pop("max_version", None)
        return self.arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def legacy_producer(module, arr):
    return type("Array", (LegacyAnswer,), {"__module__": module})(arr)


LEGACY_REFUSED = (r"argument 'out': the array was {} \(.dltensor.\), which cannot say whether "
                  r"it may be written.*pass the array itself.*versioned capsule")


@pytest.mark.hostile
@pytest.mark.parametrize("make,how", [
    # Raw capsules: no producer to ask, whatever memory they hold.
    (lambda x: torch.utils.dlpack.to_dlpack(torch.from_numpy(x)), "passed as a legacy DLPack capsule"),
    (lambda x: x.__dlpack__(), "passed as a legacy DLPack capsule"),
    (lambda x: torch.from_numpy(x).__dlpack__(), "passed as a legacy DLPack capsule"),
    # A producer no framework row knows, answering a versioned request.
    (lambda x: legacy_producer("mylib", x), "exported by its producer as a legacy DLPack capsule"),
    (lambda x: legacy_producer("numpyish", x), "exported by its producer as a legacy DLPack capsule"),
], ids=["torch.utils.dlpack.to_dlpack", "numpy legacy", "torch legacy", "unknown producer", "near name"])
def test_legacy_capsules_are_read_only_for_writable_parameters(make, how):
    """A legacy (unversioned) capsule cannot say whether it may be written
    (NumPy imports one read-only): a writable parameter refuses it, saying
    how it came and what to pass instead; a read-only one reads it."""
    x = np.arange(3.0)
    with pytest.raises(TypeError, match=LEGACY_REFUSED.format(how)):
        ext.fill_f64(make(x), 1.0)
    assert ext.values(make(x)) == [0.0, 1.0, 2.0]
    assert ext.describe(make(x))[4] is True
    # Returned, a view of it is read-only too: never handed on writable.
    v = ext.identity(make(x))
    assert v.read_only and not np.from_dlpack(v).flags.writeable
    torch.from_dlpack(v.__dlpack__()).fill_(5.0)  # a copy of its own
    assert x.tolist() == [0.0, 1.0, 2.0]
    # The fixes the message names: the array itself, or a versioned capsule.
    ext.fill_f64(x, 1.0)
    ext.fill_f64(x.__dlpack__(max_version=(1, 0)), 2.0)
    assert x.tolist() == [2.0] * 3


READ_ONLY_EITHER_WAY = r"argument 'x': the array (is read-only|was passed as a legacy DLPack capsule)"


@pytest.mark.hostile
def test_legacy_capsules_of_immutable_frameworks_stay_read_only():
    """JAX and MLX answer a versioned request with a legacy capsule, and
    TensorFlow exports one: their arrays are immutable, read-only whichever
    way they come (the array, or its capsule passed directly)."""
    import mlx.core as mx

    for arr in (jnp.zeros(3, jnp.float32), mx.zeros(3)):
        for given in (arr, arr.__dlpack__()):
            with pytest.raises(TypeError, match=READ_ONLY_EITHER_WAY):
                ext.add_one_f32(given)
            assert ext.describe(arr)[4] is True
    t = tf.zeros(3)
    for given in (t, tf.experimental.dlpack.to_dlpack(t)):
        with pytest.raises(TypeError, match=READ_ONLY_EITHER_WAY):
            ext.add_one_f32(given)
    assert t.numpy().tolist() == [0.0] * 3
    # A producer that claims an immutable framework's package is read-only
    # too (its claim can only take writes away).
    x = np.zeros(3, np.float32)
    with pytest.raises(TypeError, match="argument 'x': the array is read-only"):
        ext.add_one_f32(legacy_producer("jax", x))


@pytest.mark.hostile
# The packages of the table's `legacy_writable` frameworks, but PyTorch's:
# a class claiming `torch` takes the PyTorch path, which refuses it before
# (its Python dispatch key, a BufferError).
@pytest.mark.parametrize(
    "module", [facts_table.PACKAGES[o] for o in facts_table.LEGACY_WRITABLE if o != "torch"]
)
def test_legacy_capsules_of_classes_python_code_made_are_read_only(module):
    """NumPy (and array_api_strict, whose `__dlpack__` is NumPy's) refuses
    to export a read-only array through a legacy capsule; CuPy and
    PaddlePaddle have no read-only arrays: a legacy capsule from their own
    `__dlpack__` may be written (the `legacy_writable` column), but only
    where the array's type is a static type, made by C code, whose
    `__dlpack__` and package Python code cannot replace. A class Python
    code made that claims one of these packages is read-only: it could
    forward any memory (an immutable framework's, a read-only array's)."""
    x = np.zeros(3)
    with pytest.raises(TypeError, match=LEGACY_REFUSED.format(
            "exported by its producer as a legacy DLPack capsule")):
        ext.fill_f64(legacy_producer(module, x), 4.0)
    assert x.tolist() == [0.0] * 3


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
    if not ext.BUFFER_PROTOCOL:
        # Below abi3-py311 only bytes and bytearray are read in place
        # (test_abi3.py): other buffers are refused, saying so.
        with pytest.raises(BufferError, match="abi3-py311"):
            ext.fill_f64(arr, 4.0)
        return
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
    if not ext.BUFFER_PROTOCOL:
        with pytest.raises(BufferError, match="abi3-py311"):
            ext.values(mv)
        return
    # The untyped parameter reads only in place: its TypeError names the
    # strides, the buffer's refusal is the cause.
    with pytest.raises(TypeError, match=r"strides \(12,\) \(bytes\) are not whole elements of 8") as info:
        ext.values(mv)
    assert re.search("not a multiple of the item size", str(info.value.__cause__))


def test_unsupported_buffer_formats():
    refusal = "unsupported buffer format" if ext.BUFFER_PROTOCOL else "abi3-py311"
    with pytest.raises(BufferError, match=refusal):
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


def test_tensorflow_tensors_are_read():
    x = tf.constant([[1.0, 2.0], [3.0, 4.0]], dtype=tf.float64)
    assert ext.values(x) == [1.0, 2.0, 3.0, 4.0]
    assert ext.sum_f64(x) == 10.0
    # A capsule from tf.experimental.dlpack.to_dlpack, passed directly.
    assert ext.values(tf.experimental.dlpack.to_dlpack(tf.range(3, dtype=tf.int32))) == [0, 1, 2]


def test_tensorflow_objects_without_dlpack_go_through_to_dlpack(monkeypatch):
    # Older TensorFlow tensors have no __dlpack__; dlcast then calls
    # tf.experimental.dlpack.to_dlpack. Stand in such a tensor type.
    calls = []
    real = tf.constant([5.0, 6.0], dtype=tf.float64)

    def to_dlpack(t):
        calls.append(t)
        return real.__dlpack__()

    monkeypatch.setattr(tf.experimental.dlpack, "to_dlpack", to_dlpack)
    OldTensor = type("EagerTensor", (), {"__module__": "tensorflow.python.framework.ops"})
    old = OldTensor()
    assert ext.values(old) == [5.0, 6.0]
    assert calls == [old]


# Every dtype TensorFlow has (the dtype table's `absent_from` column) but
# the float8 types (test_float8.py).
IN_TENSORFLOW = [d for d in facts_table.DTYPE_NAMES
                 if "tensorflow" not in facts_table.ABSENT_FROM[d] and not d.startswith("float8_")]


@pytest.mark.parametrize("dtype", IN_TENSORFLOW)
def test_returns_tensorflow(dtype):
    out, _ = ext.arange_tensorflow(dtype, [2, 3])
    assert isinstance(out, tf.Tensor)
    assert out.shape == (2, 3)
    want = facts_table.arange_values(dtype, 6)
    assert np.array_equal(out.numpy().ravel(), np.array(want)), (dtype, out)


def test_returns_cupy_calls_cupy_from_dlpack(monkeypatch):
    seen = []

    def from_dlpack(obj):
        seen.append((type(obj).__module__, type(obj).__name__, obj.__dlpack_device__()))
        return np.from_dlpack(obj)

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(from_dlpack=from_dlpack))
    out, _ = ext.arange_cupy("float32", [4])
    assert seen == [("dlcast", "Array", (1, 0))]
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("make,cls", [
    (lambda: np.zeros((2, 3)), np.ndarray),
    (lambda: torch.zeros(2, 3), torch.Tensor),
    (lambda: jnp.zeros((2, 3)), type(jnp.zeros(1))),
    (lambda: xp.zeros((2, 3)), type(xp.zeros(1))),
    (lambda: tf.zeros((2, 3)), tf.Tensor),
    (lambda: memoryview(np.zeros((2, 3))), type(None)),
])
def test_returns_like_the_input(make, cls):
    if cls is type(None) and not ext.BUFFER_PROTOCOL:
        # Below abi3-py311 a memoryview is not read in place (test_abi3.py).
        with pytest.raises(BufferError, match="abi3-py311"):
            ext.ones_like(make())
        return
    out = ext.ones_like(make())
    if cls is type(None):
        # A buffer has no framework: the result stays a dlcast.Array.
        assert type(out).__name__ == "Array"
    else:
        assert isinstance(out, cls)
    assert np.asarray(out.numpy() if hasattr(out, "numpy") and not isinstance(out, np.ndarray)
                      else out).tolist() == [[1.0] * 3] * 2


def test_returns_like_an_optional_input():
    assert isinstance(ext.maybe_ones_like(torch.zeros(2)), torch.Tensor)
    assert type(ext.maybe_ones_like()).__name__ == "Array"


def _jax_behind_array_api_attribute(j):
    a = xp.asarray(np.zeros(3, np.float32))
    a._array = j  # an instance attribute any Python code may set
    return a, None


def _jax_behind_array_api_class(j):
    cls = type(xp.asarray(1.0))
    saved = cls.__dict__["__dlpack__"]
    cls.__dlpack__ = lambda self, **kw: j.__dlpack__()
    return xp.asarray(np.zeros(3, np.float32)), lambda: setattr(cls, "__dlpack__", saved)


def _jax_behind_a_claimed_module(j):
    return legacy_producer("numpy", j), None


@pytest.mark.hostile
@pytest.mark.parametrize("make", [
    _jax_behind_array_api_attribute,
    _jax_behind_array_api_class,
    _jax_behind_a_claimed_module,
], ids=["array_api _array replaced", "array_api __dlpack__ replaced", "__module__ claimed"])
def test_immutable_memory_behind_a_legacy_capsule_is_never_written(make):
    """Hostile (review of #32): whether a legacy capsule may be written
    comes from the `legacy_writable` row of `Framework::of(obj)`, which is
    the type's `__module__` string; what the object's `__dlpack__` then
    hands out is decided by Python code (array_api_strict's `__dlpack__`
    forwards to `self._array`, an instance attribute; the class attribute
    itself can be replaced; any class can claim a module). Any of them
    hands a JAX array's legacy capsule to a writable parameter, which
    writes immutable JAX memory."""
    j = jnp.zeros(3, jnp.float32)
    arr, undo = make(j)
    try:
        with pytest.raises(TypeError, match="argument 'x'.*(read-only|legacy)"):
            ext.add_one_f32(arr)
    finally:
        if undo:
            undo()
    assert np.asarray(j).tolist() == [0.0, 0.0, 0.0]
