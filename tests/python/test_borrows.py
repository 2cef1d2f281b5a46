"""The process-wide borrow registry (kind 8 of the soundness issue): a live
`&mut` view excludes every other view of its memory, and a live `&` view
excludes writable ones, across arguments, nested calls, Python callbacks,
threads (bodies inside `py.detach`) and separately built extension modules.
"""

import threading
import time

import numpy as np
import pytest
import torch

import dlcast_second as second
import dlcast_testext as ext

IN_USE = r"the array's memory is in use by another call still running"


def test_kind8_a_callback_cannot_write_under_a_live_mut_slice():
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


def test_kind8_readers_share_and_writers_wait_their_turn():
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


def test_kind8_a_second_extension_sees_the_first_ones_borrows_and_the_reverse():
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


def test_kind8_threads_inside_detach_never_write_at_once():
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


def test_kind8_a_reader_in_detach_keeps_writers_out():
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


def test_kind8_strided_views_that_share_no_element_are_both_taken():
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


def test_kind8_borrows_end_with_the_call_on_every_path():
    a = np.zeros(4)
    with pytest.raises(TypeError):
        ext.add_one_into(a, a)  # refused: nothing stays registered
    with pytest.raises(ZeroDivisionError):
        ext.hold_mut_and_call(a, lambda: 1 / 0)
    view = ext.identity_mut(np.zeros(3, np.float32))  # exported: Python's now
    assert ext.live_borrows() == 0
    ext.fill_f64(a, 1.0)
    del view


def test_kind8_the_registry_is_shared_through_the_interpreter_state():
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