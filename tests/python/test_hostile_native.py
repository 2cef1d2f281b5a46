"""Hostile use of Rust's own view types as `#[dlpack_fn]` parameters
(`&[T]`, `&mut [T]`, `ndarray` views, `Option` of each) and of the call
context they borrow. Test functions: tests/src/attack.rs.

Two kinds of tests live here:

- `test_finding_*`: an attack that broke something when it was written
  (undefined behaviour from safe Rust, a panic reaching Python, a leak, a
  refusal or acceptance that contradicted the design), each fixed since:
  `take` checks the view type against `prepare`'s, `body` takes a closure,
  conversions probe the borrow registry first, bool values are checked in
  phase 2, `__mro__` is looked up instead of PyO3's `mro()`, a finished
  call context releases its owners at once, and what NumPy can read but
  dlcast cannot converts through NumPy.
- `test_held_*`: an attack that the implementation withstands; kept so
  that it stays withstood.
"""

import array
import itertools
import random
import threading

import numpy as np
import pytest
import torch
from numpy.lib.stride_tricks import as_strided

import dlcast_testext as t
from conftest import capsule, deleters_balanced, run_py

IN_USE = r"the array's memory is in use by another call still running"
SHARE = r"share memory, and '\w+' is writable"


def misaligned_f64(values):
    """A float64 NumPy array at an odd address, holding `values`."""
    n = len(values)
    a = np.frombuffer(bytearray(8 * n + 1), np.float64, offset=1)
    a[:] = values
    assert a.ctypes.data % 8 != 0
    return a


@pytest.fixture(autouse=True)
def registry_empty_after():
    """Every test must leave the borrow registry empty."""
    yield
    assert t.live_borrows() == 0


# =============================================================================
# Findings: each fails today.
# =============================================================================

# -- F1: two `&mut [f64]` to one memory from safe Rust -------------------------

def test_finding_take_hands_out_a_writable_view_of_a_read_only_registration():
    """`dlcast_runtime::__private::CallCx` is public and its methods are safe.
    `evil_alias` (attack.rs) prepares both arguments as `&[f64]` (so the
    borrow registry lets them share memory), then `take`s both as
    `&mut [f64]`: `take` never checks that the view type it builds is the
    one `prepare` registered, so safe Rust gets two `&mut` to one memory
    (the write through `a` is seen through `b`). Expected: `take` refuses a
    view type other than the prepared one (at least a writable view of a
    read-only registration)."""
    x = np.arange(4.0)
    with pytest.raises((TypeError, BufferError)):
        t.evil_alias(x, x)
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_finding_take_builds_a_view_of_another_dtype_than_was_checked():
    """The same hole with dlcast's own views, whose `from_raw` checks
    nothing: prepared as `TensorRef<u8>` (16 bytes), taken as
    `TensorRef<f64>` -- a view of 16 float64 elements, whose `as_slice()`
    reads 128 bytes (here the rest of `big`; past the end of any
    allocation in general). Expected: `take` refuses."""
    big = np.arange(256, dtype=np.uint8)
    x = big[:16]
    try:
        got = t.evil_retype(x)
    except (TypeError, BufferError):
        return
    beyond = big[:128].view(np.float64).tolist()
    pytest.fail(f"read 128 bytes of a 16-byte array: {got == beyond}")


def test_finding_take_builds_a_writable_view_of_read_only_memory():
    """Prepared as `TensorRef<f64>` (a read-only array is fine), taken as
    `TensorMut<f64>`: the write lands in a `bytes` object, which Python
    promises is immutable. Expected: `take` refuses."""
    b = bytes(16)
    x = np.frombuffer(b, np.float64)
    assert not x.flags.writeable
    with pytest.raises((TypeError, BufferError)):
        t.evil_write_read_only(x)
    assert b == bytes(16)


# -- F2: the body guard's per-thread state does not survive safe Rust ---------

_GUARD_SCRIPT = """
import array, numpy as np
import dlcast_testext as t
from conftest import capsule
t.{evil}(np.arange(3.0))
for _ in range(3):
    t.slice_sum(capsule(np.arange(3.0)))
made, deleted = t.producer_counts()
ba = bytearray(16)
t.u8_values(ba)
try:
    ba.extend(b"x")
    resizable = True
except BufferError:
    resizable = False
print("RESULT", made, deleted, resizable, flush=True)
for _ in range(3):
    t.slice_sum(array.array("d", [1.0, 2.0]))
"""


@pytest.mark.parametrize("evil", ["evil_guards_out_of_order", "evil_forget_guard"])
def test_finding_body_guards_dropped_out_of_order_or_forgotten(evil):
    """(Fixed: `CallCx::body` now takes the body as a closure, so bodies
    nest strictly; these functions nest, panic inside, and forget a view.)
    It was: `CallCx::body()` returned a guard that swaps a thread-local "deferred
    owners" frame in and out. Two guards dropped out of order (or one
    `mem::forget`-ten), in safe Rust, leave the frame installed for good:
    every later view owner dropped outside a body (all slice and ndarray
    parameters: their reads live in the context, which drops after the
    guard) is pushed there and never released. Deleters stop running,
    buffers stay exported (a bytearray cannot be resized after the call),
    and at thread exit the thread-local drops the owners without the GIL
    (the process segfaults at exit). Expected: every deleter runs once, the
    buffer is released, the process exits cleanly."""
    proc = run_py(_GUARD_SCRIPT.format(evil=evil))
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, proc.stderr[-2000:]
    _, made, deleted, resizable = line[0].split()
    assert (made, deleted, resizable) == ("3", "3", "True")
    assert proc.returncode == 0, proc.stderr[-2000:]


# -- F3: a nested call's conversion reads memory a live `&mut` holds ----------

def _views_of(x):
    """Arguments that share `x`'s memory but need a conversion (so the
    nested call reads them through NumPy's copy, not a view)."""
    buf = x.view(np.uint8)
    return {
        "dtype": x.view(np.int64),
        "byteswapped": x.view(">f8"),
        "misaligned": np.frombuffer(buf.data, np.float64, count=len(x) - 1, offset=4),
        "strided": x[::2],
    }


@pytest.mark.parametrize("kind", ["dtype", "byteswapped", "misaligned", "strided"])
def test_finding_nested_conversion_reads_memory_under_a_live_mut_slice(kind):
    """The outer body holds `x` as `&mut [f64]` (exclusive, per the README)
    and calls back into Python. A nested `slice_sum(x)` is refused with
    BufferError, but a nested `slice_sum` of a view of the same memory that
    needs a conversion (another dtype, byte order, alignment or stride) is
    converted -- NumPy reads the exclusively borrowed memory -- and
    accepted. The read pass returns `Refusal::Convert` (and the NumPy
    `Dlpack` step) before the argument is checked against the registry.
    Expected: BufferError naming the outer call, as for `slice_sum(x)`."""
    x = np.arange(8.0)
    other = _views_of(x)[kind]
    errors = []

    def callback():
        for call in (lambda: t.slice_sum(x), lambda: t.slice_sum(other)):
            try:
                call()
                errors.append(None)
            except BufferError as e:
                errors.append(str(e))

    assert t.mut_slice_cb(x, callback) == 8.0
    assert errors[0] is not None and "mut_slice_cb()" in errors[0]
    assert errors[1] is not None and "mut_slice_cb()" in errors[1], (
        f"the {kind} view of the exclusively borrowed array was read")


# -- F4: a panic reaches Python for objects whose type is not ready ----------

def test_finding_type_without_mro_panics():
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


# -- F5: a nested call's view owners wait for the outer body -------------------

def test_finding_nested_call_releases_its_buffers_when_it_returns():
    """A callback inside a body calls `u8_values(ba)` (a `&[u8]` of a
    bytearray) and then resizes `ba`. The inner call has returned, but its
    buffer export is still held: the inner context drops after the inner
    body's guard, so the owner lands in the OUTER body's deferred frame and
    is released only when the outer call returns (capsule deleters too).
    Expected: an argument is released when the call that took it returns."""
    ba = bytearray(16)
    outcome = []

    def callback():
        t.u8_values(ba)
        try:
            ba.extend(b"x")
            outcome.append("resized")
        except BufferError as e:
            outcome.append(str(e))

    t.slice_cb(np.arange(3.0), callback)
    assert outcome == ["resized"]


def test_finding_nested_call_runs_its_capsule_deleter_when_it_returns():
    """As above with a DLPack capsule: the inner call's deleter runs only
    when the outer body returns."""
    seen = []

    def callback():
        before = t.producer_counts()[1]
        t.slice_sum(capsule(np.arange(3.0)))
        seen.append(t.producer_counts()[1] - before)

    with deleters_balanced():
        t.slice_cb(np.arange(3.0), callback)
    assert seen == [1]


# -- F6: conversions that the new NumPy path makes, refused elsewhere ----------

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
def test_finding_read_only_slice_of_a_non_native_buffer_or_subclass_converts(make):
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


# -- F7: checks of the element values run after the version bump -------------

def test_finding_refused_bool_argument_still_bumps_the_torch_version():
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


# -- F8: an unnamed error for an empty array ndarray will not describe -------

def test_finding_ndarray_shape_error_says_what_is_wrong():
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


# =============================================================================
# Attacks that held.
# =============================================================================

# -- same memory twice in one call --------------------------------------------

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


@pytest.mark.parametrize("kind", sorted(_sharing_pairs()))
@pytest.mark.parametrize("func", [t.mut_and_ref, t.ref_and_mut, t.opt_mut_and_ref])
def test_held_writable_and_read_only_of_one_memory_are_refused(func, kind):
    a, b = _sharing_pairs()[kind]  # `a` is passed to the writable parameter
    before = np.asarray(a).copy()
    with pytest.raises(TypeError, match=SHARE):
        func(b, a) if func is t.ref_and_mut else func(a, b)
    assert np.array_equal(np.asarray(a), before)


def test_held_writable_views_overlapping_in_bytes_are_refused():
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


def test_held_interleaved_writable_views_that_share_no_byte_are_both_taken():
    x = np.zeros(10)
    t.nd_mut_pair(x[::2], x.view(np.float32)[2::4])
    assert x[::2].tolist() == [1.0] * 5
    assert x.view(np.float32)[2::4].tolist() == [2.0] * 5
    assert (x.view(np.float32)[3::4] == 0).all()


def test_held_two_read_only_views_of_one_memory_share():
    x = np.arange(4.0)
    assert t.ref_ref(x, x[::-1]) == (6.0, 6.0)


def test_held_a_converted_read_only_argument_is_a_copy_taken_before_the_body():
    """`b` needs a conversion (int64 bits of `a`'s memory): its copy is made
    before `a` is written, so `b` holds the values from before."""
    a = np.arange(4.0)
    expected = float(a.view(np.int64).astype(np.float64).sum())
    assert t.mut_and_ref(a, a.view(np.int64)) == expected
    assert a.tolist() == [1.0] * 4


# -- Python code while a body holds a view -----------------------------------

def test_held_callbacks_cannot_take_the_memory_a_body_holds():
    x = np.arange(6.0)
    seen = []

    def write():
        for call in (lambda: t.slice_fill(x, 9.0), lambda: t.nd2_scale(x.reshape(2, 3), 2.0),
                     lambda: t.slice_fill(x[2:4], 9.0), lambda: t.bool_nd_mut(x.view(np.bool_))):
            with pytest.raises(BufferError, match=IN_USE):
                call()
            seen.append(1)

    assert t.slice_cb(x, write) == (15.0, 15.0)
    assert t.nd_cb(x.reshape(2, 3), write) == (15.0, 15.0)

    def read():
        for call in (lambda: t.slice_sum(x), lambda: t.nd2_sum(x.reshape(3, 2)),
                     lambda: t.slice_sum(x[5:])):
            with pytest.raises(BufferError, match=IN_USE):
                call()
            seen.append(1)

    assert t.mut_slice_cb(x, read) == 6.0
    assert t.nd_mut_cb(x, read) == 6.0
    assert len(seen) == 14
    assert x.tolist() == [1.0] * 6


def test_held_a_converted_outer_view_is_not_the_callers_memory():
    """The body reads a fresh copy of a misaligned argument: a callback may
    write the caller's array (it is not borrowed) and the body's values do
    not change."""
    x = misaligned_f64([1.0, 2.0, 3.0])

    def callback():
        x[:] = 100.0

    assert t.slice_cb(x, callback) == (6.0, 6.0)
    assert x.tolist() == [100.0] * 3


def test_held_the_gil_released_with_a_slice_keeps_writers_out():
    x = np.arange(5.0)
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("sum", t.detach_hold(x)))
    th.start()
    try:
        while not t.detach_entered():
            pass
        with pytest.raises(BufferError, match=IN_USE):
            t.slice_fill(x, 9.0)
        with pytest.raises(BufferError, match=IN_USE):
            t.nd2_scale(x.reshape(5, 1), 2.0)
        assert t.slice_sum(x) == 10.0  # readers share
    finally:
        t.detach_release()
        th.join()
    assert out == {"sum": 10.0}
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_held_a_panicking_body_releases_its_views():
    x = np.zeros(3)
    with deleters_balanced():
        for arg in (x, capsule(np.zeros(3))):
            with pytest.raises(BaseException, match="panicked on purpose") as info:
                t.panic_with_mut_slice(arg)
            assert type(info.value).__name__ == "PanicException"
            assert t.live_borrows() == 0
    t.slice_fill(x, 1.0)
    assert x.tolist() == [1.0] * 3


# -- bool ---------------------------------------------------------------------

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


@pytest.mark.parametrize("kind", sorted(_invalid_bools()))
def test_held_invalid_bool_bytes_never_reach_a_rust_bool(kind, balanced):
    func, x = _invalid_bools()[kind]
    before = bytes(np.asarray(x).view(np.uint8).tobytes()) if not str(type(x)).endswith(
        "PyCapsule'>") and not isinstance(x, memoryview) else None
    with pytest.raises(ValueError, match=rf"{func.__name__}\(\): argument 'x'.*not valid bool"):
        func(x)
    if before is not None:
        assert np.asarray(x).view(np.uint8).tobytes() == before


# -- layouts ------------------------------------------------------------------

def test_held_writable_ndarray_views_never_alias_random_layouts():
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


@pytest.mark.parametrize(
    "make",
    [
        lambda: as_strided(np.zeros(1), (0,), (-8,)),
        lambda: as_strided(np.zeros(1), (0,), (2**60,)),
        lambda: as_strided(np.zeros(1), (0, 5), (3, -7)),
        lambda: capsule(np.zeros(0), shape=[0, 3], strides=[2**40, -(2**40)]),
    ],
)
def test_held_empty_arrays_with_any_strides(make, balanced):
    x = make()
    assert t.ndd_values(x) == []
    if np.asarray(x).ndim == 1 if not str(type(x)).endswith("PyCapsule'>") else False:
        assert t.slice_values(x) == []
        t.slice_fill(x, 1.0)


def test_held_extent_one_strides_are_never_stepped(balanced):
    assert t.nd1_values(capsule(np.array([5.0]), strides=[-(2**63)])) == [5.0]
    assert t.slice_values(capsule(np.array([5.0]), strides=[-(2**63)])) == [5.0]
    assert t.ndd_values(capsule(np.array([[5.0], [6.0]]), strides=[1, -(2**63)])) == [5.0, 6.0]
    assert t.nd1_values(capsule(np.array([5.0, 6.0]), strides=[-1], byte_offset=8)) == [6.0, 5.0]


def test_held_zero_strides_read_but_never_written(balanced):
    assert t.nd1_values(capsule(np.array([5.0, 6.0]), shape=[3], strides=[0])) == [5.0] * 3
    with pytest.raises(TypeError, match="two indices"):
        t.ndd_mut_iota(capsule(np.array([5.0, 6.0]), shape=[3], strides=[0]))
    with pytest.raises(TypeError, match="cannot be converted: a DLPack capsule"):
        t.slice_values(capsule(np.array([5.0, 6.0]), shape=[3], strides=[0]))
    with pytest.raises(TypeError, match="not aligned to 8 bytes"):
        t.nd1_values(capsule(np.array([5.0, 6.0]), data_offset=1))


def test_held_0d_is_not_a_slice():
    with pytest.raises(TypeError, match=r"expected shape \(_,\), got \(\)"):
        t.slice_values(np.array(1.0))
    with pytest.raises(TypeError, match=r"expected shape \(_,\), got \(\)"):
        t.nd1_values(np.array(1.0))
    assert t.ndd_values(torch.tensor(2.0, dtype=torch.float64)) == [2.0]


# -- conversions: the copy is what the view reads -----------------------------

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


@pytest.mark.parametrize("kind", sorted(_non_native()))
def test_held_arrays_dlpack_cannot_describe_convert_for_read_only(kind):
    x = _non_native()[kind]
    expected = x.astype(np.float64).tolist()
    assert t.slice_values(x) == expected
    assert t.nd1_values(x) == expected
    addr, n = t.slice_addr(x)
    assert n == len(expected) and addr % 8 == 0
    assert not (x.ctypes.data <= addr < x.ctypes.data + x.nbytes)
    with pytest.raises((TypeError, BufferError), match=r"slice_fill\(\): argument 'x'"):
        t.slice_fill(x, 0.0)


def test_held_fitting_inputs_are_read_in_place():
    """No copy where none is needed: the slice is the caller's memory."""
    x = np.arange(5.0)
    assert t.slice_addr(x) == (x.ctypes.data, 5)
    tt = torch.arange(10, dtype=torch.float64)[2:7]
    assert t.slice_addr(tt) == (tt.data_ptr(), 5)
    assert t.slice_addr(memoryview(x)[1:]) == (x.ctypes.data + 8, 4)
    assert t.slice_addr(x[::-1])[0] != x.ctypes.data  # reversed: a copy


def test_held_a_raising_callback_releases_every_view():
    x = np.arange(3.0)

    def boom():
        raise KeyError("from the callback")

    for func in (t.slice_cb, t.mut_slice_cb, t.nd_mut_cb):
        with pytest.raises(KeyError, match="from the callback"):
            func(x, boom)
        assert t.live_borrows() == 0
    t.slice_fill(x, 2.0)
    assert x.tolist() == [2.0] * 3


def test_held_byteswapped_other_element_types_convert():
    assert t.c128_values(np.array([1 + 2j, 3 - 4j], ">c16")) == [(1.0, 2.0), (3.0, -4.0)]
    assert t.f16_values(np.array([1.5, 2.5], ">f2")) == [1.5, 2.5]
    assert t.i64_values(np.array([1, -2], ">i8")) == [1, -2]
    with pytest.raises(TypeError, match="does not convert to uint8"):
        t.u8_values(np.array([1, 2], ">i8"))
    for bad in (np.array([1.0], dtype=object), np.array([1], "M8[s]"), np.array(["1"])):
        with pytest.raises(TypeError, match="which dlcast cannot read in place"):
            t.slice_values(bad) if bad.dtype.kind != "M" else t.i64_values(bad)


def test_held_misaligned_capsules_are_refused_and_released(balanced):
    with pytest.raises(TypeError, match="a DLPack capsule can be read only once"):
        t.slice_values(capsule(np.array([5.0, 6.0]), data_offset=1))


# -- frameworks ---------------------------------------------------------------

def test_held_torch_tensors():
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


def test_held_jax_and_array_api_strict():
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


# -- producers that lie or change things --------------------------------------

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


def test_held_a_producer_handing_out_another_arguments_memory():
    x = np.arange(4.0)
    with pytest.raises(TypeError, match=SHARE):
        t.mut_and_ref(x, _Aliasing(x))
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_held_a_producer_reshaping_an_earlier_argument():
    """Phase 1 of `b` reshapes `a` in place: `a` is read after every Python
    step, so the slice parameter sees the new (2-D) shape and refuses."""
    a = np.zeros(4)
    with pytest.raises(TypeError, match=r"mut_and_ref\(\): argument 'a'"):
        t.mut_and_ref(a, _Reshaping(a, np.ones(3)))
    assert not a.any()


# -- Rust side: views cannot outlive the call ---------------------------------

def test_held_a_leaked_context_keeps_the_memory_alive():
    """Leaking the call context (`Box::leak`) gives a `&'static [f64]`; it
    is sound because the context, and so the producer's owner, is leaked too
    (the registry entry stays for the process: run in a process of its own)."""
    proc = run_py("""
        import gc, numpy as np, dlcast_testext as t
        x = np.arange(3.0) + 1
        t.evil_leak_slice(x)
        del x
        gc.collect()
        junk = [np.full(3, 9.0) for _ in range(1000)]
        print("RESULT", t.evil_leaked_values(), t.live_borrows())
    """)
    assert "RESULT [1.0, 2.0, 3.0] 1" in proc.stdout, proc.stderr[-2000:]


def test_held_the_rust_body_is_callable_from_rust():
    assert t.native_add_into_from_rust() == [11.0, 22.0, 33.0]
    a, b, c = np.arange(3.0), np.ones(3), np.zeros(3)
    t.native_add_into(a, b, c)
    assert c.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(TypeError, match="dimension 'n' is 3 in 'a' but 2 in 'c'"):
        t.native_add_into(a, b, np.zeros(2))
    with pytest.raises(TypeError, match=SHARE):
        t.native_add_into(a, b, a)


def test_held_dtype_generic_writable_slice():
    x = np.ones(3, np.float32)
    assert t.generic_mut_zero(x) == 3 and not x.any()
    with pytest.raises(TypeError, match="generic_mut_zero"):
        t.generic_mut_zero(np.ones(3, np.int8))
    with pytest.raises(TypeError, match="not aligned"):
        t.generic_mut_zero(misaligned_f64([1.0, 2.0]))


def test_held_array_array_and_bytes():
    assert t.slice_values(array.array("d", [1.0, 2.0])) == [1.0, 2.0]
    assert t.u8_values(b"\x01\x02") == b"\x01\x02"
    with pytest.raises(TypeError, match="read-only"):
        t.bool_slice_mut(memoryview(bytes([0, 1])).cast("?"))


def test_held_exported_views_keep_their_writability():
    """A `dlcast.Array` view of an input, passed back to a writable slice:
    refused for read-only origins (read-only NumPy, `bytes`, JAX, a tensor
    that requires grad), written through for a writable one, and still
    seen as the same memory as its origin."""
    import jax.numpy as jnp

    ro = np.arange(4.0)
    ro.flags.writeable = False
    b = bytes(32)
    for origin in (ro, np.frombuffer(b, np.float64), jnp.arange(4.0),
                   torch.ones(4, dtype=torch.float64, requires_grad=True)):
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
