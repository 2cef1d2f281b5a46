"""Implicit conversion of read-only arguments (issue #4): which casts happen,
by which framework, and what never converts."""

import array_api_strict as xp
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import dlcast_testext as ext
from conftest import capsule, deleters_balanced

# Every dtype NumPy has that dlcast reads, with a typed function for it.
TYPED = [
    ("bool", ext.count_true),
    ("int8", ext.sum_i8),
    ("int16", ext.sum_i16),
    ("int32", ext.sum_i32),
    ("int64", ext.sum_i64),
    ("uint8", ext.sum_u8),
    ("uint16", ext.sum_u16),
    ("uint32", ext.sum_u32),
    ("uint64", ext.sum_u64),
    ("float16", ext.sum_f16),
    ("float32", ext.sum_f32),
    ("float64", ext.sum_f64),
    ("complex64", ext.sum_c64),
    ("complex128", ext.sum_c128),
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


def test_the_issue_examples():
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


FRAMEWORKS = {
    "numpy": lambda a: a,
    "torch": torch.from_numpy,
    "jax": jnp.asarray,
    "array_api_strict": xp.asarray,
}


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_dtype_conversion_in_each_framework(fw):
    src = np.arange(6, dtype=np.int16).reshape(2, 3)
    x = FRAMEWORKS[fw](src)
    dtype, shape, strides, vals = ext.seen_f32(x)
    assert (dtype, shape, strides) == ("float32", [2, 3], [3, 1])
    assert vals == values_of(src)


@pytest.mark.parametrize("fw", ["numpy", "torch"])
def test_c2_transposed_input_converts_to_c_order(fw):
    src = np.arange(6.0).reshape(2, 3)
    x = FRAMEWORKS[fw](src).T
    dtype, shape, strides, vals = ext.seen_c(x)
    assert (dtype, shape, strides) == ("float64", [3, 2], [2, 1])
    assert vals == src.T.ravel().tolist()
    # With conversion off, the same input is refused (C2's other half).
    with pytest.raises(TypeError, match=r"strict_c\(\): argument 'x': expected a C-contiguous"):
        ext.strict_c(x)


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_f_order_conversion_really_yields_f_layout(fw):
    src = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4)
    dtype, shape, strides = ext.seen_f(FRAMEWORKS[fw](src))
    assert (dtype, shape, strides) == ("float32", [2, 3, 4], [1, 2, 6])
    # dtype and order in one conversion, values unchanged.
    m = np.arange(6, dtype=np.int64).reshape(2, 3)
    dtype, strides, vals = ext.seen_f32_f(FRAMEWORKS[fw](m))
    assert (dtype, strides) == ("float32", [1, 2])
    assert vals == m.ravel().tolist()  # to_vec reads in logical (C) order


def test_torch_tensor_with_grad_converts_detached():
    t = torch.arange(4.0, dtype=torch.float64, requires_grad=True)
    assert ext.seen_f32(t)[3] == [0.0, 1.0, 2.0, 3.0]
    assert t.grad is None and t.dtype == torch.float64


def test_buffers_and_other_producers_convert_through_numpy():
    import array

    assert ext.seen_f32(array.array("h", [1, 2, 3]))[3] == [1.0, 2.0, 3.0]
    assert ext.seen_f32(memoryview(np.arange(3, dtype=np.uint8)))[3] == [0.0, 1.0, 2.0]
    # dlcast's own exported array (no framework of its own).
    a, _ = ext.arange_default("int32", [4])
    assert ext.seen_f32(a)[3] == [0.0, 1.0, 2.0, 3.0]


def test_bfloat16_is_a_float_kind():
    t = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    assert ext.seen_f32(t)[3] == [1.5, -2.0]


def test_capsules_do_not_convert_and_are_freed():
    with deleters_balanced(1):
        with pytest.raises(TypeError) as info:
            ext.seen_f32(capsule(np.arange(3.0)))
    assert str(info.value) == (
        "seen_f32(): argument 'x': expected dtype float32, got float64, and it cannot be "
        "converted: a DLPack capsule can be read only once"
    )


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
    # caller's new array (issue #14), and writes to it leave x alone.
    assert out.flags.writeable
    out[0] = 9.0
    assert x[0] == 0.0
    y = np.arange(10.0)  # no conversion: zero-copy and writable
    assert np.from_dlpack(ext.rows(y, 0, 3)).flags.writeable


def test_interrupts_and_memory_errors_during_conversion_propagate():
    class Fake:
        """Claims to be a NumPy array; its astype raises."""

        def __init__(self, exc):
            self.exc = exc
            self.a = np.arange(3)

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return (1, 0)

        def astype(self, *a, **kw):
            raise self.exc

    Fake.__module__ = "numpy"
    with pytest.raises(KeyboardInterrupt):
        ext.seen_f32(Fake(KeyboardInterrupt()))
    with pytest.raises(MemoryError):
        ext.seen_f32(Fake(MemoryError()))
    with pytest.raises(TypeError, match=r"converting it with x\.astype\(\) raised ValueError: no") as info:
        ext.seen_f32(Fake(ValueError("no")))
    assert isinstance(info.value.__cause__, ValueError)


def test_a_conversion_that_changes_the_shape_is_refused():
    class Liar:
        __module__ = "numpy"

        def __dlpack__(self, **kw):
            return np.arange(3).__dlpack__(**kw)

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


# ---------------------------------------------------------------------------
# Property: for any NumPy or PyTorch layout (slices, negative steps,
# transposes, empty and 0-d arrays) and any source dtype, a converting
# parameter sees exactly what the framework's own conversion gives.

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SOURCES = ["bool", "int8", "uint8", "int16", "int32", "int64", "uint16", "float16", "float32", "float64"]


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
