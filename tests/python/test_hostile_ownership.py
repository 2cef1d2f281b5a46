"""Hostile tests of ownership (ArrayBuffer, Tensor::from_static,
Tensor::from_raw_parts, into_read_only, returns = memoryview | mlx | paddle)
and of rank-typed views (TensorRef<'_, T, N>, views over Rust data).

`test_finding_*` tests fail today: each is a bug report (input, expected
behaviour). `test_held_*` tests are attacks that the code withstood.
The Rust side is tests/src/attack2.rs.
"""

import gc
import textwrap

import numpy as np
import pytest
import torch

import dlcast_testext as ext


def collect():
    for _ in range(3):
        gc.collect()


def run_child(code):
    """Runs `code` in a fresh interpreter (a crash must not take pytest down)."""
    from conftest import run_py

    return run_py(
        "import warnings; warnings.simplefilter('ignore')\n"
        "import numpy as np, torch, jax, dlcast_testext as ext\n" + textwrap.dedent(code)
    )


# --- findings -------------------------------------------------------------


@pytest.mark.parametrize(
    "route",
    [
        # NumPy re-exports its read-only array with DLPack's READ_ONLY flag,
        # which PyTorch ignores.
        "a = ext.a2_static_numpy(); t = torch.from_dlpack(a)",
        # The same through returns = memoryview and numpy.frombuffer.
        "a = np.frombuffer(ext.a2_static_memoryview(), np.float32); t = torch.from_dlpack(a)",
        # JAX takes 64-byte aligned static data without a copy and re-exports
        # it as a legacy capsule, with no read-only mark at all.
        "a = ext.a2_static_aligned_jax(); t = torch.from_dlpack(a)",
        # returns = tensorflow passes a legacy capsule with copied = false
        # (export.rs, Framework::Tensorflow), skipping the copy that
        # __dlpack__ makes of never-written memory; TensorFlow re-exports it.
        "import tensorflow as tf\n"
        "a = ext.a2_static_tensorflow(); t = torch.from_dlpack(tf.experimental.dlpack.to_dlpack(a))",
    ],
    ids=["numpy", "memoryview", "jax", "tensorflow"],
)
def test_finding_static_data_reaches_pytorch_through_a_reexporting_consumer(route):
    # Tensor::from_static hands a Rust static (in read-only pages) to NumPy,
    # memoryview and JAX without a copy; they hand it on to PyTorch, which
    # writes: SIGSEGV. Expected: no crash (PyTorch gets a copy, or an error).
    code = route + "\nt.fill_(7)\nprint('alive')\n"
    p = run_child(code)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert "alive" in p.stdout


def test_finding_read_only_foreign_memory_written_by_pytorch_through_numpy():
    # Tensor::from_raw_parts(.., read_only = true, ..) (the README's mmap
    # example): `returns = numpy` gives NumPy a read-only array over the
    # memory; torch.from_dlpack(a) writes it in place (for a read-only
    # mapping, SIGSEGV). Expected: memory that must never be written is
    # never handed to a consumer that can pass it on writable.
    # Fixed: such memory is exported as one read-only copy, so what PyTorch
    # writes (it ignores READ_ONLY) is that copy, never the foreign memory;
    # a second export of the same memory still reads the original values.
    made0, dropped0 = ext.a2_counted_stats()
    a = ext.a2_counted_numpy(4, read_only=True)
    assert not a.flags.writeable
    # The foreign memory was copied and let go at export: nothing holds it.
    made, dropped = ext.a2_counted_stats()
    assert (made - made0, dropped - dropped0) == (1, 1)
    t = torch.from_dlpack(a)
    t.fill_(7.0)  # writes dlcast's copy
    assert a.tolist() == [7.0] * 4


def test_finding_bool_buffer_gives_rust_invalid_bools():
    # ArrayBuffer<bool> exported writable; Python writes the byte 2 (NumPy:
    # True) through a uint8 view. ArrayBuffer::read() then hands safe Rust
    # a &[bool] holding 2, and ArrayBuffer::get() reads it with
    # `ptr.read()`: undefined behaviour; in practice Rust sees `false`.
    # Expected: Rust sees True (as TensorRef<bool>::get does via read_at)
    # or gets an error.
    b = ext.BoolBuf(3)
    a = b.data()
    a.view(np.uint8)[1] = 2
    assert bool(a[1]) is True
    try:
        got = b.get_byte(1)
    except ValueError:
        got = None
    assert got in (1, None), got
    try:
        got = list(b.read_bytes())
    except ValueError:
        got = None
    assert got in ([0, 1, 0], None), got


def test_finding_bool_buffer_as_mut_slice_invalid_bools():
    # The same byte left behind after the export is gone: as_mut_slice()
    # gives safe Rust a &mut [bool] holding 2.
    b = ext.BoolBuf(2)
    a = b.data()
    a.view(np.uint8)[0] = 2
    del a
    collect()
    try:
        got = list(b.mut_bytes())
    except ValueError:
        got = None
    assert got in ([1, 0], None), got


@pytest.mark.parametrize("method", ["frozen", "frozen2"])
def test_finding_jax_array_over_a_buffer_changes_after_creation(method):
    # A read-only ArrayBuffer view goes to JAX without a copy; the object
    # (ArrayBuffer::set) and writable exports still write the memory, so an
    # "immutable" JAX array changes value. Expected: JAX gets a copy (as it
    # does for data that is not 64-byte aligned), or returns = jax of a
    # buffer view is refused.
    o = ext.JaxBuf()
    j = getattr(o, method)()
    before = np.asarray(j).copy()
    o.set(3, 5.0)
    assert np.array_equal(np.asarray(j), before)


def test_finding_returns_mlx_negative_strides_error_names_nothing():
    # returns = mlx of a negatively strided tensor: MLX's own
    # "ValueError: Cannot convert DLPack arrays with negative strides to mlx
    # array." without the function; torch and paddle get a BufferError from
    # dlcast naming the problem and the fix, JAX gets a copy. Expected: a
    # copy (MLX copies anyway) or dlcast's BufferError.
    pytest.importorskip("mlx.core")
    try:
        r = ext.a2_counted_mlx(4, reversed=True)
    except BufferError as e:
        assert "negative stride" in str(e)
        return
    except ValueError as e:
        pytest.fail(f"MLX's own error leaked: {e}")
    assert np.array(r).tolist() == [3.0, 2.0, 1.0, 0.0]


def test_finding_empty_rust_view_with_huge_extent_error_contradicts_itself():
    # An empty view over Rust data with an extent beyond i64::MAX, returned:
    # the copy's error says "shape [0, 9223372036854775808] holds 0
    # elements, but the data has 0". Expected: the real reason (an extent
    # exceeds i64::MAX / cannot be exported).
    with pytest.raises(ValueError) as e:
        ext.a2_rust_empty([0, 2**63])
    assert "holds 0 elements, but the data has 0" not in str(e.value)


def test_finding_buffer_zeros_overflow_error_is_misleading():
    # ArrayBuffer::zeros(&[usize::MAX, 2]) (and Tensor::zeros): "shape
    # [18446744073709551615, 2] holds 18446744073709551615 elements, but the
    # data has 0": no data was given; the element count overflows.
    # Expected: a message saying the element count overflows (and
    # MemoryError, as for any size that cannot be allocated).
    kind, msg = ext.a2_buffer_zeros_error([2**64 - 1, 2])
    assert "data has 0" not in msg
    assert kind == "MemoryError"


def test_finding_buffer_get_wrong_length_index_says_out_of_bounds():
    # ArrayBuffer::get(&[1]) on a (4, 4) buffer: "index [1] is out of bounds
    # for a buffer of shape [4, 4]"; the view accessors say "index (1,) has
    # 1 entry, the array 2 dimensions". Expected: the same wording.
    msg = ext.a2_buffer_get_error([1])
    assert "out of bounds" not in msg and "entr" in msg


# --- attacks that held ------------------------------------------------------


@pytest.mark.parametrize("framework", ["torch", "jax", "numpy", "memoryview", "mlx", ""])
@pytest.mark.parametrize("kw", [{}, {"read_only": True}, {"reversed": True}])
def test_held_foreign_owner_dropped_exactly_once(framework, kw):
    if framework == "mlx":
        pytest.importorskip("mlx.core")
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


def test_held_static_memoryview_and_numpy_stay_read_only():
    mv = ext.a2_static_memoryview()
    assert mv.readonly
    a = np.frombuffer(mv, np.float32)
    with pytest.raises(ValueError):
        a.setflags(write=True)
    b = ext.a2_static_numpy()
    with pytest.raises(ValueError):
        b.setflags(write=True)
    assert ext.a2_static_first() == 1.0


def test_held_static_jax_unaligned_is_copied():
    j = ext.a2_static_jax()
    t = torch.from_dlpack(j)
    t.fill_(7.0)
    assert ext.a2_static_first() == 1.0


def test_held_bool_buffer_valid_bytes_round_trip():
    b = ext.BoolBuf(3)
    a = b.data()
    a[2] = True
    assert list(b.read_bytes()) == [0, 0, 1]
    assert b.get_byte(2) == 1


def test_held_buffer_object_collected_while_torch_tensor_lives():
    m = ext.Matrix4f()
    t = m.data_torch()
    del m
    collect()
    t.add_(2.0)
    assert float(t.sum()) == 32.0


def test_held_set_refused_under_a_read_guard_reentrantly():
    m = ext.Mutable()
    seen = []

    def cb():
        try:
            m.mutate()
        except BufferError as e:
            seen.append(str(e))

    assert m.read_around(cb) == 15
    assert len(seen) == 1 and "in use" in seen[0]
    assert ext.live_borrows() == 0


def test_held_buffer_zeros_huge_is_memory_error():
    kind, _ = ext.a2_buffer_zeros_error([2**61])
    assert kind == "MemoryError"
    assert ext.a2_buffer_zeros_error([2**62, 0]) is None


def test_held_seven_d_get_and_iter_with_negative_strides():
    x = np.arange(2.0**7).reshape((2,) * 7)[:, ::-1, :, ::-1, :, :, ::-1]
    idx = [1, 0, 1, 0, 1, 1, 0]
    assert ext.a2_get_dyn(x, idx) == x[tuple(idx)]
    with pytest.raises(IndexError, match="a2_get_dyn.*'x'.*out of bounds"):
        ext.a2_get_dyn(x, idx[:-1] + [2])
    with pytest.raises(IndexError, match="has 3 entries, the array 7 dimensions"):
        ext.a2_get_dyn(x, [1, 0, 1])
    assert ext.a2_iter7(x) == x.ravel().tolist()
    assert ext.live_borrows() == 0


def test_held_into_rank_and_reshape():
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


def test_held_copy_into_flipped_transpose_and_set_after_slice():
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


def test_held_as_array_of_a_permuted_strided_view():
    x = np.arange(24.0).reshape(2, 3, 4)[:, ::-1, ::2]
    shape, total = ext.a2_as_array_permuted(x)
    assert shape == list(np.transpose(x, (2, 0, 1)).shape)
    assert total == x.sum()


def test_held_rust_data_views_are_copied():
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


def test_finding_returns_numpy_of_device_memory_raises_numpys_error():
    # Tensor::from_raw_parts over CUDA memory, returned with
    # `returns = numpy`: NumPy's "RuntimeError: Unsupported device in
    # DLTensor." leaks out (no `returns = numpy`, no device named), where
    # `returns = torch` / `paddle` refusals say "returns = torch: ...".
    # Expected: dlcast's own error naming the option and the device.
    collect()
    made0, dropped0 = ext.a2_counted_stats()
    with pytest.raises(Exception) as e:
        ext.a2_counted_device_numpy(3)
    collect()
    made, dropped = ext.a2_counted_stats()
    assert (made - made0, dropped - dropped0) == (1, 1)  # held: freed once
    assert "returns = numpy" in str(e.value) and "cuda" in str(e.value), repr(e.value)


def test_finding_writable_interleaved_layout_refused_as_overlapping():
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


def test_finding_readme_says_only_numpy_cycles_leak():
    # An object holding a PyTorch tensor or JAX array over its own buffer
    # (`m.attached = m.data_torch()`) is never collected, like the NumPy
    # case the README documents: neither framework reports its DLPack
    # owner to the garbage collector. The README (Ownership) names NumPy
    # only. Expected: the README names every framework whose arrays leak
    # such a cycle (checked below against the behaviour).
    import pathlib
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
    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    section = readme[readme.index("## Ownership") : readme.index("## Annotations")]
    cycles = section[section.index("reference cycle") if "reference cycle" in section else section.index("a cycle") :]
    cycles = cycles[: cycles.index("\n\n")]
    assert "PyTorch" in cycles, cycles


# --- more attacks that held -------------------------------------------------


def test_held_iterators_and_get_on_random_strided_layouts():
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


def test_held_copy_from_slice_on_random_non_overlapping_layouts():
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
            # Refused (overlapping, or interleaved: see the finding above):
            # nothing written.
            assert not base.any()
            continue
        assert len(set(offsets)) == len(offsets), (shape, strides)
        assert x.ravel().tolist() == vals
        assert base.sum() == sum(vals)  # no stray writes
        checked += 1
    assert ext.live_borrows() == 0


def test_held_misaligned_torch_input_converted_is_a_copy():
    # A misaligned float64 tensor that requires grad, passed to an
    # #[order(c)] view (which needs aligned data) and returned: the
    # "converted temporary" must not alias the grad-requiring input.
    buf = bytearray(8 * 5 + 1)
    x = torch.frombuffer(buf, dtype=torch.float64, offset=1, count=4)
    x.requires_grad_(True)
    r = np.asarray(ext.passthrough_f64_c(x))
    assert r.flags.writeable
    assert not (x.data_ptr() <= r.ctypes.data < x.data_ptr() + 32)
    r[0] = 5.0
    assert x[0].item() == 0.0


def test_held_static_aligned_mlx_is_copied():
    pytest.importorskip("mlx.core")
    m = ext.a2_static_aligned_mlx()
    a = np.array(m, copy=False)
    a[0] = 7.0  # MLX's own copy
    assert ext.a2_static_aligned_first() == 1.0


def test_held_memoryview_refusals_free_the_owner_once():
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


def test_held_read_guard_across_threads_refuses_writers():
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


def test_held_detached_writer_excludes_buffer_readers_and_writers():
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


def run_paddle(body):
    """PaddlePaddle crashes the process when imported after TensorFlow
    (which other test files import): its checks run in a fresh interpreter
    that imports it first, as in test_ownership.py."""
    from conftest import run_py

    code = (
        "import paddle\n"
        "import gc, weakref\n"
        "import numpy as np\n"
        "import pytest\n"
        "import dlcast_testext as ext\n"
        "def collect():\n"
        "    for _ in range(3):\n"
        "        gc.collect()\n"
        + textwrap.dedent(body)
        + "\nprint('paddle-ok')\n"
    )
    r = run_py(code, timeout=300)
    assert r.returncode == 0 and "paddle-ok" in r.stdout, r.stdout + r.stderr


def test_held_paddle_view_keeps_the_object_alive_and_owners_freed_once():
    run_paddle(
        """
        o = ext.JaxBuf()
        p = o.to_paddle()
        w = weakref.ref(o)
        o.set(1, 3.0)
        assert p.numpy()[:3].tolist() == [0.0, 3.0, 0.0]
        del o
        collect()
        assert w() is not None
        p.add_(paddle.ones([16]))  # in place: the object's memory
        assert w().total() == 19.0
        del p
        collect()
        assert w() is None
        with pytest.raises(BufferError):
            ext.a2_static_paddle()
        for kw in [{}, {"read_only": True}, {"reversed": True}]:
            collect()
            made0, dropped0 = ext.a2_counted_stats()
            try:
                r = ext.a2_counted_paddle(5, **kw)
            except BufferError:
                assert kw
                r = None
            else:
                assert not kw and r.numpy().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
            del r
            collect()
            made, dropped = ext.a2_counted_stats()
            assert (made - made0, dropped - dropped0) == (1, 1), kw
        """
    )


def test_held_extent_one_dims_with_extreme_strides():
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


@pytest.mark.xfail(strict=True, reason=(
    "known gap, README Safety: ArrayBuffer guards are entered in rust-numpy's own "
    "borrow table only through dlcast's registry; where a rust-numpy extension "
    "published its table first, each export is a separate base object to it"))
def test_finding_buffer_guards_unseen_by_rust_numpys_own_table():
    # When rust-numpy's own borrow table is in use (a rust-numpy extension
    # borrowed first), ArrayBuffer::read / set are registered in dlcast's
    # registry only: a rust-numpy PyReadwriteArray of an array exported from
    # the buffer and the object's own &[f64] (or element writes) coexist, an
    # aliasing &mut / & pair in safe Rust, and writes under rust-numpy's
    # shared view. Expected: refused both ways, as in the other order.
    results = rnp_scenario("rust-numpy first")
    allowed = [k for k, v in results.items() if v == "allowed"]
    assert not allowed, results


def test_held_buffer_guards_meet_rust_numpy_borrows_through_dlcasts_table():
    results = rnp_scenario("dlcast first")
    assert all(v.startswith("refused") for v in results.values()), results


@pytest.mark.xfail(strict=True, reason=(
    "known gap, README Safety: ArrayBuffer guards are entered in rust-numpy's own "
    "borrow table only through dlcast's registry; where a rust-numpy extension "
    "published its table first, each export is a separate base object to it"))
def test_finding_buffer_conflict_with_rust_numpy_names_an_empty_argument():
    # The refusal reads "cannot read: the buffer's memory is in use by a
    # writable borrow that is still live (argument '' of <rust-numpy>())".
    # Expected: "... borrowed by a rust-numpy extension", as dlcast's views
    # say, not an empty argument name.
    results = rnp_scenario("dlcast first")
    text = results["read under rnp &mut"]
    assert "argument ''" not in text and "rust-numpy extension" in text, text


def test_held_dlcast_bodies_and_buffer_access_exclude_each_other():
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
