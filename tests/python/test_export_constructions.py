"""Every way a `Tensor` or `ArrayBuffer` is built (owned, zeros, from a
function, static, foreign memory, views), returned to every consumer: the
right values, flags and alignment; huge sizes are MemoryError or ValueError;
errors say what is wrong.
"""

import contextlib
import gc
import sys

import numpy as np
import pytest
import torch

import dlcast_testext as ext
import dlcast_testext as t
from conftest import CASES, buffer_of, expected, exports_freed, negative


ALIGN = 64



def numpy_flags_for(arr):
    """The contiguity flags NumPy computes itself for `arr`'s shape and
    strides (given explicitly: `as_strided` over a scratch buffer, never
    read)."""
    scratch = np.zeros(1, dtype=arr.dtype)
    ref = np.lib.stride_tricks.as_strided(scratch, shape=arr.shape, strides=arr.strides)
    return ref.flags.c_contiguous, ref.flags.f_contiguous


def check_numpy(out, shape, read_only, kind):
    assert isinstance(out, np.ndarray)
    assert out.shape == shape
    np.testing.assert_array_equal(out, expected(shape))
    assert out.flags.writeable is (not read_only) or kind == "static"
    assert out.flags.aligned
    # NULL strides (NumPy's defaults) or explicit ones: the flags are the
    # ones NumPy computes for the same strides.
    assert (out.flags.c_contiguous, out.flags.f_contiguous) == numpy_flags_for(out)
    if kind == "zeros" and out.size:
        assert out.ctypes.data % ALIGN == 0


# A. Returned arrays

@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("read_only", [False, True])
@pytest.mark.parametrize("kind,shape", CASES)
def test_every_construction_returned_to_numpy(kind, shape, read_only):
    with exports_freed():
        out = t.s2_make_numpy(kind, list(shape), read_only)
        check_numpy(out, shape, read_only, kind)
        if not read_only and kind != "static" and out.size:
            out[...] = -1.0  # writes stay inside the allocation
            assert (out == -1.0).all()
        del out


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("kind,shape", CASES)
def test_every_construction_as_array_to_every_consumer(kind, shape):
    exp = expected(shape)
    with exports_freed():
        a = t.s2_make(kind, list(shape), False)
        # NumPy through __array_interface__ / buffer protocol, twice.
        n1 = np.asarray(a)
        n2 = np.asarray(a)
        np.testing.assert_array_equal(n1, exp)
        np.testing.assert_array_equal(n2, exp)
        # DLPack consumers: NumPy, PyTorch (the managed tensor and its
        # context in one allocation).
        np.testing.assert_array_equal(np.from_dlpack(a), exp)
        if kind == "static" or negative(kind, shape):
            # Static data goes to PyTorch as a copy; PyTorch itself refuses
            # negative strides.
            with contextlib.suppress(RuntimeError, BufferError):
                torch.from_dlpack(a)
            tt = torch.from_numpy(exp.copy())
        else:
            tt = torch.from_dlpack(a)
        np.testing.assert_array_equal(tt.numpy(), exp)
        if kind == "zeros" and tt.numel():
            assert tt.data_ptr() % ALIGN == 0
        mv = buffer_of(a)
        assert mv.shape == shape
        # The Array dies first; the consumers keep the memory.
        del a
        gc.collect()
        np.testing.assert_array_equal(n1, exp)
        np.testing.assert_array_equal(tt.numpy(), exp)
        if tt.numel() and tt.is_contiguous() and kind != "static":
            tt.view(-1)[0] = 42.0
        del n1, n2, tt, mv


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("kind,shape", CASES)
def test_every_construction_returned_to_torch_jax_memoryview_array_api(kind, shape):
    exp = expected(shape)
    import jax
    import array_api_strict as xp
    with exports_freed():
        if kind != "static" and negative(kind, shape):
            # Negative strides of writable memory: refused for PyTorch.
            with pytest.raises(BufferError):
                t.s2_make_torch(kind, list(shape), False)
            tt = None
        else:
            tt = t.s2_make_torch(kind, list(shape), False)
            np.testing.assert_array_equal(tt.numpy(), exp)
        j = t.s2_make_jax(kind, list(shape), False)
        np.testing.assert_array_equal(np.asarray(j), exp)
        j_ro = t.s2_make_jax(kind, list(shape), True)
        np.testing.assert_array_equal(np.asarray(j_ro), exp)
        mv = t.s2_make_memoryview(kind, list(shape), False)
        assert isinstance(mv, memoryview) and mv.shape == shape
        np.testing.assert_array_equal(np.asarray(mv), exp)
        aa = t.s2_make_array_api(kind, list(shape), False)
        np.testing.assert_array_equal(np.asarray(xp.asarray(aa)), exp)
        del tt, j, j_ro, mv, aa
        jax.clear_caches()


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("kind,shape", CASES[::3])
def test_read_only_to_torch_is_a_copy_freed_once(kind, shape):
    # PyTorch has no read-only tensors: it gets a copy of its own (any
    # strides), and the read-only export is freed exactly once.
    with exports_freed():
        tt = t.s2_make_torch(kind, list(shape), True)
        np.testing.assert_array_equal(tt.numpy(), expected(shape))
        del tt


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("n", list(range(0, 130)) + [4095, 4096, 4097])
def test_zeros_are_aligned_and_zero_for_every_small_size(n):
    a = t.s2_zeros_u8_numpy([n])
    assert a.shape == (n,) and not a.any()
    if n:
        assert a.ctypes.data % ALIGN == 0
    b = np.asarray(t.s2_zeros_u8([n]))
    assert not b.any()
    if n:
        assert b.ctypes.data % ALIGN == 0


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize(
    "nbytes", [8, 1000, (128 << 10) - 64, (128 << 10) - 1, 128 << 10, (128 << 10) + 1, 1 << 20, (1 << 20) + 17]
)
def test_zeros_are_zero_after_the_allocator_reuses_dirty_memory(nbytes):
    # Below 128 KiB dlcast zeroes the bytes itself (malloc reuses freed,
    # dirty blocks); above, calloc does. Dirty a block of the same size,
    # free it, and ask again, several times.
    for _ in range(5):
        dirty = t.s2_zeros_u8_numpy([nbytes])
        dirty[...] = 0xAB
        del dirty
        fresh = t.s2_zeros_u8_numpy([nbytes])
        assert not fresh.any(), f"{nbytes} bytes: a zeros buffer holds old bytes"
        assert fresh.ctypes.data % ALIGN == 0
        del fresh


ISIZE_MAX = sys.maxsize


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize(
    "shape",
    [
        [ISIZE_MAX],
        [ISIZE_MAX - 63],
        [ISIZE_MAX - 64],
        [ISIZE_MAX - 48],
        [ISIZE_MAX - 47],
        [ISIZE_MAX - 16],
        [(ISIZE_MAX - 64) // 2, 2],
        [2**62, 4],
        [2**63],
        [2**64 - 1],
        [1 << 40, 1 << 40],
    ],
)
def test_huge_zeros_raise_memory_or_value_error(shape):
    # The slack (48 bytes) added to sizes near isize::MAX: a Python error,
    # never an abort or a short buffer.
    for fn in (t.s2_zeros_u8, t.s2_zeros_u8_numpy, t.s2_zeros_f32_torch):
        with pytest.raises((MemoryError, ValueError, OverflowError)):
            fn(shape)


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize(
    "shape", [[0, ISIZE_MAX], [ISIZE_MAX, 0], [0, 2**62, 2**62], [3, 0, 2**63 - 1], [0] * 9]
)
def test_empty_arrays_with_huge_extents(shape):
    for fn in (t.s2_zeros_u8, t.s2_zeros_u8_numpy, t.s2_zeros_f32_torch):
        try:
            out = fn(shape)
        except (ValueError, MemoryError, BufferError):
            continue
        assert tuple(out.shape) == tuple(shape)
        if isinstance(out, np.ndarray):
            assert out.size == 0
            assert (out.flags.c_contiguous, out.flags.f_contiguous) == numpy_flags_for(out)


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
def test_many_dimensions_spill_and_round_trip():
    for nd in (4, 5, 8, 9, 32, 64):
        shape = [1] * (nd - 2) + [2, 3]
        out = t.s2_make_numpy("zeros", shape, False)
        np.testing.assert_array_equal(out, expected(tuple(shape)))
        tt = t.s2_make_torch("vec_spare", shape, False)
        np.testing.assert_array_equal(tt.numpy(), expected(tuple(shape)))
    # Above NumPy's 64 dimensions: refused or read back whole, never a crash.
    shape = [1] * 70
    a = t.s2_make("zeros", shape, False)
    try:
        out = np.asarray(a)
    except (ValueError, BufferError, TypeError):
        pass
    else:
        # NumPy (64 dimensions at most) makes an object scalar of it.
        assert out.shape == tuple(shape) or (out.dtype == object and out.shape == ())
    with pytest.raises((ValueError, BufferError, TypeError, RuntimeError)):
        t.s2_make_numpy("zeros", shape, False)


def collect():
    for _ in range(3):
        gc.collect()


@pytest.mark.hostile
def test_returns_mlx_of_negative_strides_is_copied_or_named():
    # returns = mlx of a negatively strided tensor: MLX's own
    # "ValueError: Cannot convert DLPack arrays with negative strides to mlx
    # array." without the function; torch and paddle get a BufferError from
    # dlcast naming the problem and the fix, JAX gets a copy. Expected: a
    # copy (MLX copies anyway) or dlcast's BufferError.
    import mlx.core  # noqa: F401 (installed by make test: never skipped)
    try:
        r = ext.a2_counted_mlx(4, reversed=True)
    except BufferError as e:
        assert "negative stride" in str(e)
        return
    except ValueError as e:
        pytest.fail(f"MLX's own error leaked: {e}")
    assert np.array(r).tolist() == [3.0, 2.0, 1.0, 0.0]


@pytest.mark.hostile
def test_empty_rust_view_with_huge_extent_error_gives_the_real_reason():
    # An empty view over Rust data with an extent beyond i64::MAX, returned:
    # the copy's error says "shape [0, 9223372036854775808] holds 0
    # elements, but the data has 0". Expected: the real reason (an extent
    # exceeds i64::MAX / cannot be exported).
    with pytest.raises(ValueError) as e:
        ext.a2_rust_empty([0, 2**63])
    assert "holds 0 elements, but the data has 0" not in str(e.value)


@pytest.mark.hostile
def test_buffer_zeros_count_overflow_error_says_so():
    # ArrayBuffer::zeros(&[usize::MAX, 2]) (and Tensor::zeros): "shape
    # [18446744073709551615, 2] holds 18446744073709551615 elements, but the
    # data has 0": no data was given; the element count overflows.
    # Expected: a message saying the element count overflows (and
    # MemoryError, as for any size that cannot be allocated).
    kind, msg = ext.a2_buffer_zeros_error([2**64 - 1, 2])
    assert "data has 0" not in msg
    assert kind == "MemoryError"


@pytest.mark.hostile
def test_buffer_zeros_huge_is_memory_error():
    kind, _ = ext.a2_buffer_zeros_error([2**61])
    assert kind == "MemoryError"
    assert ext.a2_buffer_zeros_error([2**62, 0]) is None


@pytest.mark.hostile
def test_returns_numpy_of_device_memory_names_the_device_and_frees_once():
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
