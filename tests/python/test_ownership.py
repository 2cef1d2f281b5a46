"""Ownership: arrays over a #[pyclass]'s own buffer (`ArrayBuffer`), static
data and foreign memory. Rust's access and Python's views exclude each other
as the registry says; read-only memory stays read-only through every
consumer; bools stay valid; converted inputs come back as new arrays.
"""

import gc
import textwrap
import threading

import jax
import jax.numpy as jnp
import mlx.core as mx
import numpy as np
import pytest
import torch

import dlcast_testext as ext
from conftest import buffer_of


def collect():
    for _ in range(3):
        gc.collect()


# --- (1) views of an object's buffer ---------------------------------------


def test_matrix_data_writes_reach_the_object():
    m = ext.Matrix4f()
    a = m.data_ref()
    assert isinstance(a, np.ndarray) and a.shape == (4, 4) and a.dtype == np.float32
    assert a.flags.writeable
    a[1, 2] = 5.0
    assert m.get(1, 2) == 5.0
    # Through the dlcast.Array and the buffer protocol too.
    b = np.asarray(m.data())
    b[3, 3] = -1.0
    assert m.get(3, 3) == -1.0
    # And through PyTorch.
    t = m.data_torch()
    t[0, 0] = 9.0
    assert m.get(0, 0) == 9.0
    assert a[0, 0] == 9.0  # the views share the memory


def test_matrix_data_copy_is_independent():
    m = ext.Matrix4f()
    c = m.data_copy()
    c[0, 0] = 3.0
    assert m.get(0, 0) == 0.0
    assert m.exports() == 0  # a copy holds nothing of the object


def test_mutate_is_seen_by_an_array_returned_earlier():
    o = ext.Mutable()
    arr = np.asarray(o.array())
    t = torch.from_dlpack(o.array())
    assert arr.tolist() == [1, 2, 3, 4, 5]
    o.mutate()
    assert arr.tolist() == [2, 4, 6, 8, 10]
    assert t.tolist() == [2, 4, 6, 8, 10]


def test_rust_mut_access_refused_while_exported():
    m = ext.Matrix4f()
    a = m.data_ref()
    assert m.exports() == 1
    with pytest.raises(BufferError, match="in use by 1 exported array"):
        m.set(0, 0, 1.0)
    with pytest.raises(BufferError, match="cannot resize the buffer"):
        m.resize(8)
    # A read-only view counts too.
    del a
    c = m.data_const()
    with pytest.raises(BufferError, match="in use"):
        m.set(0, 0, 1.0)
    del c
    collect()
    assert m.exports() == 0
    m.set(0, 0, 1.0)
    m.resize(2)
    assert m.data_ref().shape == (2, 2)


def test_replacing_the_buffer_keeps_old_views_valid():
    m = ext.Matrix4f()
    a = m.data_ref()
    a[0, 0] = 4.0
    m.replace()  # `self.data = ...` with a view alive: the view keeps the old memory
    assert m.get(0, 0) == 7.0
    assert a[0, 0] == 4.0
    a[0, 0] = 5.0  # still valid memory, no longer the object's
    assert m.get(0, 0) == 7.0


def test_read_guard_refuses_writable_views_reentrantly():
    m = ext.Matrix4f()
    seen = []

    def body():
        # A writable export while Rust holds &[f32] of the buffer.
        with pytest.raises(BufferError, match="in use by a read-only borrow"):
            m.data()
        # A read-only one is fine.
        seen.append(m.data_const().sum())

    m.sum_around(body)
    assert seen == [0.0]


def test_writable_dlcast_view_refused_under_a_rust_read_guard():
    m = ext.Matrix4f()
    a = m.data()  # exported before the guard

    def body():
        with pytest.raises(BufferError, match=r"ArrayBuffer\.read\(\)"):
            ext.Matrix4f.add_into(a, 1.0)  # a TensorMut of the same memory
        assert ext.Matrix4f.total(a) == 0.0  # readers share

    assert m.sum_around(body) == 0.0
    ext.Matrix4f.add_into(a, 1.0)  # the guard is gone
    assert m.get(0, 0) == 1.0


def test_dlcast_writer_excludes_rust_reader():
    o = ext.Mutable()
    arr = o.array()
    errors = []

    def body():
        # mutate() writes element by element: refused under the read guard.
        try:
            o.mutate()
        except BufferError as e:
            errors.append(str(e))

    assert o.read_around(body) == 15
    assert errors and "in use" in errors[0]


def test_pyclass_mutably_borrowed_blocks_views():
    m = ext.Matrix4f()
    refused = []

    def body():
        # Inside a `&mut self` method: no view may be made (PyO3's borrow flag).
        try:
            m.data()
        except RuntimeError as e:
            refused.append(str(e))

    m.with_mut(body)
    assert refused and "borrowed" in refused[0]
    assert m.exports() == 0
    # PyO3's own borrow flag: data() needs a shared borrow of the object.
    a = m.data()
    ext.Matrix4f.add_into(a, 2.0)  # a dlcast TensorMut of the view
    assert m.get(2, 2) == 2.0
    assert ext.Matrix4f.total(a) == 32.0


def test_views_from_threads():
    m = ext.Matrix4f()
    errors = []

    def worker():
        try:
            for _ in range(200):
                a = m.data_ref()
                a += 1.0
                del a
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=worker) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    collect()
    assert m.exports() == 0
    assert m.get(0, 0) == 800.0


def test_read_only_view_flags():
    m = ext.Matrix4f()
    c = m.data_const()
    assert not c.flags.writeable
    with pytest.raises(ValueError):
        c[0, 0] = 1.0
    j = m.data_jax()
    assert isinstance(j, jax.Array) and j.shape == (4, 4)
    del c, j
    collect()
    assert m.exports() == 0
    # PyTorch has no read-only tensors: it gets a copy of its own, and the
    # export of the object's memory is let go at once.
    t = m.data_const_torch()
    assert isinstance(t, torch.Tensor) and t.shape == (4, 4)
    t.fill_(-1.0)
    assert m.get(0, 0) != -1.0
    collect()
    assert m.exports() == 0


# --- (2) read-only owned tensors --------------------------------------------


def test_read_only_tensor_numpy():
    a = ext.read_only_range_numpy(5)
    assert a.tolist() == [0, 1, 2, 3, 4]
    assert not a.flags.writeable
    arr = ext.read_only_range(5)
    assert arr.read_only
    assert not np.asarray(arr).flags.writeable
    assert not np.from_dlpack(arr).flags.writeable
    assert buffer_of(arr).readonly


def test_read_only_tensor_versioned_capsule_flag():
    # describe() reads the capsule's DLPACK_FLAG_BITMASK_READ_ONLY.
    cap = ext.read_only_range(3).__dlpack__(max_version=(1, 0))
    assert ext.describe(cap)[4] is True
    cap = ext.foreign(3).__dlpack__(max_version=(1, 0))
    assert ext.describe(cap)[4] is False
    # A legacy capsule cannot say so: it holds a copy, and copy=False,
    # which forbids that, raises.
    assert ext.values(ext.read_only_range(3).__dlpack__()) == [0.0, 1.0, 2.0]
    with pytest.raises(BufferError, match="read-only.*copy=False"):
        ext.read_only_range(3).__dlpack__(copy=False)


def test_read_only_tensor_torch_is_a_copy():
    # PyTorch has no read-only tensors: returns = torch gets a writable
    # copy, the tensor's alone.
    t = ext.read_only_range_torch(3)
    assert isinstance(t, torch.Tensor) and t.tolist() == [0.0, 1.0, 2.0]
    t[0] = 5.0
    assert t.tolist() == [5.0, 1.0, 2.0]


def test_read_only_tensor_jax():
    j = ext.read_only_range_jax(4)
    assert isinstance(j, jax.Array)
    assert j.tolist() == [0, 1, 2, 3]
    # JAX asks for a legacy capsule, which cannot say read-only: it gets a
    # copy of its own (returns = jax above takes the memory as it is).
    arr = ext.read_only_range(2)
    j = jnp.from_dlpack(arr)
    assert j.tolist() == [0, 1]
    assert j.unsafe_buffer_pointer() != ext.data_ptr(arr)


# --- (3) static and foreign memory ------------------------------------------


def test_static_data_read_only():
    a = ext.static_table_numpy()
    assert a.tolist() == [[10, 20, 30], [40, 50, 60]]
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a[0, 0] = 1
    arr = ext.static_table()
    assert arr.read_only and arr.dtype == "uint16"
    # PyTorch gets a copy: writing it leaves the static as it was.
    s = ext.static_table_torch()
    s[0, 0] = 1
    assert s.tolist() == [[1, 20, 30], [40, 50, 60]]
    assert ext.static_table_numpy()[0, 0] == 10
    with pytest.raises(ValueError):
        a.flags.writeable = True  # NumPy asks the exporter, which refuses
    # PyTorch ignores DLPack's READ_ONLY: __dlpack__ hands it a copy, so a
    # write cannot reach the static (it would fault).
    t = torch.from_dlpack(ext.static_table())
    t[0, 0] = 1
    assert ext.static_table_numpy()[0, 0] == 10
    with pytest.raises(BufferError, match="must never be written"):
        ext.static_table().__dlpack__(max_version=(1, 0), copy=False)
    # Rust never hands out &mut of static or foreign memory.
    assert ext.shared_tensors_give_no_slice() == (False, False)


def test_foreign_memory_read_only_and_strided():
    n0, _ = ext.foreign_drops()
    a = np.asarray(ext.foreign(3, read_only=True))
    assert not a.flags.writeable
    r = np.from_dlpack(ext.foreign_reversed(4))
    assert r.tolist() == [3, 2, 1, 0]
    del a, r
    collect()
    assert ext.foreign_drops()[0] == n0 + 2


# --- (4) converted inputs returned -------------------------------------------


def test_converted_numpy_input_returned_writable():
    x = np.arange(4, dtype=np.int32)
    y = ext.passthrough_f64(x)  # converted to float64 by NumPy, returned
    assert isinstance(y, np.ndarray) and y.dtype == np.float64
    assert y.flags.writeable
    y[0] = 5.0
    assert x[0] == 0  # a new array: the caller's input is unchanged
    # Order conversions too.
    f = np.asfortranarray(np.ones((3, 2)))
    z = ext.passthrough_f64_c(f)
    assert not z.read_only
    np.asarray(z)[0, 0] = 2.0
    assert f[0, 0] == 1.0


def test_unconverted_input_keeps_its_own_mark():
    x = np.arange(3, dtype=np.float64)
    x.flags.writeable = False
    assert not ext.passthrough_f64(x).flags.writeable
    y = np.arange(3, dtype=np.float64)
    assert np.shares_memory(ext.passthrough_f64(y), y)


def test_converted_torch_input_returned_to_torch():
    x = torch.arange(4, dtype=torch.int32)
    y = ext.passthrough_f64(x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float64
    y += 1  # writable, and not the caller's tensor
    assert y.tolist() == [1, 2, 3, 4] and x.tolist() == [0, 1, 2, 3]
    # From NumPy to PyTorch: no longer refused as read-only.
    z = ext.passthrough_f64_torch(np.arange(3, dtype=np.int16))
    assert z.dtype == torch.float64 and z.tolist() == [0, 1, 2]
    z[0] = 7


def test_converted_jax_input_returned():
    x = jnp.arange(4, dtype=jnp.int32)
    y = ext.passthrough_f64(x)
    assert isinstance(y, jax.Array) and y.dtype == jnp.float64
    assert y.tolist() == [0, 1, 2, 3]
    # JAX's temporary is immutable: NumPy and PyTorch get a writable copy.
    n = ext.passthrough_f64_numpy(jnp.arange(3, dtype=jnp.float32))
    assert n.flags.writeable
    n[0] = 1.0
    t = ext.passthrough_f64_torch(jnp.arange(3, dtype=jnp.int32))
    t[0] = 1.0
    assert t.tolist() == [1, 1, 2]


def test_converted_array_api_input_returned():
    import array_api_strict as xp

    x = xp.asarray([1, 2, 3], dtype=xp.int32)
    y = ext.passthrough_f64(x)
    assert y.dtype == xp.float64
    t = ext.passthrough_f64_torch(x)
    t += 1
    assert t.tolist() == [2, 3, 4]


def test_converted_tensorflow_input_returned():
    import tensorflow as tf

    x = tf.constant([1, 2, 3], dtype=tf.int32)
    y = ext.passthrough_f64(x)  # returns = like(x): TensorFlow
    assert isinstance(y, tf.Tensor) and y.dtype == tf.float64
    # TensorFlow's temporary is immutable: PyTorch gets a writable copy.
    t = ext.passthrough_f64_torch(x)
    t += 1
    assert t.tolist() == [2, 3, 4]


# --- (5) returns = memoryview ------------------------------------------------


def test_returns_memoryview():
    m = ext.range_memoryview(4)
    assert isinstance(m, memoryview)
    assert m.format == "f" and m.shape == (4,) and not m.readonly
    assert m.tolist() == [0.0, 1.0, 2.0, 3.0]
    m[0] = 5.0
    assert m.tolist()[0] == 5.0
    assert ext.range_memoryview(2, read_only=True).readonly
    f = ext.flipped_memoryview()
    assert f.strides == (24, -8)
    assert f.tolist() == [[2.0, 1.0, 0.0], [5.0, 4.0, 3.0]]


def test_returns_mlx():
    a = ext.range_mlx(3)
    assert isinstance(a, mx.array) and a.dtype == mx.float32
    assert a.tolist() == [0.0, 1.0, 2.0]
    # MLX arrays are immutable: read-only data goes to MLX too.
    assert ext.range_mlx(2, read_only=True).tolist() == [0.0, 1.0]


def test_mlx_inputs():
    x = mx.arange(6, dtype=mx.float32).reshape(2, 3)
    assert ext.describe(x)[:3] == ([2, 3], [3, 1], "float32")
    assert ext.sum_f32(x) == 15.0
    y = ext.doubled_like(x)  # returns = like(x): MLX in, MLX out
    assert isinstance(y, mx.array) and y.tolist() == [[0, 2, 4], [6, 8, 10]]
    # Immutable, like JAX arrays: imported read-only.
    assert ext.describe(x)[4] is True
    with pytest.raises(TypeError, match="read-only"):
        ext.increment_f32(x)
    # Converted (int32 -> float32) and returned.
    z = ext.doubled_like(mx.arange(3, dtype=mx.int32))
    assert isinstance(z, mx.array) and z.tolist() == [0.0, 2.0, 4.0]


# --- (8) PaddlePaddle ----------------------------------------------------------
# PaddlePaddle (3.x) crashes the process when it is imported after
# TensorFlow, which other test files import: its checks run in a fresh
# interpreter that imports it first (conftest.run_py).


def run_paddle(body):
    from conftest import run_py

    code = (
        "import paddle\n"
        "import gc, weakref\n"
        "import numpy as np\n"
        "import pytest\n"
        "import dlcast_testext as ext\n"
        + textwrap.dedent(body)
        + "\nprint('paddle-ok')\n"
    )
    r = run_py(code, timeout=300)
    assert r.returncode == 0 and "paddle-ok" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
def test_paddle_inputs_through_its_exchange_api():
    run_paddle("""
        x = paddle.arange(6, dtype="float32").reshape([2, 3])
        assert ext.import_path(x) == "exchange_api"
        assert ext.describe(x)[:5] == ([2, 3], [3, 1], "float32", (1, 0), False)
        assert ext.sum_f32(x) == 15.0
        ext.increment_f32(x)  # writable: Paddle tensors are mutable
        assert x.numpy().tolist() == [[1, 2, 3], [4, 5, 6]]
        col = paddle.ones([4, 4], dtype="float32")[:, 1]
        assert ext.describe(col)[:2] == ([4], [4])
        y = ext.doubled_like(x)  # returns = like(x): Paddle in, Paddle out
        assert isinstance(y, paddle.Tensor)
        assert y.numpy().tolist() == [[2, 4, 6], [8, 10, 12]]
    """)


@pytest.mark.slow
def test_returns_paddle():
    run_paddle("""
        t = ext.range_paddle(3)
        assert isinstance(t, paddle.Tensor) and t.numpy().tolist() == [0.0, 1.0, 2.0]
        t[0] = 4.0
        # Paddle, like PyTorch, ignores READ_ONLY and has no negative strides.
        # Read-only data reaches it as a writable copy of its own.
        r = ext.range_paddle(3, read_only=True)
        assert isinstance(r, paddle.Tensor) and r.numpy().tolist() == [0.0, 1.0, 2.0]
        with pytest.raises(BufferError, match="negative stride"):
            ext.flipped_paddle()
        # Static data reaches Paddle only as a copy.
        s = paddle.from_dlpack(ext.static_table())
        assert s.data_ptr() != np.asarray(ext.static_table()).ctypes.data
        assert s.numpy().tolist() == [[10, 20, 30], [40, 50, 60]]
        # A buffer view goes to Paddle zero-copy and keeps the object alive.
        m = ext.Matrix4f()
        p = paddle.from_dlpack(m.data())
        np.asarray(m.data())[1, 1] = 3.0
        assert float(p[1, 1]) == 3.0
        w = weakref.ref(m)
        del m
        gc.collect()
        assert w() is not None
        del p
        gc.collect()
        assert w() is None
        # Converted inputs returned to Paddle are writable.
        q = ext.passthrough_f64(paddle.arange(3, dtype="int32"))
        assert isinstance(q, paddle.Tensor) and "float64" in str(q.dtype)
        q[0] = 2.0
    """)


def run_child(code):
    """Runs `code` in a fresh interpreter (a crash must not take pytest down)."""
    from conftest import run_py

    return run_py(
        "import warnings; warnings.simplefilter('ignore')\n"
        "import numpy as np, torch, jax, dlcast_testext as ext\n" + textwrap.dedent(code)
    )



@pytest.mark.slow
@pytest.mark.hostile
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
def test_static_data_reexported_to_pytorch_is_never_written(route):
    # Tensor::from_static hands a Rust static (in read-only pages) to NumPy,
    # memoryview and JAX without a copy; they hand it on to PyTorch, which
    # writes: SIGSEGV. Expected: no crash (PyTorch gets a copy, or an error).
    code = route + "\nt.fill_(7)\nprint('alive')\n"
    p = run_child(code)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert "alive" in p.stdout


@pytest.mark.hostile
def test_read_only_foreign_memory_is_never_written_by_pytorch_through_numpy():
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


@pytest.mark.hostile
def test_bool_buffer_never_gives_rust_invalid_bools():
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


@pytest.mark.hostile
def test_bool_buffer_as_mut_slice_never_holds_invalid_bools():
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


@pytest.mark.hostile
@pytest.mark.parametrize("method", ["frozen", "frozen2"])
def test_a_jax_array_over_a_buffer_never_changes_after_creation(method):
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


@pytest.mark.hostile
@pytest.mark.parametrize("route", ["returns", "default"])
def test_a_tensorflow_tensor_over_a_buffer_never_changes_after_creation(route):
    # As for JAX above: a read-only ArrayBuffer view went to TensorFlow
    # (immutable tensors) as it is, through a legacy capsule, by
    # `returns = tensorflow` and by the default return (a TensorFlow first
    # argument). ArrayBuffer::set and with_mut then changed an "immutable"
    # tensor, and TensorFlow re-exports it as a legacy capsule (no read-only
    # mark), so PyTorch got a writable alias that no writable-export count
    # saw: with_mut lent `&mut [T]` over memory Python could write.
    # Expected: TensorFlow gets a copy, as JAX does.
    import tensorflow as tf

    b = ext.TfBuf(4)
    b.set(0, 1.0)
    t = b.frozen_tf() if route == "returns" else b.frozen_like(tf.constant([0.0]))
    assert isinstance(t, tf.Tensor)
    b.set(1, 5.0)
    assert t.numpy().tolist() == [1.0, 0.0, 0.0, 0.0]
    alias = torch.from_dlpack(tf.experimental.dlpack.to_dlpack(t))
    assert b.sort_desc() == 5.0  # only read-only exports (if any) live
    alias.fill_(7.0)  # TensorFlow's memory, not the buffer's
    b.set(2, 3.0)
    assert t.numpy().tolist() == [7.0] * 4
    assert b.sort_desc() == 5.0


@pytest.mark.hostile
def test_buffer_get_with_a_wrong_length_index_says_so():
    # ArrayBuffer::get(&[1]) on a (4, 4) buffer: "index [1] is out of bounds
    # for a buffer of shape [4, 4]"; the view accessors say "index (1,) has
    # 1 entry, the array 2 dimensions". Expected: the same wording.
    msg = ext.a2_buffer_get_error([1])
    assert "out of bounds" not in msg and "entr" in msg


@pytest.mark.hostile
def test_static_memoryview_and_numpy_stay_read_only():
    mv = ext.a2_static_memoryview()
    assert mv.readonly
    a = np.frombuffer(mv, np.float32)
    with pytest.raises(ValueError):
        a.setflags(write=True)
    b = ext.a2_static_numpy()
    with pytest.raises(ValueError):
        b.setflags(write=True)
    assert ext.a2_static_first() == 1.0


@pytest.mark.hostile
def test_static_jax_unaligned_is_copied():
    j = ext.a2_static_jax()
    t = torch.from_dlpack(j)
    t.fill_(7.0)
    assert ext.a2_static_first() == 1.0


@pytest.mark.hostile
def test_bool_buffer_valid_bytes_round_trip():
    b = ext.BoolBuf(3)
    a = b.data()
    a[2] = True
    assert list(b.read_bytes()) == [0, 0, 1]
    assert b.get_byte(2) == 1


@pytest.mark.hostile
def test_set_refused_under_a_read_guard_reentrantly():
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


@pytest.mark.hostile
def test_static_aligned_mlx_is_copied():
    import mlx.core  # noqa: F401 (installed by make test: never skipped)
    m = ext.a2_static_aligned_mlx()
    a = np.array(m, copy=False)
    a[0] = 7.0  # MLX's own copy
    assert ext.a2_static_aligned_first() == 1.0


def run_paddle_child(body):
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


@pytest.mark.slow
@pytest.mark.hostile
def test_paddle_view_keeps_the_object_alive_and_owners_freed_once():
    run_paddle_child(
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
        # Read-only data (static, or made read-only) goes as a copy of its
        # own; negative strides are refused.
        assert isinstance(ext.a2_static_paddle(), paddle.Tensor)
        for kw in [{}, {"read_only": True}, {"reversed": True}]:
            collect()
            made0, dropped0 = ext.a2_counted_stats()
            try:
                r = ext.a2_counted_paddle(5, **kw)
            except BufferError:
                assert "reversed" in kw
                r = None
            else:
                assert "reversed" not in kw
                assert r.numpy().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
            del r
            collect()
            made, dropped = ext.a2_counted_stats()
            assert (made - made0, dropped - dropped0) == (1, 1), kw
        """
    )


# --- static data: one shared copy -------------------------------------------


def test_static_data_exports_share_one_read_only_copy():
    # Tensor::from_static: two calls give the same memory (no copy after
    # the first export), a sub-slice of the static shares it, and it stays
    # read-only. It is not the static itself (NumPy would hand that on to
    # PyTorch, which writes: see the hostile test above).
    a = ext.body_static_numpy(False)
    b = ext.body_static_numpy(False)
    tail = ext.body_static_numpy(True)
    assert a.ctypes.data == b.ctypes.data
    assert np.shares_memory(a, b)
    assert tail.ctypes.data == a.ctypes.data + 8
    assert a.tolist() == [1.0, 2.0, 3.0, 4.0] and tail.tolist() == [3.0, 4.0]
    static_address, first = ext.body_static_table()
    assert a.ctypes.data != static_address and first == 1.0
    assert not a.flags.writeable
    with pytest.raises(ValueError):
        a.setflags(write=True)
    with pytest.raises(ValueError):
        a[0] = 5.0
    # memoryview: the same memory, read-only.
    mv = buffer_of(ext.body_static_array())
    assert mv.readonly
    assert np.frombuffer(mv, np.float32).ctypes.data == a.ctypes.data
    # DLPack consumers still get a copy each (PyTorch cannot be told apart).
    c = np.from_dlpack(ext.body_static_array())
    assert c.ctypes.data != a.ctypes.data and c.tolist() == a.tolist()


# --- ArrayBuffer: bulk writes ------------------------------------------------


def test_buffer_bulk_writes_are_seen_by_live_views():
    # copy_from_slice and fill: the bulk `set`, allowed while views live.
    b = ext.BulkBuf(4)
    w, r = b.view(), b.view_ro()
    assert b.exports() == (2, 1)
    b.load([3.0, 1.0, 4.0, 2.0])
    assert w.tolist() == r.tolist() == [3.0, 1.0, 4.0, 2.0]
    b.fill(9.0)
    assert w.tolist() == [9.0] * 4
    with pytest.raises(ValueError, match="holds 4 elements, but the data has 1"):
        b.load([1.0])
    assert w.tolist() == [9.0] * 4


def test_buffer_with_mut_is_refused_while_a_writable_view_lives():
    # with_mut lends `&mut [T]`: allowed while only read-only views live
    # (they see the result), refused while a writable one does.
    b = ext.BulkBuf(4)
    b.load([3.0, 1.0, 4.0, 2.0])
    r = b.view_ro()
    assert b.sort_desc() == 4.0
    assert r.tolist() == [4.0, 3.0, 2.0, 1.0]
    w = b.view()
    with pytest.raises(BufferError, match=r"with_mut.*1 exported array"):
        b.sort_desc()
    del w
    gc.collect()
    b.load([1.0, 2.0, 3.0, 4.0])
    assert b.sort_desc() == 4.0 and r.tolist() == [4.0, 3.0, 2.0, 1.0]


def test_buffer_bulk_writes_go_through_the_registry():
    # A live Rust read guard, or a dlcast view of the buffer's own export
    # (the source of the copy), refuses the write: Rust would see its
    # shared reference change.
    b = ext.BulkBuf(4)
    b.load([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(BufferError, match=r"read-only borrow.*ArrayBuffer.read"):
        b.load_while_reading([0.0] * 4)
    w = b.view()
    with pytest.raises(BufferError, match=r"argument 'x' of load_from"):
        b.load_from(w)
    assert w.tolist() == [1.0, 2.0, 3.0, 4.0]
    b.load_from(np.full(4, 7.0, np.float32))
    assert w.tolist() == [7.0] * 4
