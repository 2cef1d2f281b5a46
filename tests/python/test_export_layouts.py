"""The export paths and view accessors against hostile layouts: huge
broadcasts, extents beyond i64, huge and negative strides, empty arrays.
Each ends in a clear exception (MemoryError, ValueError, BufferError) or the
right values, never in a wrapped size, a panic or a leak.
"""

import gc
import itertools
import math
import os
import weakref

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import dlcast_testext as ext
from conftest import buffer_of


F64 = (2, 64, 1)
I64_MAX = 2**63 - 1
I64_MIN = -(2**63)
# Element counts whose copy can never be allocated: more bytes than a 47-bit
# address space (2**45 float64 = 256 TiB), or than isize::MAX.
UNALLOCATABLE = [2**45, 2**61 + 1]


def overcommit_always():
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def not_a_panic(e):
    """Whatever was raised is an ordinary `Exception`, not pyo3's
    `PanicException` (which derives from `BaseException`)."""
    assert isinstance(e, Exception), f"{type(e).__mro__}: {e}"
    assert type(e).__name__ != "PanicException", str(e)


def call(f, *args):
    """`("ok", result)` or `("err", exception)`; anything that is not an
    `Exception` (a panic) propagates and fails the test."""
    try:
        return "ok", f(*args)
    except Exception as e:  # noqa: BLE001 - the point is to catch them all
        not_a_panic(e)
        return "err", e


def balanced_exports():
    gc.collect()
    created, freed, caps, deleters = ext.export_stats()
    return created - freed, caps - deleters


# Checked sizes on export.

@pytest.mark.hostile
def test_memoryview_of_returned_torch_broadcast_raises_buffererror():
    x = torch.zeros(1, dtype=torch.float64).expand(2**61 + 1)
    a = ext.identity(x)
    assert a.shape == (2**61 + 1,)
    with pytest.raises(BufferError, match="Py_ssize_t"):
        buffer_of(a)
    # The same through a transform of the view (a slice keeps it huge).
    b = ext.acc_slice_axis(x, 0, 1, 2**61 + 1)
    with pytest.raises(BufferError, match="Py_ssize_t"):
        buffer_of(b)


@pytest.mark.hostile
def test_memoryview_of_a_broadcast_that_fits_has_the_right_length():
    x = np.broadcast_to(np.arange(1.0, 2.0), (2**40,))
    m = buffer_of(ext.identity(x))
    assert m.nbytes == 2**43 and m.strides == (0,) and m.shape == (2**40,)
    assert m[2**40 - 1] == 1.0


@pytest.mark.hostile
def test_returns_numpy_of_a_huge_broadcast_is_an_exception():
    x = torch.zeros(1, dtype=torch.float64).expand(2**61 + 1)
    kind, out = call(ext.identity_numpy, x)
    if kind == "ok":
        assert out.shape == (2**61 + 1,) and out[2**61] == 0.0


@pytest.mark.hostile
def test_extent_beyond_i64_is_refused_not_wrapped():
    # An empty shape holds no bytes, so its other extents are unchecked by
    # the byte size; 2**63 would have been exported as -2**63.
    with pytest.raises(ValueError, match="i64::MAX"):
        ext.tensor_zeros([0, 2**63])
    with pytest.raises(ValueError, match="i64::MAX"):
        ext.tensor_from_vec_strides(0, [2**64 - 1, 0], [1, 1])


@pytest.mark.hostile
@pytest.mark.parametrize(
    "shape, strides",
    [
        ([0, 3], [I64_MAX, I64_MAX]),
        ([2, 0], [I64_MIN, 1]),
        ([0], [I64_MIN]),
        ([1, 0, 5], [2**62, -(2**62), 2**61]),
    ],
)
def test_empty_tensor_with_huge_strides_exports(shape, strides):
    a = ext.tensor_from_vec_strides(0, shape, strides)
    assert a.shape == tuple(shape)
    # Byte strides of never-stepped dimensions that overflow are exported
    # as 0; every consumer reads an empty array of that shape.
    assert all(abs(s) * 8 <= I64_MAX for s in a.strides)
    m = buffer_of(a)
    assert m.nbytes == 0 and m.shape == tuple(shape)
    assert np.from_dlpack(a).shape == tuple(shape)


@pytest.mark.hostile
def test_huge_stride_of_an_extent_one_dimension_exports():
    # (2, 1) with stride i64::MAX on the extent-1 dimension: a legal layout
    # whose byte stride overflows; exported as 0, values unchanged.
    x = ext.make_capsule(np.array([1.0, 2.0]).tobytes(), [2, 1], [1, I64_MAX], dtype=F64)
    a = ext.identity(x)
    assert a.shape == (2, 1) and a.strides == (1, 0)
    assert buffer_of(a).tolist() == [[1.0], [2.0]]
    assert np.from_dlpack(a).tolist() == [[1.0], [2.0]]


# Allocations that cannot be satisfied raise MemoryError.

def broadcast(n):
    """A float64 array of `n` zeros broadcast from one element (NumPy caps
    sizes at 2**63 bytes; PyTorch goes further)."""
    if n < 2**56:
        return np.broadcast_to(np.zeros(1), (n,))
    return torch.zeros(1, dtype=torch.float64).expand(n)


def huge_broadcasts():
    sizes = list(UNALLOCATABLE)
    if not overcommit_always():
        sizes.insert(0, 2**40)  # 8 TiB: refused unless overcommit is "always"
    return sizes


@pytest.mark.hostile
@pytest.mark.parametrize("n", huge_broadcasts())
def test_dlpack_copy_true_of_huge_broadcast_raises_memoryerror(n):
    a = ext.identity(broadcast(n))
    before = balanced_exports()
    with pytest.raises(MemoryError, match="cannot allocate"):
        a.__dlpack__(copy=True)
    with pytest.raises(MemoryError):
        a.__dlpack__(copy=True, max_version=(1, 0))
    del a
    assert balanced_exports() == (before[0] - 1, before[1])


@pytest.mark.hostile
@pytest.mark.parametrize("n", huge_broadcasts())
def test_returns_jax_of_huge_broadcast_raises_memoryerror(n):
    x = broadcast(n)
    before = balanced_exports()
    with pytest.raises(MemoryError, match="cannot allocate"):
        ext.identity_jax(x)
    assert balanced_exports() == before


@pytest.mark.hostile
@pytest.mark.parametrize("n", huge_broadcasts())
def test_to_vec_of_huge_broadcast_raises_memoryerror(n):
    x = broadcast(n)
    with pytest.raises(MemoryError, match="cannot allocate"):
        ext.acc_to_vec(x)
    with pytest.raises(MemoryError):
        ext.sum_f64(x)


@pytest.mark.hostile
def test_to_vec_beyond_isize_raises_memoryerror():
    x = torch.zeros(1, dtype=torch.float64).expand(2**62)
    with pytest.raises(MemoryError, match="cannot allocate"):
        ext.acc_to_vec(x)


@pytest.mark.hostile
@pytest.mark.parametrize("shape", [[2**45], [2**20, 2**25], [2**59], [2**62], [2**32, 2**31]])
def test_tensor_zeros_and_from_fn_of_huge_shape_raise_memoryerror(shape):
    with pytest.raises(MemoryError, match="cannot allocate"):
        ext.tensor_zeros(shape)
    with pytest.raises(MemoryError, match="cannot allocate"):
        ext.tensor_from_fn(shape)
    # The Rust error is its own variant, distinct from a shape mismatch.
    assert ext.tensor_zeros_error(shape).startswith("OutOfMemory")


@pytest.mark.hostile
def test_tensor_zeros_count_overflow_stays_a_value_error():
    with pytest.raises(ValueError):
        ext.tensor_zeros([2**40, 2**40])
    assert ext.tensor_zeros_error([2**40, 2**40]).startswith("Length")
    assert ext.tensor_zeros_error([3, 4]) is None


# A refused export frees everything it holds, exactly once.

@pytest.mark.hostile
def test_returns_torch_of_negative_strides_is_a_clear_error_and_frees_all():
    x = np.arange(6.0)
    alive = weakref.ref(x)
    before = balanced_exports()
    for _ in range(2000):
        with pytest.raises(BufferError, match="negative stride"):
            ext.flipped_torch(x, 0)
    assert balanced_exports() == before
    del x
    gc.collect()
    assert alive() is None, "the refused export kept the input alive"


@pytest.mark.slow
@pytest.mark.hostile
def test_returns_torch_refusals_do_not_grow_rss():
    def rss():
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    x = torch.arange(2.0 * 2**16, dtype=torch.float64).reshape(2, -1)  # 1 MiB
    for _ in range(50):
        with pytest.raises(BufferError):
            ext.flipped_torch(x, 1)
    gc.collect()
    r0 = rss()
    for _ in range(500):
        with pytest.raises(BufferError):
            # A fresh tensor each time: a leak would keep 500 MiB alive.
            ext.flipped_torch(x.clone(), 1)
    gc.collect()
    assert rss() - r0 < 64 * 2**20


@pytest.mark.hostile
def test_accepted_negative_stride_of_extent_one_still_exports():
    # PyTorch takes a negative stride where it is never stepped along.
    y = np.zeros(1)[::-1]
    assert y.strides == (-8,)
    t = ext.identity_torch(y)
    assert t.tolist() == [0.0]


@pytest.mark.hostile
@pytest.mark.parametrize(
    "fn, make, exc",
    [
        (ext.flipped_torch, lambda: (np.arange(4.0).reshape(2, 2), 1), BufferError),
        (ext.identity_torch, lambda: (np.arange(4.0)[::-2],), BufferError),
        (ext.identity_jax, lambda: (np.broadcast_to(np.zeros(1), (2**45,)),), MemoryError),
        (ext.identity_numpy, lambda: (broadcast(2**62),), Exception),
        (ext.identity_array_api, lambda: (broadcast(2**62),), Exception),
    ],
)
def test_every_refused_export_path_frees_export_and_input(fn, make, exc):
    args = make()
    x = args[0]
    base = x.base if isinstance(x, np.ndarray) else x._base  # what the view keeps alive
    base = x if base is None else base
    alive = weakref.ref(base)
    before = balanced_exports()
    for _ in range(50):
        kind, out = call(fn, *args)
        if kind == "ok":
            # NumPy and array-api-strict may take the broadcast as it is:
            # nothing was refused, and the export is freed with `out`.
            assert exc is Exception, f"{fn.__name__} accepted the input"
        else:
            assert isinstance(out, exc)
        # An exception's traceback may hold the export: drop it first.
        del out
    del args, x, base
    assert balanced_exports() == before
    assert alive() is None


# No panic on legal layouts (explicit cases).

def cap(values, shape, strides, **kw):
    return ext.make_capsule(np.asarray(values, np.float64).tobytes(), shape, strides, dtype=F64, **kw)


@pytest.mark.hostile
def test_as_ndarray_mut_of_empty_arrays():
    for shape in [(0,), (3, 0), (0, 3), (2, 0, 4), (1, 0)]:
        assert ext.acc_as_ndarray_mut(np.zeros(shape), 1.0) == list(shape)
        assert ext.acc_as_ndarray(np.zeros(shape)) == (list(shape), [])
    # Empty with huge strides, through a capsule.
    assert ext.acc_as_ndarray_mut(cap([0.0], [3, 0], [I64_MAX, I64_MIN]), 1.0) == [3, 0]
    assert ext.acc_as_ndarray(cap([0.0], [0, 2**62], [I64_MIN, 1])) == ([0, 2**62], [])
    # ndarray allows at most isize::MAX as the product of non-zero extents.
    with pytest.raises(ValueError, match="ndarray"):
        ext.acc_as_ndarray(cap([0.0], [0, 2**62, 4], [1, 1, 1]))


@pytest.mark.hostile
def test_to_vec_with_huge_strides_on_extent_one_dims():
    x = np.lib.stride_tricks.as_strided(np.arange(2, dtype=np.uint8), shape=(2, 1), strides=(1, 2**63 - 1))
    assert ext.values(x) == [0, 1]
    assert ext.acc_to_vec(cap([1.0, 2.0], [2, 1], [1, I64_MAX])) == [1.0, 2.0]
    assert ext.acc_to_vec(cap([1.0, 2.0, 3.0], [3, 1, 1], [-1, I64_MIN, I64_MAX], data_offset=16)) == [
        3.0,
        2.0,
        1.0,
    ]
    assert ext.acc_as_ndarray(cap([1.0, 2.0], [2, 1], [1, I64_MIN])) == ([2, 1], [1.0, 2.0])


@pytest.mark.hostile
def test_flip_of_isize_min_stride():
    a = ext.acc_flip_axis(cap([7.0], [1], [I64_MIN]), 0)
    assert a.shape == (1,) and np.from_dlpack(a).tolist() == [7.0]
    assert ext.acc_flip_to_vec(cap([7.0], [1, 1], [I64_MIN, I64_MIN]), 1) == [7.0]
    a = ext.acc_flip_axis(cap([0.0], [0, 2], [I64_MIN, I64_MIN]), 1)
    assert a.shape == (0, 2)


@pytest.mark.hostile
def test_slice_of_empty_arrays_with_huge_strides():
    a = ext.acc_slice_axis(cap([0.0], [0, 3], [1, 2**62]), 1, 1, 2)
    assert a.shape == (0, 1)
    assert ext.acc_slice_to_vec(cap([0.0], [0, 3], [I64_MAX, I64_MIN]), 1, 2, 3) == []
    a = ext.acc_slice_axis(np.lib.stride_tricks.as_strided(np.zeros(1), (0, 4), (8, 2**62)), 1, 3, 4)
    assert a.shape == (0, 1)


@pytest.mark.hostile
def test_reshape_and_permute_of_huge_layouts():
    x = cap([0.0], [0, 2**62], [1, 1])
    with pytest.raises(ValueError):
        ext.acc_reshape(x, [0, 2**62, 2**62])
    a = ext.acc_permute(cap([0.0], [0, 2**62], [I64_MIN, I64_MAX]), [1, 0])
    assert a.shape == (2**62, 0)
    a = ext.acc_reshape(cap([1.0, 2.0], [2, 1], [1, I64_MAX]), [1, 2])
    assert np.from_dlpack(a).tolist() == [[1.0, 2.0]]


# Every accessor against generated hostile layouts (Hypothesis).

HUGE_STRIDES = [I64_MAX, I64_MIN, 2**62, -(2**62), 2**40, -(2**40), I64_MAX // 8 + 1]


@st.composite
def hostile_layouts(draw):
    ndim = draw(st.integers(0, 4))
    shape = [draw(st.sampled_from([0, 1, 1, 2, 3])) for _ in range(ndim)]
    if ndim and draw(st.booleans()):
        # A broadcast (stride 0) dimension whose elements cannot be copied.
        shape[draw(st.integers(0, ndim - 1))] = draw(st.sampled_from(UNALLOCATABLE + [2**62]))
    empty = 0 in shape
    strides = []
    for n in shape:
        if n > 3:
            strides.append(0)
        elif n <= 1 or empty:
            strides.append(draw(st.sampled_from(HUGE_STRIDES) | st.integers(-3, 3)))
        else:
            strides.append(draw(st.integers(-3, 3)))
    return shape, strides


def model_of(shape, strides):
    """`(capsule bytes, data_offset, numpy model or None)`: a buffer that
    holds every element the layout reaches, and the array it describes
    (None when empty or too large to enumerate)."""
    stepped = [(n, s) for n, s in zip(shape, strides) if n > 1 and 0 not in shape]
    lo = sum(min(0, (n - 1) * s) for n, s in stepped)
    hi = sum(max(0, (n - 1) * s) for n, s in stepped)
    buf = np.arange(1.0, hi - lo + 2.0)
    count = math.prod(shape)
    if count == 0 or count > 10_000:
        return buf.tobytes(), -lo * 8, None
    eff = [s * 8 if n > 1 else 0 for n, s in zip(shape, strides)]
    model = np.lib.stride_tricks.as_strided(buf[-lo:], shape, eff, writeable=False)
    return buf.tobytes(), -lo * 8, model.copy()


def expected_at(shape, strides, index):
    """The model's value at `index` of a non-empty layout (`model_of`'s
    buffer holds 1.0, 2.0, ... from its lowest reached element)."""
    stepped = [(n, s) for n, s in zip(shape, strides) if n > 1]
    lo = sum(min(0, (n - 1) * s) for n, s in stepped)
    return 1.0 + (-lo) + sum(i * s for i, n, s in zip(index, shape, strides) if n > 1)


def fresh(shape, strides):
    data, off, _ = model_of(shape, strides)
    return ext.make_capsule(data, shape, strides, dtype=F64, data_offset=off)


def check_export(out, expected_shape, model):
    """An exported `dlcast.Array`: right shape; right values where small."""
    assert out.shape == tuple(expected_shape)
    kind, arr = call(np.from_dlpack, out)
    if model is not None:
        assert kind == "ok"
        assert np.array_equal(arr, model)
        kind, m = call(buffer_of, out)
        assert kind == "ok" and m.nbytes == model.size * 8
        if model.ndim:
            assert m.tolist() == model.tolist()
    elif kind == "ok":
        assert arr.shape == tuple(expected_shape)


def check_rank_typed_accessors(shape, strides, model, count):
    """The rank-typed accessors and the iterators (tests/src/ranked.rs) on
    a hostile layout: right values, or an `IndexError`/`TypeError`/..., never
    a panic. Huge broadcasts are only iterated lazily."""
    small = model is not None
    first = None if count == 0 else expected_at(shape, strides, [0] * len(shape))

    kind, out = call(ext.rk_iter, fresh(shape, strides))
    assert kind == "ok"
    if small:
        assert out == model.ravel().tolist()
    else:
        assert len(out) == min(count, 10_000) and (count == 0 or out[0] == first)
    kind, out = call(ext.rk_iter_memory, fresh(shape, strides))
    assert kind == "ok" and len(out) == min(count, 10_000)
    if small:
        assert sorted(out) == sorted(model.ravel().tolist())
    assert call(ext.rk_iter_len, fresh(shape, strides)) == ("ok", (count, count))

    ndim = len(shape)
    corners = ([0] * ndim, [max(n - 1, 0) for n in shape])
    getters = {0: ext.rk_get0, 1: ext.rk_get1, 2: ext.rk_get2}
    for rank, get in getters.items():
        for index in corners:
            if rank != ndim:
                kind, out = call(get, fresh(shape, strides), *([0] * rank))
                assert kind == "err" and isinstance(out, TypeError), out
                # The rank the type fixes is checked at the boundary, as a #[shape].
                want = "(" + ", ".join(["_"] * rank) + ("," if rank == 1 else "") + ")"
                assert f"expected shape {want}, got" in str(out), out
                continue
            kind, out = call(get, fresh(shape, strides), *index)
            if count == 0:
                assert kind == "err" and isinstance(out, IndexError), out
            else:
                assert (kind, out) == ("ok", expected_at(shape, strides, index))
        if rank == ndim and ndim:
            # One past the end of the first dimension.
            beyond = [shape[0]] + [0] * (ndim - 1)
            kind, out = call(get, fresh(shape, strides), *beyond)
            assert kind == "err" and isinstance(out, IndexError) and "out of bounds" in str(out)
    if ndim != 2:
        return
    if small or count == 0:
        kind, out = call(ext.rk_all2, fresh(shape, strides))
        assert (kind, out) == ("ok", model.ravel().tolist() if small else [])
    kind, out = call(ext.rk_as_array2, fresh(shape, strides))
    if small:
        assert (kind, out) == ("ok", (shape, model.ravel().tolist()))
    elif kind == "err":
        assert isinstance(out, ValueError), out
    # Writable: refused at the boundary where indices alias (TypeError), else
    # each write lands.
    for fn, args in [
        (ext.rk_set2, (0, 0, 5.0)),
        (ext.rk_set2, (shape[0], 0, 5.0)),
        (ext.rk_as_array_mut2, (5.0,)),
    ] + ([(ext.rk_set_all2, (5.0,))] if small or count == 0 else []):
        kind, out = call(fn, fresh(shape, strides), *args)
        if kind == "err":
            assert isinstance(out, (TypeError, IndexError, ValueError)), out


@pytest.mark.slow
@pytest.mark.hostile
@settings(
    max_examples=int(os.environ.get("DLCAST_HYPOTHESIS_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(layout=hostile_layouts(), data=st.data())
def test_every_accessor_survives_hostile_layouts(layout, data):
    shape, strides = layout
    _, _, model = model_of(shape, strides)
    count = math.prod(shape)
    small = model is not None
    if count >= 2**64:
        # More elements than usize holds: refused at import, by every path.
        for fn, args in [(ext.acc_to_vec, ()), (ext.identity, ()), (ext.acc_flip_axis, (0,))]:
            kind, out = call(fn, fresh(shape, strides), *args)
            assert kind == "err" and "element count" in str(out)
        return

    kind, out = call(ext.acc_to_vec, fresh(shape, strides))
    if small:
        assert (kind, out) == ("ok", model.ravel().tolist())
    elif count == 0:
        assert (kind, out) == ("ok", [])
    else:
        assert kind == "err"
        # Beyond 2**64 elements the import itself refuses the layout.
        assert isinstance(out, MemoryError) or count >= 2**64

    for index in ([0] * len(shape), [max(n - 1, 0) for n in shape]):
        kind, out = call(ext.acc_get, fresh(shape, strides), index)
        assert kind == "ok"
        assert out == (None if count == 0 else expected_at(shape, strides, index))
        if small:
            assert out == model[tuple(index)]

    check_rank_typed_accessors(shape, strides, model, count)

    kind, out = call(ext.acc_as_slice, fresh(shape, strides))
    assert kind == "ok"
    if out is not None:
        assert out == (model.ravel().tolist() if small else [])

    kind, out = call(ext.acc_as_ndarray, fresh(shape, strides))
    if small:
        assert (kind, out) == ("ok", (shape, model.ravel().tolist()))
    elif count == 0:
        # ndarray refuses a product of non-zero extents beyond isize::MAX.
        assert (kind, out) == ("ok", (shape, [])) or isinstance(out, ValueError)
    elif kind == "ok":
        assert out[0] == shape and out[1] == [expected_at(shape, strides, [0] * len(shape))] * min(
            count, 10_000
        ) or len(set(out[1])) > 1

    for fn, args in [
        (ext.acc_set, ([0] * len(shape), 5.0)),
        (ext.acc_fill, (5.0,)),
        (ext.acc_as_slice_mut, (5.0,)),
        (ext.acc_as_ndarray_mut, (5.0,)),
    ]:
        kind, out = call(fn, fresh(shape, strides), *args)
        if count == 0 and fn is ext.acc_as_ndarray_mut:
            assert (kind, out) == ("ok", shape) or isinstance(out, ValueError)

    # Exports and transforms.
    kind, out = call(ext.identity, fresh(shape, strides))
    assert kind == "ok"
    check_export(out, shape, model)
    kind, out = call(lambda c: ext.identity(c).__dlpack__(copy=True), fresh(shape, strides))
    if small or count == 0:
        assert kind == "ok"
    if shape:
        axis = data.draw(st.integers(0, len(shape) - 1), label="axis")
        n = shape[axis]
        start = data.draw(st.integers(0, min(n, 4)), label="start")
        stop = data.draw(st.integers(start, min(n, start + 4)), label="stop")
        kind, out = call(ext.acc_slice_axis, fresh(shape, strides), axis, start, stop)
        assert kind == "ok"
        sl = model[(slice(None),) * axis + (slice(start, stop),)] if small else None
        check_export(out, shape[:axis] + [stop - start] + shape[axis + 1 :], sl)

        kind, out = call(ext.acc_flip_axis, fresh(shape, strides), axis)
        assert kind == "ok"
        check_export(out, shape, np.flip(model, axis) if small else None)

        perm = data.draw(st.permutations(range(len(shape))), label="perm")
        kind, out = call(ext.acc_permute, fresh(shape, strides), list(perm))
        assert kind == "ok"
        check_export(out, [shape[p] for p in perm], model.transpose(perm) if small else None)

    new_shape = [count] if count <= I64_MAX else [count // 2, 2]
    kind, out = call(ext.acc_reshape, fresh(shape, strides), new_shape)
    if kind == "ok":
        check_export(out, new_shape, model.reshape(new_shape) if small else None)
    elif small:
        # Only a view that is not C-contiguous may be refused.
        assert isinstance(out, ValueError) and "C-contiguous" in str(out)


@pytest.mark.hostile
def test_all_layout_combinations_of_extreme_strides():
    """The deterministic corner: every extent in {0, 1, 2} against every
    extreme stride, in 1 and 2 dimensions, through every read accessor."""
    extents = [0, 1, 2]
    strides = [0, 1, -1, I64_MAX, I64_MIN, 2**62, -(2**62)]
    for ndim in (1, 2):
        for shape in itertools.product(extents, repeat=ndim):
            for st_ in itertools.product(strides, repeat=ndim):
                shape_l, st_l = list(shape), list(st_)
                for fn, extra in [
                    (ext.acc_to_vec, ()),
                    (ext.acc_as_ndarray, ()),
                    (ext.acc_as_slice, ()),
                    (ext.identity, ()),
                    (ext.acc_flip_axis, (0,)),
                    (ext.acc_slice_axis, (0, 0, shape[0])),
                ]:
                    reachable = all(n <= 1 or abs(s) <= 1 for n, s in zip(shape, st_)) or 0 in shape
                    if reachable:
                        data, off, _ = model_of(shape_l, st_l)
                    else:
                        # Steps of 2**62 elements and more: the import must
                        # refuse them (their byte extent overflows).
                        data, off = bytes(8), 0
                    c = ext.make_capsule(data, shape_l, st_l, dtype=F64, data_offset=off)
                    kind, out = call(fn, c, *extra)
                    if not reachable:
                        assert kind == "err"
                    elif fn is not ext.acc_as_ndarray or math.prod(shape) != 0:
                        assert kind == "ok", (shape, st_, fn, out)
