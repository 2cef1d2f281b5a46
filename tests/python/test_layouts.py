"""Layouts that broke real DLPack consumers are read right: negative strides,
transposes, strides of extent-one dimensions, empty arrays, NULL strides,
byte offsets and read-only NumPy arrays.
"""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import dlcast_testext as ext
from conftest import capsule, deleters_balanced


def test_negative_strides():
    a = np.arange(12.0).reshape(3, 4)[:, ::-1]
    shape, strides, dtype, *_ = ext.describe(a)
    assert (shape, strides, dtype) == ([3, 4], [4, -1], "float64")
    assert ext.get_f64(a, [0, 0]) == 3.0
    assert ext.values(a) == a.ravel().tolist()
    assert ext.ndarray_f64(a) == a.ravel().tolist()
    # A negatively strided view is not C-contiguous: no slice.
    assert ext.slice_f64(a) is None
    # Both axes reversed, and the same through a capsule of the producer.
    b = np.arange(12.0).reshape(3, 4)[::-1, ::-1]
    assert ext.values(b) == b.ravel().tolist()
    with deleters_balanced(1):
        raw = np.arange(12.0)
        # data points at element 3 of the buffer; strides (4, -1).
        c = ext.make_capsule(raw.tobytes(), [3, 4], [4, -1], data_offset=3 * 8)
        assert ext.values(c) == a.ravel().tolist()


def test_negative_strides_writable():
    a = np.zeros((3, 4))
    view = a[:, ::-1]
    assert ext.set_f64(view, [0, 0], 5.0)
    assert a[0, 3] == 5.0
    ext.add_one_f32(np.zeros(4, np.float32)[::-1])  # negative stride, any order


def test_transposed_numpy_and_torch():
    a = np.arange(4.0).reshape(2, 2).T
    assert ext.get_f64(a, [0, 1]) == 2.0
    t = torch.arange(6.0, dtype=torch.float64).reshape(2, 3).T
    assert ext.get_f64(t, [0, 1]) == 3.0
    assert ext.describe(t)[1] == [1, 3]
    for x in (a, t):
        # Conversion off: order(c) refuses them.
        with pytest.raises(TypeError, match=r"needs_c\(\): argument 'x': expected a C-contiguous \(order c\) array"):
            ext.needs_c(x)
        # Conversion on (the default): the framework makes a C-order copy
        # with the same values.
        dtype, shape, strides, values = ext.seen_c(x)
        assert (shape, strides) == (list(x.shape), [x.shape[1], 1])
        assert values == np.asarray(x).ravel().tolist()
        # F order and "contiguous" accept the transposes.
        assert ext.needs_f(x) == list(x.shape)
        assert ext.needs_contiguous(x) == list(x.shape)


def test_extent_one_dimensions_ignore_strides():
    t = torch.rand(16)[::3][:1]
    assert t.stride() == (3,)
    assert ext.needs_c(t) == [1]
    assert ext.needs_f(t) == [1]
    z = torch.zeros(1, 77)
    assert ext.needs_c(z) == [1, 77]
    # Any stride on an extent-1 dimension, through a capsule.
    with deleters_balanced(1):
        c = ext.make_capsule(bytes(77 * 8), [1, 77], [12345, 1])
        assert ext.needs_c(c) == [1, 77]


def test_empty_arrays_are_contiguous_and_never_read():
    z = np.zeros((1, 8, 0, 128), np.float32)
    for f in (ext.needs_c, ext.needs_f, ext.needs_contiguous):
        assert f(z) == [1, 8, 0, 128]
    assert ext.values(z) == []
    with deleters_balanced(3):
        # Strides of 0 and a NULL data pointer: contiguous, nothing read.
        c = ext.make_capsule(b"", [2, 0, 3], [0, 0, 0], null_data=True)
        assert ext.needs_c(c) == [2, 0, 3]
        c = ext.make_capsule(b"", [0], [0], null_data=True)
        assert ext.values(c) == []
        c = ext.make_capsule(b"", [0, 4], [0, 0], null_data=True)
        assert ext.slice_f64(c) == []
    assert ext.values(torch.zeros(0, 3)) == []
    assert ext.values(jnp.zeros((0,))) == []


def test_null_strides_are_row_major():
    data = np.arange(6.0)
    with deleters_balanced(2):
        for version in [(1, 0), (1, 1)]:
            c = ext.make_capsule(data.tobytes(), [2, 3], None, version=version)
            shape, strides, *_ = ext.describe(c)
            assert (shape, strides) == ([2, 3], [3, 1])
    with deleters_balanced(1):
        c = ext.make_capsule(data.tobytes(), [2, 3], None, versioned=False)
        assert ext.get_f64(c, [1, 0]) == 3.0


def test_byte_offset_is_honoured():
    data = np.arange(9.0)
    with deleters_balanced(2):
        c = ext.make_capsule(data.tobytes(), [1], [1], byte_offset=8 * 8)
        assert ext.values(c) == [8.0]
        # Also legacy, and with a 2-d view.
        c = ext.make_capsule(data.tobytes(), [2, 2], [3, 1], byte_offset=2 * 8, versioned=False)
        assert ext.values(c) == [2.0, 3.0, 5.0, 6.0]


def test_read_only_numpy():
    a = np.arange(10.0)
    a.flags.writeable = False
    assert ext.sum_f64(a) == 45.0
    assert ext.describe(a)[4] is True
    with pytest.raises(TypeError, match=r"fill_f64\(\): argument 'out': the array is read-only, but the parameter is writable"):
        ext.fill_f64(a, 1.0)
    assert (a == np.arange(10.0)).all()
    # Other read-only producers: bytes, the READ_ONLY flag of a capsule.
    with pytest.raises(TypeError, match="read-only"):
        ext.zero_bytes(b"abc")
    with deleters_balanced(1):
        c = capsule(np.arange(3.0), flags=1)
        with pytest.raises(TypeError, match="read-only"):
            ext.fill_f64(c, 0.0)
