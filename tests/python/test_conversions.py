"""Implicit conversion of read-only arguments: which casts happen (NumPy's
same-kind rule), in which framework, where the temporary lives, and that a
conversion's Python code can neither leave a borrow behind nor make the body
read memory it did not check.
"""

import array
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import dlcast_testext as ext
import dlcast_testext as t
import facts_table
from conftest import capsule, deleters_balanced, run_py


# Every dtype NumPy has that dlcast reads (the dtype table's rows,
# facts_table.py), with a typed function for it: the test extension's
# `sum_<#[dtype] name>`, `bool`'s `count_true`.
TYPED = [
    (name, ext.count_true if name == "bool" else getattr(ext, f"sum_{facts_table.RUST_NAMES[name]}"))
    for name in facts_table.IN_NUMPY
]


@pytest.mark.parametrize("source", [d for d, _ in TYPED])
def test_casts_follow_numpy_same_kind(source):
    """For every (input dtype, parameter dtype) pair: conversion happens
    exactly where NumPy's can_cast(..., "same_kind") says so."""
    x = np.ones(3, source)
    for target, fn in TYPED:
        if source == target or np.can_cast(source, target, "same_kind"):
            fn(x)  # converted (or already fitting): no error
        else:
            with pytest.raises(TypeError) as info:
                fn(x)
            assert str(info.value).endswith(
                f"expected dtype {target}, got {source}; {source} does not convert to "
                f'{target} implicitly (only same-kind casts do, as NumPy\'s '
                f'can_cast(..., casting="same_kind"))'
            )


def test_widening_converts_and_narrowing_kinds_never_do():
    # int -> float, f64 -> f32, bool -> int convert ...
    assert ext.seen_f32(np.arange(3))[3] == [0.0, 1.0, 2.0]
    assert ext.seen_f32(np.array([0.1]))[3] == [float(np.float32(0.1))]
    assert ext.seen_i32(np.array([True, False, True])) == [1, 0, 1]
    # ... float -> int and complex -> real never do.
    with pytest.raises(TypeError, match="expected dtype int32, got float64; float64 does not convert"):
        ext.seen_i32(np.arange(3.0))
    with pytest.raises(TypeError, match="expected dtype float32, got complex64; complex64 does not convert"):
        ext.seen_f32(np.ones(2, np.complex64))


def values_of(x):
    return np.asarray(x).astype(np.float64).ravel().tolist()


# The frameworks whose arrays dlcast recognises (the table's `modules`
# column), by option; what the table cannot say, by hand: those whose arrays
# another file converts, as (file, test), or (None, why no test does), and
# those that need a process of their own (see test_exports.py).
CONVERTED_ELSEWHERE = {
    "cupy": (None, "CuPy needs a CUDA device; no test here converts its arrays"),
    "paddle": ("test_ownership.py", "test_paddle_inputs_through_its_exchange_api"),
}
CONVERTED = [o for o in facts_table.PACKAGES if o not in CONVERTED_ELSEWHERE]


def in_framework(fw, dtype, shape):
    """`arange` of `dtype` as framework `fw`'s array (handed over as
    `returns = <fw>` does; test_exports.py tests that hand-off)."""
    facts_table.require(fw)
    return ext.arange_to(fw, dtype, shape)[0]


def test_the_conversion_quirks_name_rows_and_tests():
    for option, (file, test) in CONVERTED_ELSEWHERE.items():
        assert option in facts_table.PACKAGES, option
        assert file is None or facts_table.test_file_has(file, test), (option, file, test)


@pytest.mark.parametrize("fw", CONVERTED)
def test_dtype_conversion_in_each_framework(fw):
    src = np.arange(6, dtype=np.int16).reshape(2, 3)
    x = in_framework(fw, "int16", [2, 3])
    dtype, shape, strides, vals = ext.seen_f32(x)
    assert (dtype, shape, strides) == ("float32", [2, 3], [3, 1])
    assert vals == values_of(src)


@pytest.mark.parametrize("fw", ["numpy", "torch"])
def test_transposed_input_converts_to_c_order(fw):
    src = np.arange(6.0).reshape(2, 3)
    x = in_framework(fw, "float64", [2, 3]).T
    dtype, shape, strides, vals = ext.seen_c(x)
    assert (dtype, shape, strides) == ("float64", [3, 2], [2, 1])
    assert vals == src.T.ravel().tolist()
    # With conversion off, the same input is refused (C2's other half).
    with pytest.raises(TypeError, match=r"strict_c\(\): argument 'x': expected a C-contiguous"):
        ext.strict_c(x)


@pytest.mark.parametrize("fw", CONVERTED)
def test_f_order_conversion_really_yields_f_layout(fw):
    dtype, shape, strides = ext.seen_f(in_framework(fw, "float32", [2, 3, 4]))
    assert (dtype, shape, strides) == ("float32", [2, 3, 4], [1, 2, 6])
    # dtype and order in one conversion, values unchanged.
    m = np.arange(6, dtype=np.int64).reshape(2, 3)
    dtype, strides, vals = ext.seen_f32_f(in_framework(fw, "int64", [2, 3]))
    assert (dtype, strides) == ("float32", [1, 2])
    assert vals == m.ravel().tolist()  # to_vec reads in logical (C) order


def test_torch_tensor_with_grad_converts_detached():
    t = torch.arange(4.0, dtype=torch.float64, requires_grad=True)
    assert ext.seen_f32(t)[3] == [0.0, 1.0, 2.0, 3.0]
    assert t.grad is None and t.dtype == torch.float64


def _mmap_of(data):
    import mmap

    m = mmap.mmap(-1, len(data))
    m.write(data)
    return m


class _BytesBuffer:
    """A Python exporter (PEP 688 `__buffer__`) whose buffer is `B`."""

    def __init__(self, data):
        self.data = bytearray(data)

    def __buffer__(self, flags):
        return memoryview(self.data)


class _Bytes(bytes):
    pass


# Raw bytes: what reaches dlcast through the buffer protocol with format
# `B` (unsigned bytes, or no format at all). Each holds the float32 bytes of
# [1.0, 2.0].
_F32 = np.array([1.0, 2.0], np.float32).tobytes()
RAW_BYTES = {
    "bytes": lambda: _F32,
    "bytearray": lambda: bytearray(_F32),
    "memoryview of bytes": lambda: memoryview(_F32),
    "memoryview of a NumPy uint8 array": lambda: memoryview(np.frombuffer(_F32, np.uint8)),
    "array('B')": lambda: array.array("B", _F32),
    "mmap": lambda: _mmap_of(_F32),
    "ctypes ubyte array": lambda: (__import__("ctypes").c_ubyte * 8).from_buffer_copy(_F32),
    "bytes subclass": lambda: _Bytes(_F32),
}
if sys.version_info >= (3, 12):
    RAW_BYTES["__buffer__ of format B"] = lambda: _BytesBuffer(_F32)


@pytest.mark.parametrize("kind", sorted(RAW_BYTES))
def test_raw_bytes_are_never_converted(kind):
    """Raw bytes given to a parameter of another element type are refused
    (a TypeError naming both explicit ways), never read as byte values:
    `f(wave.readframes(n))` must not compute on bytes. A `&[u8]` takes them
    in place; `numpy.frombuffer` says which reading is meant."""
    b = RAW_BYTES[kind]()
    # (Below abi3-py311 dlcast reads only exact bytes and bytearray itself;
    # the others reach NumPy's copy, refused the same way, except a bytes
    # subclass, which NumPy reads as one string: the limited API's refusal.)
    if not ext.BUFFER_PROTOCOL and kind == "bytes subclass":
        with pytest.raises(BufferError, match="abi3-py311"):
            ext.seen_f32(b)
        return
    with pytest.raises(TypeError, match=(
            r"^seen_f32\(\): argument 'x': expected dtype float32, got raw bytes .*"
            r'numpy\.frombuffer\(b, dtype="float32"\) to read them as float32 values, or '
            r'numpy\.frombuffer\(b, dtype="uint8"\) to convert each byte\'s value$')):
        ext.seen_f32(b)
    # A parameter that never converts gives the first way only.
    if ext.BUFFER_PROTOCOL or kind in ("bytes", "bytearray"):
        with pytest.raises(TypeError, match=r'got raw bytes .*dtype="float64"\) to read them as float64 values$'):
            ext.slice_sum_nc(b)
    else:
        with pytest.raises(BufferError, match="abi3-py311"):
            ext.slice_sum_nc(b)
    # Either way, once asked for, is taken.
    assert ext.seen_f32(np.frombuffer(b, dtype="float32"))[3] == [1.0, 2.0]
    assert ext.seen_f32(np.frombuffer(b, dtype="uint8"))[3] == list(map(float, _F32))
    assert ext.u8_values(b) == _F32


def test_raw_bytes_for_a_writable_parameter_name_the_view_that_writes_them():
    ba = bytearray(16)
    with pytest.raises(TypeError, match=r'^fill_f64\(\): argument \'out\': .*got raw bytes .*'
                                        r'numpy\.frombuffer\(b, dtype="float64"\) to read them as float64 values$'):
        ext.fill_f64(ba, 1.0)
    assert ba == bytearray(16)
    # The fix writes the bytearray's own memory.
    ext.fill_f64(np.frombuffer(ba, dtype="float64"), 1.0)
    assert np.frombuffer(ba, np.float64).tolist() == [1.0, 1.0]


@pytest.mark.hostile
def test_typed_buffers_and_producers_of_uint8_are_not_raw_bytes():
    """Only the buffer protocol's untyped bytes are raw: a buffer of another
    format converts (a memoryview cast to signed bytes, an exporter whose
    `B` buffer is cast to float32 is read as floats), and so do producers
    that name their dtype (NumPy, PyTorch, a capsule), uint8 included."""
    assert ext.seen_f32(torch.arange(3, dtype=torch.uint8))[3] == [0.0, 1.0, 2.0]
    assert ext.seen_f32(capsule(np.arange(3, dtype=np.uint8)))[3] == [0.0, 1.0, 2.0]
    if ext.BUFFER_PROTOCOL:  # (the limited API below 3.11 reads no memoryview)
        signed = memoryview(_F32).cast("b")
        assert ext.seen_f32(signed)[3] == [float(v) for v in np.frombuffer(_F32, np.int8)]
        assert ext.seen_f32(memoryview(bytearray(_F32)).cast("f"))[3] == [1.0, 2.0]


def test_buffers_and_other_producers_convert_through_numpy():
    import array

    assert ext.seen_f32(array.array("h", [1, 2, 3]))[3] == [1.0, 2.0, 3.0]
    assert ext.seen_f32(memoryview(np.arange(3, dtype=np.int16)))[3] == [0.0, 1.0, 2.0]
    assert ext.seen_f32(array.array("b", [1, -2]))[3] == [1.0, -2.0]
    # NumPy's own uint8 arrays are typed: they convert.
    assert ext.seen_f32(np.arange(3, dtype=np.uint8))[3] == [0.0, 1.0, 2.0]
    # dlcast's own exported array (no framework of its own).
    a, _ = ext.arange_default("int32", [4])
    assert ext.seen_f32(a)[3] == [0.0, 1.0, 2.0, 3.0]


def test_bfloat16_is_a_float_kind():
    t = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    assert ext.seen_f32(t)[3] == [1.5, -2.0]


def test_capsules_convert_from_what_was_read_and_are_freed():
    # The capsule's memory, read once, is what NumPy converts (through a
    # view of that read): the capsule is never asked again.
    with deleters_balanced(1):
        assert ext.seen_f32(capsule(np.arange(3.0)))[3] == [0.0, 1.0, 2.0]


class TwoFaced:
    """A producer that hands out other memory at its second `__dlpack__`
    (as a pool or a double buffer may)."""

    def __init__(self, first, second):
        self.arrays = [first, second]
        self.calls = 0

    def __dlpack__(self, **kw):
        self.calls += 1
        return self.arrays[min(self.calls, 2) - 1].__dlpack__(**kw)

    def __dlpack_device__(self):
        return (1, 0)


@pytest.mark.hostile
@pytest.mark.parametrize("fn, first, want", [
    # dtype conversion, order conversion, and both.
    ("seen_c", np.arange(4, dtype=np.float32), [0.0, 1.0, 2.0, 3.0]),
    ("seen_c", np.arange(6.0).reshape(2, 3).T, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]),
    ("seen_c", np.arange(6, dtype=np.int16).reshape(3, 2).T, [0.0, 2.0, 4.0, 1.0, 3.0, 5.0]),
    ("seen_f32", np.arange(4.0), [0.0, 1.0, 2.0, 3.0]),
])
def test_conversion_copies_what_was_read_never_asks_the_producer_again(fn, first, want):
    second = np.full(first.shape, 99, first.dtype)
    p = TwoFaced(first, second)
    assert getattr(ext, fn)(p)[3] == want
    assert p.calls == 1
def test_writable_parameters_never_convert():
    for x in (np.zeros(3), torch.zeros(3, dtype=torch.float64)):
        with pytest.raises(TypeError) as info:
            ext.fill_c_f32(x, 1.0)
        assert str(info.value) == (
            "fill_c_f32(): argument 'x': expected dtype float32, got float64; a writable "
            "parameter never converts (writes into a converted copy would be lost)"
        )
    t = np.zeros((3, 2), np.float32).T
    with pytest.raises(TypeError, match="C-contiguous.*a writable parameter never converts"):
        ext.fill_c_f32(t, 1.0)
    assert not t.any()


def test_noconvert_on_the_parameter_and_on_the_function():
    with pytest.raises(TypeError, match=r"^strict_c\(\): argument 'x': expected a C-contiguous \(order c\) array, got shape \(2, 2\) with strides \(1, 2\)$"):
        ext.strict_c(np.zeros((2, 2)).T)
    with pytest.raises(TypeError, match=r"^strict_pair\(\): argument 'y': expected dtype float32, got float64$"):
        ext.strict_pair(np.zeros(2, np.float32), np.zeros(2))
    assert ext.strict_pair(np.zeros(2, np.float32), np.zeros(3, np.float32)) == 5


def test_shape_device_and_read_only_never_convert():
    with pytest.raises(TypeError, match=r"expected shape \(3,\), got \(4,\)"):
        ext.triple_f32(np.zeros(4))  # dtype would convert; shape does not
    with pytest.raises(TypeError, match="expected device cuda"):
        ext.cuda_only(np.zeros(3))
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    with pytest.raises(TypeError, match="read-only"):
        ext.fill_c_f32(ro, 1.0)


def test_jax_conversion_keeps_values_and_the_input():
    x = jnp.arange(5, dtype=jnp.int32)
    assert ext.seen_f32(x)[3] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert x.dtype == jnp.int32


def test_the_temporary_lives_as_long_as_a_returned_view():
    # `doubled` reads a converted (C-order) copy and returns a new array;
    # `Accumulator.echo` is noconvert, so fitting inputs are zero-copy.
    a = np.arange(4.0).reshape(2, 2).T
    np.testing.assert_array_equal(ext.doubled(a), a * 2)
    acc = ext.Accumulator()
    x = np.arange(3, dtype=np.float32)
    out = acc.echo(x)
    assert out.__array_interface__["data"][0] == x.__array_interface__["data"][0]


def test_a_returned_view_of_a_converted_copy_is_a_new_writable_array():
    x = np.arange(10, dtype=np.float32)  # `rows` wants float64: converted
    out = np.from_dlpack(ext.rows(x, 0, 3))
    assert out.tolist() == [0.0, 1.0, 2.0]
    # The temporary belonged to the call alone: returned, it is the
    # caller's new array, and writes to it leave x alone.
    assert out.flags.writeable
    out[0] = 9.0
    assert x[0] == 0.0
    y = np.arange(10.0)  # no conversion: zero-copy and writable
    assert np.from_dlpack(ext.rows(y, 0, 3)).flags.writeable


def test_interrupts_and_memory_errors_during_conversion_propagate():
    class Fake:
        """Claims to be a JAX array; its astype raises. (bfloat16, which
        NumPy cannot view: only then is the argument's own framework asked
        to convert host memory.)"""

        def __init__(self, exc):
            self.exc = exc
            self.a = torch.arange(3, dtype=torch.bfloat16)

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return (1, 0)

        def astype(self, *a, **kw):
            raise self.exc

    Fake.__module__ = "jax"
    with pytest.raises(KeyboardInterrupt):
        ext.seen_f32(Fake(KeyboardInterrupt()))
    with pytest.raises(MemoryError):
        ext.seen_f32(Fake(MemoryError()))
    with pytest.raises(TypeError, match=r"converting it with x\.astype\(\) raised ValueError: no") as info:
        ext.seen_f32(Fake(ValueError("no")))
    assert isinstance(info.value.__cause__, ValueError)


def test_a_conversion_that_changes_the_shape_is_refused():
    class Liar:
        __module__ = "jax"

        def __dlpack__(self, **kw):
            return torch.arange(3, dtype=torch.bfloat16).__dlpack__(**kw)

        def __dlpack_device__(self):
            return (1, 0)

        def astype(self, *a, **kw):
            return np.zeros(100, np.float32)

    with pytest.raises(TypeError, match=r"converting it gave shape \(100,\), not \(3,\)"):
        ext.seen_f32(Liar())


def test_jax_to_64_bit_goes_through_numpy():
    x = jnp.arange(3, dtype=jnp.float32)
    assert ext.seen_c(x)[:2] == ("float64", [3])


def test_no_bfloat16_from_numpy():
    with pytest.raises(TypeError, match="NumPy has no bfloat16 that DLPack can export"):
        ext.sum_bf16(np.ones(2, np.float32))
    # PyTorch has one.
    assert ext.sum_bf16(torch.ones(2)) == 2.0


# The dtypes the layout property test draws: a sample of NumPy's real ones
# (every dtype's conversions are tested above), rows of the dtype table.
SOURCES = ["bool", "int8", "uint8", "int16", "int32", "int64", "uint16", "float16", "float32", "float64"]


def test_the_layout_sample_names_rows_numpy_has():
    assert set(SOURCES) <= set(facts_table.IN_NUMPY), SOURCES


@st.composite
def layouts(draw):
    """A NumPy or PyTorch array of a random dtype, shape (0-d and empty
    included), per-axis step (negative for NumPy) and axis order."""
    fw = draw(st.sampled_from(["numpy", "torch"]))
    ndim = draw(st.integers(0, 3))
    shape = [draw(st.integers(0, 4)) for _ in range(ndim)]
    steps = [draw(st.sampled_from([1, 2, -1] if fw == "numpy" else [1, 2])) for _ in range(ndim)]
    perm = draw(st.permutations(range(ndim)))
    dtype = draw(st.sampled_from(SOURCES if fw == "numpy" else [d for d in SOURCES if d != "uint16"]))
    full = [n * abs(k) for n, k in zip(shape, steps)]
    base = np.arange(int(np.prod(full))).astype(dtype).reshape(full)
    x = torch.from_numpy(base) if fw == "torch" else base
    index = tuple(slice(None, None, k) for k in steps)
    x = x[index] if ndim else x
    if ndim:
        x = x.permute(*perm) if fw == "torch" else x.transpose(perm)
    return x


def f_contiguous(shape, strides):
    """F order as DLPack consumers read it: extent-1 axes ignored."""
    if 0 in shape:
        return True  # empty: any strides
    want = 1
    for n, s in zip(shape, strides):
        if n != 1 and s != want:
            return False
        want *= n
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_conversion_sees_what_the_framework_gives(x):
    want32 = np.asarray(x).astype(np.float32)
    dtype, shape, strides, vals = ext.seen_f32(x)
    assert (dtype, shape) == ("float32", list(want32.shape))
    assert vals == want32.ravel().tolist()
    if want32.ndim >= 1:
        # order(f) and float32 in one conversion: real F layout, same values.
        dtype, fstrides, fvals = ext.seen_f32_f(x)
        assert dtype == "float32" and fvals == want32.ravel().tolist()
        assert f_contiguous(want32.shape, fstrides), (want32.shape, fstrides)


def misaligned_f64(values):
    """A float64 NumPy array at an odd address, holding `values`."""
    n = len(values)
    a = np.frombuffer(bytearray(8 * n + 1), np.float64, offset=1)
    a[:] = values
    assert a.ctypes.data % 8 != 0
    return a


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: memoryview(np.array([1.0, 2.0, 3.0], ">f8")), id="memoryview->d"),
        pytest.param(lambda: memoryview(np.zeros(3, [("b", "<i4"), ("a", "<f8")])["a"]),
                     id="memoryview-odd-byte-stride"),
        pytest.param(lambda: np.array([1.0, 2.0, 3.0], ">f8").view(np.recarray),
                     id="recarray-byteswapped"),
    ],
)
def test_read_only_slice_of_a_non_native_buffer_or_subclass_converts(make):
    """A read-only typed parameter converts an exact `numpy.ndarray` that
    DLPack cannot describe (byte-swapped, odd byte strides), but the same
    memory as a `memoryview` (format '>d', or byte strides that are not
    whole elements) or as a NumPy subclass is refused with a BufferError --
    for the buffer, worded "the producer described an invalid array", which
    the array is not. Expected: converted like the exact ndarray (NumPy's
    `asarray` reads all three), or at least an error that says what is
    unsupported."""
    x = make()
    expected = np.asarray(x, dtype=np.float64).tolist()
    assert t.slice_values(x) == expected


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_a_converted_read_only_argument_is_a_copy_taken_before_the_body():
    """`b` needs a conversion (int64 bits of `a`'s memory): its copy is made
    before `a` is written, so `b` holds the values from before."""
    a = np.arange(4.0)
    expected = float(a.view(np.int64).astype(np.float64).sum())
    assert t.mut_and_ref(a, a.view(np.int64)) == expected
    assert a.tolist() == [1.0] * 4


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_a_converted_outer_view_is_not_the_callers_memory():
    """The body reads a fresh copy of a misaligned argument: a callback may
    write the caller's array (it is not borrowed) and the body's values do
    not change."""
    x = misaligned_f64([1.0, 2.0, 3.0])

    def callback():
        x[:] = 100.0

    assert t.slice_cb(x, callback) == (6.0, 6.0)
    assert x.tolist() == [100.0] * 3


def _non_native():
    raw = np.frombuffer(bytearray(8 * 12 + 1), ">f8", offset=1)
    raw[:] = np.arange(12.0)
    rec = np.zeros(4, [("b", "<i4"), ("a", "<f8")])
    rec["a"] = [1, 2, 3, 4]
    packed = np.zeros(4, np.dtype([("c", "u1"), ("a", "<f8")], align=False))
    packed["a"] = [5, 6, 7, 8]
    return {
        "byteswapped-misaligned-strided": raw[::2],
        "byteswapped-misaligned-negative": raw[::-3],
        "struct-field-odd-stride": rec["a"],
        "packed-field-misaligned": packed["a"],
        "byteswapped-0d-in-1d": np.array([4.5], ">f8"),
    }


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
@pytest.mark.parametrize("kind", sorted(_non_native()))
def test_arrays_dlpack_cannot_describe_convert_for_read_only(kind):
    x = _non_native()[kind]
    expected = x.astype(np.float64).tolist()
    assert t.slice_values(x) == expected
    assert t.nd1_values(x) == expected
    addr, n = t.slice_addr(x)
    assert n == len(expected) and addr % 8 == 0
    assert not (x.ctypes.data <= addr < x.ctypes.data + x.nbytes)
    with pytest.raises((TypeError, BufferError), match=r"slice_fill\(\): argument 'x'"):
        t.slice_fill(x, 0.0)


class _ClaimsNdarray:
    """Neither a NumPy array nor a buffer: its `__class__` says
    `numpy.ndarray`, its `__array_interface__` (counted) describes `data`,
    and its `__dlpack__` refuses."""

    __class__ = property(lambda self: np.ndarray)

    def __init__(self, data, exc=None):
        self.data, self.exc, self.asked = data, exc, 0

    @property
    def __array_interface__(self):
        self.asked += 1
        if self.exc is not None:
            raise self.exc
        return self.data.__array_interface__

    def __dlpack__(self, **kwargs):
        raise BufferError("refused by the producer")

    def __dlpack_device__(self):
        return (1, 0)


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_arrays_dlpack_cannot_describe_are_numpys_own_or_buffers():
    """Only NumPy's own arrays (by type, not by what `__class__` claims) and
    buffer-protocol objects go to NumPy when DLPack cannot describe them:
    another object's `__array_interface__` is never asked, and the producer's
    refusal stands."""
    for fn in (t.slice_values, lambda x: ext.fill_f64(x, 1.0)):
        x = _ClaimsNdarray(np.arange(4.0))
        with pytest.raises(BufferError, match="refused by the producer"):
            fn(x)
        assert x.asked == 0


@pytest.mark.hostile
@pytest.mark.parametrize("exc", ["KeyboardInterrupt", "MemoryError"])
def test_an_interrupt_while_numpy_reads_an_argument_propagates(exc):
    """What NumPy's reading of an argument raises through no fault of the
    argument propagates unchanged, for a read-only parameter (which would
    convert) and a writable one (whose refusal NumPy's reading words).
    (`numpy.asarray` replaced: a process of its own.)"""
    proc = run_py(f"""
        import numpy as np
        import dlcast_testext as t

        class Sub(np.ndarray):
            def __dlpack__(self, **kwargs):
                raise BufferError("refused by the producer")

        x = np.zeros(4, ">f8").view(Sub)
        calls = []

        def asarray(a, *args, **kwargs):
            calls.append(a)
            raise {exc}

        np.asarray = asarray
        for fn in (t.slice_values, lambda x: t.fill_f64(x, 1.0)):
            try:
                fn(x)
            except {exc}:
                pass
            else:
                raise AssertionError("no {exc}")
        assert len(calls) == 2, calls
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_byteswapped_other_element_types_convert():
    assert t.c128_values(np.array([1 + 2j, 3 - 4j], ">c16")) == [(1.0, 2.0), (3.0, -4.0)]
    assert t.f16_values(np.array([1.5, 2.5], ">f2")) == [1.5, 2.5]
    assert t.i64_values(np.array([1, -2], ">i8")) == [1, -2]
    with pytest.raises(TypeError, match="does not convert to uint8"):
        t.u8_values(np.array([1, 2], ">i8"))
    for bad in (np.array([1.0], dtype=object), np.array([1], "M8[s]"), np.array(["1"])):
        with pytest.raises(TypeError, match="which dlcast cannot read in place"):
            t.slice_values(bad) if bad.dtype.kind != "M" else t.i64_values(bad)


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("src", ["int64", "torch_int", "buffer_int", "capsule_int"])
def test_converted_temporaries_with_a_callback(src):
    """A converted argument's view reads the call's own temporary (NumPy or
    PyTorch: no guard): a callback that rewrites or frees the caller's array
    changes nothing the body reads; a capsule converts from its one read and
    is released; a buffer's export ends at the conversion."""
    made = {"int64": lambda: np.arange(4),
            "torch_int": lambda: torch.arange(4),
            "buffer_int": lambda: array.array("i", range(4)),
            "capsule_int": lambda: capsule(np.arange(4))}[src]

    def cb():
        if isinstance(x, array.array):
            x.extend([0] * 4)  # the buffer is no longer exported
        elif isinstance(x, np.ndarray):
            x.resize(0, refcheck=False)  # frees the caller's memory
        elif isinstance(x, torch.Tensor):
            x.set_(torch.zeros(0, dtype=x.dtype))

    with deleters_balanced():
        x = made()
        assert t.slice_cb(x, cb) == (6.0, 6.0)


#    `clear_reads` while Python code runs in `work()`.

class _Producer:
    """A producer of bfloat16 data behind `__dlpack__` that says it is an
    array-api-strict array: a `&[f64]` parameter converts it by its own
    framework's `astype` (NumPy cannot view bfloat16), Python code run in
    `work()`, after an earlier argument was read and registered in the pass
    that stopped. `during(n)` runs at `__dlpack__` (n = 1) and at the
    conversion (n = 2)."""

    __module__ = "array_api_strict"
    float64 = "float64"

    def __init__(self, during, values=(1, 2, 3)):
        self.data = torch.tensor(values, dtype=torch.bfloat16)
        self.values = values
        self.during = during
        self.calls = 0

    def __dlpack__(self, **kw):
        self.calls += 1
        self.during(self.calls)
        return self.data.__dlpack__(**kw)

    def __dlpack_device__(self):
        return (1, 0)

    def __array_namespace__(self):
        return self

    def astype(self, x, dtype):
        self.calls += 1
        self.during(self.calls)
        return np.array(self.values, dtype=np.float64)


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_no_registry_entry_survives_a_stopped_pass():
    """While the conversion's Python code runs, nothing of the stopped pass
    is in the registry, only the conversion's read of the memory it copies:
    a nested call may write the first argument (which the call reads again
    afterwards), and call the function re-entrantly."""
    a = np.zeros(3)
    seen = []

    def during(n):
        if n == 2:
            seen.append(t.live_borrows())
            t.fill_f64(a, 9.0)
            seen.append(t.mut_and_ref(a, np.ones(2)))

    p = _Producer(during)
    assert t.mut_and_ref(a, p) == 6.0
    assert p.calls == 2
    assert seen == [1, 2.0]
    assert a.tolist() == [1.0] * 3


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_an_earlier_argument_freed_while_a_pass_is_stopped():
    """The conversion's Python code resizes the first argument (NumPy frees
    its memory): the next pass reads the new memory, never the old."""
    a = np.zeros(3)

    def during(n):
        if n == 2:
            a.resize(1000, refcheck=False)

    assert t.mut_and_ref(a, _Producer(during)) == 6.0
    assert a.shape == (1000,) and (a == 1.0).all()


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_the_version_bump_pass_after_a_conversion():
    """A writable PyTorch argument (bumped once every check passed) next to
    an argument converted in `work()`: one bump, the right values."""
    a = torch.zeros(3, dtype=torch.float64)
    v0 = a._version
    seen = []

    def during(n):
        if n == 2:
            seen.append((a._version, t.live_borrows()))

    assert t.mut_and_ref(a, _Producer(during)) == 6.0
    # Only the conversion's read of the second argument is registered.
    assert seen == [(v0, 1)]
    assert a._version == v0 + 1
    assert a.tolist() == [1.0] * 3


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_a_conversion_that_raises_leaves_nothing_behind():
    a = np.zeros(3)

    def during(n):
        if n == 2:
            raise RuntimeError("no second export")

    with pytest.raises(TypeError, match="no second export"):
        t.mut_and_ref(a, _Producer(during))
    assert a.tolist() == [0.0] * 3
    assert t.mut_and_ref(a, np.ones(2)) == 2.0


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_the_same_memory_byteswapped_after_a_writable_read():
    """`mut_and_ref(a, a viewed big-endian)`: the second argument goes
    through `__dlpack__`, then NumPy's copy (two stops) after `a` was read
    and registered writable; the copy is made before the body writes."""
    a = np.arange(3.0)
    b = a.view(">f8")
    expected = float(np.asarray(b, dtype=np.float64).sum())
    assert t.mut_and_ref(a, b) == expected
    assert a.tolist() == [1.0] * 3


_RNP_SCRIPT = """
import numpy as np
import torch
import dlcast_rnp as rnp
import dlcast_testext as t
# rust-numpy publishes its own table first: dlcast then also holds its
# NumPy views there, acquired in phase 1 (rust-numpy's functions are other
# code: never called between the raw reads and the body) and kept until
# the call ends.
rnp.hold_ref_and_call(np.zeros(3), lambda: None)
a = np.zeros(3)
out = []

class P:
    # bfloat16, which NumPy cannot view: converted by the framework it says
    # it is (array-api-strict), Python code run between two passes.
    __module__ = "array_api_strict"
    float64 = "float64"
    def __init__(self):
        self.data = torch.arange(1, 4, dtype=torch.bfloat16)
        self.calls = 0
    def __array_namespace__(self):
        return self
    def __dlpack_device__(self):
        return (1, 0)
    def __dlpack__(self, **kw):
        self.calls += 1
        return self.data.__dlpack__(**kw)
    def astype(self, x, dtype):
        self.calls += 1
        if self.calls == 2:
            # Between two passes (Python code may run): `a` is still held
            # writable in rust-numpy's table, since phase 1.
            try:
                out.append(rnp.hold_mut_and_call(a, lambda: None))
            except TypeError as e:
                out.append("refused" if "already borrowed" in str(e) else repr(e))
        return np.arange(1.0, 4.0)

r = t.mut_and_ref(a, P())
values = a.tolist()
try:
    rnp.hold_mut_and_call(a, lambda: None)
    after = "free"
except Exception as e:
    after = type(e).__name__
print("RESULT", r, out, values, after, t.live_borrows())
"""


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_rust_numpy_holds_last_from_phase_one_to_the_end_of_the_call():
    proc = run_py(_RNP_SCRIPT)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, proc.stderr[-2000:]
    # Held across the stopped pass (rust-numpy refuses its own writable
    # borrow then), the body fills `a` with 1.0, and the hold ends with the
    # call: rust-numpy borrows `a` writable again, no borrow is left.
    assert line[0] == "RESULT 6.0 ['refused'] [1.0, 1.0, 1.0] free 0"


@pytest.mark.hostile
def test_misaligned_torch_input_converted_is_a_copy():
    # A misaligned float64 tensor that requires grad, passed to an
    # #[order(c)] view (which needs aligned data) and returned: the
    # "converted temporary" must not alias the grad-requiring input.
    buf = bytearray(8 * 5 + 1)
    x = torch.frombuffer(buf, dtype=torch.float64, offset=1, count=4)
    x.requires_grad_(True)
    r = np.asarray(ext.passthrough_f64_c(x))
    assert r.flags.writeable
    assert not (x.data_ptr() <= r.ctypes.data < x.data_ptr() + 32)
    r[0] = 5.0
    assert x[0].item() == 0.0
