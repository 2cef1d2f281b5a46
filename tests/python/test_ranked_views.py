"""Views whose type fixes the rank (`TensorRef<'_, T, N>`) and the accessors
of every view (`get`, iterators, `copy_into`, `into_rank`, reshapes): they
agree with NumPy on every layout, refuse out-of-bounds indices with errors
naming the call, and views over Rust data are copied when returned.
"""

import gc

import numpy as np
import pytest
import torch

import dlcast_testext as ext
from conftest import capsule, deleters_balanced


def by_address(x):
    """The elements of `x` sorted by their address (ties: C order)."""
    idx = np.indices(x.shape).reshape(x.ndim, -1)
    addr = sum(i * s for i, s in zip(idx, x.strides)) if x.ndim else np.zeros(1, int)
    order = np.argsort(addr, kind="stable")
    return x.ravel()[order].tolist()


def layouts():
    """2-d float64 arrays of every kind of layout, with their values."""
    a = np.arange(1.0, 13.0).reshape(3, 4)
    return [
        a,
        np.asfortranarray(a),
        a.T,
        a[::-1, ::2],
        a[1:, ::-3],
        np.broadcast_to(np.arange(4.0), (3, 4)),
        a[:0],
        np.zeros((4, 0)),
    ]


@pytest.mark.parametrize("x", layouts(), ids=lambda x: f"{x.shape}{x.strides}")
def test_get_and_iter_agree_with_numpy_on_every_layout(x):
    assert ext.rk_all2(x) == x.ravel().tolist()
    assert ext.rk_iter(x) == x.ravel().tolist()
    assert ext.rk_as_array2(x) == (list(x.shape), x.ravel().tolist())
    if x.size:
        i, j = x.shape[0] - 1, x.shape[1] - 1
        assert ext.rk_get2(x, i, j) == x[i, j]
        assert ext.rk_get_dyn(x, [i, j]) == x[i, j]
    # Memory order: every index once, in increasing address order.
    mem = ext.rk_iter_memory(x)
    assert sorted(mem) == sorted(x.ravel().tolist())
    assert mem == by_address(x)
    assert ext.rk_iter_len(x) == (x.size, x.size)


def test_unaligned_and_byte_offset_memory_is_read():
    # Element 0 at an odd address: a typed view's host memory is aligned at
    # the boundary, so that no accessor fails on alignment: a NumPy array
    # and a capsule (from what its one read described) through an aligned
    # copy.
    def c():
        data = bytes(3) + np.arange(6.0).tobytes()
        return ext.make_capsule(data, [2, 3], [3, 1], dtype=(2, 64, 1), data_offset=3)

    assert ext.rk_all2(c()) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert ext.rk_iter(c()) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert ext.rk_iter_memory(c()) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert ext.rk_as_array2(c()) == ([2, 3], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    assert ext.values(c()) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]  # untyped: read in place
    u = np.frombuffer(bytearray(49), np.float64, offset=1).reshape(2, 3)
    u[:] = np.arange(6.0).reshape(2, 3)
    assert u.ctypes.data % 8 != 0
    assert ext.rk_all2(u) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert ext.rk_iter_memory(u) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert ext.rk_as_array2(u) == ([2, 3], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    c = capsule(np.arange(6.0).reshape(2, 3), byte_offset=8, shape=[2, 2], strides=[3, 1])
    assert ext.rk_all2(c) == [1.0, 2.0, 4.0, 5.0]


def test_zero_d_and_rank_mismatch():
    assert ext.rk_get0(np.array(2.5)) == 2.5
    assert ext.rk_get1(np.arange(3.0), 2) == 2.0
    assert ext.rk_iter(np.array(7.0)) == [7.0]
    assert ext.rk_iter_memory(np.array(7.0)) == [7.0]
    with pytest.raises(TypeError) as info:
        ext.rk_get2(np.zeros(3), 0, 0)
    # The rank the type fixes is checked at the boundary, as a #[shape].
    assert str(info.value) == "rk_get2(): argument 'x': expected shape (_, _), got (3,)"
    with pytest.raises(TypeError, match=r"rk_get0\(\): argument 'x': expected shape \(\), got \(1,\)"):
        ext.rk_get0(np.zeros(1))
    with pytest.raises(TypeError, match=r"rk_set2\(\): argument 'out': expected shape \(_, _\), got \(2, 2, 2\)"):
        ext.rk_set2(np.zeros((2, 2, 2)), 0, 0, 1.0)
    with pytest.raises(TypeError, match=r"into_rank\(\): expected an array of 2 dimensions"):
        ext.rk_into_rank2(np.zeros((1, 2, 3)))
    assert ext.rk_into_rank2(np.zeros((2, 5))) == [2, 5]


def test_out_of_bounds_is_an_index_error_naming_function_parameter_and_index():
    a = np.arange(9.0).reshape(3, 3)
    with pytest.raises(IndexError) as info:
        ext.rk_get2(a, 3, 0)
    assert str(info.value) == "rk_get2(): argument 'x': get(): index (3, 0) is out of bounds for shape (3, 3)"
    with pytest.raises(IndexError, match=r"rk_get2\(\): argument 'x': get\(\): index \(0, 0\) is out of bounds for shape \(0, 3\)"):
        ext.rk_get2(a[:0], 0, 0)
    with pytest.raises(IndexError) as info:
        ext.rk_get_dyn(a, [1])
    assert str(info.value) == (
        "rk_get_dyn(): argument 'x': get(): index (1,) has 1 entry, the array 2 dimensions (shape (3, 3))"
    )
    with pytest.raises(IndexError, match=r"index \(0, 0, 0\) has 3 entries"):
        ext.rk_get_dyn(a, [0, 0, 0])
    with pytest.raises(IndexError, match=r"index \(18446744073709551615, 0\) is out of bounds"):
        ext.rk_get2(a, 2**64 - 1, 0)
    # Writes out of bounds raise and write nothing.
    out = np.zeros((2, 3))
    with pytest.raises(IndexError) as info:
        ext.rk_set2(out, 0, 3, 1.0)
    assert str(info.value) == "rk_set2(): argument 'out': set(): index (0, 3) is out of bounds for shape (2, 3)"
    with pytest.raises(IndexError, match=r"rk_set_dyn\(\): argument 'out': set\(\): index \(2,\) has 1 entry"):
        ext.rk_set_dyn(out, [2], 1.0)
    assert not out.any()


def test_writes_reach_every_layout():
    base = np.zeros((4, 6))
    out = base[::-2, 1::2]
    ext.rk_set2(out, 1, 2, 7.0)
    assert base[1, 5] == 7.0 and base.sum() == 7.0
    ext.rk_set_all2(out, 3.0)
    assert (out == 3.0).all() and base.sum() == 3.0 * out.size
    base[:] = 0
    ext.rk_copy_from(out, list(range(out.size)))
    assert out.ravel().tolist() == list(range(out.size))
    with pytest.raises(ValueError, match=r"rk_copy_from\(\): argument 'out': copy_from_slice\(\): shape \(2, 3\) holds 6 elements, the slice 2"):
        ext.rk_copy_from(out, [1.0, 2.0])
    assert ext.rk_as_array_mut2(out, 5.0) == [2, 3]
    assert (out == 5.0).all() and base.sum() == 30.0
    t = torch.zeros(3, 4, dtype=torch.float64).t()
    ext.rk_set2(t, 3, 2, 1.5)
    assert t[3, 2] == 1.5 and t.sum() == 1.5


def test_box_filter_with_rank_typed_accessors_matches_numpy():
    rng = np.random.default_rng(3)
    img = rng.random((7, 9), dtype=np.float32)
    for src in (img, img[::-1], np.asfortranarray(img), torch.from_numpy(img.copy())):
        out = np.zeros((7, 9), np.float32)[:, ::-1]
        ext.rk_box3(src, out)
        arr = np.asarray(src)
        padded = np.pad(arr, 1, mode="edge")
        want = sum(padded[dy : dy + 7, dx : dx + 9] for dy in range(3) for dx in range(3)) / 9.0
        np.testing.assert_allclose(out, want, rtol=1e-5)


def test_readme_centroid():
    points = np.array([[0.0, 0.0, 0.0], [2.0, 4.0, 6.0]], np.float32)
    assert ext.centroid(points, np.ones(2, np.float32)) == [1.0, 2.0, 3.0]
    assert ext.centroid(points, np.array([3.0, 1.0], np.float32)) == [0.5, 1.0, 1.5]


def test_dims_and_device_memory():
    x = np.zeros((2, 3, 4), np.float32)[:, ::-1]
    assert ext.rk_dims3(x) == ([2, 3, 4], [12, -4, 1])
    with deleters_balanced(3):
        c = capsule(np.zeros((2, 3, 4), np.float32), device=(2, 0), null_data=False)
        assert ext.rk_dims3(c) == ([2, 3, 4], [12, 4, 1])
        c = capsule(np.zeros((2, 2), np.float32), device=(2, 0), null_data=False)
        with pytest.raises(ValueError) as info:
            ext.rk_device_get2(c)
        assert str(info.value) == (
            "rk_device_get2(): argument 'x': get(): the array is on cuda:0, not in memory the CPU can access"
        )
        c = capsule(np.zeros((2, 2), np.float32), device=(2, 0), null_data=False)
        assert ext.rk_device_iter(c) == (
            "rk_device_iter(): argument 'x': iter(): the array is on cuda:0, not in memory the CPU can access",
            "rk_device_iter(): argument 'x': iter_memory_order(): the array is on cuda:0, not in memory the CPU "
            "can access",
        )
    # Pinned host memory is readable.
    assert ext.rk_device_get2(capsule(np.full((1, 1), 4.0, np.float32), device=(3, 0))) == 4.0


def test_iterators_of_huge_broadcasts_are_lazy():
    x = np.lib.stride_tricks.as_strided(np.arange(3.0), (2**40, 3), (0, 8))
    assert ext.rk_iter_len(x) == (2**40 * 3, 2**40 * 3)
    assert ext.rk_iter(x)[:6] == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]
    assert len(ext.rk_iter_memory(x)) == 10_000


def test_views_over_rust_data_are_copied_when_returned():
    a = ext.rk_rust_view(5)
    assert np.asarray(a).tolist() == [4.0, 3.0, 2.0, 1.0, 0.0]
    assert np.from_dlpack(a).flags.c_contiguous
    assert ext.rk_from_slice_error(5, [2, 3]) == "from_slice(): shape (2, 3) holds 6 elements, the slice 5"
    assert ext.rk_from_slice_error(6, [6]) == "from_slice(): expected an array of 2 dimensions, got shape (6,)"
    assert ext.rk_from_slice_error(6, [3, 2]) is None
    assert ext.rk_from_slice_error(1, [2**63, 2**2]) is not None


def test_rank_typed_views_of_inputs_are_returned_zero_copy():
    a = np.arange(12.0).reshape(3, 4)
    out = ext.rk_first_rows_flipped(a, 2)
    assert isinstance(out, np.ndarray)
    assert out.tolist() == a[:2, ::-1].tolist()
    assert np.shares_memory(out, a)


def collect():
    for _ in range(3):
        gc.collect()


@pytest.mark.hostile
def test_seven_d_get_and_iter_with_negative_strides():
    x = np.arange(2.0**7).reshape((2,) * 7)[:, ::-1, :, ::-1, :, :, ::-1]
    idx = [1, 0, 1, 0, 1, 1, 0]
    assert ext.a2_get_dyn(x, idx) == x[tuple(idx)]
    with pytest.raises(IndexError, match="a2_get_dyn.*'x'.*out of bounds"):
        ext.a2_get_dyn(x, idx[:-1] + [2])
    with pytest.raises(IndexError, match="has 3 entries, the array 7 dimensions"):
        ext.a2_get_dyn(x, [1, 0, 1])
    assert ext.a2_iter7(x) == x.ravel().tolist()
    assert ext.live_borrows() == 0


@pytest.mark.hostile
def test_into_rank_and_reshape():
    with pytest.raises(TypeError, match=r"a2_into_rank2\(\): argument 'x': into_rank\(\): expected an array of 2 dimensions, got shape \(3,\)"):
        ext.a2_into_rank2(np.zeros(3))
    x = np.arange(6.0)
    assert ext.a2_reshape_get(x, [2, 3], 1, 2) == x.reshape(2, 3)[1, 2]
    assert ext.a2_reshape_get(x, [3, 2], 2, 1) == x.reshape(3, 2)[2, 1]
    with pytest.raises(IndexError):
        ext.a2_reshape_get(x, [3, 2], 1, 2)
    with pytest.raises(ValueError, match="reshape"):
        ext.a2_reshape_get(x[::2], [1, 3], 0, 0)
    assert ext.live_borrows() == 0


@pytest.mark.hostile
def test_copy_into_flipped_transpose_and_set_after_slice():
    o = np.zeros((2, 3))
    ext.a2_copy_into_flipped_t(o, [float(i) for i in range(6)])
    expected = np.zeros((2, 3))
    expected.T[::-1].flat[:] = np.arange(6.0)
    assert np.array_equal(o, expected)
    with pytest.raises(ValueError, match="copy_from_slice"):
        ext.a2_copy_into_flipped_t(o, [1.0] * 5)
    o = np.zeros((4, 3))
    with pytest.raises(IndexError, match=r"index \(2, 0\) is out of bounds for shape \(2, 3\)"):
        ext.a2_set_after_slice(o, 2, 2, 0, 1.0)
    assert not o.any()
    ext.a2_set_after_slice(o, 2, 1, 2, 1.0)
    assert o[1, 2] == 1.0 and o.sum() == 1.0
    assert ext.live_borrows() == 0


@pytest.mark.hostile
def test_as_array_of_a_permuted_strided_view():
    x = np.arange(24.0).reshape(2, 3, 4)[:, ::-1, ::2]
    shape, total = ext.a2_as_array_permuted(x)
    assert shape == list(np.transpose(x, (2, 0, 1)).shape)
    assert total == x.sum()


@pytest.mark.hostile
def test_rust_data_views_are_copied():
    grid = np.arange(6.0).reshape(2, 3)
    f = ext.a2_rust_flipped()
    assert np.array_equal(f, grid[::-1, ::-1])
    assert f.flags.writeable
    f[0, 0] = 100.0  # a copy: the static stays as it was
    assert np.array_equal(ext.a2_rust_flipped(), grid[::-1, ::-1])
    b = ext.a2_rust_broadcast(4)
    assert np.array_equal(b, np.broadcast_to(grid[0], (4, 3)))
    h = ext.VecHolder(4)
    v = h.view()
    h.fill(9.0)
    h.clear()
    collect()
    assert v.tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(MemoryError):
        ext.a2_rust_broadcast(2**60)



@pytest.mark.hostile
def test_iterators_and_get_on_random_strided_layouts():
    import random

    rng = random.Random(7)
    base = np.arange(1.0, 401.0)
    checked = 0
    while checked < 400:
        nd = rng.randint(0, 5)
        shape = [rng.choice([0, 1, 1, 2, 3, 4]) for _ in range(nd)]
        strides = [rng.choice([0, 1, 2, 3, -1, -2, 5, -7, 12]) for _ in range(nd)]
        lo = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides) if n > 0)
        hi = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides) if n > 0)
        if hi - lo >= len(base):
            continue
        x = np.lib.stride_tricks.as_strided(base[-lo:], shape, [s * 8 for s in strides])
        assert ext.rk_iter(x) == x.ravel().tolist()
        assert sorted(ext.rk_iter_memory(x)) == sorted(x.ravel().tolist())
        if x.size and x.ndim:
            idx = [rng.randrange(n) for n in x.shape]
            assert ext.rk_get_dyn(x, idx) == x[tuple(idx)]
        checked += 1
    assert ext.live_borrows() == 0


@pytest.mark.hostile
def test_copy_from_slice_on_random_non_overlapping_layouts():
    import itertools
    import random

    rng = random.Random(3)
    checked = 0
    while checked < 300:
        nd = rng.randint(0, 4)
        shape = [rng.choice([0, 1, 2, 3, 4]) for _ in range(nd)]
        strides = [rng.choice([0, 1, 2, -1, -2, 5, -7, 12]) for _ in range(nd)]
        lo = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides) if n > 0)
        hi = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides) if n > 0)
        if hi - lo >= 300:
            continue
        base = np.zeros(300)
        x = np.lib.stride_tricks.as_strided(base[-lo:], shape, [s * 8 for s in strides], writeable=True)
        offsets = [sum(i * s for i, s in zip(ix, strides)) for ix in itertools.product(*map(range, shape))]
        vals = [float(i + 1) for i in range(x.size)]
        try:
            ext.rk_copy_from(x, vals)
        except TypeError:
            # Refused (overlapping, or interleaved: see the test of interleaved layouts):
            # nothing written.
            assert not base.any()
            continue
        assert len(set(offsets)) == len(offsets), (shape, strides)
        assert x.ravel().tolist() == vals
        assert base.sum() == sum(vals)  # no stray writes
        checked += 1
    assert ext.live_borrows() == 0


@pytest.mark.hostile
def test_extent_one_dims_with_extreme_strides():
    from conftest import capsule

    m = -(2**63)
    a = np.arange(3.0)
    assert ext.rk_get2(capsule(a.reshape(1, 3), strides=[m, 1]), 0, 2) == 2.0
    with pytest.raises(IndexError, match=r"index \(1, 0\) is out of bounds for shape \(1, 3\)"):
        ext.rk_get2(capsule(a.reshape(1, 3), strides=[m, 1]), 1, 0)
    assert ext.rk_iter(capsule(a.reshape(1, 3), strides=[m, 1])) == [0.0, 1.0, 2.0]
    assert ext.rk_iter_memory(capsule(a.reshape(3, 1), strides=[1, m])) == [0.0, 1.0, 2.0]
    assert ext.rk_as_array2(capsule(a.reshape(3, 1), strides=[1, m])) == ([3, 1], [0.0, 1.0, 2.0])
    empty = lambda: capsule(np.zeros(0), shape=[0, 2**62], strides=[m, 2**62])  # noqa: E731
    assert ext.rk_iter(empty()) == []
    assert ext.rk_as_array2(empty()) == ([0, 2**62], [])
    with pytest.raises(IndexError):
        ext.rk_get_dyn(empty(), [0, 0])
    assert ext.a2_as_array_permuted(capsule(a.reshape(3, 1, 1), strides=[1, m, 2**62])) == ([1, 3, 1], 3.0)
    assert np.asarray(ext.rk_first_rows_flipped(capsule(a.reshape(1, 3), strides=[m, 1]), 1)).tolist() == [[2.0, 1.0, 0.0]]
    assert ext.live_borrows() == 0


# --- several views of one argument --------------------------------------------


@pytest.mark.parametrize("make", [np.asarray, torch.from_numpy], ids=["numpy", "torch"])
def test_one_argument_gives_a_view_of_each_item(make):
    # `x.index_axis(0, i)` borrows the argument's view: a batch splits into
    # N views of its own memory (no copy), and the argument stays whole.
    base = np.arange(12, dtype=np.float32).reshape(4, 3)
    x = make(base)
    sums, ptrs = ext.body_item_sums(x)
    assert sums == base.sum(axis=1).tolist()
    start = base.ctypes.data
    assert ptrs == [start + 12 * i for i in range(4)]
    col, shape = ext.body_column(x, 2)
    assert (col, shape) == ([2.0, 5.0, 8.0, 11.0], [4, 3])
    # Strided arguments too: a transposed argument's items are its columns.
    sums, ptrs = ext.body_item_sums(make(base).T)
    assert sums == base.sum(axis=0).tolist()
    assert ptrs == [start + 4 * j for j in range(3)]


@pytest.mark.parametrize("make", [np.zeros, torch.zeros], ids=["numpy", "torch"])
def test_writable_views_lend_shorter_writable_views(make):
    # `index_axis_mut` and `reborrow` give writable views of the argument
    # for a while; the argument's own view is usable again afterwards.
    out = make((3, 2), dtype=np.float32 if make is np.zeros else torch.float32)
    ext.body_fill_rows(out)
    assert np.asarray(out).tolist() == [[-0.0, 0.0], [-1.0, 1.0], [-2.0, 2.0]]


def test_an_untyped_writable_view_gives_its_address():
    a = np.zeros(5, np.float64)
    assert ext.body_dyn_mut_ptr(a[1:]) == (a.ctypes.data + 8, a.ctypes.data + 8)
