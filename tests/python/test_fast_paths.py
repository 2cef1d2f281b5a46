"""The fast import paths: each is taken where it should be,
gives the same view as the generic path, and allocates nothing on the Rust
heap for up to 8 dimensions (dlcast_runtime::INLINE_DIMS)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import dlcast_testext as ext
from conftest import run_py


class Sub(np.ndarray):
    pass


def generic(x):
    """The same array through the generic path: a versioned capsule from
    __dlpack__ (a legacy one, which cannot say whether it may be written,
    is read read-only)."""
    return x.__dlpack__(max_version=(1, 0))


def test_paths_taken():
    a = np.zeros(3)
    assert ext.import_path(a) == "numpy"
    assert ext.import_path(a.view(Sub)) == "dlpack"  # subclasses may override __dlpack__
    assert ext.import_path(torch.zeros(3)) == "exchange_api"
    assert ext.import_path(jnp.zeros(3)) == "dlpack"
    assert ext.import_path(a.__dlpack__()) == "capsule"
    assert ext.import_path(b"ab") == "buffer"


NUMPY_CASES = {
    "c": lambda: np.arange(24.0).reshape(2, 3, 4),
    "f": lambda: np.asfortranarray(np.arange(24.0).reshape(2, 3, 4)),
    "negative": lambda: np.arange(24.0).reshape(2, 3, 4)[::-1, :, ::-2],
    "zero-d": lambda: np.array(5.0),
    "empty": lambda: np.zeros((3, 0, 2)),
    "broadcast": lambda: np.broadcast_to(np.arange(3.0), (4, 3)),
    "int8": lambda: np.arange(10, dtype=np.int8)[1::3],
    "bool": lambda: np.array([True, False, True]),
    "float16": lambda: np.arange(4, dtype=np.float16),
    "complex64": lambda: np.arange(4, dtype=np.complex64) * 1j,
    "long": lambda: np.arange(4, dtype=np.int_),
    "uint64": lambda: np.arange(4, dtype=np.uint64),
    "eight-d": lambda: np.zeros((1, 2, 1, 2, 1, 2, 1, 2)),
    "nine-d": lambda: np.zeros((1,) * 8 + (3,)),
}


@pytest.mark.parametrize("case", NUMPY_CASES)
def test_numpy_fast_path_matches_generic(case):
    a = NUMPY_CASES[case]()
    assert ext.import_path(a) == "numpy"
    assert ext.describe(a) == ext.describe(generic(a))
    assert ext.values(a) == ext.values(generic(a))


def test_numpy_read_only_and_misaligned():
    ro = np.arange(4.0)
    ro.flags.writeable = False
    assert ext.describe(ro) == ext.describe(generic(ro))
    assert ext.describe(ro)[4] is True
    # A misaligned float64 view: a `TensorDyn` reads it in place (unaligned
    # loads); a `TensorRef` gets an aligned copy, so its slice and ndarray
    # accessors do not fail on alignment.
    raw = np.zeros(8 * 4 + 1, np.uint8)
    mis = raw[1:].view(np.float64)
    mis[:] = [1.0, 2.0, 3.0, 4.0]
    assert ext.import_path(mis) == "numpy"
    assert ext.values(mis) == [1.0, 2.0, 3.0, 4.0]
    assert ext.slice_f64(mis) == [1.0, 2.0, 3.0, 4.0]
    assert ext.ndarray_f64(mis) == [1.0, 2.0, 3.0, 4.0]


def test_numpy_inputs_the_fast_path_declines_get_numpys_own_errors():
    # What the untyped parameter cannot read in place: its TypeError, NumPy's
    # own refusal kept at the end of the cause chain.
    with pytest.raises(TypeError, match="byte order") as info:
        ext.values(np.arange(3.0).astype(">f8"))
    assert isinstance(info.value.__cause__.__cause__, BufferError)
    rec = np.zeros(3, dtype=[("a", "<f8"), ("b", "<i4")])
    with pytest.raises(TypeError, match="not whole elements") as info:
        ext.values(rec["a"])
    assert isinstance(info.value.__cause__.__cause__, BufferError)
    with pytest.raises(BufferError):
        ext.values(np.zeros(2, np.longdouble))


def test_numpy_spans_the_fast_path_declines_get_the_generic_checks():
    # Strides whose span wraps around the address space: the one-pass
    # NumPy read declines, and the generic path refuses with its message.
    wraps = np.lib.stride_tricks.as_strided(np.zeros(4), shape=(3,), strides=(-(2**62),))
    with pytest.raises(BufferError, match="wraps around the address space"):
        ext.describe(wraps)
    # An empty array with the same strides touches no memory: taken as is.
    empty = np.lib.stride_tricks.as_strided(np.zeros(4), shape=(0, 3), strides=(2**62, 2**62))
    assert ext.import_path(empty) == "numpy"
    assert ext.describe(empty) == ext.describe(generic(empty))


TORCH_CASES = {
    "c": lambda: torch.arange(24.0).reshape(2, 3, 4),
    "t": lambda: torch.arange(24.0).reshape(2, 3, 4).permute(2, 0, 1),
    "sliced": lambda: torch.arange(24.0).reshape(6, 4)[1::2, 1:],
    "zero-d": lambda: torch.tensor(3.0),
    "empty": lambda: torch.zeros(0, 3),
    "expanded": lambda: torch.arange(3.0).expand(4, 3),
    "bfloat16": lambda: torch.arange(4.0, dtype=torch.bfloat16),
    "offset": lambda: torch.arange(10.0)[3:],
}


@pytest.mark.parametrize("case", TORCH_CASES)
def test_exchange_api_matches_generic(case):
    t = TORCH_CASES[case]()
    assert ext.import_path(t) == "exchange_api"
    assert ext.describe(t) == ext.describe(generic(t))
    if t.dtype != torch.bfloat16:
        assert ext.values(t) == ext.values(generic(t))
    assert ext.data_ptr(t) == t.data_ptr()


def test_exchange_api_writes_and_exports():
    t = torch.zeros(4, dtype=torch.float64)
    ext.fill_f64(t[1:3], 2.0)
    assert t.tolist() == [0.0, 2.0, 2.0, 0.0]
    # A returned view of an exchange-API import owns its memory.
    v = ext.rows(torch.arange(6.0, dtype=torch.float64).reshape(3, 2), 1, 3)
    assert np.asarray(v).tolist() == [[2.0, 3.0], [4.0, 5.0]]


def count_allocations(fn, x, calls=200):
    fn(x)  # warm caches (type lookups, interned names)
    before = ext.rust_allocations()
    for _ in range(calls):
        fn(x)
    return ext.rust_allocations() - before


@pytest.mark.parametrize("ndim", range(1, 9))
def test_no_heap_allocation_up_to_eight_dimensions(ndim):
    a = np.zeros((2,) * ndim)
    t = torch.zeros((2,) * ndim, dtype=torch.float64)
    assert count_allocations(ext.first_f64, a) == 0
    assert count_allocations(ext.first_f64, t) == 0


def test_annotated_calls_allocate_nothing():
    pts = np.zeros((1000, 3), np.float32)
    assert count_allocations(ext.points_len, pts) == 0
    assert count_allocations(ext.points_len, torch.from_numpy(pts)) == 0
    w = np.ones(1000, np.float32)
    before = ext.rust_allocations()
    for _ in range(100):
        ext.centroid(pts, w)
    assert ext.rust_allocations() == before


def test_beyond_eight_dimensions_allocation_is_the_only_cost():
    a = np.zeros((1,) * 9 + (2,))
    assert count_allocations(ext.first_f64, a, calls=10) > 0


# --- The call driver's fast path for exact NumPy arrays --------------------
# Every case runs twice in a fresh interpreter (the switch is process-wide):
# with the fast path on and off (`ext.numpy_fast_path`, debug builds), on
# fresh inputs each time; results, refusals (type and message) and what the
# call wrote must be the same. `fast` lists the cases the fast path must
# complete (the others must fall back to the general path).

FAST_SCENARIO = r'''
import json, sys
import numpy as np
import dlcast_testext as ext

class Sub(np.ndarray):
    pass

def f64(*shape):
    return np.arange(float(np.prod(shape)) or 0.0).reshape(shape)

def f32(*shape):
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape)

def ro(a):
    a.flags.writeable = False
    return a

def swapped(a):
    return a.astype(a.dtype.newbyteorder())

def misaligned(dtype, n):
    raw = np.zeros(n * np.dtype(dtype).itemsize + 1, np.uint8)
    return raw[1:].view(dtype)

def overlapping():
    base = np.arange(8, dtype=np.float32)
    return [f32(4, 3), f32(4, 3), base[0:4], base[2:6]]

CASES = {
    "ordinary": {
        "ref 1d": ("fp_ref", lambda: [f64(10)]),
        "ref 2d": ("fp_ref", lambda: [f64(3, 4)]),
        "ref 4d": ("fp_ref", lambda: [f64(2, 3, 2, 2)]),
        "ref 5d": ("fp_ref", lambda: [f64(2, 1, 2, 1, 2)]),
        "ref f order": ("fp_ref", lambda: [np.asfortranarray(f64(3, 4))]),
        "ref strided": ("fp_ref", lambda: [f64(10)[::3]]),
        "ref negative": ("fp_ref", lambda: [f64(10)[::-2]]),
        "ref 0-d": ("fp_ref", lambda: [np.array(2.5)]),
        "ref empty": ("fp_ref", lambda: [f64(3, 0)]),
        "ref broadcast": ("fp_ref", lambda: [np.broadcast_to(f64(3), (4, 3))]),
        "ref read-only": ("fp_ref", lambda: [ro(f64(5))]),
        "ref int64": ("fp_ref", lambda: [np.arange(5)]),
        "ref float32": ("fp_ref", lambda: [f32(5)]),
        "ref complex": ("fp_ref", lambda: [np.arange(3) * 1j]),
        "ref bool": ("fp_ref", lambda: [np.array([True, False])]),
        "pts": ("fp_pts", lambda: [f32(5, 3)]),
        "pts rows": ("fp_pts", lambda: [f32(10, 3)[::2]]),
        "pts one row": ("fp_pts", lambda: [f32(1, 3)]),
        "pts shape": ("fp_pts", lambda: [f32(5, 4)]),
        "pts rank": ("fp_pts", lambda: [f32(15)]),
        "pts f order": ("fp_pts", lambda: [np.asfortranarray(f32(5, 3))]),
        "pts columns": ("fp_pts", lambda: [f32(5, 6)[:, ::2]]),
        "f order i32": ("fp_ref_f", lambda: [np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4))]),
        "f order c i32": ("fp_ref_f", lambda: [np.arange(12, dtype=np.int32).reshape(3, 4)]),
        "mut": ("fp_mut", lambda: [f64(2, 3)]),
        "mut strided": ("fp_mut", lambda: [f64(10)[::2]]),
        "mut read-only": ("fp_mut", lambda: [ro(f64(4))]),
        "mut broadcast": ("fp_mut", lambda: [np.broadcast_to(f64(3), (2, 3))]),
        "mut float32": ("fp_mut", lambda: [f32(4)]),
        "slice": ("fp_slice", lambda: [f64(6)]),
        "slice one": ("fp_slice", lambda: [f64(40)[::20][:1]]),
        "slice strided": ("fp_slice", lambda: [f64(10)[::2]]),
        "slice reversed": ("fp_slice", lambda: [f64(10)[::-1]]),
        "slice 2d": ("fp_slice", lambda: [f64(2, 3)]),
        "slice empty": ("fp_slice", lambda: [f64(0)]),
        "slice read-only": ("fp_slice", lambda: [ro(f64(3))]),
        "slice int": ("fp_slice", lambda: [np.arange(3)]),
        "slice mut": ("fp_slice_mut", lambda: [f64(5)]),
        "slice mut read-only": ("fp_slice_mut", lambda: [ro(f64(5))]),
        "slice mut strided": ("fp_slice_mut", lambda: [f64(10)[::2]]),
        "view": ("fp_view", lambda: [f32(4, 3)]),
        "view f order": ("fp_view", lambda: [np.asfortranarray(f32(4, 3))]),
        "view strided": ("fp_view", lambda: [f32(8, 6)[::2, 1::2]]),
        "view column": ("fp_view", lambda: [f32(4, 5)[:, 2:3]]),
        "view negative": ("fp_view", lambda: [f32(4, 3)[::-1]]),
        "view empty": ("fp_view", lambda: [f32(0, 3)]),
        "view rank": ("fp_view", lambda: [f32(4)]),
        "view mut 3d": ("fp_view_mut", lambda: [np.arange(24, dtype=np.int32).reshape(2, 3, 4)]),
        "view mut 5d": ("fp_view_mut", lambda: [np.zeros((1, 2, 1, 2, 2), np.int32)]),
        "view mut transposed": ("fp_view_mut", lambda: [np.arange(6, dtype=np.int32).reshape(2, 3).T]),
        "view mut read-only": ("fp_view_mut", lambda: [ro(np.arange(4, dtype=np.int32))]),
        "args": ("fp_args", lambda: [f32(4, 3), f32(4, 3), f32(4), np.zeros(4, np.float32)]),
        "args extent": ("fp_args", lambda: [f32(4, 3), f32(5, 3), f32(4), np.zeros(4, np.float32)]),
        "args out read-only": ("fp_args", lambda: [f32(4, 3), f32(4, 3), f32(4), ro(np.zeros(4, np.float32))]),
    },
    "hostile": {
        "ref swapped": ("fp_ref", lambda: [swapped(f64(4))]),
        "ref misaligned": ("fp_ref", lambda: [misaligned(np.float64, 4)]),
        "ref subclass": ("fp_ref", lambda: [f64(4).view(Sub)]),
        "ref memoryview": ("fp_ref", lambda: [memoryview(f64(4))]),
        "pts swapped": ("fp_pts", lambda: [swapped(f32(5, 3))]),
        "mut swapped": ("fp_mut", lambda: [swapped(f64(4))]),
        "mut misaligned": ("fp_mut", lambda: [misaligned(np.float64, 4)]),
        "slice misaligned": ("fp_slice", lambda: [misaligned(np.float64, 4)]),
        "slice swapped": ("fp_slice", lambda: [swapped(f64(4))]),
        "slice mut misaligned": ("fp_slice_mut", lambda: [misaligned(np.float64, 4)]),
        "view misaligned": ("fp_view", lambda: [misaligned(np.float32, 6).reshape(2, 3)]),
        "view mut overlapping": ("fp_view_mut", lambda: [np.lib.stride_tricks.as_strided(np.zeros(4, np.int32), (3, 2), (4, 4))]),
        "args shared out": ("fp_args", lambda: (lambda w: [f32(4, 3), f32(4, 3), w, w])(f32(4))),
        "args overlapping": ("fp_args", overlapping),
        "args out is a": ("fp_args", lambda: (lambda a: [a, f32(4, 3), f32(4), a[:, 0]])(f32(4, 3))),
        "args same a and b": ("fp_args", lambda: (lambda a: [a, a, f32(4), np.zeros(4, np.float32)])(f32(4, 3))),
    },
}

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:
    byte_bounds = np.byte_bounds

def norm(v, base):
    """Addresses as offsets from the first argument's element 0 where they
    lie in its bytes, else "elsewhere" (a converted copy's)."""
    if isinstance(v, (list, tuple)):
        return [norm(x, base) for x in v]
    if isinstance(v, int) and not isinstance(v, bool) and v > (1 << 32):
        lo, hi, zero = base
        return ("addr", v - zero) if lo <= v < max(hi, lo + 1) else "elsewhere"
    if isinstance(v, float) and v != v:
        return "nan"
    return v

def run(fn, make):
    args = make()
    a = args[0]
    base = (*byte_bounds(a), a.ctypes.data) if isinstance(a, np.ndarray) else (0, 0, 0)
    before = ext.numpy_fast_path()
    try:
        out = ("ok", norm(getattr(ext, fn)(*args), base))
    except Exception as e:
        out = ("err", type(e).__name__, str(e))
    fast = ext.numpy_fast_path() > before
    after = [a.tolist() if isinstance(a, np.ndarray) else None for a in args]
    return out, after, fast

ext.fp_ref(f64(3))  # NumPy's array type is learned on a first call
report = {}
for name, (fn, make) in CASES[sys.argv[1]].items():
    ext.numpy_fast_path(True)
    on = run(fn, make)
    ext.numpy_fast_path(False)
    off = run(fn, make)
    report[name] = {"on": on[:2], "off": off[:2], "fast": on[2], "fast_when_off": off[2]}
ext.numpy_fast_path(True)
print(json.dumps(report, default=repr))
'''

# The cases the fast path completes; every other case falls back.
FAST_CASES = {
    "ref 1d", "ref 2d", "ref 4d", "ref f order", "ref strided", "ref broadcast",
    "ref read-only", "pts", "pts one row", "f order i32", "mut", "mut strided",
    "slice", "slice one", "slice read-only", "slice mut", "view", "view f order",
    "view strided", "view column", "view mut 3d", "view mut transposed", "args",
    "args same a and b",
}


def fast_vs_general(group):
    r = run_py(FAST_SCENARIO.replace("sys.argv[1]", repr(group)), timeout=300)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    for name, case in report.items():
        assert case["on"] == case["off"], (name, case)
        assert not case["fast_when_off"], name
    taken = {name for name, case in report.items() if case["fast"]}
    assert taken == FAST_CASES & set(report), taken ^ (FAST_CASES & set(report))
    return report


def test_numpy_fast_path_accepts_and_refuses_as_the_general_path():
    report = fast_vs_general("ordinary")
    # The comparison is not vacuous: both outcomes occur, writes included.
    assert report["mut"]["on"][1][0] == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    assert report["args extent"]["on"][0][0] == "err"
    assert "'b'" in report["args extent"]["on"][0][2]
    assert report["slice mut read-only"]["on"][0][1] == "TypeError"


@pytest.mark.hostile
def test_numpy_fast_path_refuses_hostile_inputs_as_the_general_path():
    report = fast_vs_general("hostile")
    for name in ("args shared out", "args overlapping", "view mut overlapping"):
        assert report[name]["on"][0][0] == "err", name


def test_numpy_fast_path_views_that_outlive_the_body():
    before = ext.live_borrows()
    x = np.arange(5.0)
    out = ext.fp_return(x)
    assert np.shares_memory(np.asarray(out), x)
    assert ext.live_borrows() == before
    # A writable view dropped in the body ends its registry entry with it.
    y = np.arange(3.0)
    assert ext.fp_drop_then_call(y, lambda: ext.fp_slice_mut(y)) == ([1.0, 2.0, 3.0], y.ctypes.data)
    assert ext.live_borrows() == before
    assert ext.numpy_fast_path() > 0


def test_numpy_fast_path_that_gives_up_midway_leaves_nothing_registered():
    # The straight-line call registers each argument as it reads it; a
    # later argument it cannot take (an extent that differs, a read-only
    # output, a conflict with an earlier argument) ends every entry it made
    # before the general path runs the call (and refuses it).
    before = ext.live_borrows()
    a, b = (np.arange(12, dtype=np.float32).reshape(4, 3) for _ in range(2))
    w, out = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    ro_out = np.zeros(4, np.float32)
    ro_out.flags.writeable = False
    refused = [
        (a, np.zeros((5, 3), np.float32), w, out),  # `n` differs at b
        (a, b, w, ro_out),  # read-only output, after three entries
        (a, b, w, w),  # the output is w: a conflict within the call
    ]
    for args in refused:
        with pytest.raises((TypeError, ValueError, BufferError)):
            ext.fp_args(*args)
        assert ext.live_borrows() == before
    # Nothing left behind: the same arrays, writable ones included, are
    # taken again, by the fast path.
    taken = ext.numpy_fast_path()
    assert ext.fp_args(a, b, w, out) == pytest.approx(float(sum(a[:, 0] + b[:, 1] + w)))
    assert out.tolist() == (a[:, 0] + b[:, 1] + w).tolist()
    assert ext.numpy_fast_path() > taken
    assert ext.live_borrows() == before
