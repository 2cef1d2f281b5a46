"""What a call reads is released when the call ends, not before and not later:
capsule deleters and buffer releases that run producer code wait for the
outermost body that could see them; nested, refused, panicking and
hand-driven calls (`CallContext`) release exactly what they took.
"""

import array
import gc
import itertools

import numpy as np
import pytest
import torch

import dlcast_testext as ext
import dlcast_testext as t
from conftest import capsule, deleters_balanced, run_py



@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_take_never_hands_out_a_writable_view_of_a_read_only_registration():
    """`dlcast_runtime::__private::CallContext` is public and its methods are safe.
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


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_take_never_builds_a_view_of_another_dtype_than_was_checked():
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


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_take_never_builds_a_writable_view_of_read_only_memory():
    """Prepared as `TensorRef<f64>` (a read-only array is fine), taken as
    `TensorMut<f64>`: the write lands in a `bytes` object, which Python
    promises is immutable. Expected: `take` refuses."""
    b = bytes(16)
    x = np.frombuffer(b, np.float64)
    assert not x.flags.writeable
    with pytest.raises((TypeError, BufferError)):
        t.evil_write_read_only(x)
    assert b == bytes(16)


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


@pytest.mark.slow
@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
@pytest.mark.parametrize("evil", ["evil_guards_out_of_order", "evil_forget_guard"])
def test_bodies_nest_strictly_even_when_they_panic_or_forget_a_view(evil):
    """(Fixed: `CallContext::body` now takes the body as a closure, so bodies
    nest strictly; these functions nest, panic inside, and forget a view.)
    It was: `CallContext::body()` returned a guard that swaps a thread-local "deferred
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


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_a_nested_call_releases_its_buffers_when_the_outer_body_returns():
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


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_a_nested_call_capsule_deleter_runs_when_the_outer_body_returns():
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


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_misaligned_capsules_are_copied_and_released(balanced):
    # Element 0 one byte into the producer's buffer: an aligned copy of
    # those bytes, whatever they hold, and the capsule released once.
    assert len(t.slice_values(capsule(np.array([5.0, 6.0]), data_offset=1))) == 2


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_a_leaked_context_keeps_the_memory_alive():
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


class _Holder:
    """Memory behind a NumPy array whose last release runs Python code:
    `on_del()` when the array (and so this object) is freed."""

    def __init__(self, on_del, n=3):
        self.keep = np.arange(float(n))
        self.__array_interface__ = self.keep.__array_interface__
        self.on_del = on_del

    def __del__(self):
        self.on_del()


def _capsule_running_python(on_del):
    """A NumPy DLPack capsule whose deleter ends up running `on_del()`."""
    a = np.asarray(_Holder(on_del))
    cap = a.__dlpack__()
    del a
    gc.collect()
    return cap


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("b_kind", ["numpy", "torch"])
def test_capsule_deleter_waits_for_the_body_next_to_a_fast_argument(b_kind):
    """`drop_a_then_sum_b(a: TensorDyn, b: TensorMut<f64>)` fills `b`, drops
    `a`, sums `b`. `a` is a capsule whose deleter writes `b` through dlcast;
    `b` alone (NumPy, PyTorch) would not need the guard, `a` does: the
    deleter must run after the body, so the sum is 4.0 and the deleter's
    own call finds no borrow left."""
    b = np.zeros(4) if b_kind == "numpy" else torch.zeros(4, dtype=torch.float64)
    seen = []

    def on_del():
        t.fill_f64(b, 7.0)
        seen.append(t.live_borrows())

    cap = _capsule_running_python(on_del)
    assert t.drop_a_then_sum_b(cap, b) == 4.0
    gc.collect()
    assert seen == [0]
    assert (np.asarray(b) == 7.0).all()


def _export_dropped_in_nested_body(outer_arg, middle):
    """A callback of an outer body calls a middle `#[dlpack_fn]` (NumPy
    arguments only: no body guard) whose callback exports a view of a
    bytearray and drops it; once the middle call has returned, the outer
    callback resizes the bytearray (refused while any export is held)."""
    ba = bytearray(16)
    out = []

    def inner_cb():
        arr = t.identity(ba)
        del arr

    def outer_cb():
        if middle:
            t.slice_cb(np.arange(3.0), inner_cb)
        else:
            inner_cb()
        try:
            ba.extend(b"x")
            out.append("resized")
        except BufferError:
            out.append("still exported")

    t.slice_cb(outer_arg, outer_cb)
    return out


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_release_in_an_unguarded_middle_body_waits_for_the_outer_body():
    """(Fixed: `CallContext::body` starts a guard inside another call's body even
    when its own views defer nothing.) It was: a middle call with no
    deferring view ran its body without a guard, so an owner dropped in its
    body (an exported bytearray view) landed in the OUTER body's deferred
    frame and was released only when the outer call returned."""
    with deleters_balanced():
        assert _export_dropped_in_nested_body(capsule(np.arange(3.0)), True) == ["resized"]


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_capsule_exports_dropped_in_an_unguarded_middle_body_are_held():
    """(Fixed, as above.) The deleters of capsule views exported and dropped
    inside an unguarded middle body ran only when the outer body returned:
    a loop there kept every producer's memory alive."""
    pending = []

    def inner_cb():
        for _ in range(20):
            arr = t.identity(capsule(np.arange(1000.0)))
            del arr

    def outer_cb():
        before = t.producer_counts()
        t.slice_cb(np.arange(3.0), inner_cb)
        after = t.producer_counts()
        # capsules made by the middle call's callback, minus deleters run
        pending.append((after[0] - before[0]) - (after[1] - before[1]))

    with deleters_balanced():
        t.slice_cb(capsule(np.arange(3.0)), outer_cb)
    assert pending == [0]


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.xfail(strict=True, reason=(
    "pre-existing at 21da48a (not from #15): an export of another call dropped "
    "by a callback inside a guarded body (one with a capsule or buffer view) "
    "is deferred to that body's end, like the body's own views"))
def test_export_dropped_in_a_callback_of_a_guarded_body_is_held():
    assert _export_dropped_in_nested_body(capsule(np.arange(3.0)), False) == ["resized"]


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_release_in_a_numpy_only_nesting_is_immediate():
    """Without any guard on the stack, the export is released at once."""
    assert _export_dropped_in_nested_body(np.arange(3.0), True) == ["resized"]
    assert _export_dropped_in_nested_body(np.arange(3.0), False) == ["resized"]


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_capsule_call_inside_an_unguarded_body_inside_a_guarded_one():
    """Outer body: a capsule (guard). Middle: NumPy only (no guard). Inner:
    a capsule, which must be released when the inner call returns."""
    seen = []

    def inner():
        before = t.producer_counts()[1]
        t.slice_sum(capsule(np.arange(3.0)))
        seen.append(t.producer_counts()[1] - before)

    def middle():
        t.slice_cb(np.arange(2.0), inner)

    with deleters_balanced(2):
        assert t.slice_cb(capsule(np.arange(4.0)), middle) == (6.0, 6.0)
    assert seen == [1]


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("middle", [False, True])
def test_a_refused_nested_call_releases_its_capsule_at_once(middle):
    """A nested call refused in phase 2 (a capsule of a dtype that does not
    convert to the slice's) releases the capsule it consumed before it
    returns, whether a guarded body (outer, capsule) or an unguarded one
    (middle, NumPy only) is running around it."""
    seen = []

    def inner():
        before = t.producer_counts()
        with pytest.raises(TypeError, match="expected dtype"):
            t.slice_sum(capsule(np.arange(3, dtype=np.complex64)))
        after = t.producer_counts()
        seen.append((after[0] - before[0], after[1] - before[1]))

    def outer_cb():
        if middle:
            t.slice_cb(np.arange(2.0), inner)
        else:
            inner()

    with deleters_balanced():
        t.slice_cb(capsule(np.arange(3.0)), outer_cb)
    assert seen == [(1, 1)]


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("a_kind,b_kind", list(itertools.product(
    ["none", "numpy", "capsule", "buffer", "torch"], repeat=2)))
def test_optional_parameters_every_source(a_kind, b_kind):
    """`opt_mut_and_ref(a: Option<&mut [f64]>, b: Option<&[f64]>)` with every
    mix of absent, fast (NumPy, PyTorch) and deferring (capsule, buffer)
    sources: right values, every capsule released, buffers resizable after."""
    def make(kind):
        if kind == "none":
            return None
        if kind == "numpy":
            return np.arange(3.0)
        if kind == "capsule":
            return capsule(np.arange(3.0))
        if kind == "buffer":
            return array.array("d", [0.0, 1.0, 2.0])
        return torch.arange(3, dtype=torch.float64)

    with deleters_balanced():
        a, b = make(a_kind), make(b_kind)
        got = t.opt_mut_and_ref(a, b)
    if b is None:
        assert np.isnan(got)
    else:
        assert got == 3.0
    if a_kind in ("numpy", "torch"):
        assert np.asarray(a).tolist() == [1.0] * 3
    if a_kind == "buffer":
        assert a.tolist() == [1.0] * 3
    for x in (a, b):
        if isinstance(x, array.array):
            x.append(0.0)  # no export left


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("kind", ["capsule", "bytearray", "numpy"])
def test_failed_take_in_a_hand_driven_context_releases_its_read(kind):
    """`evil_retype` prepares `TensorRef<u8>` and takes `TensorRef<f64>`:
    `take` refuses, and the read it held is released (capsule deleter run,
    buffer export gone), whatever the source."""
    with deleters_balanced():
        x = {"capsule": lambda: capsule(np.arange(16, dtype=np.uint8)),
             "bytearray": lambda: bytearray(16),
             "numpy": lambda: np.arange(16, dtype=np.uint8)}[kind]()
        with pytest.raises((TypeError, BufferError)):
            t.evil_retype(x)
    if kind == "bytearray":
        x.extend(b"x")


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("kind", ["capsule", "buffer"])
def test_hand_driven_bodies_with_deferring_views(kind):
    """The hand-driven nesting of bodies, with a panic in one (attack.rs),
    with sources whose release runs producer code, in a fresh process:
    every capsule released once, every buffer export ended, a clean exit."""
    make = ("capsule(np.arange(3.0))" if kind == "capsule"
            else "array.array('d', [0.0, 1.0, 2.0])")
    proc = run_py(f"""
        import array, gc
        import numpy as np
        import dlcast_testext as t
        from conftest import capsule
        made0, del0 = t.producer_counts()
        r = [t.evil_guards_out_of_order({make}) for _ in range(3)]
        buf = array.array("d", [5.0, 1.0])
        r.append(t.evil_guards_out_of_order(buf))
        buf.append(0.0)
        gc.collect()
        made, deleted = t.producer_counts()
        print("RESULT", r, made - made0, deleted - del0, t.live_borrows())
    """)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, proc.stderr[-2000:]
    made = 3 if kind == "capsule" else 0
    assert line[0] == f"RESULT [0.0, 0.0, 0.0, 5.0] {made} {made} 0"
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("src", ["capsule", "numpy", "torch", "bytearray"])
def test_dtype_generic_functions_release_what_peek_read(src):
    """`generic_mut_zero<T>(#[dtype(f32, f64, i32)] x: &mut [T])`: `peek`
    prepares the argument before dispatch; each source is read once, zeroed,
    released (capsules, buffers), or refused for an unlisted dtype."""
    def make(dtype):
        a = np.arange(1, 5).astype(dtype)
        if src == "capsule":
            return capsule(a)
        if src == "torch":
            return torch.from_numpy(a.copy())
        if src == "bytearray":
            return bytearray(a.tobytes())
        return a

    for dtype in (np.float32, np.float64, np.int32):
        with deleters_balanced():
            x = make(dtype)
            if src == "bytearray":
                # A bytearray is bytes ('B'): not a listed dtype.
                with pytest.raises(TypeError, match="expected dtype"):
                    t.generic_mut_zero(x)
                x.extend(b"x")
                continue
            assert t.generic_mut_zero(x) == 4
        if src in ("numpy", "torch"):
            assert np.asarray(x).tolist() == [0] * 4
    with deleters_balanced():
        with pytest.raises(TypeError, match="expected dtype"):
            t.generic_mut_zero(make(np.int16))


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("make", [lambda: np.arange(3.0), lambda: capsule(np.arange(3.0)),
                                  lambda: array.array("d", [0.0, 1.0, 2.0])])
def test_a_context_of_the_wrong_size_refuses_every_step(make):
    with deleters_balanced():
        x = make()
        assert t.evil_spec_count(x) == 16


@pytest.mark.hostile
def test_deferred_deleter_calling_back_into_dlcast():
    # A capsule whose deleter runs Python (NumPy array over a Holder with
    # __del__) that calls dlcast again, writing the body's own argument:
    # the release comes after the body, with its borrows gone.
    b = np.zeros(4)
    seen = []

    class Holder:
        def __init__(self):
            self.keep = np.arange(3.0)
            self.__array_interface__ = self.keep.__array_interface__

        def __del__(self):
            ext.fill_f64(b, 7.0)
            seen.append(ext.live_borrows())

    a = np.asarray(Holder())
    cap = a.__dlpack__()
    del a
    gc.collect()
    assert ext.drop_a_then_sum_b(cap, b) == 4.0
    assert seen == [0]
    assert (b == 7.0).all()


@pytest.mark.hostile
def test_nested_bodies_release_every_capsule_once():
    before = ext.producer_counts()
    b = np.zeros(3)

    def cb():
        for _ in range(50):
            c = ext.make_capsule(np.arange(4.0).tobytes(), [4])
            ext.drop_a_then_sum_b(c, np.zeros(2))

    def boom():
        cb()
        raise RuntimeError("boom")

    for _ in range(20):
        ext.sum_around_call(b, cb)
        with pytest.raises(RuntimeError, match="boom"):
            ext.sum_around_call(b, boom)
    gc.collect()
    after = ext.producer_counts()
    assert after[0] - before[0] == 2000
    assert after[1] - before[1] == 2000  # every deleter ran, once
    assert ext.live_borrows() == 0
