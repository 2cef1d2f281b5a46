"""Lifetimes: an exported array keeps what it views alive (inputs, objects
owning a buffer, foreign memory), and every owner and deleter runs exactly
once -- on another thread, without the GIL, at interpreter exit, through
reference cycles.
"""

import gc
import subprocess
import sys
import textwrap
import threading
import weakref

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import dlcast_testext as ext
import dlcast_testext as t
from conftest import CASES, buffer_of, expected, exports_freed, negative, run_py


def stats():
    gc.collect()
    return ext.export_stats()


def test_every_export_is_freed_exactly_once():
    b0 = stats()
    a, _ = ext.arange_default("float32", [10])
    del a
    s = stats()
    assert s[0] - b0[0] == 1 and s[1] - b0[1] == 1
    # Consumed by NumPy, PyTorch, JAX; a capsule never consumed.
    for consume in (np.from_dlpack, torch.from_dlpack, jnp.from_dlpack,
                    lambda a: a.__dlpack__(), lambda a: a.__dlpack__(max_version=(1, 0))):
        before = stats()
        a, _ = ext.arange_default("float32", [10], "aligned")
        held = consume(a)
        del a
        mid = stats()
        assert mid[1] == before[1], "freed while a consumer holds it"
        del held
        after = stats()
        assert after[0] - before[0] == 1, consume
        assert after[1] - before[1] == 1, consume
        assert after[2] - before[2] == after[3] - before[3], "capsule deleters unbalanced"


def test_deleter_on_a_thread_without_the_gil():
    before = stats()
    a, _ = ext.arange_default("float64", [8])
    cap = a.__dlpack__(max_version=(1, 0))
    del a
    ext.delete_on_foreign_thread(cap)
    del cap
    after = stats()
    # The capsule's reference to the array was released off-thread; PyO3
    # applies it the next time the GIL is taken.
    np.zeros(1) + 1
    after = stats()
    assert after[3] - before[3] == 1
    assert after[1] - before[1] == 1
    # A legacy capsule too.
    a, _ = ext.arange_default("int32", [3])
    ext.delete_on_foreign_thread(a.__dlpack__())


@pytest.mark.slow
def test_arrays_alive_at_interpreter_exit():
    script = textwrap.dedent("""
        import threading, numpy as np, torch, jax.numpy as jnp, dlcast_testext as ext
        keep = []
        for fw in (np.from_dlpack, torch.from_dlpack, jnp.from_dlpack, lambda a: a):
            a, _ = ext.arange_default("float32", [64], "aligned")
            keep.append(fw(a))
        keep.append(ext.arange_default("float64", [4])[0].__dlpack__(max_version=(1, 0)))
        keep.append(ext.rows(np.arange(12.0).reshape(3, 4), 0, 2))
        def hold():
            t = torch.from_dlpack(ext.arange_default("float32", [8])[0])
            threading.Event().wait()
        threading.Thread(target=hold, daemon=True).start()
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
    assert "GIL" not in r.stderr and "Fatal" not in r.stderr


def test_view_outlives_its_input():
    src = np.arange(12.0).reshape(3, 4)
    view = ext.rows(src, 1, 3)
    ptr = src.__array_interface__["data"][0]
    del src
    gc.collect()
    np.zeros((3, 4))  # reuse of freed memory would show up as zeros
    out = np.asarray(view)
    assert out.__array_interface__["data"][0] == ptr + 4 * 8
    assert out.tolist() == [[4.0, 5.0, 6.0, 7.0], [8.0, 9.0, 10.0, 11.0]]
    # Through PyTorch, after the intermediate dlcast.Array is gone too.
    t = torch.from_dlpack(ext.rows(torch.arange(6.0, dtype=torch.float64).reshape(3, 2), 2, 3))
    gc.collect()
    assert t.tolist() == [[4.0, 5.0]]
    # The producer's deleter ran exactly once, after the last consumer.
    from conftest import deleters_balanced
    with deleters_balanced(1):
        _, deleted0 = ext.producer_counts()
        c = ext.make_capsule(np.arange(4.0).tobytes(), [4], [1])
        v = ext.identity(c)
        del c
        assert ext.producer_counts()[1] == deleted0, "the producer's deleter ran too early"
        n = np.from_dlpack(v)
        del v
        assert n.tolist() == [0.0, 1.0, 2.0, 3.0]
        del n


@pytest.mark.hostile
def test_a_returned_view_keeps_the_memory_it_was_made_of():
    # The body runs Python code that changes the caller's tensor (dtype,
    # size, storage) before the view is exported: the export describes the
    # memory of the view, which the alias keeps alive.
    for change in (lambda t: setattr(t, "data", t.data.to(torch.int8)),
                   lambda t: t.resize_(1),
                   lambda t: t.set_(torch.zeros(1, dtype=torch.float64))):
        x = torch.arange(6, dtype=torch.float64)
        out = ext.view_after_call(x, lambda: change(x))
        assert out.dtype == np.float64 and out.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        del x
        gc.collect()
        assert out.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def collect():
    for _ in range(3):
        gc.collect()


def test_view_keeps_the_object_alive_and_lets_it_go():
    m = ext.Matrix4f()
    w = weakref.ref(m)
    a = m.data_ref()
    del m
    collect()
    assert w() is not None, "the view must keep the object alive"
    a[0, 0] = 1.0
    assert w().get(0, 0) == 1.0
    del a
    collect()
    assert w() is None, "the object must be freed with its last view"


@pytest.mark.parametrize("kind", ["dlcast", "torch", "capsule"])
def test_object_alive_through_each_consumer(kind):
    m = ext.Matrix4f()
    w = weakref.ref(m)
    if kind == "dlcast":
        v = m.data()
    elif kind == "torch":
        v = m.data_torch()
    else:
        v = m.data().__dlpack__(max_version=(1, 0))
    del m
    collect()
    assert w() is not None
    del v
    collect()
    assert w() is None


def test_reference_cycle_through_the_view_is_collected():
    m = ext.Matrix4f()
    m.attached = m.data()  # object -> dlcast.Array -> object
    w = weakref.ref(m)
    del m
    collect()
    assert w() is None, "the cycle object -> array -> object must be collected"


def test_only_arrays_that_refer_to_a_python_object_are_gc_tracked():
    # A returned array over dlcast's own allocation refers to no Python
    # object, so it can be in no cycle: the garbage collector does not track
    # it (as CPython's tuples of atomic values). One that views an object's
    # memory is tracked, so the cycle above is collected.
    own = ext.ones_like(np.zeros(3)).base  # NumPy's array over a dlcast.Array
    assert type(own).__name__ == "Array" and not gc.is_tracked(own)
    m = ext.Matrix4f()
    view = m.data()
    assert type(view).__name__ == "Array" and gc.is_tracked(view)


def test_foreign_memory_freed_once():
    n0, _ = ext.foreign_drops()
    a = np.asarray(ext.foreign(6))
    assert a.tolist() == [0, 1, 2, 3, 4, 5]
    assert a.flags.writeable
    a[0] = 10.0
    b = a[2:]
    del a
    collect()
    assert ext.foreign_drops()[0] == n0, "a NumPy view still holds the memory"
    assert b.tolist() == [2, 3, 4, 5]
    del b
    collect()
    assert ext.foreign_drops()[0] == n0 + 1


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_foreign_memory_freed_once_by_frameworks(framework):
    n0, _ = ext.foreign_drops()
    f = ext.foreign(8)
    x = torch.from_dlpack(f) if framework == "torch" else jnp.from_dlpack(f)
    del f
    collect()
    assert float(x.sum()) == 28.0
    if framework == "torch":
        assert ext.foreign_drops()[0] == n0
    # (JAX copies a buffer that is not 64-byte aligned and lets go of it
    # at once.)
    del x
    collect()
    assert ext.foreign_drops()[0] == n0 + 1


def test_foreign_memory_freed_from_a_thread_without_the_gil():
    n0, threads0 = ext.foreign_drops()
    f = ext.foreign(4)
    cap = f.__dlpack__(max_version=(1, 0))
    del f  # the capsule alone holds the export now
    collect()
    assert ext.foreign_drops()[0] == n0
    ext.consume_on_thread(cap)  # deleter called on another thread, no GIL held there
    n1, threads1 = ext.foreign_drops()
    assert n1 == n0 + 1
    assert threads1[-1] == "deleter-thread"
    del cap  # renamed: its destructor frees nothing more
    collect()
    assert ext.foreign_drops()[0] == n0 + 1


def test_foreign_owner_dropped_when_unexported():
    n0, _ = ext.foreign_drops()
    ext.shared_tensors_give_no_slice()  # builds and drops one unexported
    assert ext.foreign_drops()[0] == n0 + 1


def test_converted_temporaries_are_freed():
    import sys

    x = np.arange(5, dtype=np.int32)
    y = ext.passthrough_f64_numpy(x)
    w = weakref.ref(y)
    del y
    collect()
    assert w() is None
    assert sys.getrefcount(x) == 2  # only `x` and the call's argument


def test_memoryview_of_a_buffer_view_keeps_the_object():
    m = ext.Matrix4f()
    w = weakref.ref(m)
    mv = buffer_of(m.data())
    del m
    collect()
    assert w() is not None
    mv[0, 0] = 2.0
    assert w().get(0, 0) == 2.0
    mv.release()
    del mv
    collect()
    assert w() is None

@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("kind,shape", CASES[::2])
def test_capsules_consumed_or_not_exported_twice_dropped_on_another_thread(kind, shape):
    exp = expected(shape)
    with exports_freed():
        a = t.s2_make(kind, list(shape), False)
        unconsumed = a.__dlpack__()
        legacy = a.__dlpack__(max_version=None) if True else None
        versioned = a.__dlpack__(max_version=(1, 0))
        copied = a.__dlpack__(max_version=(1, 0), copy=True)
        if negative(kind, shape):
            t1, t2 = None, torch.from_numpy(exp.copy())  # PyTorch refuses negative strides
        else:
            t1 = torch.from_dlpack(a)
            t2 = torch.from_dlpack(a)
        del a
        # Freed on another thread, with the GIL taken there by Python.
        box = [unconsumed, legacy, versioned, copied, t1]
        th = threading.Thread(target=box.clear)
        th.start()
        th.join()
        del unconsumed, legacy, versioned, copied, t1
        np.testing.assert_array_equal(t2.numpy(), exp)
        th = threading.Thread(target=lambda: None)
        th.start()
        th.join()
        del t2


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_interpreter_exit_with_live_exports_and_capsules():
    r = run_py(
        """
        import threading, numpy as np, torch, dlcast_testext as t
        keep = []
        for kind in ("zeros", "vec_spare", "ndarray_f", "ndarray_inverted", "static"):
            a = t.s2_make(kind, [2, 3], False)
            keep += [a, a.__dlpack__(), np.asarray(a), t.s2_make_numpy(kind, [2, 3], False)]
            if kind not in ("static", "ndarray_inverted"):
                keep += [torch.from_dlpack(a), t.s2_make_torch(kind, [2, 3], False)]
        # A thread still holding exports when the interpreter exits.
        ev = threading.Event()
        def hold(x=list(keep)):
            ev.wait()
        threading.Thread(target=hold, daemon=True).start()
        print("ok")
        """
    )
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-2000:]



@pytest.mark.hostile
@pytest.mark.parametrize("framework", ["torch", "jax", "numpy", "memoryview", "mlx", ""])
@pytest.mark.parametrize("kw", [{}, {"read_only": True}, {"reversed": True}])
def test_foreign_owner_dropped_exactly_once(framework, kw):
    if framework == "mlx":
        import mlx.core  # noqa: F401 (installed by make test: never skipped)
    f = getattr(ext, "a2_counted_" + framework if framework else "a2_counted")
    collect()
    made0, dropped0 = ext.a2_counted_stats()
    try:
        r = f(5, **kw)
    except (BufferError, ValueError):
        r = None
    if r is not None:
        vals = np.asarray(r).tolist()
        expected = [4.0, 3.0, 2.0, 1.0, 0.0] if kw.get("reversed") else [0.0, 1.0, 2.0, 3.0, 4.0]
        assert vals == expected
        made, dropped = ext.a2_counted_stats()
        assert made - made0 == 1
    del r
    collect()
    made, dropped = ext.a2_counted_stats()
    assert (made - made0, dropped - dropped0) == (1, 1)


@pytest.mark.hostile
def test_buffer_object_collected_while_torch_tensor_lives():
    m = ext.Matrix4f()
    t = m.data_torch()
    del m
    collect()
    t.add_(2.0)
    assert float(t.sum()) == 32.0


@pytest.mark.hostile
def test_only_the_documented_cycles_through_an_own_buffer_leak():
    # An object holding a PyTorch tensor or JAX array over its own buffer
    # (`m.attached = m.data_torch()`) is never collected, like the NumPy
    # case the guide documents: neither framework reports its DLPack
    # owner to the garbage collector. The guide (Ownership) names NumPy
    # only. Expected: the guide names every framework whose arrays leak
    # such a cycle (checked below against the behaviour).
    import weakref

    leaked = []
    for method in ["data_torch", "data_jax"]:
        m = ext.Matrix4f()
        m.attached = getattr(m, method)()
        w = weakref.ref(m)
        del m
        collect()
        if w() is not None:
            leaked.append(method)
            w().attached = None  # break it by hand
    # JAX now gets a copy of an object's buffer (its arrays are immutable),
    # so only the PyTorch cycle remains.
    assert leaked == ["data_torch"]
    from doc_text import chapter

    section = chapter("ownership")
    # The bullet on `dlcast.Array`'s cycles (not the stored-array section).
    cycles = section[section.index("`dlcast.Array` reports the object to the garbage collector") :]
    cycles = cycles[: cycles.index("\n\n")]
    assert "PyTorch" in cycles, cycles


@pytest.mark.hostile
def test_memoryview_refusals_free_the_owner_once():
    collect()
    made0, dropped0 = ext.a2_counted_stats()
    with pytest.raises(BufferError, match="host memory"):
        ext.a2_counted_device_memoryview(3)
    collect()
    made, dropped = ext.a2_counted_stats()
    assert (made - made0, dropped - dropped0) == (1, 1)
    with pytest.raises(BufferError, match="no buffer-protocol format"):
        ext.a2_mv_bf16(3)
    with pytest.raises(BufferError, match="Py_ssize_t"):
        ext.a2_mv_broadcast(2**61)
    mv = ext.a2_mv_broadcast(2)
    assert mv.tolist() == [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]] and mv.strides == (0, 8)
