"""Every copy dlcast makes of memory that a view may be writing is a read
in the borrow registry (README, *Safety*).

dlcast copies memory it did not allocate itself in a few places: the copy
`dlcast.Array.__dlpack__(copy=True)` hands out (what
`numpy.from_dlpack(a, copy=True)` asks for), the aligned copy behind
`returns = jax` (and other consumers that cannot take the layout), and the
conversion of an argument by its framework. While another call's body
holds a `&mut` of that memory (here: with the GIL released, in another
thread, parked until the test lets it go, so the copy certainly overlaps
it), each of them must be refused with a `BufferError`, never read the
memory under the writer (a data race, a torn copy).
"""

import contextlib
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest

import dlcast_testext as ext
from conftest import run_py


@contextlib.contextmanager
def writer_holding(x):
    """Runs `a2_hold_mut(x)` in a thread: its body holds `&mut [f32]` of
    `x` with the GIL released until the block ends, then adds 1 to every
    element. Entered once the body holds it (a state it reports, waited
    for: no timing decides anything)."""
    errors = []

    def run():
        try:
            ext.a2_hold_mut(x)
        except BaseException as e:  # reported below
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 60
    while not ext.a2_held() and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.001)
    # The flag is set with the GIL held right before the body releases
    # it, so seen from here the body is inside `py.detach`, holding `&mut`.
    held = ext.a2_held()
    try:
        assert held, f"the writer never held the memory: {errors}"
        yield
    finally:
        ext.a2_release()
        t.join(60)
    assert not t.is_alive()
    assert not errors, errors


def exported_views():
    """`dlcast.Array`s whose memory a dlcast `&mut` can hold: an
    `ArrayBuffer`'s writable export, and the export of an input's view."""
    buf = ext.JaxBuf()
    base = np.zeros(17, np.float32)
    return {
        "ArrayBuffer": (buf.view(), lambda v: v, buf),
        # Not 64-byte aligned: `returns = jax` copies it.
        "input view": (ext.identity(base[1:]), lambda v: base[1:], base),
    }


@pytest.mark.hostile
@pytest.mark.parametrize("kind", ["ArrayBuffer", "input view"])
def test_dlpack_copy_is_refused_while_another_call_writes(kind):
    view, memory_of, keep = exported_views()[kind]
    with writer_holding(memory_of(view)):
        with pytest.raises(BufferError, match=r"__dlpack__\(copy=True\).*a2_hold_mut"):
            np.from_dlpack(view, copy=True)
        with pytest.raises(BufferError, match="a2_hold_mut"):
            view.__dlpack__(copy=True, max_version=(1, 0))
    # Once the writer is done, the copy is made, and sees its writes.
    copy = np.from_dlpack(view, copy=True)
    assert copy.tolist() == [1.0] * len(copy)
    copy[0] = 5.0
    assert np.from_dlpack(view)[0] == 1.0  # a copy, not the memory
    del keep


@pytest.mark.hostile
@pytest.mark.parametrize("kind", ["ArrayBuffer", "input view"])
def test_returns_jax_copy_is_refused_while_another_call_writes(kind):
    view, memory_of, keep = exported_views()[kind]
    with writer_holding(memory_of(view)):
        with pytest.raises(BufferError, match=r"returns = jax.*a2_hold_mut"):
            ext.cp_to_jax(view)
    out = ext.cp_to_jax(view)
    assert np.asarray(out).tolist() == [1.0] * len(out)
    del keep


@pytest.mark.hostile
def test_legacy_capsule_copy_of_read_only_data_is_refused_while_another_call_writes():
    """A read-only `dlcast.Array` asked for a legacy capsule (JAX's and
    MLX's `from_dlpack`) hands out a copy: a read of memory that another
    call's `&mut` may hold (here: a read-only view of an array whose
    writable base another call holds), refused while it does."""
    base = np.zeros(17, np.float32)
    ro = base[1:]
    ro.flags.writeable = False
    view = ext.identity(ro)
    assert view.read_only
    with writer_holding(base[1:]):
        with pytest.raises(BufferError, match=r"legacy capsule goes as a copy.*a2_hold_mut"):
            view.__dlpack__()
        with pytest.raises(BufferError, match="a2_hold_mut"):
            jnp.from_dlpack(view)
    # Once the writer is done, the copy is made, and sees its writes.
    assert jnp.from_dlpack(view).tolist() == [1.0] * 16


def test_copies_are_made_while_other_calls_only_read():
    # A read-only view of another call does not stop a copy: both read.
    x = np.arange(4.0)
    v = ext.identity(x)
    copies = []
    assert ext.hold_ref_and_call(
        x, lambda: copies.append(np.from_dlpack(v, copy=True))) == (6.0, 6.0)
    assert copies[0].tolist() == [0.0, 1.0, 2.0, 3.0]


def _convert_under_writer(lie):
    """A byte-swapped view (DLPack cannot describe it: converted through
    NumPy) of an array another call holds `&mut` of, passed from that
    call's callback; `lie` replaces numpy.lib.array_utils.byte_bounds first."""
    return run_py(f"""
        import numpy as np, numpy.lib.array_utils as au
        import dlcast_testext as ext
        real = au.byte_bounds
        au.byte_bounds = {lie}
        x = np.zeros(8)
        def callback():
            try:
                print("converted", ext.sum_around_call(x.view(">f8"), lambda: None))
            except BufferError as e:
                print("BufferError", e)
        print("sum", ext.hold_mut_and_call(x, callback))
    """)


@pytest.mark.hostile
@pytest.mark.parametrize("lie", [
    "real",
    "lambda a: (0, 0)",
    "lambda a: (1, 2)",
    "lambda a: real(np.zeros(3))",
])
def test_conversion_probe_ignores_a_replaced_byte_bounds(lie):
    r = _convert_under_writer(lie)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0].startswith("BufferError sum_around_call(): argument 'x': "), out
    assert "hold_mut_and_call()" in out[0]
    assert out[1] == "sum 8.0"


@pytest.mark.hostile
def test_conversion_holds_its_read_while_its_python_code_runs():
    # A float32 tensor for a float64 parameter: PyTorch converts it. Python
    # code the conversion runs before it copies (here an import hook, as
    # `import torch` inside the conversion calls `__import__`) starts another
    # thread's writable view of the same memory: refused, since the
    # conversion holds its read from before the copy until it has finished.
    r = run_py("""
        import builtins, threading, time
        import torch
        import dlcast_testext as ext
        t = torch.arange(8, dtype=torch.float32)
        real_import = builtins.__import__
        outcome = []

        def writer():
            try:
                ext.a2_hold_mut(t)
                outcome.append("wrote")
            except BufferError as e:
                outcome.append("BufferError " + str(e))

        def hook(name, *args, **kw):
            global armed
            if name == "torch" and armed:
                armed = False
                w = threading.Thread(target=writer)
                w.start()
                deadline = time.monotonic() + 30
                while not ext.a2_held() and w.is_alive() and time.monotonic() < deadline:
                    time.sleep(0.001)
                outcome.append("held" if ext.a2_held() else "refused")
                ext.a2_release()
                w.join(30)
            return real_import(name, *args, **kw)

        ext.seen_c(t)  # PyTorch's handles found once, outside the hook
        armed = True
        builtins.__import__ = hook
        seen = ext.seen_c(t)
        builtins.__import__ = real_import
        print(outcome)
        print(seen[3])
    """)
    assert r.returncode == 0, r.stderr
    outcome, seen = r.stdout.splitlines()
    # The writer was refused (and said so before it ended), never held it.
    assert outcome.startswith("[\"BufferError a2_hold_mut(): argument 'x'"), outcome
    assert "argument 'x' of seen_c(), a read-only view" in outcome
    assert outcome.endswith("'refused']"), outcome
    assert seen == str([float(i) for i in range(8)])


@pytest.mark.hostile
def test_conversion_under_a_writing_thread_is_never_torn():
    # Two plain threads, no tampering: one fills a float32 array with one
    # value after another (a writable view each time, GIL held while it
    # writes), the other has it converted to float64 (NumPy's cast releases
    # the GIL while it copies). Every accepted conversion saw one value
    # throughout; the others were refused while the writer held the memory.
    n = 1 << 20
    a = np.zeros(n, np.float32)
    small = np.zeros(1)
    stop = threading.Event()
    errors = []

    def writer():
        k = 0
        while not stop.is_set():
            k = (k + 1) % 1000
            try:
                ext.fill_c_f32(a, float(k))
            except BufferError:
                pass
            except BaseException as e:  # reported below
                errors.append(e)
                return

    w = threading.Thread(target=writer)
    w.start()
    torn, accepted = [], 0
    try:
        deadline = time.monotonic() + 20
        while accepted < 60 and time.monotonic() < deadline:
            try:
                total, _ = ext.sum_f64_and_len(a, small)
            except BufferError:
                continue
            accepted += 1
            if total % n:
                torn.append(total / n)
    finally:
        stop.set()
        w.join(60)
    assert not errors, errors
    assert accepted > 0
    assert not torn, f"{len(torn)} of {accepted} conversions torn: {torn[:5]}"


@pytest.mark.hostile
def test_a_torch_conversion_copies_only_the_memory_it_holds():
    """Hostile (review of #32): a PyTorch argument converts from dlcast's
    private alias inside the disabled regions, which keep modes out, but
    `torch_convert` calls `detach`, `to` and `contiguous` as attributes of
    `torch.Tensor`, a heap type: a replaced `torch.Tensor.detach` receives
    the private alias and `set_()`s it onto memory another call holds
    `&mut` of. The copy then reads that memory under the writer, with no
    read entry for it (a data race); it must read only `a`'s memory, which
    it holds, or be refused."""
    import torch

    held = np.full(16, 3.0, np.float32)
    a = torch.ones(16, dtype=torch.float32)  # float32 -> float64: converted
    real = torch.Tensor.__dict__.get("detach")
    inherited = torch.Tensor.detach

    def detach(self):
        self.set_(torch.from_numpy(held))
        return inherited(self)

    got = None
    with writer_holding(held):
        torch.Tensor.detach = detach
        try:
            got = ext.sum_f64(a)
        except BufferError:
            pass
        finally:
            if real is None:
                del torch.Tensor.detach
            else:
                torch.Tensor.detach = real
    assert got in (None, 16.0), got
