"""The process-wide borrow registry: a live writable view excludes every other
view of its memory (callbacks, other threads, a second extension), readers
share, and every borrow ends with its call on every path (return, exception,
panic); an `ArrayBuffer`'s
guards and rust-numpy's borrows meet the same registry.
"""

import gc
import threading
import time

import numpy as np
import pytest
import torch

import dlcast_second as second
import dlcast_testext as ext
import dlcast_testext as t
from conftest import capsule, deleters_balanced, run_py


IN_USE = r"the array's memory is in use by another call still running"


def test_a_callback_cannot_write_under_a_live_mut_slice():
    a = np.zeros(6)
    seen = []

    def callback():
        # Each of these would write (or read) the memory the body holds as
        # `&mut [f64]`: undefined behaviour in Rust, refused here.
        for call in (lambda: ext.fill_f64(a, 5.0), lambda: ext.fill_f64(a[2:4], 5.0),
                     lambda: ext.sum_f64(a), lambda: second.fill(a, 5.0),
                     lambda: ext.fill_f64(torch.from_numpy(a), 5.0)):
            with pytest.raises(BufferError, match=IN_USE) as info:
                call()
            seen.append(str(info.value))

    assert ext.hold_mut_and_call(a, callback) == 6.0
    assert a.tolist() == [1.0] * 6
    assert len(seen) == 5
    assert seen[0].startswith("fill_f64(): argument 'out': ")
    assert "argument 'x' of hold_mut_and_call(), a writable view" in seen[0]
    # Memory next to the held array is free.
    b = np.zeros(12)
    ext.hold_mut_and_call(b[:6], lambda: ext.fill_f64(b[6:], 2.0))
    assert b.tolist() == [1.0] * 6 + [2.0] * 6
    # Once the call returns, its borrow is gone.
    ext.fill_f64(a, 3.0)
    assert a.tolist() == [3.0] * 6


def test_readers_share_and_writers_wait_their_turn():
    a = np.arange(4.0)
    inner = []

    def callback():
        inner.append(ext.sum_f64(a))  # read-only under read-only: allowed
        inner.append(second.hold_and_call(a, lambda: None))
        with pytest.raises(BufferError, match=IN_USE):
            ext.fill_f64(a, 0.0)
        with pytest.raises(BufferError, match=IN_USE):
            second.fill(a[1:], 0.0)

    assert ext.hold_ref_and_call(a, callback) == (6.0, 6.0)
    assert inner == [6.0, (0.0, 0.0)]
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_second_extension_sees_the_first_ones_borrows_and_the_reverse():
    a = np.ones(3)
    with pytest.raises(BufferError, match=r"^fill\(\): argument 'x': " + IN_USE):
        ext.hold_ref_and_call(a, lambda: second.fill(a, 0.0))
    errors = []

    def try_fill():
        try:
            ext.fill_f64(a, 9.0)
        except BufferError as e:
            errors.append(str(e))

    assert second.hold_and_call(a, try_fill) == (1.0, 1.0)
    assert len(errors) == 1 and "argument 'x' of hold_and_call()" in errors[0]
    # Both modules use one registry.
    assert ext.live_borrows() == second.live_borrows() == 0


def test_threads_inside_detach_never_write_at_once():
    # Eight threads increment one array with the GIL released; a body
    # holds `&mut [i64]` the whole time. Two at once would lose updates;
    # the registry refuses the second instead, so every successful call
    # added exactly 1 to every element.
    a = np.zeros(2000, np.int64)
    done, refused = [0], [0]
    lock = threading.Lock()

    def worker():
        for _ in range(15):
            try:
                ext.increment_detached(a)
                with lock:
                    done[0] += 1
            except BufferError as e:
                assert IN_USE in str(e)
                with lock:
                    refused[0] += 1

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert done[0] + refused[0] == 8 * 15
    assert done[0] > 0
    assert (a == done[0]).all()
    assert ext.live_borrows() == 0


def test_a_reader_in_detach_keeps_writers_out():
    a = np.ones(3000, np.int64)
    results, refused = [], [0]
    start = threading.Barrier(2)

    def reader():
        start.wait()
        deadline = time.monotonic() + 60
        while len(results) < 5 and time.monotonic() < deadline:
            try:
                results.append(ext.sum_detached_slowly(a))
            except BufferError:
                refused[0] += 1
                time.sleep(0.001)

    def writer():
        start.wait()
        for _ in range(10):
            try:
                ext.increment_detached(a)
            except BufferError:
                refused[0] += 1

    t1, t2 = threading.Thread(target=reader), threading.Thread(target=writer)
    t1.start(), t2.start()
    t1.join(), t2.join()
    # Every sum saw a consistent array: n * (1 + k) for some whole k.
    assert len(results) >= 5
    assert all(s % 3000 == 0 for s in results), results


def test_strided_views_that_share_no_element_are_both_taken():
    a = np.arange(12.0)
    ext.copy_strided(a[::2], a[1::2])  # even elements written from odd ones
    assert a.tolist() == [1, 1, 3, 3, 5, 5, 7, 7, 9, 9, 11, 11]
    m = np.zeros((5, 4))
    m[:, 1] = 7.0
    ext.copy_strided(m[:, 0], m[:, 1])  # columns of one matrix
    assert m[:, 0].tolist() == [7.0] * 5
    # Overlapping ones are refused, in one call as before.
    with pytest.raises(TypeError, match="arguments 'dst' and 'src' share memory"):
        ext.copy_strided(a[:6], a[4:10])
    with pytest.raises(TypeError, match="arguments 'dst' and 'src' share memory"):
        ext.copy_strided(a[::2], a[2::2])


def test_borrows_end_with_the_call_on_every_path():
    a = np.zeros(4)
    with pytest.raises(TypeError):
        ext.add_one_into(a, a)  # refused: nothing stays registered
    with pytest.raises(ZeroDivisionError):
        ext.hold_mut_and_call(a, lambda: 1 / 0)
    view = ext.identity_mut(np.zeros(3, np.float32))  # exported: Python's now
    assert ext.live_borrows() == 0
    ext.fill_f64(a, 1.0)
    del view


def test_the_registry_is_shared_through_the_interpreter_state():
    import ctypes
    import sys

    # Kept in the interpreter's C-level state dictionary (reached here
    # through the C API), not in `sys.modules`.
    api = ctypes.pythonapi
    api.PyInterpreterState_Get.restype = ctypes.c_void_p
    # A borrowed reference: taken as a plain pointer, then as an object
    # (a `py_object` result type would steal a reference it does not own).
    api.PyInterpreterState_GetDict.restype = ctypes.c_void_p
    api.PyInterpreterState_GetDict.argtypes = [ctypes.c_void_p]
    ext.live_borrows()
    state = ctypes.cast(api.PyInterpreterState_GetDict(api.PyInterpreterState_Get()), ctypes.py_object)
    cap = state.value["dlcast.borrow_registry"]
    assert type(cap).__name__ == "PyCapsule"
    assert "dlcast.borrow_registry" in repr(cap)
    assert "_dlcast_shared" not in sys.modules

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


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
@pytest.mark.parametrize("kind", ["dtype", "byteswapped", "misaligned", "strided"])
def test_a_nested_call_never_reads_memory_under_a_live_mut_slice(kind):
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


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_callbacks_cannot_take_the_memory_a_body_holds():
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


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_the_gil_released_with_a_slice_keeps_writers_out():
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


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_a_panicking_body_releases_its_views():
    x = np.zeros(3)
    with deleters_balanced():
        for arg in (x, capsule(np.zeros(3))):
            with pytest.raises(BaseException, match="panicked on purpose") as info:
                t.panic_with_mut_slice(arg)
            assert type(info.value).__name__ == "PanicException"
            assert t.live_borrows() == 0
    t.slice_fill(x, 1.0)
    assert x.tolist() == [1.0] * 3


@pytest.mark.usefixtures("registry_empty_after")
@pytest.mark.hostile
def test_a_raising_callback_releases_every_view():
    x = np.arange(3.0)

    def boom():
        raise KeyError("from the callback")

    for func in (t.slice_cb, t.mut_slice_cb, t.nd_mut_cb):
        with pytest.raises(KeyError, match="from the callback"):
            func(x, boom)
        assert t.live_borrows() == 0
    t.slice_fill(x, 2.0)
    assert x.tolist() == [2.0] * 3


# Formerly a hole: dropping a view inside a body runs the producer's deleter,
# which can run arbitrary Python code (here NumPy's own deleter freeing an
# array whose base has a __del__), while the body holds another view's
# `&mut [f64]`: Python writes under a live Rust `&mut`.

@pytest.mark.hostile
def test_a_view_dropped_in_the_body_runs_no_python_under_a_live_mut_slice():
    b = np.zeros(4)

    class Holder:
        def __init__(self):
            self.keep = np.arange(3.0)
            self.__array_interface__ = self.keep.__array_interface__

        def __del__(self):
            b[:] = 5.0  # an ordinary NumPy write, from a finalizer

    a = np.asarray(Holder())
    cap = a.__dlpack__()
    del a
    gc.collect()
    # The body fills b with 1.0 through &mut [f64], drops the view of `cap`,
    # and sums the same slice: 4.0 unless Python wrote under the &mut.
    assert ext.drop_a_then_sum_b(cap, b) == 4.0


def _park(target, *args):
    """Runs `target(*args)` on a thread and waits until it is parked inside
    py.detach holding its borrow; gives (thread, results)."""
    import threading

    out = []
    t = threading.Thread(target=lambda: out.append(target(*args)))
    t.start()
    while not ext.a2_held():
        if not t.is_alive():
            raise AssertionError("the parked call ended early", out)
        __import__("time").sleep(0.001)
    return t, out


@pytest.mark.hostile
def test_read_guard_across_threads_refuses_writers():
    o = ext.JaxBuf()
    a = np.asarray(o.view())  # exported before the guard
    t, out = _park(o.hold_read)
    try:
        with pytest.raises(BufferError, match="in use"):
            o.set(0, 1.0)  # ArrayBuffer::set from another thread
        with pytest.raises(BufferError, match=r"ArrayBuffer\.read"):
            ext.increment_f32(a)  # a dlcast TensorMut of the exported memory
        with pytest.raises(BufferError, match="in use"):
            o.view()  # a new writable export
        assert o.total() == 0.0  # readers share
    finally:
        ext.a2_release()
        t.join()
    assert out == [0.0]
    assert ext.live_borrows() == 0
    o.set(0, 1.0)
    assert a[0] == 1.0


@pytest.mark.hostile
def test_detached_writer_excludes_buffer_readers_and_writers():
    o = ext.JaxBuf()
    a = np.asarray(o.view())
    t, _ = _park(ext.a2_hold_mut, a)
    try:
        with pytest.raises(BufferError):
            o.total()  # read guard vs a live &mut [f32] on another thread
        with pytest.raises(BufferError):
            o.set(1, 2.0)
        with pytest.raises(BufferError):
            o.view()
    finally:
        ext.a2_release()
        t.join()
    assert o.total() == 16.0
    assert ext.live_borrows() == 0


# --- ArrayBuffer and rust-numpy ---------------------------------------------

RNP_SCENARIO = """
import sys
import numpy as np
import dlcast_rnp as rnp
import dlcast_testext as ext

if sys.argv[1] == "rust-numpy first":
    # A rust-numpy extension borrows an array before dlcast meets its first
    # NumPy array: rust-numpy's own table holds rust-numpy's borrows.
    rnp.hold_ref_and_call(np.zeros(3), lambda: None)
else:
    ext.hold_ref_and_call(np.zeros(3), lambda: None)
o = ext.F64Buf(4)
a = o.data()  # a writable NumPy array over the object's ArrayBuffer
results = {}

def attempt(name, f):
    try:
        f()
        results[name] = "allowed"
    except (BufferError, TypeError) as e:
        results[name] = "refused: " + str(e)

# A: rust-numpy holds &mut of `a`; the object reads its buffer (&[f64]).
attempt("read under rnp &mut", lambda: rnp.hold_mut_and_call(a, lambda: o.sum_around(lambda: None)))
# B: the object holds &[f64]; rust-numpy takes &mut of `a`.
attempt("rnp &mut under read", lambda: o.sum_around(lambda: rnp.hold_mut_and_call(a, lambda: None)))
# C: rust-numpy holds &mut; the object writes an element (ArrayBuffer::set).
attempt("set under rnp &mut", lambda: rnp.hold_mut_and_call(a, lambda: o.set0(5.0)))
# D: rust-numpy holds & (its view must not change); the object writes.
attempt("set under rnp &", lambda: rnp.hold_ref_and_call(a, lambda: o.set0(7.0)))
print(repr(results))
assert ext.live_borrows() == 0
"""


def rnp_scenario(order):
    import ast

    from conftest import run_py

    r = run_py(RNP_SCENARIO.replace("sys.argv[1]", repr(order)))
    assert r.returncode == 0, r.stdout + r.stderr
    return ast.literal_eval(r.stdout.strip().splitlines()[-1])


@pytest.mark.hostile
def test_buffer_guards_are_seen_by_rust_numpys_own_table():
    # When rust-numpy's own borrow table is in use (a rust-numpy extension
    # borrowed first), ArrayBuffer::read / set are registered in dlcast's
    # registry only: a rust-numpy PyReadwriteArray of an array exported from
    # the buffer and the object's own &[f64] (or element writes) coexist, an
    # aliasing &mut / & pair in safe Rust, and writes under rust-numpy's
    # shared view. Expected: refused both ways, as in the other order.
    # Fixed: with rust-numpy's own table, Rust's writes (and `read()` while
    # a writable export lives) are refused while exports live, since
    # rust-numpy keys its borrows by each export's base object.
    results = rnp_scenario("rust-numpy first")
    allowed = [k for k, v in results.items() if v == "allowed"]
    assert not allowed, results


@pytest.mark.hostile
def test_buffer_guards_meet_rust_numpy_borrows_through_dlcasts_table():
    results = rnp_scenario("dlcast first")
    assert all(v.startswith("refused") for v in results.values()), results


@pytest.mark.hostile
def test_buffer_conflict_with_rust_numpy_names_the_other_extension():
    # The refusal reads "cannot read: the buffer's memory is in use by a
    # writable borrow that is still live (argument '' of <rust-numpy>())".
    # Expected: "... borrowed by a rust-numpy extension", as dlcast's views
    # say, not an empty argument name.
    results = rnp_scenario("dlcast first")
    text = results["read under rnp &mut"]
    assert "argument ''" not in text and "rust-numpy extension" in text, text


@pytest.mark.hostile
def test_dlcast_bodies_and_buffer_access_exclude_each_other():
    o = ext.F64Buf(4)
    a = o.data()
    # A dlcast body reading `a` (&[f64]) calls back into the object.
    with pytest.raises(BufferError, match="cannot write the buffer"):
        ext.hold_ref_and_call(a, lambda: o.set0(1.0))
    # A dlcast body writing `a` (&mut [f64]) calls back into the object.
    with pytest.raises(BufferError, match="cannot read"):
        ext.hold_mut_and_call(a, lambda: o.sum_around(lambda: None))
    # The object reads; a dlcast body asks to write `a`.
    with pytest.raises(BufferError):
        o.sum_around(lambda: ext.hold_mut_and_call(a, lambda: None))
    assert ext.live_borrows() == 0
    # Only the second body ran (it fills with 1.0 before its callback).
    assert a.tolist() == [1.0] * 4
