"""Never alias: a writable argument whose memory overlaps another argument's
(in the same call, or one still held by an enclosing call) is refused before
anything is written, whatever the element sizes, strides or producers; views
that share no byte are taken.
"""

import numpy as np
import pytest
import torch
from numpy.lib.stride_tricks import as_strided

import dlcast_testext as ext
import dlcast_testext as t
from conftest import capsule, deleters_balanced


as_strided = np.lib.stride_tricks.as_strided


def refused(f, *args, first, second):
    """Calls `f(*args)`, which must be refused for sharing memory before its
    body runs."""
    before = ext.bodies_run()
    with pytest.raises(TypeError) as info:
        f(*args)
    assert str(info.value) == (
        f"{f.__name__}(): arguments '{first}' and '{second}' share memory, and '{first}' is writable"
    )
    assert ext.bodies_run() == before


def accepted(f, *args):
    before = ext.bodies_run()
    f(*args)
    assert ext.bodies_run() == before + 1


def test_same_array_twice():
    a = np.arange(6.0)
    refused(ext.add_one_into, a, a, first="dst", second="src")
    refused(ext.swap_f64, a, a, first="a", second="b")
    assert a.tolist() == list(range(6))


def overlapping_pairs():
    """Pairs of views of one 1-d buffer `a` (12 elements) that share memory,
    each pair of equal lengths."""
    a = np.arange(12.0)
    return a, [
        (a[0:6], a[3:9]),              # overlapping slices
        (a[3:9], a[0:6]),
        (a[::-1][:6], a[3:9]),         # negative stride over a[6:12], a[3:9]
        (a[8:2:-1], a[2:8]),           # the same range, reversed
        (a[8:2:-1], a[7:1:-1]),        # both reversed, shifted
        (a[0:12:2], a[10::-2]),        # the same even elements, one reversed
        (a[0:9:3], a[3::3]),           # strided and sharing elements
    ]


def test_interleaved_views_that_share_no_element_are_taken():
    # The spans overlap but no element is in both (the borrow registry
    # decides this from the strides): both arguments are taken.
    for src_slice, dst_slice in ((slice(None, None, 2), slice(1, None, 2)),
                                 (slice(11, 0, -2), slice(0, 11, 2))):
        a = np.arange(12.0)
        expect = a.copy()
        expect[dst_slice] = a[src_slice] + 1
        ext.add_one_into(a[src_slice], a[dst_slice])
        assert a.tolist() == expect.tolist()


def test_overlapping_views_are_refused_and_the_output_untouched():
    a, pairs = overlapping_pairs()
    for i, (src, dst) in enumerate(pairs):
        before = a.copy()
        refused(ext.add_one_into, src, dst, first="dst", second="src")
        refused(ext.swap_f64, src, dst, first="a", second="b")
        refused(ext.swap_f64, dst, src, first="a", second="b")
        assert (a == before).all(), i


def test_transposed_and_reshaped_aliases():
    m = np.zeros((3, 4))
    before = m.copy()
    refused(ext.copy_into, m.T, m, first="dst", second="src")
    refused(ext.copy_into, m, m.T, first="dst", second="src")
    refused(ext.copy_into, m.reshape(4, 3), m[:, ::-1].T, first="dst", second="src")
    refused(ext.copy_into, m[1:, 1:], m[:2, :3], first="dst", second="src")
    # A view through a capsule of the same memory, and through the buffer protocol.
    refused(ext.copy_into, m.__dlpack__(), m, first="dst", second="src")
    refused(ext.copy_into, memoryview(m).cast("B").cast("d", [3, 4]), m, first="dst", second="src")
    assert (m == before).all()


def test_buffer_aliases():
    ba = bytearray(8 * 6)
    v = np.frombuffer(ba, np.float64)
    refused(ext.add_one_into, memoryview(ba).cast("d"), v, first="dst", second="src")
    refused(ext.add_one_into, v, memoryview(ba).cast("d"), first="dst", second="src")
    assert bytes(ba) == bytes(48)
    accepted(ext.add_one_into, memoryview(ba)[:24].cast("d"), v[3:])
    assert v.tolist() == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]


def test_one_shared_byte_is_enough():
    raw = np.zeros(8 * 7, np.uint8)
    a = raw[0:48].view(np.float64)   # bytes 0..48
    b = raw[47:55].view(np.float64)  # bytes 47..55 (unaligned)
    # Untyped views take unaligned memory in place (typed ones are aligned at
    # the boundary: a read-only one reads a copy, a writable one is refused).
    refused(ext.device_pair, a[5:6], b, first="dst", second="src")
    refused(ext.device_pair, b, a[5:6], first="dst", second="src")
    # Adjacent (touching, not overlapping) ranges are fine.
    c = raw[48:56].view(np.float64)
    accepted(ext.add_one_into, a[5:6], c)
    assert c.tolist() == [1.0]


def test_disjoint_views_are_accepted():
    a = np.arange(12.0)
    accepted(ext.add_one_into, a[:6], a[6:])
    assert a.tolist() == [0, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 6]
    accepted(ext.add_one_into, a[6:][::-1], a[:6])
    assert a[:6].tolist() == [7, 6, 5, 4, 3, 2]
    b = np.arange(6.0)
    accepted(ext.swap_f64, a[:6], b)
    assert a[:6].tolist() == [0, 1, 2, 3, 4, 5] and b.tolist() == [7, 6, 5, 4, 3, 2]
    m = np.zeros((4, 4))
    accepted(ext.swap_f64, m[:2], m[2:])


def test_read_only_views_may_overlap_each_other():
    pts = np.ones((4, 3), np.float32)
    # Two read-only parameters of one array: no writable one, no refusal.
    assert ext.centroid(pts, pts[:, 0]) == [1.0, 1.0, 1.0]
    assert ext.matmul_shapes(pts, pts.T, np.zeros((4, 4))) == (4, 3, 4)


def test_empty_views_never_overlap():
    a = np.arange(4.0)
    accepted(ext.add_one_into, a[2:2], a[2:2])
    accepted(ext.swap_f64, a[:0], a[:0])
    with deleters_balanced(2):
        # Same address, both empty, through capsules.
        accepted(ext.add_one_into, capsule(np.zeros(0)), capsule(np.zeros(0)))


def test_capsule_aliases_of_one_numpy_array():
    a = np.arange(4.0)
    # (A legacy capsule is read-only: the writable `dst` gets a versioned one.)
    refused(ext.add_one_into, a.__dlpack__(), a.__dlpack__(max_version=(1, 0)), first="dst", second="src")
    refused(ext.add_one_into, a[::-1].__dlpack__(), a, first="dst", second="src")
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0]


# ---------------------------------------------------------------------------
# TensorMut refuses self-overlapping layouts


SELF_OVERLAPPING = [
    ((4,), (0,)),          # stride 0 on an extent above 1
    ((3, 2), (0, 1)),      # a broadcast row
    ((3, 3), (1, 1)),      # sliding windows
    ((2, 3), (2, 1)),      # rows overlapping by one element
    ((2, 2), (-1, -1)),    # negative strides, overlapping
    ((3, 2), (1, 2)),      # element 2 reached as (2, 0) and (0, 1)
    ((2, 2, 2), (4, 2, 2)),
]


@pytest.mark.parametrize("shape,strides", SELF_OVERLAPPING)
def test_self_overlapping_writable_views_are_refused(shape, strides):
    # Element 0 at 8, so that offsets -8..23 stay inside `base` (as_strided
    # does not check: a view past the end once made `make sanitize` flag
    # reads beyond the buffer, by NumPy and dlcast alike).
    base = np.arange(32.0)
    start = 8
    offsets = [sum(i * s for i, s in zip(idx, strides)) for idx in np.ndindex(*shape)]
    assert -start <= min(offsets) and start + max(offsets) < base.size
    v = as_strided(base[start:], shape=shape, strides=[s * 8 for s in strides])
    assert v.flags.writeable
    before = base.copy()
    for f in (lambda x: ext.fill_f64(x, -1.0), ext.double_slice_f64,
              lambda x: ext.set_f64(x, [0] * len(shape), 5.0)):
        with pytest.raises(TypeError, match="a writable array must not reach one element from two indices"):
            f(v)
    base32 = np.arange(32, dtype=np.float32)
    v32 = as_strided(base32[start:], shape=shape, strides=[s * 4 for s in strides])
    with pytest.raises(TypeError, match="must not reach one element from two indices"):
        ext.add_one_f32(v32)
    with pytest.raises(TypeError, match="must not reach one element from two indices"):
        ext.identity_mut(v32)  # a writable view returned to NumPy
    assert base32.tolist() == list(range(32))
    # Through capsules (the producer's own copy) too.
    with deleters_balanced(1):
        c = ext.make_capsule(base.tobytes(), list(shape), list(strides), data_offset=start * 8)
        with pytest.raises(TypeError, match="must not reach one element from two indices"):
            ext.fill_f64(c, 0.0)
    assert (base == before).all()
    # Reading such a layout is fine.
    assert ext.values(v) == v.ravel().tolist()


@pytest.mark.parametrize(
    "shape,strides",
    [((4,), (1,)), ((1,), (0,)), ((1, 4), (0, 1)), ((3, 1), (1, 0)), ((2, 3), (1, 2)),
     ((3, 2), (-2, -1)), ((2, 2), (2, -1)), ((0, 5), (0, 0)), ((2, 2), (5, 1))],
)
def test_non_overlapping_writable_views_are_accepted(shape, strides):
    base = np.zeros(32)
    offsets = [sum(i * s for i, s in zip(idx, strides)) for idx in np.ndindex(*shape)] or [0]
    assert -12 <= min(offsets) and 12 + max(offsets) < base.size
    v = as_strided(base[12:], shape=shape, strides=[s * 8 for s in strides])
    ext.fill_f64(v, 3.0)
    assert (v == 3.0).all()
    assert base.sum() == 3.0 * v.size


# ---------------------------------------------------------------------------
# Device memory: compared within one device, never across devices or with
# host memory. Fake device capsules: their addresses are never read.


def device_capsule(address, n, device=(2, 0)):
    """`n` float64 at `address` on `device`, from the test producer."""
    return ext.make_capsule(b"", [n], [1], device=device, null_data=True, byte_offset=address)


def test_device_memory_overlap_is_refused_on_one_device():
    with deleters_balanced(2):
        refused(ext.device_pair, device_capsule(2**40, 8), device_capsule(2**40 + 56, 4),
                first="dst", second="src")
    with deleters_balanced(2):
        refused(ext.device_pair, device_capsule(2**40, 8, (10, 3)), device_capsule(2**40, 8, (10, 3)),
                first="dst", second="src")


def test_device_memory_of_other_devices_or_disjoint_ranges_is_accepted():
    with deleters_balanced(6):
        # Adjacent ranges on one device.
        accepted(ext.device_pair, device_capsule(2**40, 8), device_capsule(2**40 + 64, 8))
        # The same addresses on two devices, or on two device types.
        accepted(ext.device_pair, device_capsule(2**40, 8, (2, 0)), device_capsule(2**40, 8, (2, 1)))
        accepted(ext.device_pair, device_capsule(2**40, 8, (2, 0)), device_capsule(2**40, 8, (10, 0)))
    # Device memory at the numeric address of a host array is other memory.
    a = np.zeros(8)
    with deleters_balanced(1):
        accepted(ext.device_pair, device_capsule(a.ctypes.data, 8), a)
SHARE = r"share memory, and '\w+' is writable"



def _sharing_pairs():
    x = np.arange(4.0)
    tt = torch.zeros(6, dtype=torch.float64)
    return {
        "same-numpy": (x, x),
        "numpy-overlapping-slices": (x[:3], x[1:]),
        "torch-overlapping-views": (tt[:4], tt[2:]),
        "torch-and-its-numpy": (tt, tt.numpy()),
        "numpy-and-memoryview": (x, memoryview(x)),
        "numpy-and-capsule-of-it": (x, x.__dlpack__()),
    }


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
@pytest.mark.parametrize("kind", sorted(_sharing_pairs()))
@pytest.mark.parametrize("func", [t.mut_and_ref, t.ref_and_mut, t.opt_mut_and_ref])
def test_writable_and_read_only_of_one_memory_are_refused(func, kind):
    a, b = _sharing_pairs()[kind]  # `a` is passed to the writable parameter
    before = np.asarray(a).copy()
    with pytest.raises(TypeError, match=SHARE):
        func(b, a) if func is t.ref_and_mut else func(a, b)
    assert np.array_equal(np.asarray(a), before)


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_writable_views_overlapping_in_bytes_are_refused():
    x = np.zeros(10)
    with pytest.raises(TypeError, match=SHARE):
        t.nd_mut_pair(x[::2], x.view(np.float32)[1::4])  # bytes 4..8 of x[0]
    with pytest.raises(TypeError, match=SHARE):
        t.ndd_mut_and_slice(x.reshape(2, 5), x[3:4])
    b = bytearray(8)
    with pytest.raises(TypeError, match=SHARE):
        t.u8_mut_pair(b, memoryview(b)[2:5])
    with pytest.raises(TypeError, match=SHARE):
        t.u8_mut_pair(b, np.frombuffer(b, np.uint8))
    assert not x.any() and b == bytearray(8)


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_interleaved_writable_views_that_share_no_byte_are_both_taken():
    x = np.zeros(10)
    t.nd_mut_pair(x[::2], x.view(np.float32)[2::4])
    assert x[::2].tolist() == [1.0] * 5
    assert x.view(np.float32)[2::4].tolist() == [2.0] * 5
    assert (x.view(np.float32)[3::4] == 0).all()


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_two_read_only_views_of_one_memory_share():
    x = np.arange(4.0)
    assert t.ref_ref(x, x[::-1]) == (6.0, 6.0)


class _Aliasing:
    """Hands out the memory of another array through `__dlpack__`."""

    def __init__(self, target):
        self.target = target

    def __dlpack__(self, **kw):
        return self.target.__dlpack__(**kw)

    def __dlpack_device__(self):
        return (1, 0)


class _Reshaping:
    """Changes an earlier argument's fields from its `__dlpack__` (phase 1)."""

    def __init__(self, victim, value):
        self.victim, self.value = victim, value

    def __dlpack__(self, **kw):
        self.victim.shape = (2, 2)
        return self.value.__dlpack__(**kw)

    def __dlpack_device__(self):
        return (1, 0)


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_a_producer_handing_out_another_arguments_memory():
    x = np.arange(4.0)
    with pytest.raises(TypeError, match=SHARE):
        t.mut_and_ref(x, _Aliasing(x))
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_a_producer_reshaping_an_earlier_argument():
    """Phase 1 of `b` reshapes `a` in place: `a` is read after every Python
    step, so the slice parameter sees the new (2-D) shape and refuses."""
    a = np.zeros(4)
    with pytest.raises(TypeError, match=r"mut_and_ref\(\): argument 'a'"):
        t.mut_and_ref(a, _Reshaping(a, np.ones(3)))
    assert not a.any()


# Formerly a hole: the borrow registry's overlap test swaps the two itemsizes
# (borrow.rs, may_overlap): views of different dtypes over the same bytes
# are called disjoint, so a `&mut [f64]` and a `&[u8]` coexist.

@pytest.mark.hostile
def test_registry_mixed_itemsize_single_elements_in_one_call_are_refused():
    y = np.zeros(2)
    # out = y[0] (bytes 0..8, writable), other = byte 3 of y[0]
    with pytest.raises(TypeError, match="share memory"):
        ext.fill_then_len(y[:1], y.view(np.uint8)[3:4], 1.0)


@pytest.mark.hostile
def test_registry_mixed_itemsize_strided_in_one_call_are_refused():
    x = np.zeros(8)
    # out = x[::2] (elements at bytes 0, 16, 32, 48), other = bytes 3, 19, 35, 51
    with pytest.raises(TypeError, match="share memory"):
        ext.fill_then_len(x[::2], x.view(np.uint8)[3::16], 1.0)


@pytest.mark.hostile
def test_registry_mixed_itemsize_in_a_nested_call_is_refused():
    x = np.zeros(1)
    seen = []

    def cb():
        # A read of byte 3 of the element the outer body holds as &mut f64.
        seen.append(ext.sum_u8(x.view(np.uint8)[3:4]))

    with pytest.raises(BufferError, match="in use by another call"):
        ext.hold_mut_and_call(x, cb)
    assert seen == []


@pytest.mark.hostile
def test_registry_same_itemsize_interleaved_and_overlapping():
    x = np.zeros(8)
    # disjoint interleavings are allowed, real overlaps refused.
    assert ext.fill_then_len(x[::2], x[1::2], 1.0) == 4
    with pytest.raises(TypeError, match="share memory"):
        ext.fill_then_len(x[::2], x[2::4], 1.0)
    with pytest.raises(TypeError, match="share memory"):
        ext.fill_then_len(x[:1], x.view(np.uint8)[:16], 1.0)


@pytest.mark.hostile
def test_registry_aliases_through_other_producers():
    # the same memory through torch.from_numpy, a memoryview and a
    # capsule of NumPy's is seen by the registry.
    x = np.zeros(4)
    for other in (torch.from_numpy(x), memoryview(x), x.__dlpack__(), x[::-1]):
        with pytest.raises(TypeError, match="share memory"):
            ext.fill_then_len(x, other, 1.0)

    def cb():
        ext.fill_f64(torch.from_numpy(x), 7.0)

    with pytest.raises(BufferError, match="in use by another call"):
        ext.hold_ref_and_call(x, cb)


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("step", [2, 3, 5])
@pytest.mark.parametrize("off", [0, 1, 2, 3, 4])
def test_one_dimensional_strided_overlap(step, off):
    """One-dimensional requests (gcd of a single stride: the `a == 0` shortcut):
    `copy_strided(dst=x[::step], src=x[off::step2])` is refused exactly when
    the two element sets meet, and copies otherwise."""
    for step2 in (step, 2 * step, 1):
        x = np.arange(40.0)
        src = x[off::step2][: len(x[::step])]
        dst = x[::step][: len(src)]
        dst_idx = set(range(0, 40, step)[: len(src)])
        src_idx = set(range(off, 40, step2)[: len(src)])
        expected = x.copy()
        if dst_idx & src_idx:
            with pytest.raises(TypeError, match="share memory"):
                t.copy_strided(dst, src)
            assert (x == expected).all()
        else:
            t.copy_strided(dst, src)
            expected[::step][: len(src)] = expected[off::step2][: len(src)]
            assert (x == expected).all()


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("dtype", [np.float16, np.complex64, np.complex128, np.bool_])
def test_element_size_of_requests_for_every_item_size(dtype):
    """The element size of a request is `bits * lanes` rounded up to bytes:
    a writable view of a wide dtype must meet a view of another dtype that
    reads one byte of its last element (mixed item sizes)."""
    x = np.zeros(8, dtype=dtype)
    raw = x.view(np.uint8)
    item = x.itemsize
    last_byte = raw[len(raw) - 1:]  # inside the last element only
    with pytest.raises(BufferError, match="in use by another call"):
        _hold_mut_then(x, lambda: t.u8_values(last_byte))
    # And a byte just past the end of `x` does not meet it.
    big = np.zeros(8 * item + 8, dtype=np.uint8)
    y = big[: 8 * item].view(dtype)
    assert _hold_mut_then(y, lambda: t.u8_values(big[8 * item:])) == bytes(8)


def _hold_mut_then(x, f):
    """Runs `f` inside a body that holds a writable `TensorDynMut` of `x`
    (`dyn_mut_cb`); returns what `f` returned."""
    out = []

    def cb():
        out.append(f())

    assert t.dyn_mut_cb(x, cb) == x.size
    return out[0]


@pytest.mark.hostile
def test_writable_interleaved_layout_refusal_says_it_is_conservative():
    # A writable (2, 3) array with strides (3, 2) elements reaches six
    # distinct elements (0, 2, 4, 3, 5, 7), yet a TensorMut refuses it with
    # "a writable array must not reach one element from two indices"
    # (layout::may_self_overlap is a sufficient test, not an exact one).
    # Expected: the layout is taken (an exact test for small extents), or
    # the message says the test is conservative and what to do (a copy).
    base = np.zeros(8)
    x = np.lib.stride_tricks.as_strided(base, (2, 3), (24, 16), writeable=True)
    addresses = {i * 3 + j * 2 for i in range(2) for j in range(3)}
    assert len(addresses) == 6
    try:
        ext.rk_copy_from(x, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    except TypeError as e:
        # The refusal says its test is conservative, and what to do.
        assert "conservative" in str(e) and "ascontiguousarray" in str(e), str(e)
    else:
        assert x.ravel().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


@pytest.mark.hostile
def test_exported_writable_view_then_dlcast_write_is_refused():
    x = np.zeros(4, dtype=np.float32)
    y = ext.identity_mut(x)  # writable NumPy view of x; its borrow ended at export
    x64 = x.view(np.float64)  # the same bytes, another dtype
    with pytest.raises(BufferError, match="in use by another call"):
        ext.hold_ref_and_call(x64, lambda: ext.add_one_f32(y))
    assert ext.live_borrows() == 0
