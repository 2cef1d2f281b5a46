"""Parameters typed as Rust's own views: `&[T]`, `&mut [T]`, `ndarray`
views. What each accepts, converts or refuses; bools are checked; a writable
view never reaches an element twice; the memory is the caller's unless a
conversion was needed.
"""

import array
import itertools
import random

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from numpy.lib.stride_tricks import as_strided

import dlcast_testext as t
from conftest import capsule


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


def test_writable_slice_writes_through():
    for x in (np.zeros(4), torch.zeros(4, dtype=torch.float64), array.array("d", [0.0] * 4)):
        t.slice_fill(x, 3.0)
        assert list(np.asarray(x)) == [3.0] * 4
    buf = bytearray(32)
    t.slice_fill(np.frombuffer(buf, np.float64), 2.0)
    assert np.frombuffer(buf, np.float64).tolist() == [2.0] * 4


WRITE_REFUSED = {
    "numpy-misaligned": (lambda: misaligned(6), TypeError, "not aligned"),
    "numpy-byteswapped": (lambda: np.zeros(6, ">f8"), TypeError, "byte order"),
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
    # Byte order a noconvert parameter cannot read: the TypeError with the
    # fix, NumPy's refusal kept as the cause.
    with pytest.raises(TypeError, match=r"nd2_sum_nc\(\): argument 'x': .*byte order.*noconvert") as info:
        t.nd2_sum_nc(np.zeros((2, 3), ">f8"))
    assert isinstance(info.value.__cause__, BufferError)
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
        (lambda: np.zeros((2, 3), ">f8"), TypeError, "byte order"),
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
SHARE = r"share memory, and '\w+' is writable"


def misaligned_f64(values):
    """A float64 NumPy array at an odd address, holding `values`."""
    n = len(values)
    a = np.frombuffer(bytearray(8 * n + 1), np.float64, offset=1)
    a[:] = values
    assert a.ctypes.data % 8 != 0
    return a


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_a_buffer_type_without_mro_is_read_without_a_panic():
    """`_testbuffer.ndarray` (CPython's own buffer test type) is a static
    type its module never readies: `tp_mro` stays NULL until Python code
    first looks an attribute up on the type. dlcast's
    `exchange::torch_in_mro` calls PyO3's `PyType::mro()`, which panics on
    the NULL (`PanicException: PyObject pointer is null`) -- for every
    parameter type, slices included. Expected: the buffer is read (or a
    TypeError/BufferError), never a panic."""
    import subprocess
    import sys

    code = (
        "import _testbuffer as tb, dlcast_testext as t\n"
        "x = tb.ndarray([1.0, 2.0], shape=[2], format='d')\n"
        "print('RESULT', t.slice_sum(x), t.first_f64(x))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert "PanicException" not in proc.stderr, proc.stderr[-1500:]
    assert "RESULT 3.0 1.0" in proc.stdout, proc.stderr[-1500:]


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_a_refused_bool_argument_leaves_the_torch_version_alone():
    """`mut_and_bool(a: &mut [f32], mask: &[bool])`: `mask` holds a byte 2,
    so the call is refused (ValueError) and `a` is not written -- but the
    `bool` check runs in `take` (native.rs `check_native`), after phase 2
    bumped `a`'s PyTorch version counter, so a graph that saved `a` for
    backward now raises for a write that never happened. Expected: every
    check that can refuse the call runs before the bump."""
    a = torch.zeros(3)
    version = a._version
    bad = np.array([0, 1, 2], np.uint8).view(np.bool_)
    with pytest.raises(ValueError, match="not valid bool"):
        t.mut_and_bool(a, bad)
    assert a.tolist() == [0.0] * 3
    assert a._version == version


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_ndarray_shape_error_says_what_is_wrong():
    """An empty array whose non-zero extents multiply past isize::MAX
    (shape (0, 2**62, 2**62)) is refused as "ndarray refuses the shape":
    neither the shape nor the limit. Expected: the message names the shape
    and the constraint."""
    x = capsule(np.zeros(0), shape=[0, 2**62, 2**62], strides=[1, 1, 1])
    with pytest.raises(TypeError) as info:
        t.ndd_values(x)
    msg = str(info.value)
    assert msg.startswith("ndd_values(): argument 'x'")
    assert "(0, 4611686018427387904, 4611686018427387904)" in msg


def _invalid_bools():
    return {
        "0d": (t.bool_nd0, np.array(2, np.uint8).view(np.bool_)),
        "0d-dyn": (t.bool_ndd, np.array(2, np.uint8).view(np.bool_)),
        "broadcast": (t.bool_ndd, np.broadcast_to(np.array([2], np.uint8).view(np.bool_), (3,))),
        "negative-stride": (t.bool_ndd, np.array([0, 2, 1, 1], np.uint8).view(np.bool_)[::-2]),
        "mut-nd": (t.bool_nd_mut, np.array([0, 1, 2], np.uint8).view(np.bool_)),
        "mut-slice": (t.bool_slice_mut, np.array([0, 1, 2], np.uint8).view(np.bool_)),
        "optional": (t.bool_opt, np.array([0, 255], np.uint8).view(np.bool_)),
        "torch": (t.bool_ndd, torch.tensor([0, 1, 255], dtype=torch.uint8).view(torch.bool)),
        "memoryview": (t.bool_ndd, memoryview(bytes([0, 1, 2])).cast("?")),
        "capsule": (t.bool_ndd, capsule(np.array([2], np.uint8), dtype=(6, 8, 1))),
    }


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
@pytest.mark.parametrize("kind", sorted(_invalid_bools()))
def test_invalid_bool_bytes_never_reach_a_rust_bool(kind, balanced):
    func, x = _invalid_bools()[kind]
    before = bytes(np.asarray(x).view(np.uint8).tobytes()) if not str(type(x)).endswith(
        "PyCapsule'>") and not isinstance(x, memoryview) else None
    with pytest.raises(ValueError, match=rf"{func.__name__}\(\): argument 'x'.*not valid bool"):
        func(x)
    if before is not None:
        assert np.asarray(x).view(np.uint8).tobytes() == before


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_writable_ndarray_views_never_alias_random_layouts():
    """Random `as_strided` layouts (writeable, strides -6..6 elements): every
    layout dlcast accepts for `ArrayViewMutD` reaches each element once
    (checked by brute force), and the body's writes land in index order."""
    rng = random.Random(7)
    accepted = 0
    for _ in range(1500):
        nd = rng.randint(1, 3)
        shape = [rng.randint(1, 4) for _ in range(nd)]
        strides = [rng.randint(-6, 6) for _ in range(nd)]
        base = np.zeros(200)
        a = as_strided(base[100:], shape, [s * 8 for s in strides], writeable=True)
        offs = [sum(i * s for i, s in zip(idx, strides))
                for idx in itertools.product(*[range(n) for n in shape])]
        overlaps = len(set(offs)) != len(offs)
        try:
            n = t.ndd_mut_iota(a)
        except TypeError as e:
            assert "two indices" in str(e)
            continue
        accepted += 1
        assert not overlaps, (shape, strides)
        assert n == a.size
        assert np.array_equal(a.ravel(), np.arange(a.size, dtype=float))
    assert accepted > 500


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
@pytest.mark.parametrize(
    "make",
    [
        lambda: as_strided(np.zeros(1), (0,), (-8,)),
        lambda: as_strided(np.zeros(1), (0,), (2**60,)),
        lambda: as_strided(np.zeros(1), (0, 5), (3, -7)),
        lambda: capsule(np.zeros(0), shape=[0, 3], strides=[2**40, -(2**40)]),
    ],
)
def test_empty_arrays_with_any_strides(make, balanced):
    x = make()
    assert t.ndd_values(x) == []
    if np.asarray(x).ndim == 1 if not str(type(x)).endswith("PyCapsule'>") else False:
        assert t.slice_values(x) == []
        t.slice_fill(x, 1.0)


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_extent_one_strides_are_never_stepped(balanced):
    assert t.nd1_values(capsule(np.array([5.0]), strides=[-(2**63)])) == [5.0]
    assert t.slice_values(capsule(np.array([5.0]), strides=[-(2**63)])) == [5.0]
    assert t.ndd_values(capsule(np.array([[5.0], [6.0]]), strides=[1, -(2**63)])) == [5.0, 6.0]
    assert t.nd1_values(capsule(np.array([5.0, 6.0]), strides=[-1], byte_offset=8)) == [6.0, 5.0]


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_zero_strides_read_but_never_written(balanced):
    assert t.nd1_values(capsule(np.array([5.0, 6.0]), shape=[3], strides=[0])) == [5.0] * 3
    with pytest.raises(TypeError, match="two indices"):
        t.ndd_mut_iota(capsule(np.array([5.0, 6.0]), shape=[3], strides=[0]))
    # A slice needs one run of memory: a compact copy of the capsule's read.
    assert t.slice_values(capsule(np.array([5.0, 6.0]), shape=[3], strides=[0])) == [5.0] * 3
    # Misaligned (one byte into the producer's buffer): an aligned copy of
    # those bytes, whatever they hold.
    assert len(t.nd1_values(capsule(np.array([5.0, 6.0]), data_offset=1))) == 2


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_0d_is_not_a_slice():
    with pytest.raises(TypeError, match=r"expected shape \(_,\), got \(\)"):
        t.slice_values(np.array(1.0))
    with pytest.raises(TypeError, match=r"expected shape \(_,\), got \(\)"):
        t.nd1_values(np.array(1.0))
    assert t.ndd_values(torch.tensor(2.0, dtype=torch.float64)) == [2.0]


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_fitting_inputs_are_read_in_place():
    """No copy where none is needed: the slice is the caller's memory."""
    x = np.arange(5.0)
    assert t.slice_addr(x) == (x.ctypes.data, 5)
    tt = torch.arange(10, dtype=torch.float64)[2:7]
    assert t.slice_addr(tt) == (tt.data_ptr(), 5)
    assert t.slice_addr(memoryview(x)[1:]) == (x.ctypes.data + 8, 4)
    assert t.slice_addr(x[::-1])[0] != x.ctypes.data  # reversed: a copy


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_torch_tensors():
    assert t.slice_values(torch.arange(10, dtype=torch.float64)[3:6]) == [3.0, 4.0, 5.0]
    g = torch.ones(3, dtype=torch.float64, requires_grad=True)
    assert t.slice_values(g) == [1.0] * 3
    with pytest.raises(TypeError, match="requires grad"):
        t.slice_fill(g, 2.0)
    z = (torch.arange(2, dtype=torch.float64) * (1 + 1j)).conj()
    with pytest.raises(BufferError, match="conjugate bit"):
        t.c128_values(z)
    with pytest.raises(BufferError, match="negative bit"):
        t.slice_values(z.imag)
    assert t.c128_values(z.resolve_conj()) == [(0.0, -0.0), (1.0, -1.0)]


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_jax_and_array_api_strict():
    import array_api_strict as xp
    import jax.numpy as jnp

    assert t.slice_values(jnp.arange(3.0)) == [0.0, 1.0, 2.0]
    assert t.ndd_values(jnp.arange(6.0).reshape(2, 3).T) == [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    with pytest.raises(TypeError, match="read-only"):
        t.slice_fill(jnp.arange(3.0), 1.0)
    assert t.bool_ndd(xp.asarray([True, False, True])) == 2
    a = xp.asarray([1.0, 2.0])
    t.slice_fill(a, 5.0)
    assert [float(v) for v in a] == [5.0, 5.0]


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_the_rust_body_is_callable_from_rust():
    assert t.native_add_into_from_rust() == [11.0, 22.0, 33.0]
    a, b, c = np.arange(3.0), np.ones(3), np.zeros(3)
    t.native_add_into(a, b, c)
    assert c.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(TypeError, match="dimension 'n' is 3 in 'a' but 2 in 'c'"):
        t.native_add_into(a, b, np.zeros(2))
    with pytest.raises(TypeError, match=SHARE):
        t.native_add_into(a, b, a)


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_dtype_generic_writable_slice():
    x = np.ones(3, np.float32)
    assert t.generic_mut_zero(x) == 3 and not x.any()
    with pytest.raises(TypeError, match="generic_mut_zero"):
        t.generic_mut_zero(np.ones(3, np.int8))
    with pytest.raises(TypeError, match="not aligned"):
        t.generic_mut_zero(misaligned_f64([1.0, 2.0]))


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_array_array_and_bytes():
    assert t.slice_values(array.array("d", [1.0, 2.0])) == [1.0, 2.0]
    assert t.u8_values(b"\x01\x02") == b"\x01\x02"
    with pytest.raises(TypeError, match="read-only"):
        t.bool_slice_mut(memoryview(bytes([0, 1])).cast("?"))


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_exported_views_keep_their_writability():
    """A `dlcast.Array` view of an input, passed back to a writable slice:
    refused for read-only origins (read-only NumPy, `bytes`, JAX, a tensor
    that requires grad), written through for a writable one, and still
    seen as the same memory as its origin."""
    import jax.numpy as jnp

    ro = np.arange(4.0)
    ro.flags.writeable = False
    b = bytes(32)
    g = torch.ones(4, dtype=torch.float64, requires_grad=True)
    for origin in (ro, np.frombuffer(b, np.float64), jnp.arange(4.0), t.identity(g)):
        view = t.acc_reshape(origin, [4])
        with pytest.raises(TypeError, match="read-only"):
            t.slice_fill(view, 9.0)
    assert b == bytes(32) and ro.tolist() == [0.0, 1.0, 2.0, 3.0]
    x = np.arange(4.0)
    view = t.acc_reshape(x, [4])
    t.slice_fill(view, 9.0)
    assert x.tolist() == [9.0] * 4
    with pytest.raises(TypeError, match=SHARE):
        t.mut_and_ref(view, x)


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("ndim", [1, 7, 8, 9, 12])
def test_ndarray_views_of_many_dimensions_and_negative_strides(ndim):
    """`ndarray_parts` keeps up to 8 strides inline: views of more
    dimensions, with negative and zero strides, read every element in
    order (`ndd_values`) and write every element once (`ndd_mut_iota`)."""
    rng = np.random.default_rng(ndim)
    shape = tuple(int(s) for s in rng.integers(1, 3, size=ndim))
    base = np.arange(float(np.prod(shape) * 4)).reshape(shape[:-1] + (shape[-1] * 4,))
    x = base[..., ::-2]
    for axis in range(0, ndim, 2):
        x = np.flip(x, axis)
    assert t.ndd_values(x) == x.ravel().tolist()
    y = np.zeros(shape)[tuple(slice(None, None, -1) for _ in shape)]
    assert t.ndd_mut_iota(y) == y.size
    assert sorted(y.ravel().tolist()) == sorted(np.arange(float(y.size)).tolist())


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("ndim", [0, 1, 5, 8, 9, 11])
def test_typed_views_of_many_dimensions(ndim):
    """`Fast::of` caches up to a fixed number of extents and strides: typed
    views (`TensorRef<f64>`, `to_vec`) of more dimensions, reversed and
    strided, read every element in C order."""
    if ndim == 0:
        x = np.array(3.5)
    else:
        x = np.arange(float(2 ** ndim * 2)).reshape((2,) * (ndim - 1) + (4,))[..., ::-2]
    assert t.values(x) == np.ravel(x).tolist()
