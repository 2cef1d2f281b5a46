"""Second hostile review of the speed work (issue #15).

A. Returned arrays: `Tensor::zeros`'s aligned allocation with slack (zeroed
   by dlcast below 128 KiB, by `calloc` above), the allocation held inline
   in the export, `Vec`/`ndarray` allocations kept by their own layout, the
   export's inline dimensions (spilling above 4), the managed tensor and its
   context in one allocation, NumPy's NULL strides.
B. PyTorch inputs: the Python key read with `_python_dispatch`, the lazy
   bits asked of the private alias, the writable checks first.

Test functions: tests/src/speed2.rs (every way a `Tensor` is built, to
every framework), and the existing ones of tests/src/*.rs.

Each test asserts the safe behaviour, so a failing test is a finding.
"""

import contextlib
import gc
import sys
import threading

import numpy as np
import pytest
import torch

import dlcast_testext as t
from conftest import buffer_of, run_py

ALIGN = 64

KINDS = [
    "zeros",
    "vec_spare",
    "vec_f",
    "boxed",
    "vec_1d",
    "ndarray_f",
    "ndarray_step",
    "ndarray_inverted",
    "static",
]

SHAPES = [
    (),
    (0,),
    (5,),
    (2, 3),
    (3, 0, 2),
    (1, 1, 1, 1),
    (2, 1, 3, 2),
    (2, 1, 3, 1, 2),
    (1, 2, 1, 2, 1, 2, 1, 2, 1),
]


@pytest.fixture(autouse=True)
def registry_empty_after():
    yield
    gc.collect()
    assert t.live_borrows() == 0


@contextlib.contextmanager
def exports_freed():
    """Every buffer exported in the block is freed, and every capsule made
    had its deleter run, once the block's objects are gone."""
    gc.collect()
    b0, f0, c0, d0 = t.export_stats()
    yield
    gc.collect()
    b1, f1, c1, d1 = t.export_stats()
    assert (b1 - b0, c1 - c0) == (f1 - f0, d1 - d0), "an export or a capsule leaked"


def cases():
    for kind in KINDS:
        for shape in SHAPES:
            n = int(np.prod(shape))
            if kind in ("boxed", "vec_1d") and len(shape) != 1:
                continue
            if kind in ("ndarray_step", "ndarray_inverted") and not shape:
                continue
            if kind == "static" and n > 24:
                continue
            yield kind, shape


CASES = list(cases())


def expected(shape):
    return np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)


def negative(kind, shape):
    """Whether `kind` gives `shape` a negative stride that an index steps
    along (PyTorch has no negative strides)."""
    return kind == "ndarray_inverted" and shape[0] > 1 and int(np.prod(shape)) > 0


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


# =============================================================================
# A. Returned arrays
# =============================================================================


@pytest.mark.parametrize("read_only", [False, True])
@pytest.mark.parametrize("kind,shape", CASES)
def test_held_every_construction_returned_to_numpy(kind, shape, read_only):
    with exports_freed():
        out = t.s2_make_numpy(kind, list(shape), read_only)
        check_numpy(out, shape, read_only, kind)
        if not read_only and kind != "static" and out.size:
            out[...] = -1.0  # writes stay inside the allocation
            assert (out == -1.0).all()
        del out


@pytest.mark.parametrize("kind,shape", CASES)
def test_held_every_construction_as_array_to_every_consumer(kind, shape):
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


@pytest.mark.parametrize("kind,shape", CASES)
def test_held_every_construction_returned_to_torch_jax_memoryview_array_api(kind, shape):
    exp = expected(shape)
    import jax
    import array_api_strict as xp
    with exports_freed():
        if kind == "static" or negative(kind, shape):
            # Read-only static data and negative strides: refused for PyTorch.
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


@pytest.mark.parametrize("kind,shape", CASES[::3])
def test_held_read_only_to_torch_is_refused_not_freed_twice(kind, shape):
    with exports_freed():
        with pytest.raises(BufferError):
            t.s2_make_torch(kind, list(shape), True)


@pytest.mark.parametrize("kind,shape", CASES[::2])
def test_held_capsules_consumed_or_not_exported_twice_dropped_on_another_thread(kind, shape):
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


@pytest.mark.parametrize("n", list(range(0, 130)) + [4095, 4096, 4097])
def test_held_zeros_are_aligned_and_zero_for_every_small_size(n):
    a = t.s2_zeros_u8_numpy([n])
    assert a.shape == (n,) and not a.any()
    if n:
        assert a.ctypes.data % ALIGN == 0
    b = np.asarray(t.s2_zeros_u8([n]))
    assert not b.any()
    if n:
        assert b.ctypes.data % ALIGN == 0


@pytest.mark.parametrize(
    "nbytes", [8, 1000, (128 << 10) - 64, (128 << 10) - 1, 128 << 10, (128 << 10) + 1, 1 << 20, (1 << 20) + 17]
)
def test_held_zeros_are_zero_after_the_allocator_reuses_dirty_memory(nbytes):
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
def test_held_huge_zeros_raise_memory_or_value_error(shape):
    # The slack (48 bytes) added to sizes near isize::MAX: a Python error,
    # never an abort or a short buffer.
    for fn in (t.s2_zeros_u8, t.s2_zeros_u8_numpy, t.s2_zeros_f32_torch):
        with pytest.raises((MemoryError, ValueError, OverflowError)):
            fn(shape)


@pytest.mark.parametrize(
    "shape", [[0, ISIZE_MAX], [ISIZE_MAX, 0], [0, 2**62, 2**62], [3, 0, 2**63 - 1], [0] * 9]
)
def test_held_empty_arrays_with_huge_extents(shape):
    for fn in (t.s2_zeros_u8, t.s2_zeros_u8_numpy, t.s2_zeros_f32_torch):
        try:
            out = fn(shape)
        except (ValueError, MemoryError, BufferError):
            continue
        assert tuple(out.shape) == tuple(shape)
        if isinstance(out, np.ndarray):
            assert out.size == 0
            assert (out.flags.c_contiguous, out.flags.f_contiguous) == numpy_flags_for(out)


def test_held_many_dimensions_spill_and_round_trip():
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


def test_held_interpreter_exit_with_live_exports_and_capsules():
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


# =============================================================================
# B. PyTorch inputs
# =============================================================================


def test_held_functional_and_batched_and_fake_and_meta_tensors_are_refused():
    x = torch.arange(4, dtype=torch.float64)
    f = torch._to_functional_tensor(x)
    for fn in (t.values, t.identity_numpy):
        with pytest.raises(BufferError):
            fn(f)
    with pytest.raises(BufferError):
        t.fill_f64(torch._to_functional_tensor(x.clone()), 2.0)
    with pytest.raises(BufferError):
        torch.vmap(lambda r: torch.tensor(t.values(r)))(x.reshape(2, 2))
    with pytest.raises(BufferError):
        torch.func.functionalize(lambda r: torch.tensor(t.values(r)))(x)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.ones(3, dtype=torch.float64)
        with pytest.raises(BufferError):
            t.values(fake)
    with pytest.raises(BufferError):
        t.values(fake)
    # The fake tensor's class reassigned: the Python key stays.
    fake.__class__ = torch.Tensor
    with pytest.raises(BufferError):
        t.values(fake)
    with pytest.raises(BufferError):
        t.values(torch.ones(3, dtype=torch.float64, device="meta"))


COMPLEX = [torch.complex32, torch.complex64, torch.complex128]


@pytest.mark.parametrize("dtype", COMPLEX)
def test_held_lazy_bits_of_every_complex_dtype(dtype):
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=dtype)
    views = [z.conj(), z._neg_view(), z.conj()._neg_view(), z.conj()[1:]]
    if dtype != torch.complex32:
        views += [z.conj().imag, z.conj().real.unsqueeze(0).expand(2, 2)]
    for v in views:
        if not (v.is_neg() or v.is_conj()):
            continue
        for fn in (t.identity_numpy, t.identity_torch):
            with pytest.raises(BufferError, match="bit set"):
                fn(v)


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.float32, torch.float64, torch.int8, torch.int64, torch.uint8, torch.bool]
)
def test_held_negative_bit_of_every_real_dtype(dtype):
    v = torch.ones(3, dtype=dtype)
    torch._C._set_neg(v, True)
    for fn in (t.identity_numpy, t.identity_torch):
        with pytest.raises(BufferError, match="negative bit"):
            fn(v)
    # A real tensor cannot get the conjugate bit (PyTorch asserts).
    with pytest.raises(RuntimeError):
        torch._C._set_conj(torch.ones(2, dtype=dtype), True)


class Seen(torch.Tensor):
    seen = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        Seen.seen.append(func)
        return super().__torch_function__(func, types, args, kwargs)


def test_held_class_reassigned_by_another_thread_while_is_inference_releases_the_gil():
    # `is_inference()` releases the GIL; another thread flips the caller's
    # tensor between `torch.Tensor` and a subclass with its own
    # `__torch_function__`. dlcast's calls must never reach that Python
    # code, and the values must be right.
    x = torch.zeros(64, dtype=torch.float64)
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            x.__class__ = Seen
            x.__class__ = torch.Tensor

    Seen.seen.clear()
    th = threading.Thread(target=flip)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    th.start()
    try:
        for i in range(3000):
            t.fill_f64(x, float(i))
            assert float(x[0]) == float(i)
    finally:
        stop.set()
        th.join()
        sys.setswitchinterval(old)
    x.__class__ = torch.Tensor
    assert Seen.seen == []


def test_held_alias_mutated_through_gc_by_another_thread():
    # dlcast's private alias is reachable through gc.get_objects(); another
    # thread sets its negative bit, or points it elsewhere, whenever it can
    # (while is_neg()/is_conj() release the GIL). No crash; each call
    # refuses or reads the caller's values (the alias's memory).
    z = torch.tensor([1 + 2j, 3 - 4j] * 8, dtype=torch.complex128)
    x = torch.arange(16, dtype=torch.float64)
    ptrs = {x.data_ptr(), z.data_ptr()}
    stop = threading.Event()
    other = torch.full((16,), 7.0, dtype=torch.float64)

    def meddle():
        while not stop.is_set():
            for o in gc.get_objects():
                if isinstance(o, torch.Tensor) and o is not x and o is not z:
                    try:
                        if o.data_ptr() in ptrs:
                            torch._C._set_neg(o, True)
                    except Exception:
                        pass

    th = threading.Thread(target=meddle)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    th.start()
    try:
        for _ in range(300):
            for arg, want in ((x, x.numpy()), (z, z.numpy())):
                try:
                    out = t.identity_numpy(arg)
                except BufferError:
                    continue
                np.testing.assert_array_equal(out, want)
    finally:
        stop.set()
        th.join()
        sys.setswitchinterval(old)
    assert not x.is_neg() and not z.is_neg()
    del other


def test_held_a_later_arguments_dlpack_changes_an_earlier_tensor_dtype():
    # `x.data = ...` (a complex conjugate view) from a later argument's
    # __dlpack__: the alias taken in x's phase 1 is unchanged, so the call
    # reads x's old values (or refuses), never the new lazy view's memory.
    x = torch.arange(4, dtype=torch.float64)

    class Later:
        def __init__(self):
            self.arr = np.ones(4)

        def __dlpack__(self, **kw):
            x.data = torch.tensor([1 + 2j] * 4, dtype=torch.complex128).conj()
            return self.arr.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.arr.__dlpack_device__()

    try:
        total, n = t.sum_f64_and_len(x, Later())
    except (BufferError, TypeError, ValueError):
        pass
    else:
        assert (total, n) == (6.0, 4)
    assert x.is_conj() and x.dtype == torch.complex128


def test_held_mode_entered_by_a_finalizer_during_the_writable_checks():
    # The writable checks (`requires_grad`, `is_inference()`) run on the
    # fast path before the Python key is read; a collection started there
    # (by whatever they allocate) runs a finalizer that enters a lying
    # function mode. `_python_dispatch` must not be answered by it: a
    # tensor with the Python key (an exact `torch.Tensor` by class
    # reassignment) is refused whatever the mode says.
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Disp(torch.Tensor):
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    seen = []

    class Liar(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    entered = []

    class Trap:
        def __del__(self):
            m = Liar()
            m.__enter__()
            entered.append(m)

    moved = torch.Tensor._make_subclass(Disp, torch.zeros(3, dtype=torch.float64))
    moved.__class__ = torch.Tensor
    t.fill_f64(torch.zeros(3, dtype=torch.float64), 1.0)  # set-up done
    threshold = gc.get_threshold()
    gc.collect()
    gc.disable()
    err = None
    try:
        trap = Trap()
        trap.cycle = trap
        del trap
        gc.set_threshold(1)
        gc.enable()
        try:
            t.fill_f64(moved, 1.0)
        except BufferError as e:
            err = e
    finally:
        gc.set_threshold(*threshold)
        for m in reversed(entered):
            m.__exit__(None, None, None)
    assert err is not None and "dispatch" in str(err)
    assert seen == []


def test_finding_sliced_efficient_zero_tensor_is_refused_not_dereferenced():
    # Finding R2-2 (fixed): `torch._efficientzerotensor` has no memory; its
    # data pointer is NULL plus the storage offset, so a slice of it has a
    # non-NULL bogus address (8 for `z[1:]`, anything for a larger offset)
    # that PyTorch's exchange API and `__dlpack__` hand out. dlcast read
    # (and, for a writable parameter, wrote) that address: a segfault, or
    # reads and writes of unrelated memory. Run in a child process so that
    # a regression fails this test instead of killing the session.
    r = run_py(
        """
        import torch, dlcast_testext as t
        z = torch._efficientzerotensor(1 << 20, dtype=torch.float64)
        outcomes = []
        for w in (z[1:], z[1000:1004], z.view(1024, 1024)[3], z[:0], z):
            for call in (lambda: t.values(w), lambda: t.identity_numpy(w),
                         lambda: t.fill_f64(w, 1.0)):
                try:
                    call()
                except (BufferError, TypeError) as e:
                    outcomes.append("zero tensor" in str(e) or "NULL" in str(e))
                else:
                    outcomes.append(w.numel() == 0)
        print(all(outcomes), len(outcomes))
        """
    )
    assert r.returncode == 0, f"the child crashed ({r.returncode}): {r.stderr[-1500:]}"
    assert r.stdout.split() == ["True", "15"], r.stdout + r.stderr[-1500:]
