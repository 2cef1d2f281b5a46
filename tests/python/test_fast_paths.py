"""The fast import paths: each is taken where it should be,
gives the same view as the generic path, and allocates nothing on the Rust
heap for up to 8 dimensions (dlcast_runtime::INLINE_DIMS)."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import dlcast_testext as ext


class Sub(np.ndarray):
    pass


def generic(x):
    """The same array through the generic path: a capsule from __dlpack__."""
    return x.__dlpack__(max_version=(1, 0)) if isinstance(x, np.ndarray) else x.__dlpack__()


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
    # A misaligned float64 view: read through unaligned loads, no slice.
    raw = np.zeros(8 * 4 + 1, np.uint8)
    mis = raw[1:].view(np.float64)
    mis[:] = [1.0, 2.0, 3.0, 4.0]
    assert ext.import_path(mis) == "numpy"
    assert ext.values(mis) == [1.0, 2.0, 3.0, 4.0]
    assert ext.slice_f64(mis) is None
    with pytest.raises(ValueError, match="not aligned"):
        ext.ndarray_f64(mis)


def test_numpy_inputs_the_fast_path_declines_get_numpys_own_errors():
    with pytest.raises(BufferError) as info:
        ext.values(np.arange(3.0).astype(">f8"))
    assert isinstance(info.value.__cause__, BufferError)
    rec = np.zeros(3, dtype=[("a", "<f8"), ("b", "<i4")])
    with pytest.raises(BufferError):
        ext.values(rec["a"])
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
