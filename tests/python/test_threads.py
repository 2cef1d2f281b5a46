"""Threads: Python threads call dlcast functions concurrently on
NumPy, PyTorch and raw-capsule inputs, some of whose bodies release the GIL
(`py.detach`, after copying what they need out of their views: views
cannot cross into it, see ui-tests/tests/ui/fail/view_in_detach.rs).
Results are correct, and every buffer, capsule and producer deleter is
balanced afterwards."""

import gc
import sys
import threading

import numpy as np
import pytest
import torch

import dlcast_testext as ext
from conftest import capsule

THREADS = 8
ROUNDS = 200


@pytest.fixture
def fast_switching():
    """Switch threads every 10 µs instead of 5 ms, so calls interleave."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


def run_threads(worker, n=THREADS):
    """Runs `worker(i)` on `n` threads started together; re-raises the first
    failure."""
    barrier = threading.Barrier(n)
    errors = []

    def target(i):
        try:
            barrier.wait()
            worker(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def balanced_counts():
    gc.collect()
    return ext.export_stats(), ext.producer_counts()


def assert_balanced(before):
    (b0, bf0, c0, cd0), (pc0, pd0) = before
    (b1, bf1, c1, cd1), (pc1, pd1) = balanced_counts()
    assert b1 - b0 == bf1 - bf0, "export buffers created/freed"
    assert c1 - c0 == cd1 - cd0, "export capsules created/deleted"
    assert pc1 - pc0 == pd1 - pd0, "producer capsules created/deleted"
    return b1 - b0, pc1 - pc0


def test_concurrent_imports_with_the_gil_released(fast_switching):
    before = balanced_counts()
    shared_np = np.arange(1000.0)
    shared_torch = torch.arange(1000, dtype=torch.float64)
    total = float(shared_np.sum())

    def worker(i):
        mine = np.arange(100.0) + i
        out = np.zeros(100)
        tout = torch.zeros(100, dtype=torch.float64)
        for r in range(ROUNDS):
            # Shared read-only inputs, read by every thread at once.
            assert ext.sum_detached(shared_np) == total
            assert ext.sum_detached(shared_torch) == total
            assert ext.sum_detached(shared_np[::-3]) == float(shared_np[::-3].sum())
            # Per-thread writable outputs, written after a detached section.
            ext.scale_detached(mine, out, float(r))
            assert out[7] == (7.0 + i) * r
            ext.scale_detached(torch.from_numpy(mine), tout, 2.0)
            assert tout[99].item() == (99.0 + i) * 2.0
            # Capsules from the test producer: deleter once per capsule.
            assert ext.sum_detached(capsule(np.full(3, float(i)))) == 3.0 * i
            assert ext.values(capsule(np.arange(2.0) + r, versioned=r % 2 == 0)) == [r, r + 1.0]

    run_threads(worker)
    _, capsules = assert_balanced(before)
    assert capsules == THREADS * ROUNDS * 2
    # The GIL was really released: several threads were detached at once.
    assert ext.detached_peak() >= 2


def test_concurrent_writes_to_disjoint_slices_of_one_array(fast_switching):
    out = np.zeros((THREADS, 64))
    src = np.arange(64.0)

    def worker(i):
        for r in range(ROUNDS):
            ext.scale_detached(src, out[i], float(i))
            ext.add_one_into(src, out[i])
        # Refused aliasing from every thread at once: rows of one array.
        with pytest.raises(TypeError, match="share memory"):
            ext.scale_detached(out[i], out[i], 1.0)

    run_threads(worker)
    assert (out == src + 1.0).all()


def test_concurrent_exports_and_returned_views(fast_switching):
    before = balanced_counts()

    def worker(i):
        for r in range(ROUNDS // 2):
            a, _ = ext.arange_default("float64", [3, 4])
            n, _ = ext.arange_numpy("int32", [5])
            t, _ = ext.arange_torch("float32", [2, 2])
            assert np.asarray(a)[2, 3] == 11.0
            assert n.tolist() == [0, 1, 2, 3, 4]
            assert t.sum().item() == 6.0
            # Views of inputs returned to Python from several threads.
            base = torch.arange(12, dtype=torch.float64).reshape(6, 2)
            v = ext.rows(base, 1, 3)
            assert np.asarray(v).tolist() == [[2.0, 3.0], [4.0, 5.0]]
            w = ext.rows(np.arange(12.0).reshape(6, 2) + i, 4, 6)
            assert np.from_dlpack(w)[0, 0] == 8.0 + i
            # A capsule of an export, deleted on a thread that never held
            # the GIL while this one has released it.
            ext.delete_on_foreign_thread(ext.arange_default("uint8", [7])[0].__dlpack__())
            del a, n, t, v, w

    run_threads(worker)
    buffers, _ = assert_balanced(before)
    assert buffers >= THREADS * (ROUNDS // 2) * 4


def test_exceptions_from_many_threads(fast_switching):
    before = balanced_counts()

    class Raises:
        def __dlpack__(self, **kw):
            raise ValueError("per-thread failure")

    def worker(i):
        for r in range(ROUNDS // 3):
            with pytest.raises(BufferError):
                ext.sum_detached(Raises())
            with pytest.raises(TypeError, match="expected dtype float64"):
                ext.sum_detached(np.zeros(3, np.complex64))
            with pytest.raises(BufferError, match="invalid array"):
                ext.sum_detached(ext.make_capsule(bytes(8), [-1], [1]))
            with pytest.raises(TypeError, match="dimension 'n'"):
                ext.scale_detached(capsule(np.zeros(2)), np.zeros(3), 1.0)

    run_threads(worker)
    assert_balanced(before)
