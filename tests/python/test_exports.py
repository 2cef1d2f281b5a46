"""Arrays returned to Python: owned Rust data and views of inputs, into every
framework (`returns = ...`), `dlcast.Array` and the DLPack protocol's
keywords, zero-copy where the memory allows, read-only where it must be.
"""

import ctypes
import json
import gc

import array_api_strict as xp
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch

import dlcast_testext as ext
import facts_table
from conftest import buffer_of


# Every dtype but float8 (test_float8.py), from the dtype table; the data
# types each framework lacks (its `absent_from` column).
ALL_DTYPES = [d for d in facts_table.DTYPE_NAMES if not d.startswith("float8_")]
UNSUPPORTED = {fw: {d for d in ALL_DTYPES if fw in facts_table.ABSENT_FROM[d]}
               for fw in facts_table.OPTIONS}
# What the table cannot say, by hand: the frameworks whose hand-off another
# file tests, as (file, test) (CuPy's arrays need a CUDA device), and what a
# framework's own importer refuses (an exception of its own).
EXPORTED_ELSEWHERE = {
    "cupy": ("test_frameworks.py", "test_returns_cupy_calls_cupy_from_dlpack"),
}
REFUSED_BY_THE_FRAMEWORK = {
    # The buffer protocol has no bfloat16 format.
    ("memoryview", "bfloat16"): BufferError,
    # TensorFlow's importer takes C-order strides only.
    ("tensorflow", "f"): Exception,
    ("tensorflow", "rev"): Exception,
}
# PaddlePaddle crashes the process when imported after TensorFlow (which
# other test files import): its round trip runs in a fresh interpreter that
# imports it first.
OWN_PROCESS = {"paddle"}
# Every other row of the framework table: `ext.arange_to(option, ...)` hands
# an array to it through the runtime code `returns = <option>` runs.
HANDED_OVER = [o for o in facts_table.OPTIONS if o not in EXPORTED_ELSEWHERE]
IN_PROCESS = [o for o in HANDED_OVER if o not in OWN_PROCESS]


def test_the_hand_off_quirks_name_rows_and_tests():
    # A quirk of a row no longer in the table, or of a test no longer there,
    # would hide nothing and mislead: each names both.
    for option, (file, test) in EXPORTED_ELSEWHERE.items():
        assert option in facts_table.OPTIONS and facts_table.test_file_has(file, test), option
    for option, _ in REFUSED_BY_THE_FRAMEWORK:
        assert option in facts_table.OPTIONS, option
    assert OWN_PROCESS <= set(HANDED_OVER)


def expected(dtype, shape):
    """What `ext.arange_<option>(dtype, shape)` holds, as a NumPy array of
    Python's bools, ints, floats or complex numbers (the values of any
    dtype's row, modelled from its kind and bits: facts_table.py)."""
    values = facts_table.arange_values(dtype, int(np.prod(shape)))
    return np.array(values).reshape(shape)


def to_numpy(x):
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bfloat16:
            return x.float().numpy().astype(ml_dtypes.bfloat16)
        return x.numpy()
    if isinstance(x, type(xp.zeros(1))):
        return np.asarray(x._array)
    return np.asarray(x)


def stats():
    gc.collect()
    return ext.export_stats()


def expected_values(dtype, out):
    """`expected(dtype, (2, 3))` as dlcast reads `out` back (`ext.values`:
    Python bools, ints, floats or complex numbers, in C order). Abi3
    builds for Python 3.9/3.10 read no buffer but bytes (no buffer protocol
    in their limited API): a memoryview is read there through NumPy."""
    if isinstance(out, memoryview) and not ext.BUFFER_PROTOCOL:
        out = np.asarray(out)
    return np.array(ext.values(out)), expected(dtype, [2, 3]).ravel()


@pytest.mark.parametrize("fw", IN_PROCESS)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_round_trip_every_dtype(fw, dtype):
    round_trip(fw, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("fw", sorted(OWN_PROCESS))
def test_round_trip_every_dtype_in_a_process_of_its_own(fw):
    from conftest import run_py

    facts_table.require(fw)
    module = facts_table.PYTHON_TYPES[fw].rpartition(".")[0]
    r = run_py(f"""
        import {module}
        import test_exports
        for dtype in test_exports.ALL_DTYPES:
            test_exports.round_trip({fw!r}, dtype)
        print("round-trip-ok")
    """, timeout=300)
    assert r.returncode == 0 and "round-trip-ok" in r.stdout, r.stdout + r.stderr


def round_trip(fw, dtype):
    """Every row of the framework table: an array of every dtype and layout
    handed to it (`returns = <option>`'s code) is its array type, holding
    the values, or is refused as the table says: a dtype it lacks (the
    dtype table's `absent_from`), negative strides (its `layout`)."""
    cls = facts_table.array_class(fw)
    if dtype in UNSUPPORTED[fw]:
        with pytest.raises(BufferError, match=f"has no {dtype}"):
            ext.arange_to(fw, dtype, [2, 3])
        return
    for order in ("c", "f", "rev"):
        refused = REFUSED_BY_THE_FRAMEWORK.get((fw, dtype)) or REFUSED_BY_THE_FRAMEWORK.get((fw, order))
        if refused:
            with pytest.raises(refused):
                ext.arange_to(fw, dtype, [2, 3], order)
            continue
        if order == "rev" and facts_table.LAYOUTS[fw] == "NegativeStridesRefused":
            # Refused up front, with a BufferError that says so (and the
            # export freed).
            with pytest.raises(BufferError, match="negative stride"):
                ext.arange_to(fw, dtype, [2, 3], order)
            continue
        out, _ = ext.arange_to(fw, dtype, [2, 3], order)
        assert isinstance(out, cls)
        assert tuple(out.shape) == (2, 3)
        got, want = expected_values(dtype, out)
        assert np.array_equal(got, want), (fw, dtype, order)


# The macro's `returns = <option>` looks the option up in the same table and
# runs the same hand-off as `arange_to`, whatever the row: a sample of the
# rows (every one handed over in this process today) is tested through it;
# a new row is tested through `arange_to` above.
MACRO_SAMPLE = ["numpy", "torch", "jax", "array_api", "tensorflow", "memoryview", "mlx"]


def test_the_macro_sample_names_rows_with_functions():
    # hostile: a sample that shrank to nothing, or named a row the table
    # lost, would test nothing and pass.
    assert len(MACRO_SAMPLE) == 7
    for option in MACRO_SAMPLE:
        assert option in IN_PROCESS and hasattr(ext, f"arange_{option}"), option


@pytest.mark.parametrize("fw", MACRO_SAMPLE)
@pytest.mark.parametrize("dtype", ["bool", "int64", "float32", "complex128"])
def test_returns_option_hands_over_as_the_table_row_does(fw, dtype):
    """The macro's `returns = <option>` (`ext.arange_<option>`) gives what
    the row's hand-off gives: the same array type and values, in NumPy's
    eyes too."""
    for order in ("c", "f"):
        if REFUSED_BY_THE_FRAMEWORK.get((fw, order)):
            continue
        out, _ = getattr(ext, f"arange_{fw}")(dtype, [2, 3], order)
        twin, _ = ext.arange_to(fw, dtype, [2, 3], order)
        assert type(out) is type(twin)
        assert np.array_equal(to_numpy(out), expected(dtype, [2, 3])), (fw, dtype, order)
        assert np.array_equal(to_numpy(out), to_numpy(twin))


def test_returns_dlcast_is_a_dlcast_array():
    a, _ = ext.arange_default("float32", [2, 3])
    assert type(a).__name__ == "Array" and type(a).__module__ == "dlcast"
    assert a.shape == (2, 3) and a.ndim == 2 and a.dtype == "float32" and len(a) == 2
    assert a.__dlpack_device__() == (1, 0)
    assert repr(a) == "dlcast.Array(shape=(2, 3), dtype=float32, device=cpu)"
    for f in (np.from_dlpack, torch.from_dlpack, jnp.from_dlpack, xp.from_dlpack, np.asarray):
        assert to_numpy(f(a)).tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(TypeError, match="0-d"):
        len(ext.identity(np.array(1.0)))


def test_zero_copy_pointers_equal_the_rust_allocation():
    a, ptr = ext.arange_default("float64", [4, 5])
    assert np.asarray(a).__array_interface__["data"][0] == ptr
    assert np.from_dlpack(a).__array_interface__["data"][0] == ptr
    t, ptr = ext.arange_torch("float32", [3, 3])
    assert t.data_ptr() == ptr
    # JAX takes a buffer without a copy only when it is 64-byte aligned:
    # Tensor::from_fn / Tensor::zeros allocate so.
    j, ptr = ext.arange_jax("float32", [16], "aligned")
    assert j.unsafe_buffer_pointer() == ptr
    n, ptr = ext.arange_numpy("float64", [3, 2], "f")
    assert n.__array_interface__["data"][0] == ptr and n.flags.f_contiguous
    n, ptr = ext.from_ndarray_t(3, 4)
    assert n.__array_interface__["data"][0] == ptr and n.shape == (4, 3)
    assert n.tolist() == np.arange(12.0).reshape(3, 4).T.tolist()


def test_writes_from_python_are_seen_by_rust():
    a, _ = ext.arange_default("float64", [4])
    view = np.asarray(a)
    view[2] = 42.0
    assert ext.values(a) == [0.0, 1.0, 42.0, 3.0]
    t = torch.from_dlpack(a)
    t[0] = -1.0
    assert ext.values(a) == [-1.0, 1.0, 42.0, 3.0]
    src = np.zeros(3, np.float32)
    out = ext.identity_mut(src)
    out[1] = 5.0
    assert src.tolist() == [0.0, 5.0, 0.0]


def test_boxed_slice_option_result_and_tuples():
    b = ext.boxed_bytes(5)
    assert np.asarray(b).tolist() == [0, 1, 2, 3, 4]
    assert ext.maybe_tensor(False) is None
    assert np.asarray(ext.maybe_tensor(True)).tolist() == [1.0, 2.0]
    t = ext.fallible_tensor(True)
    assert isinstance(t, torch.Tensor) and t.tolist() == [1, 2, 3]
    with pytest.raises(RuntimeError, match="asked to fail"):
        ext.fallible_tensor(False)
    f, i = ext.tensor_pair(3)
    assert isinstance(f, np.ndarray) and isinstance(i, np.ndarray)
    assert f.tolist() == [0.5] * 3 and i.tolist() == [0, 1, 2]


def test_views_transpose_reshape_permute_slice():
    src = np.arange(24.0).reshape(2, 3, 4)
    t = ext.transposed(src)
    assert isinstance(t, torch.Tensor) and t.shape == (4, 3, 2)
    assert t.numpy().tolist() == src.T.tolist()
    assert np.asarray(ext.permuted(src, [1, 0, 2])).tolist() == src.transpose(1, 0, 2).tolist()
    r = np.asarray(ext.reshaped_flipped(src, [6, 4]))
    assert r.tolist() == src.reshape(6, 4)[::-1].tolist()
    with pytest.raises(ValueError, match="only a C-contiguous view can be reshaped"):
        ext.reshaped_flipped(src.transpose(2, 1, 0), [4, 6])
    with pytest.raises(ValueError, match="element counts differ"):
        ext.reshaped_flipped(src, [5, 5])
    with pytest.raises(ValueError, match="invalid axes"):
        ext.permuted(src, [0, 0, 1])
    with pytest.raises(ValueError, match="outside the extent 2 of axis 0"):
        ext.rows(src.reshape(2, 12), 1, 3)
    assert np.asarray(ext.rows(src.reshape(6, 4), 2, 2)).shape == (0, 4)


def test_view_of_read_only_input_is_exported_read_only():
    ro = np.arange(6.0)
    ro.flags.writeable = False
    v = ext.identity(ro)
    assert v.read_only and "read_only=True" in repr(v)
    n = np.from_dlpack(v)
    assert not n.flags.writeable
    assert not np.asarray(v).flags.writeable
    # A legacy capsule cannot say read-only: it holds a copy, which
    # copy=False forbids (see test_legacy_requests_of_read_only_data_*).
    assert ext.data_ptr(v.__dlpack__()) != ro.ctypes.data
    with pytest.raises(BufferError, match="read-only.*copy=False"):
        v.__dlpack__(copy=False)
    with pytest.raises((TypeError, BufferError)):
        ctypes.c_char.from_buffer(v)  # asks for a writable buffer
    assert buffer_of(v).readonly
    # JAX arrays are immutable, so they may take it.
    j = ext.identity_jax(ro)
    assert j.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    # A view of a writable input stays writable.
    w = ext.identity(np.zeros(2))
    assert not w.read_only and np.asarray(w).flags.writeable
    assert ctypes.c_char.from_buffer(w if ext.BUFFER_PROTOCOL else np.asarray(w)) is not None


def capsule_name(cap):
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype = ctypes.c_char_p
    get_name.argtypes = [ctypes.py_object]
    return get_name(cap).decode()


def test_legacy_without_max_version_versioned_with_it():
    a, _ = ext.arange_default("float32", [3])
    assert capsule_name(a.__dlpack__()) == "dltensor"
    assert capsule_name(a.__dlpack__(max_version=None)) == "dltensor"
    assert capsule_name(a.__dlpack__(max_version=(0, 8))) == "dltensor"
    assert capsule_name(a.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    assert capsule_name(a.__dlpack__(max_version=(1, 3))) == "dltensor_versioned"
    assert capsule_name(a.__dlpack__(max_version=(2, 0))) == "dltensor_versioned"
    with pytest.raises(TypeError):
        a.__dlpack__(max_version=(1, 0), unknown=True)
    with pytest.raises(TypeError):
        a.__dlpack__(None)  # positional
    # Our own importer reads the versioned capsule's flags.
    ro = np.arange(3.0)
    ro.flags.writeable = False
    cap = ext.identity(ro).__dlpack__(max_version=(1, 0))
    assert ext.describe(cap)[4] is True


@pytest.mark.parametrize("stream", [None, -1])
@pytest.mark.parametrize("max_version", [None, (1, 0), (1, 3)])
@pytest.mark.parametrize("dl_device", [None, (1, 0), (np.int32(1), np.int64(0))])
@pytest.mark.parametrize("copy", [None, False, True])
def test_protocol_allowed_keyword_combinations(stream, max_version, dl_device, copy):
    a, ptr = ext.arange_default("float64", [2, 3], "f")
    cap = a.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)
    name = capsule_name(cap)
    assert name == ("dltensor" if max_version is None else "dltensor_versioned")
    assert ext.values(cap) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    if copy:
        # A copy lives elsewhere than the Rust allocation.
        assert ext.data_ptr(cap_again := a.__dlpack__(max_version=max_version, copy=True)) != ptr
        del cap_again


def read_only_arrays():
    """Read-only `dlcast.Array`s (`returns = dlcast`), each with the address
    of the memory it describes, the values, and what keeps that memory."""
    j = jnp.arange(6, dtype=jnp.float32)  # immutable: imported read-only
    ro = np.arange(6, dtype=np.float32)
    ro.flags.writeable = False
    owned = ext.read_only_range(6)  # Tensor::into_read_only
    return {
        "jax input": (ext.identity(j), j.unsafe_buffer_pointer(), j),
        "read-only numpy input": (ext.identity(ro), ro.ctypes.data, ro),
        "read-only owned tensor": (owned, ext.data_ptr(owned), owned),
    }


READ_ONLY_SOURCES = ["jax input", "read-only numpy input", "read-only owned tensor"]


def _jax_import(a):
    j = jnp.from_dlpack(a)
    return j.tolist(), j.unsafe_buffer_pointer()


def _mlx_import(a):
    import mlx.core as mx

    return mx.from_dlpack(a).tolist(), None  # MLX copies whatever it gets


def _tensorflow_import(a):
    import tensorflow as tf

    # TensorFlow takes a capsule only: the consumer asks for a legacy one.
    t = tf.experimental.dlpack.from_dlpack(a.__dlpack__())
    return t.numpy().tolist(), None


@pytest.mark.parametrize("source", READ_ONLY_SOURCES)
@pytest.mark.parametrize("importer", [_jax_import, _mlx_import, _tensorflow_import],
                         ids=["jax", "mlx", "tensorflow"])
def test_read_only_array_goes_to_every_legacy_only_importer(source, importer):
    """JAX's and MLX's `from_dlpack` ask `__dlpack__` for a legacy capsule
    only (JAX passes `stream=`, MLX nothing) and TensorFlow takes only a
    capsule, which cannot say read-only: a read-only `dlcast.Array` (a JAX
    array's view returned with `returns = dlcast`, issue #32) goes to them
    as a copy of its own, never refused."""
    a, address, keep = read_only_arrays()[source]
    values, got = importer(a)
    assert values == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert got is None or got != address
    assert ext.values(a) == values
    del keep


@pytest.mark.parametrize("source", READ_ONLY_SOURCES)
def test_read_only_array_to_versioned_importers_is_shared_and_read_only(source):
    """NumPy (and array_api_strict, through it) and PyTorch ask for
    versioned capsules: read-only data goes to them as it is, marked
    `READ_ONLY` (NumPy's arrays over it are not writeable), no copy."""
    a, address, keep = read_only_arrays()[source]
    n = np.from_dlpack(a)
    assert n.ctypes.data == address and not n.flags.writeable
    x = xp.from_dlpack(a)
    assert np.asarray(x).ctypes.data == address
    with pytest.raises(ValueError):
        np.asarray(x)[0] = 9.0
    del keep


@pytest.mark.hostile
@pytest.mark.parametrize("source", READ_ONLY_SOURCES)
@pytest.mark.parametrize("kwargs", [{}, dict(max_version=None), dict(max_version=(0, 8)),
                                    dict(stream=-1, dl_device=(1, 0)), dict(copy=True)])
def test_legacy_capsule_of_read_only_array_is_never_the_original_memory(source, kwargs):
    """Hostile: a consumer that asks for a legacy capsule (which cannot say
    read-only) and writes whatever it gets, as PyTorch does with any
    capsule: it writes a copy of its own, never the original memory, which
    keeps its values; `copy=False` forbids that copy and raises."""
    a, address, keep = read_only_arrays()[source]
    cap = a.__dlpack__(**kwargs)
    t = torch.from_dlpack(cap)
    assert t.data_ptr() != address
    t.fill_(7.0)
    assert ext.values(a) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert np.from_dlpack(a).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    with pytest.raises(BufferError, match=r"read-only; a legacy DLPack capsule cannot say so.*copy=False"):
        a.__dlpack__(copy=False, **{k: v for k, v in kwargs.items() if k != "copy"})
    del keep


@pytest.mark.hostile
def test_legacy_capsule_of_read_only_device_memory_is_refused_saying_why():
    """Read-only device memory asked for a legacy capsule: dlcast cannot
    copy it, and the capsule cannot say read-only, so it is refused
    (BufferError), naming the request that works. `returns = jax` (whose
    importer asks for a legacy capsule only) refuses it too, before JAX is
    handed anything. A fake CUDA capsule (its address is never read)."""
    cap = ext.make_capsule(b"", [4], [1], device=(2, 0), null_data=True, byte_offset=2**40,
                           dtype=(2, 64, 1), flags=1)
    a = ext.identity(cap)
    assert a.read_only
    with pytest.raises(BufferError, match=r"read-only and on cuda:0.*max_version=\(1, 0\).*cannot take it"):
        a.__dlpack__()
    assert capsule_name(a.__dlpack__(max_version=(1, 0))) == "dltensor_versioned"
    with pytest.raises(BufferError, match=r"returns = jax: the array is read-only and on cuda:0.*legacy"):
        ext.cp_to_jax(a)


def test_copy_true_makes_a_real_copy_marked_copied():
    a, ptr = ext.arange_default("float64", [4])
    n = np.from_dlpack(a, copy=True)
    assert n.__array_interface__["data"][0] != ptr
    n[0] = 99.0
    assert ext.values(a)[0] == 0.0
    # IS_COPIED is bit 1 of the flags; read them off the capsule.
    cap = a.__dlpack__(max_version=(1, 0), copy=True)
    get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
    get_ptr.restype = ctypes.c_void_p
    get_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]
    addr = get_ptr(cap, b"dltensor_versioned")
    flags = ctypes.c_uint64.from_address(addr + 24).value
    assert flags & 2 == 2 and flags & 1 == 0
    # Read-only data may be copied out through a legacy capsule.
    ro = np.arange(2.0)
    ro.flags.writeable = False
    cap = ext.identity(ro).__dlpack__(copy=True)
    assert ext.values(cap) == [0.0, 1.0]


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(stream=0), BufferError, "stream=0 is not supported"),
    (dict(stream=1), BufferError, "stream=1"),
    (dict(stream="x"), TypeError, "stream must be None or an integer"),
    (dict(dl_device=(2, 0)), BufferError, r"cannot export an array on cpu to device \(2, 0\)"),
    (dict(dl_device=(1, 1)), BufferError, "device"),
    (dict(max_version=3), TypeError, "max_version must be None or a tuple"),
    (dict(max_version=(1,)), TypeError, "max_version"),
    (dict(copy="yes"), TypeError, "copy"),
    (dict(strem=None), TypeError, "strem"),
    # A wrong type is an incorrect argument (TypeError); a value that cannot
    # be honoured, whatever its size, is a BufferError.
    (dict(stream="0"), TypeError, "stream must be None or an integer"),
    (dict(stream=1.0), TypeError, "stream must be None or an integer"),
    (dict(stream=2**70), BufferError, f"stream={2**70} is not supported for an array on cpu"),
    (dict(stream=-2**70), BufferError, "not a 64-bit integer"),
    (dict(dl_device=(1, 2**40)), BufferError, rf"cannot export an array on cpu to device \(1, {2**40}\)"),
    (dict(dl_device=(2**40, 0)), BufferError, rf"to device \({2**40}, 0\)"),
    (dict(dl_device=(-2**31 - 1, 0)), BufferError, "to device"),
    (dict(dl_device="cpu"), TypeError, "dl_device must be None or a tuple"),
    (dict(dl_device=(1,)), TypeError, "dl_device must be None or a tuple"),
    (dict(dl_device=[1, 0]), TypeError, "dl_device must be None or a tuple"),
    (dict(dl_device=(1.0, 0)), TypeError, "dl_device must be None or a tuple"),
])
def test_protocol_forbidden_arguments(kwargs, exc, match):
    a, _ = ext.arange_default("float32", [2])
    with pytest.raises(exc, match=match):
        a.__dlpack__(**kwargs)


@pytest.mark.parametrize("kwargs,named,got", [
    (dict(max_version=("1", "0")), r"max_version must be None or a tuple \(major, minor\) of two integers",
     r"a tuple of \(str, str\)"),
    (dict(max_version=(1.0, 0)), "max_version", r"a tuple of \(float, int\)"),
    (dict(max_version=[1, 0]), "max_version", "list"),
    (dict(max_version="1.0"), "max_version", "str"),
    (dict(dl_device=("1", 0)), r"dl_device must be None or a tuple \(device_type, device_id\) of two integers",
     r"a tuple of \(str, int\)"),
    (dict(dl_device=(1, None)), "dl_device", r"a tuple of \(int, NoneType\)"),
    (dict(stream="0"), "stream must be None or an integer", "str"),
    (dict(stream=(0,)), "stream", r"a tuple of \(int\)"),
    (dict(copy="yes"), "copy must be None, True or False", "str"),
    (dict(copy=1), "copy", "int"),
])
def test_protocol_argument_types_are_named_in_the_type_error(kwargs, named, got):
    """A `__dlpack__` argument of the wrong type raises a `TypeError` that
    names the argument, what it must be and what it was (its type, never
    its `repr`)."""
    a, _ = ext.arange_default("float32", [2])
    with pytest.raises(TypeError, match=rf"^__dlpack__\(\): {named}.*, got {got}$"):
        a.__dlpack__(**kwargs)
    # Accepted spellings of the same arguments still work.
    a.__dlpack__(max_version=(1, 0), dl_device=(1, 0), stream=None, copy=np.bool_(False))


@pytest.mark.hostile
def test_protocol_argument_type_errors_run_no_repr_of_the_argument():
    """The message describes a wrong argument by type names alone: an object
    whose `__repr__` raises, or whose `__index__` is not an integer's, is
    still the argument's TypeError."""

    class Loud:
        def __repr__(self):
            raise RuntimeError("repr ran")

        def __index__(self):
            return "not an int"

    a, _ = ext.arange_default("float32", [2])
    for kwargs in (dict(stream=Loud()), dict(max_version=(Loud(), 0)), dict(copy=Loud()),
                   dict(dl_device=(Loud(), 0))):
        with pytest.raises(TypeError, match=r"must be .*, got .*Loud"):
            a.__dlpack__(**kwargs)


class _RaisingIndex:
    """An integer-like whose `__index__` raises `exc`."""

    def __init__(self, exc):
        self.exc = exc

    def __index__(self):
        raise self.exc


@pytest.mark.hostile
@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, MemoryError])
@pytest.mark.parametrize("where", ["stream", "dl_device", "max_version major", "max_version minor"])
def test_protocol_arguments_let_interrupts_through(exc, where):
    """What an argument's `__index__` raises through no fault of the argument
    (an interrupt, an exit, memory) propagates unchanged: it is no
    `TypeError` of a wrong argument type."""
    a, _ = ext.arange_default("float32", [2])
    bad = _RaisingIndex(exc)
    kwargs = {
        "stream": dict(stream=bad),
        "dl_device": dict(dl_device=(1, bad)),
        "max_version major": dict(max_version=(bad, 0)),
        "max_version minor": dict(max_version=(1, bad)),
    }[where]
    with pytest.raises(exc):
        a.__dlpack__(**kwargs)
    # An `__index__` that fails as a wrong argument's would is one.
    with pytest.raises(TypeError, match="must be"):
        a.__dlpack__(**{k: _swap(v, bad, _RaisingIndex(ValueError)) for k, v in kwargs.items()})


def _swap(value, old, new):
    if isinstance(value, tuple):
        return tuple(new if v is old else v for v in value)
    return new if value is old else value


@pytest.mark.hostile
@pytest.mark.parametrize("max_version,name", [
    ((1, 2**70), "dltensor_versioned"),
    ((2**70, 0), "dltensor_versioned"),
    ((-2**70, 0), "dltensor"),
    ((np.int8(1), np.uint64(2**64 - 1)), "dltensor_versioned"),
    ((0, -2**70), "dltensor"),
])
def test_protocol_max_version_of_any_integers(max_version, name):
    """`max_version` is a pair of integers, whatever their size: a major of
    at least 1 asks for a versioned capsule, the minor changes nothing."""
    a, _ = ext.arange_default("float32", [2])
    assert capsule_name(a.__dlpack__(max_version=max_version)) == name


def test_buffer_protocol():
    a, ptr = ext.arange_default("int16", [2, 3], "rev")
    mv = buffer_of(a)
    assert mv.format == "h" and mv.shape == (2, 3) and mv.strides == (-6, -2)
    assert mv.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert not mv.readonly
    with pytest.raises(BufferError, match="no buffer-protocol format"):
        buffer_of(ext.arange_default("bfloat16", [2])[0])
    # A consumer that needs contiguous data is refused.
    with pytest.raises((BufferError, TypeError), match="contiguous"):
        ctypes.c_char.from_buffer(a if ext.BUFFER_PROTOCOL else np.asarray(a))
    c, _ = ext.arange_default("uint8", [4])
    assert bytes(buffer_of(c)) == b"\x00\x01\x02\x03"


def test_read_only_views_never_reach_a_writable_consumer():
    ro = np.arange(6.0).reshape(2, 3)
    ro.flags.writeable = False
    # PyTorch has no read-only tensors: it gets a writable copy of its own.
    t = ext.transposed(ro)
    assert isinstance(t, torch.Tensor) and t.tolist() == ro.T.tolist()
    t.fill_(-1.0)
    assert ro.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    # TensorFlow and JAX arrays are immutable: they may take read-only data.
    assert ext.identity_tf(ro).numpy().tolist() == ro.tolist()
    assert ext.identity_tf(b"\x01\x02").numpy().tolist() == [1, 2]
    assert ext.identity_jax(ro).tolist() == ro.tolist()


def test_immutable_framework_inputs_are_read_only():
    import tensorflow as tf

    c = tf.constant([1.0, 2.0], dtype=tf.float64)
    with pytest.raises(TypeError, match="read-only"):
        ext.fill_f64(c, 5.0)
    assert c.numpy().tolist() == [1.0, 2.0]


def test_returns_jax_takes_any_layout():
    base = np.arange(40.0)
    for view in (base[::2], base[1::2], base[::-1], base.reshape(5, 8)[:, 1:3], base.reshape(5, 8).T):
        assert ext.identity_jax(view).tolist() == view.tolist()


def test_transpose_beyond_64_dimensions():
    c = ext.make_capsule(np.arange(2.0).tobytes(), [2] + [1] * 69, [1] + [1] * 69)
    t = ext.transposed(c)
    assert tuple(t.shape) == (1,) * 69 + (2,)


def test_empty_array_with_huge_extents():
    c = ext.make_capsule(b"", [2**62, 2**62, 0], [0, 0, 0], null_data=True)
    assert ext.describe(c)[0] == [2**62, 2**62, 0]


def test_numpy_results_are_built_through_numpys_c_api():
    # `returns = numpy` makes the ndarray directly over the exported memory,
    # with the dlcast.Array that owns it as `base` (no capsule round trip).
    before = stats()
    rev, _ = ext.arange_numpy("float64", [3, 4], "rev")  # negative strides
    np.testing.assert_array_equal(rev, np.arange(12.0).reshape(3, 4))
    assert rev.strides == (-32, -8)
    del rev
    out, ptr = ext.arange_numpy("float64", [3, 4])
    assert type(out.base).__name__ == "Array" and type(out.base).__module__ == "dlcast"
    assert out.__array_interface__["data"][0] == ptr
    assert out.flags.writeable and not out.flags.owndata
    np.testing.assert_array_equal(out, np.arange(12.0).reshape(3, 4))
    out[0, 0] = 7.0  # writes the exported buffer itself
    assert out.base is not None and out[0, 0] == 7.0
    mid = stats()
    assert mid[0] - before[0] == 2 and mid[1] - before[1] == 1  # `out` is alive
    del out
    after = stats()
    assert after[1] - before[1] == 2  # freed exactly once with the ndarray
    # A view of a read-only input stays read-only, and NumPy refuses to
    # make it writable (its base refuses writable buffer requests).
    ro = np.arange(3, dtype=np.float32)
    ro.flags.writeable = False
    echo = ext.Accumulator().echo(ro)
    assert not echo.flags.writeable
    with pytest.raises(ValueError):
        echo.flags.writeable = True


@pytest.mark.hostile
def test_memory_handed_to_an_immutable_framework_is_never_handed_out_writable():
    """Hostile (review of #32): `returns = jax` hands read-only data to
    `jax.numpy.from_dlpack` wrapped in a `dlcast.ImmutableConsumer`, whose
    `__dlpack__` answers any caller with a legacy capsule of the memory as
    it is. The importer is a module attribute (looked up at the first
    hand-over, hence a fresh interpreter): Python code that replaces it
    receives the consumer, and a legacy capsule from it is written by
    PyTorch, changing the JAX array the call returned (JAX arrays are
    immutable)."""
    from conftest import run_py

    r = run_py("""
        import json
        import jax.numpy as jnp, numpy as np, torch
        import dlcast_testext as ext
        ro = np.zeros(3, np.float32)
        ro.flags.writeable = False
        caught = []
        real = jnp.from_dlpack
        def spy(x, *args, **kwargs):
            caught.append(x)
            return real(x, *args, **kwargs)
        jnp.from_dlpack = spy
        out = ext.identity_jax(ro)
        jnp.from_dlpack = real
        before = np.asarray(out).tolist()
        for consumer in caught:
            try:
                torch.from_dlpack(consumer.__dlpack__()).fill_(5.0)
            except BufferError:
                pass
        print(json.dumps(dict(caught=len(caught), before=before,
                              after=np.asarray(out).tolist(), ro=ro.tolist())))
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["caught"] == 1, got  # the attack reached the consumer
    assert got["before"] == got["after"] == got["ro"] == [0.0, 0.0, 0.0], got


# The importer of each framework whose arrays are immutable, as a module
# and attribute, and the function that hands a `dlcast.Array` to it.
IMMUTABLE_IMPORTERS = {
    "jax": ("jax.numpy", "from_dlpack", "cp_to_jax"),
    "mlx": ("mlx.core", "from_dlpack", "cp_to_mlx"),
    "tensorflow": ("tensorflow.experimental.dlpack", "from_dlpack", "cp_to_tensorflow"),
}


@pytest.mark.hostile
@pytest.mark.parametrize("framework", sorted(IMMUTABLE_IMPORTERS))
def test_a_replaced_immutable_importer_gets_no_alias_of_read_only_memory(framework):
    """Hostile: the importer of `returns = jax`, `mlx` or `tensorflow` is a
    module attribute (looked up at the first hand-over, hence a fresh
    interpreter). Replaced, it receives what dlcast hands over and writes
    it through PyTorch before the framework sees it (taking the memory
    first, as a legacy capsule: what these importers ask for), then asks
    again. Read-only memory (a read-only NumPy array) goes over as a copy
    that only the first request gets: the write lands in the copy, the
    second request is refused, and the array never changes."""
    from conftest import run_py

    module, attr, func = IMMUTABLE_IMPORTERS[framework]
    r = run_py(f"""
        import importlib, json
        import numpy as np, torch
        import dlcast_testext as ext
        mod = importlib.import_module({module!r})
        ro = np.zeros(16, np.float32)
        ro.flags.writeable = False
        view = ext.identity(ro)
        assert view.read_only
        seen = []
        real = getattr(mod, {attr!r})
        def spy(x, *args, **kwargs):
            cap = x if type(x).__name__ == "PyCapsule" else x.__dlpack__()
            torch.from_dlpack(cap).fill_(5.0)
            seen.append(type(x).__name__)
            again = None
            if cap is not x:
                try:
                    x.__dlpack__()
                    again = "taken twice"
                except BufferError as e:
                    again = str(e)
            seen.append(again)
            return "the spy's result"
        setattr(mod, {attr!r}, spy)
        out = ext.{func}(view)
        print(json.dumps(dict(seen=seen, out=out, ro=ro.tolist(),
                              view=np.from_dlpack(view).tolist())))
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["out"] == "the spy's result", got
    assert got["ro"] == got["view"] == [0.0] * 16, got
    if framework == "tensorflow":
        assert got["seen"] == ["PyCapsule", None], got  # a capsule is taken once
    else:
        assert got["seen"][0] != "Array", got  # not the array: it would give more
        assert "already handed over" in got["seen"][1], got


@pytest.mark.parametrize("framework", sorted(IMMUTABLE_IMPORTERS))
def test_read_only_data_goes_to_an_immutable_framework_as_a_copy(framework):
    """Read-only data (here 64-byte aligned and compact, which JAX would
    take as it is) goes to JAX, MLX and TensorFlow as a copy: whatever
    their arrays are later re-exported as (legacy capsules), the read-only
    memory is not behind them. The copy is what was read: writes to the
    (writable) base afterwards do not show."""
    *_, func = IMMUTABLE_IMPORTERS[framework]
    buf = np.zeros(32, np.float32)
    start = (-buf.ctypes.data % 64) // 4
    base = buf[start:start + 16]
    base[:] = np.arange(16)
    ro = base.view()
    ro.flags.writeable = False
    out = getattr(ext, func)(ext.identity(ro))
    base[0] = 7.0
    got = np.asarray(out.numpy() if framework == "tensorflow" else out)
    assert got.tolist() == list(range(16))
    if framework == "jax":
        assert out.unsafe_buffer_pointer() != ro.ctypes.data
