"""The float8 element types: PyTorch's and JAX's (ml_dtypes') float8 arrays
read bit for bit into Rust's `microfloat` types, returned to each framework
bit for bit, refused with a clear error where a framework has no such dtype
(NumPy: none; PyTorch: three of the eight), and converted only as any other
float is (same kind, read-only parameters).
"""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

import dlcast_testext as ext
import facts_table

# Every float8 dtype of the dtype table (facts_table.py), with PyTorch's
# dtype where PyTorch has it (the table's `absent_from` column).
FLOAT8 = {
    name: None if "torch" in facts_table.ABSENT_FROM[name] else getattr(torch, name)
    for name in facts_table.DTYPE_NAMES if name.startswith("float8_")
}
IN_TORCH = [n for n, t in FLOAT8.items() if t is not None]
ALL_BYTES = bytes(range(256))


def torch_f8(name, data=ALL_BYTES):
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(FLOAT8[name])


def jax_f8(name, data=ALL_BYTES):
    return jnp.asarray(np.frombuffer(data, np.uint8).view(getattr(ml_dtypes, name)))


def torch_bytes(t):
    assert isinstance(t, torch.Tensor)
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def jax_bytes(j):
    assert isinstance(j, type(jnp.zeros(1)))
    return np.asarray(j).view(np.uint8).tobytes()


@pytest.mark.parametrize("name", IN_TORCH)
def test_torch_round_trip_is_bit_exact(name):
    t = torch_f8(name)
    # Read: every byte, NaNs and negative zeros included, as it is.
    assert ext.f8_bits(t) == (name, ALL_BYTES)
    # Back, as a Rust-owned copy, to PyTorch (named and `like(x)`).
    for f in (ext.f8_copy_torch, ext.f8_copy_like):
        out = f(t)
        assert out.dtype == FLOAT8[name] and out.shape == (256,)
        assert torch_bytes(out) == ALL_BYTES
    # ... to JAX, and as a dlcast.Array that PyTorch takes.
    j = ext.f8_copy_jax(t)
    assert j.dtype == getattr(ml_dtypes, name) and jax_bytes(j) == ALL_BYTES
    a = ext.f8_copy(t)
    assert type(a).__name__ == "Array" and a.dtype == name
    assert torch_bytes(torch.from_dlpack(a)) == ALL_BYTES
    # A strided 2-d view is read in C order.
    v = t.view(16, 16).T
    assert ext.f8_bits(v)[1] == v.contiguous().view(torch.uint8).numpy().tobytes()
    assert torch_bytes(ext.f8_copy_torch(v)) == torch_bytes(v)


@pytest.mark.parametrize("name", FLOAT8)
def test_jax_round_trip_is_bit_exact(name):
    j = jax_f8(name)
    assert ext.f8_bits(j) == (name, ALL_BYTES)
    for f in (ext.f8_copy_jax, ext.f8_copy_like):
        out = f(j)
        assert out.dtype == getattr(ml_dtypes, name) and out.shape == (256,)
        assert jax_bytes(out) == ALL_BYTES
    # The view of the input itself, zero-copy, as a (read-only) dlcast.Array,
    # which reads back the same.
    a = ext.identity(j)
    assert a.dtype == name and ext.f8_bits(a) == (name, ALL_BYTES)
    if FLOAT8[name] is not None:
        out = ext.f8_copy_torch(j)
        assert out.dtype == FLOAT8[name] and torch_bytes(out) == ALL_BYTES


@pytest.mark.parametrize("name", FLOAT8)
def test_values_are_the_frameworks_values(name):
    # The Rust type decodes each byte as ml_dtypes (and PyTorch) do: the
    # values as f32, NaNs where they have NaNs.
    got = np.array(ext.f8_values(jax_f8(name)), np.float32)
    want = np.frombuffer(ALL_BYTES, np.uint8).view(getattr(ml_dtypes, name)).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    if FLOAT8[name] is not None:
        np.testing.assert_array_equal(got, torch_f8(name).float().numpy())


@pytest.mark.parametrize("name", [n for n, t in FLOAT8.items() if t is None])
def test_torch_refuses_the_types_it_lacks_up_front(name):
    with pytest.raises(BufferError, match=f"returns = torch: PyTorch has no {name}; .*JAX has every dtype"):
        ext.f8_copy_torch(jax_f8(name))
    # returns = like(x) of a PyTorch input cannot meet one: PyTorch makes
    # none; a JAX input's goes back to JAX.
    assert jax_bytes(ext.f8_copy_like(jax_f8(name))) == ALL_BYTES


@pytest.mark.parametrize("name", FLOAT8)
def test_numpy_has_no_float8(name):
    # NumPy's own dtypes have no float8 (ml_dtypes' are NumPy user dtypes
    # that DLPack cannot export): a float8 array returned to NumPy is
    # refused with what to do instead, before anything is handed over.
    with pytest.raises(BufferError, match=f"returns = numpy: NumPy has no {name}; .*dlcast.Array"):
        ext.f8_copy_numpy(jax_f8(name))
    # An ml_dtypes NumPy array: NumPy's __dlpack__ refuses its dtype.
    a = np.frombuffer(ALL_BYTES, np.uint8).view(getattr(ml_dtypes, name))
    with pytest.raises(BufferError, match=r"f8_bits\(\): argument 'x': the producer's __dlpack__"):
        ext.f8_bits(a)
    # `numpy.asarray` of JAX's own float8 array (through ml_dtypes) is what
    # a caller who needs NumPy can use.
    assert np.asarray(ext.f8_copy_jax(jax_f8(name))).view(np.uint8).tobytes() == ALL_BYTES


def test_float8_converts_as_a_float():
    # float8 is a float kind: to a read-only float32 parameter it converts
    # (as float16 and bfloat16 do), through its own framework.
    vals = [1.0, 448.0, -0.5, 0.0]
    assert ext.sum_f32(torch.tensor(vals).to(torch.float8_e4m3fn)) == sum(vals)
    assert ext.sum_f32(jnp.asarray(vals, dtype=jnp.float8_e5m2)) == sum(vals)
    # ... and a float32 (or int) array to a read-only float8 parameter, a
    # narrowing same-kind cast like float64 -> float32.
    assert ext.f8e4m3fn_values(torch.tensor(vals)) == vals
    assert ext.f8e4m3fn_values(jnp.asarray(vals)) == vals
    assert ext.f8e4m3fn_values(torch.tensor([3, -2])) == [3.0, -2.0]
    # NumPy has nothing to convert to.
    with pytest.raises(TypeError, match="cannot be converted: NumPy has no float8_e4m3fn that"):
        ext.f8e4m3fn_values(np.ones(2, np.float32))
    # Never down the ladder, never into a writable parameter, never for a
    # dtype-generic one.
    with pytest.raises(TypeError, match="float8_e4m3fn does not convert to int32 implicitly"):
        ext.sum_i32(torch.ones(2).to(torch.float8_e4m3fn))
    with pytest.raises(TypeError, match="a writable parameter never converts"):
        ext.f8e5m2_fill(torch.ones(2), [0x3C])
    with pytest.raises(TypeError, match="expected dtype float8_e3m4, .* or float8_e8m0fnu, got float32"):
        ext.f8_bits(torch.ones(2))


def test_writes_into_a_torch_float8_tensor():
    t = torch.zeros(5, dtype=torch.float8_e5m2)
    ext.f8e5m2_fill(t, [0x3C, 0x7C, 0xFF, 0x80])
    assert torch_bytes(t) == bytes([0x3C, 0x7C, 0xFF, 0x80, 0x3C])
    assert t[0].item() == 1.0 and t[1].item() == float("inf")


def test_made_in_rust():
    vals = [1.0, 0.1, -448.0, 3e-3, 1e6]
    t = ext.f8e4m3fn_from_f32(vals)
    assert t.dtype == torch.float8_e4m3fn
    # microfloat rounds as ml_dtypes does: out of range to NaN (e4m3fn has
    # no infinity), where PyTorch's cast saturates to 448.
    want = np.array(vals, np.float32).astype(ml_dtypes.float8_e4m3fn)
    assert torch_bytes(t) == want.view(np.uint8).tobytes()
    assert torch_bytes(t)[:4] == torch_bytes(torch.tensor(vals[:4]).to(torch.float8_e4m3fn))
