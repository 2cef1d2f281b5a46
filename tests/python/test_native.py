"""Parameters typed as Rust's own views: `&[T]`, `&mut [T]`, `ndarray`
views, and `TensorRef`/`TensorMut` under `#[order]`.

What the body's type needs (host memory, aligned for T, native byte order,
contiguity for slices) is guaranteed at the boundary: a read-only argument
that lacks it is converted (unless `#[noconvert]`), a writable one refused
with a TypeError (or the producer's BufferError) naming the function and
the parameter. Each input kind is tried with NumPy, PyTorch, JAX and buffer
objects.
"""

import array

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import dlcast_testext as t


def misaligned(n, dtype=np.float64, shape=None):
    """A NumPy array whose data address is not a multiple of its itemsize."""
    item = np.dtype(dtype).itemsize
    a = np.frombuffer(bytearray(n * item + 1), dtype, offset=1)
    a[:] = np.arange(n)
    assert a.ctypes.data % item != 0
    return a.reshape(shape) if shape else a


def torch_misaligned(n):
    x = torch.frombuffer(bytearray(n * 8 + 1), dtype=torch.float64, offset=1)
    x.copy_(torch.arange(n, dtype=torch.float64))
    assert x.data_ptr() % 8 != 0
    return x


# -- read-only slices: every input that lacks something converts -------------

READ_INPUTS = {
    "numpy": lambda: np.arange(6.0),
    "numpy-misaligned": lambda: misaligned(6),
    "numpy-byteswapped": lambda: np.arange(6.0).astype(">f8"),
    "numpy-strided": lambda: np.arange(12.0)[::2],
    "numpy-negative": lambda: np.arange(6.0)[::-1],
    "numpy-int64": lambda: np.arange(6),
    "torch": lambda: torch.arange(6, dtype=torch.float64),
    "torch-misaligned": lambda: torch_misaligned(6),
    "torch-strided": lambda: torch.arange(12, dtype=torch.float64)[::2],
    "torch-flipped": lambda: torch.arange(6, dtype=torch.float64).flip(0),  # a copy
    "jax": lambda: jnp.arange(6, dtype=jnp.float32),
    "memoryview": lambda: memoryview(np.arange(6.0).tobytes()).cast("d"),
    "array.array": lambda: array.array("d", range(6)),
}

# Which of those need a conversion (and so fail under #[noconvert]).
NEEDS_CONVERSION = {
    "numpy-misaligned", "numpy-byteswapped", "numpy-strided", "numpy-negative",
    "numpy-int64", "torch-misaligned", "torch-strided", "jax",
}


@pytest.mark.parametrize("kind", sorted(READ_INPUTS))
def test_read_only_slice_gets_what_it_needs(kind):
    x = READ_INPUTS[kind]()
    expected = float(np.asarray(x, dtype=np.float64).sum())
    assert t.slice_sum(x) == expected


@pytest.mark.parametrize("kind", sorted(READ_INPUTS))
def test_noconvert_slice_refuses_what_needs_conversion(kind):
    x = READ_INPUTS[kind]()
    if kind not in NEEDS_CONVERSION:
        assert t.slice_sum_nc(x) == float(np.asarray(x).sum())
        return
    with pytest.raises((TypeError, BufferError), match=r"slice_sum_nc\(\): argument 'x'"):
        t.slice_sum_nc(x)


def test_misaligned_error_says_why():
    with pytest.raises(TypeError, match="not aligned to 8 bytes for float64"):
        t.slice_sum_nc(misaligned(6))


def test_byteswapped_of_another_kind_does_not_convert():
    with pytest.raises(TypeError, match="does not convert to float64"):
        t.slice_sum(np.arange(3, dtype=">c16"))


def test_empty_and_0d_slices():
    assert t.slice_sum(np.zeros(0)) == 0.0
    assert t.slice_sum(torch.zeros(0, dtype=torch.float64)) == 0.0
    assert np.isnan(t.slice_first(np.zeros(0, np.float32)))
    # A slice is 1-D: a 0-d array is a shape error, not a 1-element slice.
    with pytest.raises(TypeError, match=r"expected shape \(_,\), got \(\)"):
        t.slice_sum(np.float64(3.0))
    with pytest.raises(TypeError, match=r"expected shape \(_,\), got \(2, 3\)"):
        t.slice_sum(np.zeros((2, 3)))


def test_optional_slice():
    assert t.slice_first() is None
    assert t.slice_first(None) is None
    assert t.slice_first(np.array([4.0, 5.0], np.float32)) == 4.0


def test_dtype_generic_slice():
    assert t.generic_slice_sum(np.arange(4, dtype=np.int32)) == 6.0
    assert t.generic_slice_sum(np.arange(4, dtype=np.float32)[::2]) == 2.0  # converted
    assert t.generic_slice_sum(misaligned(4)) == 6.0
    with pytest.raises(TypeError, match="generic_slice_sum"):
        t.generic_slice_sum(np.arange(4, dtype=np.int8))


def test_bool_slice_values_are_checked():
    assert t.native_count_true(np.array([True, False, True])) == 2
    bad = np.array([1, 0, 2], np.uint8).view(np.bool_)
    with pytest.raises(ValueError, match=r"native_count_true\(\): argument 'x'.*not valid bool"):
        t.native_count_true(bad)


# -- writable slices: refused unless the caller's own memory fits ------------

def test_writable_slice_writes_through():
    for x in (np.zeros(4), torch.zeros(4, dtype=torch.float64), array.array("d", [0.0] * 4)):
        t.slice_fill(x, 3.0)
        assert list(np.asarray(x)) == [3.0] * 4
    buf = bytearray(32)
    t.slice_fill(np.frombuffer(buf, np.float64), 2.0)
    assert np.frombuffer(buf, np.float64).tolist() == [2.0] * 4


WRITE_REFUSED = {
    "numpy-misaligned": (lambda: misaligned(6), TypeError, "not aligned"),
    "numpy-byteswapped": (lambda: np.zeros(6, ">f8"), BufferError, "byte order"),
    "numpy-strided": (lambda: np.zeros(12)[::2], TypeError, "C-contiguous"),
    "numpy-negative": (lambda: np.zeros(6)[::-1], TypeError, "C-contiguous"),
    "numpy-int64": (lambda: np.zeros(6, np.int64), TypeError, "dtype float64"),
    "numpy-readonly": (lambda: _readonly(), TypeError, "read-only"),
    "torch-misaligned": (lambda: torch_misaligned(6), TypeError, "not aligned"),
    "torch-strided": (lambda: torch.zeros(12, dtype=torch.float64)[::2], TypeError,
                      "C-contiguous"),
    "jax": (lambda: jnp.zeros(6), TypeError, "read-only|dtype"),
    "bytes": (lambda: bytes(48), TypeError, "read-only|dtype"),
}


def _readonly():
    a = np.zeros(6)
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("kind", sorted(WRITE_REFUSED))
def test_writable_slice_refuses(kind):
    make, exc, match = WRITE_REFUSED[kind]
    x = make()
    before = bytes(memoryview(np.ascontiguousarray(np.asarray(x)))) if not isinstance(
        x, torch.Tensor) else x.clone()
    with pytest.raises(exc, match=match):
        t.slice_fill(x, 9.0)
    if isinstance(x, torch.Tensor):
        assert torch.equal(x, before)
    else:
        assert bytes(memoryview(np.ascontiguousarray(np.asarray(x)))) == before


# -- ndarray views ------------------------------------------------------------

ND_INPUTS = {
    "numpy": lambda: np.arange(6.0).reshape(2, 3),
    "numpy-transposed": lambda: np.arange(6.0).reshape(3, 2).T,
    "numpy-negative": lambda: np.arange(12.0).reshape(3, 4)[::-1, ::-2],
    "numpy-misaligned": lambda: misaligned(6, shape=(2, 3)),
    "numpy-byteswapped": lambda: np.arange(6.0).reshape(2, 3).astype(">f8"),
    "numpy-broadcast": lambda: np.broadcast_to(np.arange(3.0), (2, 3)),
    "torch-transposed": lambda: torch.arange(6, dtype=torch.float64).reshape(3, 2).T,
    "torch-flipped": lambda: torch.arange(6, dtype=torch.float64).reshape(2, 3).flip(1),
    "jax": lambda: jnp.arange(6, dtype=jnp.float32).reshape(2, 3),
    "memoryview": lambda: memoryview(np.arange(6.0).tobytes()).cast("d", (2, 3)),
}


@pytest.mark.parametrize("kind", sorted(ND_INPUTS))
def test_ndarray_view_reads_in_c_order(kind):
    x = ND_INPUTS[kind]()
    expected = np.asarray(x, dtype=np.float64)
    assert t.nd2_elements(x) == expected.ravel().tolist()
    assert t.nd2_sum(x) == float(expected.sum())


def test_ndarray_view_keeps_strides_without_copy():
    base = np.arange(12.0).reshape(3, 4)
    shape, strides = t.nd2_layout(base[::-1, ::2])
    assert shape == [3, 2]
    assert strides == [-4, 2]  # elements, negative kept: no copy was made
    assert t.nd2_layout(base.T) == ([4, 3], [1, 4])


def test_ndarray_noconvert():
    with pytest.raises(TypeError, match=r"nd2_sum_nc\(\): argument 'x'.*not aligned"):
        t.nd2_sum_nc(misaligned(6, shape=(2, 3)))
    with pytest.raises(BufferError, match="byte order"):
        t.nd2_sum_nc(np.zeros((2, 3), ">f8"))
    # Strides alone never need a conversion for an ndarray view.
    assert t.nd2_sum_nc(np.arange(12.0).reshape(3, 4)[::-1, ::2]) == 30.0


def test_ndarray_rank_comes_from_the_type():
    with pytest.raises(TypeError, match=r"nd2_sum\(\): argument 'x': expected shape \(_, _\)"):
        t.nd2_sum(np.arange(6.0))
    assert t.nd3_len(np.zeros((2, 3, 4), np.float32)) == 24
    with pytest.raises(TypeError, match="nd3_len"):
        t.nd3_len(np.zeros((2, 3), np.float32))
    assert t.nd_dyn_shape(np.zeros((2, 0, 3), np.float32)) == [2, 0, 3]
    assert t.nd_dyn_shape(np.float32(1.0)) == []
    assert t.nd0_value(np.array(2.5)) == 2.5
    assert t.nd0_value(torch.tensor(1.5, dtype=torch.float64)) == 1.5


def test_ndarray_mut_writes_through_any_strides():
    y = np.arange(6.0).reshape(2, 3)
    t.nd2_scale(y.T, 2.0)
    np.testing.assert_array_equal(y, np.arange(6.0).reshape(2, 3) * 2)
    z = np.arange(12.0).reshape(3, 4)
    t.nd2_scale(z[::-1, ::2], -1.0)
    assert (z[:, ::2] < 0).sum() == 5 and (z[:, 1::2] > 0).all()  # 0 stays 0
    tt = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    t.nd2_scale(tt.T, 3.0)
    assert tt.tolist() == [[0, 3, 6], [9, 12, 15]]


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (lambda: misaligned(6, shape=(2, 3)), TypeError, "not aligned"),
        (lambda: np.broadcast_to(np.arange(3.0), (2, 3)), TypeError, "read-only"),
        (lambda: np.zeros((2, 3), ">f8"), BufferError, "byte order"),
        (lambda: np.zeros((2, 3), np.float32), TypeError, "dtype float64"),
        (lambda: jnp.zeros((2, 3), jnp.float32), TypeError, "dtype|read-only"),
        (lambda: np.lib.stride_tricks.as_strided(np.zeros(4), (2, 3), (8, 8)), TypeError,
         "two indices|read-only"),
    ],
)
def test_ndarray_mut_refuses(make, exc, match):
    with pytest.raises(exc, match=match):
        t.nd2_scale(make(), 2.0)


def test_ndarray_and_slice_named_extents():
    pts = np.ones((4, 3), np.float32)
    assert t.native_centroid(pts, np.ones(4, np.float32)) == [1.0, 1.0, 1.0]
    with pytest.raises(TypeError, match="dimension 'n' is 4 in 'points' but 5 in 'weights'"):
        t.native_centroid(pts, np.ones(5, np.float32))
    with pytest.raises(TypeError, match=r"expected shape \(n, 3\)"):
        t.native_centroid(np.ones((4, 2), np.float32), np.ones(4, np.float32))


# -- dlcast's views under #[order]: alignment guaranteed --------------------

def test_order_c_tensorref_converts_misaligned():
    m = misaligned(6, np.float32, (2, 3))
    assert t.ordered_sum(m) == 15.0
    assert t.ordered_sum(np.arange(6, dtype=np.float32)[::-1]) == 15.0


def test_order_c_tensormut_refuses_misaligned():
    m = misaligned(6, np.float32, (2, 3))
    with pytest.raises(TypeError, match=r"ordered_double\(\): argument 'x'.*not aligned to 4"):
        t.ordered_double(m)
    ok = np.arange(6, dtype=np.float32)
    t.ordered_double(ok)
    assert ok.tolist() == [0, 2, 4, 6, 8, 10]


def test_slices_go_into_detach():
    assert t.detached_sum(np.arange(5.0)) == 10.0
