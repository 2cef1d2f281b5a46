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


@pytest.fixture
def balanced():
    with deleters_balanced():
        yield
