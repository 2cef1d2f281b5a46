"""Shared helpers for the dlcast pytest suite.

Every framework is imported directly: in CI a missing framework is a
failure, never a skip.
"""

import contextlib
import os

import numpy as np
import pytest

# `make sanitize` runs the NumPy-only files under valgrind, where importing
# JAX alone would take minutes: it sets DLCAST_NO_JAX=1.
if os.environ.get("DLCAST_NO_JAX") != "1":
    import jax

    # 64-bit JAX arrays, so every dtype can be tested from JAX too.
    jax.config.update("jax_enable_x64", True)

import dlcast_testext as ext


def pytest_configure(config):
    config.addinivalue_line("markers", "hostile: an adversarial case, named by the guarantee it attacks")
    config.addinivalue_line("markers", "slow: takes over about 2 s (leak loops, fresh interpreters); deselect with -m 'not slow'")


@contextlib.contextmanager
def deleters_balanced(created_delta=None):
    """Asserts that every capsule made by the test producer inside the block
    had its deleter called exactly once by the time the block ends."""
    created0, deleted0 = ext.producer_counts()
    yield
    created1, deleted1 = ext.producer_counts()
    made = created1 - created0
    if created_delta is not None:
        assert made == created_delta
    assert deleted1 - deleted0 == made, f"{made} capsules made, {deleted1 - deleted0} deleters ran"


def capsule(arr, **kw):
    """A capsule from the test producer describing a copy of NumPy `arr`
    (C order), with any field overridden through keywords."""
    arr = np.ascontiguousarray(arr)
    code = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}[arr.dtype.kind]
    fields = dict(
        dtype=(code, arr.dtype.itemsize * 8, 1),
    )
    fields.update(kw)
    strides = kw.pop("strides", [s // arr.itemsize for s in arr.strides])
    fields.pop("strides", None)
    shape = fields.pop("shape", list(arr.shape))
    return ext.make_capsule(arr.tobytes(), shape, strides, **fields)


def run_py(code, timeout=120):
    """Runs `code` (dedented) in a fresh interpreter from this folder: for
    checks that may crash the process, or that need a process of their own."""
    import subprocess
    import sys
    import textwrap

    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=here,
        capture_output=True,
        text=True,
        timeout=timeout,
        # `make abi3` puts its build of the test extension first on the path.
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (here, os.environ.get("PYTHONPATH")) if p)},
    )


def buffer_of(arr):
    """`memoryview(arr)` of an exported `dlcast.Array`. Abi3 builds for
    Python 3.9/3.10 (`make abi3`) have no buffer protocol
    (`ext.BUFFER_PROTOCOL` is false): there, a memoryview of
    `numpy.asarray(arr)`, which takes the same memory through the array's
    `__array_interface__` (test_abi3.py checks both)."""
    if ext.BUFFER_PROTOCOL:
        return memoryview(arr)
    return memoryview(np.asarray(arr))


def pytest_collection_finish(session):
    """Everything imported by collection (NumPy, PyTorch, JAX, TensorFlow:
    about 500,000 objects) lives to the end: it is moved out of the cyclic
    collector's sight, so that each of the suite's thousands of
    `gc.collect()` calls scans only what the tests made (0.4 s each
    before, microseconds after). Objects made later are collected as usual."""
    import gc

    gc.collect()
    gc.freeze()


@pytest.fixture
def balanced():
    with deleters_balanced():
        yield


@pytest.fixture
def registry_empty_after():
    """The test leaves the borrow registry empty, checked as soon as it
    returns (use with `@pytest.mark.usefixtures`)."""
    yield
    assert ext.live_borrows() == 0


@pytest.fixture
def registry_empty_after_collect():
    """The test leaves the borrow registry empty once its garbage is
    collected (use with `@pytest.mark.usefixtures`)."""
    import gc

    yield
    gc.collect()
    assert ext.live_borrows() == 0


# ---------------------------------------------------------------------------
# The DLPack C exchange API (`__dlpack_c_exchange_api__`) as ctypes structures,
# for tests that build their own (hostile or fake-GPU) tables.

import ctypes  # noqa: E402


class DLTensorC(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_uint32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class HeaderC(ctypes.Structure):
    pass


HeaderC._fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                    ("prev_api", ctypes.POINTER(HeaderC))]

FROM_OBJ = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(DLTensorC))
WORK_STREAM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint32, ctypes.c_int32,
                               ctypes.POINTER(ctypes.c_void_p))


class ManagedC(ctypes.Structure):
    """DLManagedTensorVersioned."""


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(ManagedC))
ManagedC._fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
                     ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER),
                     ("flags", ctypes.c_uint64), ("dl_tensor", DLTensorC)]
MANAGED_FROM_OBJ = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p,
                                    ctypes.POINTER(ctypes.POINTER(ManagedC)))


class ApiC(ctypes.Structure):
    _fields_ = [("header", HeaderC), ("allocator", ctypes.c_void_p),
                ("managed_from_obj", MANAGED_FROM_OBJ), ("managed_to_obj", ctypes.c_void_p),
                ("dltensor_from_obj", FROM_OBJ), ("current_work_stream", WORK_STREAM)]


# Owning tensors made by `owning_export` tables, and their deleters run.
OWNED = {"made": 0, "deleted": 0}
_OWNED_KEEP = {}


@DELETER
def _owned_deleter(m):
    OWNED["deleted"] += 1
    _OWNED_KEEP.pop(ctypes.addressof(m.contents), None)


def owning_export(fill):
    """A `managed_tensor_from_py_object_no_sync` for a ctypes table: an
    owning tensor (version 1.3) whose DLTensor `fill(tensor)` writes; its
    deleter counts in `OWNED`."""

    def export(obj, out):
        m = ManagedC()
        m.major, m.minor = 1, 3
        m.deleter = _owned_deleter
        fill(m.dl_tensor)
        _OWNED_KEEP[ctypes.addressof(m)] = m
        OWNED["made"] += 1
        out[0] = ctypes.pointer(m)
        return 0

    return MANAGED_FROM_OBJ(export)


# ---------------------------------------------------------------------------
# Every way a `Tensor` is built (tests/src/constructions.rs), in every shape:
# the cases of test_export_constructions.py and test_lifetimes.py.

import gc  # noqa: E402

import dlcast_testext as t  # noqa: E402

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


@contextlib.contextmanager
def exports_freed():
    """Every buffer exported in the block is freed, and every capsule made
    had its deleter run, once the block's objects are gone. JAX releases an
    imported buffer on a thread of its own, after its array is gone: the
    counts are read again (up to about two seconds) until they balance."""
    import time

    gc.collect()
    b0, f0, c0, d0 = t.export_stats()
    yield
    for _ in range(100):
        gc.collect()
        b1, f1, c1, d1 = t.export_stats()
        if (b1 - b0, c1 - c0) == (f1 - f0, d1 - d0):
            break
        time.sleep(0.02)
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
