"""Capsules built field by field: legacy and versioned, odd but legal
layouts, impossible descriptions. The producer's deleter runs exactly once
on every path, error paths included."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dlcast_testext as ext
from conftest import capsule, deleters_balanced


@pytest.mark.parametrize("versioned", [True, False])
def test_deleter_runs_once_on_success_and_on_each_error(versioned):
    data = np.arange(6.0)
    with deleters_balanced(4):
        assert ext.values(capsule(data, versioned=versioned)) == data.tolist()
        with pytest.raises(TypeError, match="expected dtype float32"):
            ext.sum_f32(capsule(data, versioned=versioned))
        with pytest.raises(TypeError, match="expected shape"):
            ext.scalar_f64(capsule(data, versioned=versioned))
        # A capsule nobody consumes is freed by its own destructor.
        capsule(data, versioned=versioned)


def test_higher_minor_version_is_read():
    with deleters_balanced(1):
        assert ext.values(capsule(np.arange(2.0), version=(1, 99))) == [0.0, 1.0]


def test_zero_d_with_null_shape_and_strides():
    with deleters_balanced(1):
        c = ext.make_capsule(np.float64(4.5).tobytes(), [], None)
        assert ext.scalar_f64(c) == 4.5


def test_many_dimensions():
    # 70 dimensions of extent 1 plus one of 3: beyond the inline storage.
    shape = [1] * 70 + [3]
    with deleters_balanced(1):
        c = ext.make_capsule(np.arange(3.0).tobytes(), shape, [1] * 71)
        assert ext.describe(c)[0] == shape
    with deleters_balanced(1):
        c = ext.make_capsule(np.arange(3.0).tobytes(), shape, [1] * 71)
        assert ext.values(c) == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(shape=[3], strides=[1], ndim=-1), "ndim is -1"),
        (dict(shape=[-2], strides=[1]), "extent -2 in dimension 0"),
        (dict(shape=[4], strides=[1], null_data=True), "data is NULL for a non-empty array"),
        (dict(shape=[3], strides=[2**62]), "beyond the address space"),
        (dict(shape=[2**40, 2**40], strides=[1, 1]), "element count overflows"),
        (dict(shape=[2], strides=[1], byte_offset=2**64 - 8), "data + byte_offset overflows"),
        (dict(shape=[2], strides=[-2**58]), "wraps around"),
        (dict(shape=[2**62], strides=None), "beyond the address space"),
    ],
    ids=["neg-ndim", "neg-extent", "null-data", "huge-stride", "count-overflow",
         "offset-wrap", "below-zero", "null-strides-huge"],
)
def test_impossible_descriptions_are_refused(fields, message):
    shape = fields.pop("shape")
    strides = fields.pop("strides")
    with deleters_balanced(1):
        c = ext.make_capsule(bytes(32), shape, strides, **fields)
        with pytest.raises(BufferError, match="the producer described an invalid array") as info:
            ext.values(c)
        assert message in str(info.value)


def test_null_shape_with_dimensions_is_refused():
    with deleters_balanced(1):
        c = ext.make_capsule(bytes(8), [], None, ndim=2)
        with pytest.raises(BufferError, match="shape is NULL with ndim 2"):
            ext.describe(c)


def test_null_deleter_is_allowed():
    c = ext.make_capsule(np.arange(2.0).tobytes(), [2], [1], null_deleter=True)
    assert ext.values(c) == [0.0, 1.0]


def test_foreign_capsules_are_refused():
    c = ext.make_capsule(bytes(8), [1], [1], name="not_dlpack")
    with pytest.raises(BufferError, match='a capsule named "not_dlpack" is not a DLPack capsule'):
        ext.values(c)
    # Still refused the second time (nothing was renamed).
    with pytest.raises(BufferError, match="not_dlpack"):
        ext.values(c)


class Returns:
    def __init__(self, value):
        self.value = value

    def __dlpack__(self, **kw):
        return self.value


def test_dlpack_returning_non_capsules():
    with pytest.raises(BufferError, match=r"__dlpack__\(\) returned int, not a DLPack capsule"):
        ext.values(Returns(3))
    used = np.arange(2.0).__dlpack__()
    ext.consume(used)
    with pytest.raises(BufferError, match="already consumed"):
        ext.values(Returns(used))


def test_numpy_legacy_and_versioned_capsules_directly():
    a = np.arange(4.0)
    assert ext.values(a.__dlpack__()) == [0.0, 1.0, 2.0, 3.0]
    assert ext.values(a.__dlpack__(max_version=(1, 0))) == [0.0, 1.0, 2.0, 3.0]
    ro = np.arange(3.0)
    ro.flags.writeable = False
    assert ext.describe(ro.__dlpack__(max_version=(1, 0)))[4] is True


# Property test: arbitrary strided layouts over a buffer, checked against
# NumPy's own view of the same memory.
@st.composite
def layouts(draw):
    ndim = draw(st.integers(0, 4))
    shape = draw(st.lists(st.integers(0, 4), min_size=ndim, max_size=ndim))
    strides = draw(st.lists(st.integers(-6, 6), min_size=ndim, max_size=ndim))
    # Place element 0 so that every reachable element is inside the buffer.
    lo = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides) if n > 0)
    hi = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides) if n > 0)
    start = -lo + draw(st.integers(0, 3))
    size = start + hi + 1 + draw(st.integers(0, 3))
    split = draw(st.integers(0, start))  # part in data_offset, part in byte_offset
    legacy = draw(st.booleans())
    return shape, strides, start, size, split, legacy


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_values_match_numpy_model(layout):
    shape, strides, start, size, split, legacy = layout
    buf = np.arange(size, dtype=np.float64) * 1.5
    expected = np.lib.stride_tricks.as_strided(
        buf[start:], shape=shape, strides=[s * 8 for s in strides]
    ) if all(n > 0 for n in shape) else np.zeros(shape)
    with deleters_balanced(1):
        c = ext.make_capsule(
            buf.tobytes(), shape, strides,
            data_offset=split * 8, byte_offset=(start - split) * 8, versioned=not legacy,
        )
        assert ext.values(c) == expected.ravel().tolist()
