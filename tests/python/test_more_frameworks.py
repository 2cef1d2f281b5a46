"""TensorFlow (installed by `make test`), CuPy (a stand-in module: CuPy
needs CUDA, and the GPU script covers the real one), and results in the
caller's framework (`returns = like(x)`)."""

import sys
import types

import array_api_strict as xp
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
import torch

import dlcast_testext as ext


def test_tensorflow_tensors_are_read():
    x = tf.constant([[1.0, 2.0], [3.0, 4.0]], dtype=tf.float64)
    assert ext.values(x) == [1.0, 2.0, 3.0, 4.0]
    assert ext.sum_f64(x) == 10.0
    # A capsule from tf.experimental.dlpack.to_dlpack, passed directly.
    assert ext.values(tf.experimental.dlpack.to_dlpack(tf.range(3, dtype=tf.int32))) == [0, 1, 2]


def test_tensorflow_objects_without_dlpack_go_through_to_dlpack(monkeypatch):
    # Older TensorFlow tensors have no __dlpack__; dlcast then calls
    # tf.experimental.dlpack.to_dlpack. Stand in such a tensor type.
    calls = []
    real = tf.constant([5.0, 6.0], dtype=tf.float64)

    def to_dlpack(t):
        calls.append(t)
        return real.__dlpack__()

    monkeypatch.setattr(tf.experimental.dlpack, "to_dlpack", to_dlpack)
    OldTensor = type("EagerTensor", (), {"__module__": "tensorflow.python.framework.ops"})
    old = OldTensor()
    assert ext.values(old) == [5.0, 6.0]
    assert calls == [old]


@pytest.mark.parametrize("dtype", ["bool", "int8", "int32", "int64", "uint8", "float16",
                                   "bfloat16", "float32", "float64", "complex64"])
def test_returns_tensorflow(dtype):
    out, _ = ext.arange_tensorflow(dtype, [2, 3])
    assert isinstance(out, tf.Tensor)
    assert out.shape == (2, 3)
    want = np.arange(6).reshape(2, 3)
    got = out.numpy()
    if dtype == "bool":
        assert got.tolist() == (want % 2 == 1).tolist()
    elif dtype.startswith("complex"):
        assert got.tolist() == (want - 1j * want).tolist()
    else:
        assert got.astype(np.float64).tolist() == want.tolist()


def test_returns_cupy_calls_cupy_from_dlpack(monkeypatch):
    seen = []

    def from_dlpack(obj):
        seen.append((type(obj).__module__, type(obj).__name__, obj.__dlpack_device__()))
        return np.from_dlpack(obj)

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(from_dlpack=from_dlpack))
    out, _ = ext.arange_cupy("float32", [4])
    assert seen == [("dlcast", "Array", (1, 0))]
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("make,cls", [
    (lambda: np.zeros((2, 3)), np.ndarray),
    (lambda: torch.zeros(2, 3), torch.Tensor),
    (lambda: jnp.zeros((2, 3)), type(jnp.zeros(1))),
    (lambda: xp.zeros((2, 3)), type(xp.zeros(1))),
    (lambda: tf.zeros((2, 3)), tf.Tensor),
    (lambda: memoryview(np.zeros((2, 3))), type(None)),
])
def test_returns_like_the_input(make, cls):
    out = ext.ones_like(make())
    if cls is type(None):
        # A buffer has no framework: the result stays a dlcast.Array.
        assert type(out).__name__ == "Array"
    else:
        assert isinstance(out, cls)
    assert np.asarray(out.numpy() if hasattr(out, "numpy") and not isinstance(out, np.ndarray)
                      else out).tolist() == [[1.0] * 3] * 2


def test_returns_like_an_optional_input():
    assert isinstance(ext.maybe_ones_like(torch.zeros(2)), torch.Tensor)
    assert type(ext.maybe_ones_like()).__name__ == "Array"
