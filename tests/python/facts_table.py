"""The framework and dtype tables (`dlcast-runtime/src/facts.rs`) as the
Python tests read them: the tests' own lists of frameworks and dtypes are
derived from these or checked against them, so that a row added to a table
fails a test until the tests cover it.

Generated: `DLCAST_BLESS=1 cargo test -p dlcast-ui-tests --test facts`
rewrites the block below; that test fails while it differs from the tables.
"""

# ---- generated from dlcast-runtime/src/facts.rs; do not edit ----
# One tuple per row: (option, name, modules, (hand-off module, function),
# legacy_writable, python_type, layout, stub type).
FRAMEWORKS = [
    ("numpy", "NumPy", ("numpy",), ("numpy", "from_dlpack"), True, "numpy.ndarray", "AsIs", "numpy.typing.NDArray[typing.Any]"),
    ("torch", "PyTorch", ("torch",), ("torch", "from_dlpack"), True, "torch.Tensor", "NegativeStridesRefused", "torch.Tensor"),
    ("jax", "JAX", ("jax", "jaxlib"), ("jax.numpy", "from_dlpack"), False, "jax.Array", "CompactCopy", "jax.Array"),
    ("cupy", "CuPy", ("cupy",), ("cupy", "from_dlpack"), True, "cupy.ndarray", "AsIs", "cupy.ndarray"),
    ("tensorflow", "TensorFlow", ("tensorflow",), ("tensorflow.experimental.dlpack", "from_dlpack"), False, "tensorflow.Tensor", "AsIs", "tensorflow.Tensor"),
    ("array_api", "array_api_strict", ("array_api_strict",), ("array_api_strict", "from_dlpack"), True, "array_api_strict.Array", "AsIs", "array_api_strict._array_object.Array"),
    ("memoryview", "memoryview", (), ("builtins", "memoryview"), False, "memoryview", "AsIs", "memoryview"),
    ("mlx", "MLX", ("mlx",), ("mlx.core", "from_dlpack"), False, "mlx.core.array", "NegativeStridesCopied", "mlx.core.array"),
    ("paddle", "PaddlePaddle", ("paddle",), ("paddle", "from_dlpack"), True, "paddle.Tensor", "NegativeStridesRefused", "paddle.Tensor"),
]
# One tuple per row: (name, #[dtype] name, whether NumPy has it, the
# options of the frameworks without it, DLPack code, bits, kind, Rust type).
DTYPES = [
    ("bool", "bool", True, (), 6, 8, "Bool", "bool"),
    ("int8", "i8", True, (), 0, 8, "Int", "i8"),
    ("int16", "i16", True, (), 0, 16, "Int", "i16"),
    ("int32", "i32", True, (), 0, 32, "Int", "i32"),
    ("int64", "i64", True, (), 0, 64, "Int", "i64"),
    ("uint8", "u8", True, (), 1, 8, "UInt", "u8"),
    ("uint16", "u16", True, (), 1, 16, "UInt", "u16"),
    ("uint32", "u32", True, (), 1, 32, "UInt", "u32"),
    ("uint64", "u64", True, (), 1, 64, "UInt", "u64"),
    ("float16", "f16", True, ("array_api",), 2, 16, "Float", "half::f16"),
    ("bfloat16", "bf16", False, ("numpy", "array_api"), 4, 16, "Float", "half::bf16"),
    ("float32", "f32", True, (), 2, 32, "Float", "f32"),
    ("float64", "f64", True, (), 2, 64, "Float", "f64"),
    ("complex64", "c64", True, (), 5, 64, "Complex", "num_complex::Complex<f32>"),
    ("complex128", "c128", True, (), 5, 128, "Complex", "num_complex::Complex<f64>"),
    ("float8_e3m4", "f8e3m4", False, ("numpy", "array_api", "torch"), 7, 8, "Float", "microfloat::f8e3m4"),
    ("float8_e4m3", "f8e4m3", False, ("numpy", "array_api", "torch"), 8, 8, "Float", "microfloat::f8e4m3"),
    ("float8_e4m3b11fnuz", "f8e4m3b11fnuz", False, ("numpy", "array_api", "torch"), 9, 8, "Float", "microfloat::f8e4m3b11fnuz"),
    ("float8_e4m3fn", "f8e4m3fn", False, ("numpy", "array_api"), 10, 8, "Float", "microfloat::f8e4m3fn"),
    ("float8_e4m3fnuz", "f8e4m3fnuz", False, ("numpy", "array_api"), 11, 8, "Float", "microfloat::f8e4m3fnuz"),
    ("float8_e5m2", "f8e5m2", False, ("numpy", "array_api"), 12, 8, "Float", "microfloat::f8e5m2"),
    ("float8_e5m2fnuz", "f8e5m2fnuz", False, ("numpy", "array_api"), 13, 8, "Float", "microfloat::f8e5m2fnuz"),
    ("float8_e8m0fnu", "f8e8m0fnu", False, ("numpy", "array_api"), 14, 8, "Float", "microfloat::f8e8m0fnu"),
]
# ---- end of generated ----

OPTIONS = [f[0] for f in FRAMEWORKS]
# The package each recognised framework's arrays come from (`like(x)`).
PACKAGES = {f[0]: f[2][0] for f in FRAMEWORKS if f[2]}
HANDOFFS = {f[0]: f[3] for f in FRAMEWORKS}
LEGACY_WRITABLE = [f[0] for f in FRAMEWORKS if f[4]]
PYTHON_TYPES = {f[0]: f[5] for f in FRAMEWORKS}
LAYOUTS = {f[0]: f[6] for f in FRAMEWORKS}
STUB_TYPES = {f[0]: f[7] for f in FRAMEWORKS}
DTYPE_NAMES = [d[0] for d in DTYPES]
RUST_NAMES = {d[0]: d[1] for d in DTYPES}
RUST_TYPES = {d[0]: d[7] for d in DTYPES}
IN_NUMPY = [d[0] for d in DTYPES if d[2]]
ABSENT_FROM = {d[0]: set(d[3]) for d in DTYPES}
# The dtype of each DLPack (code, bits) pair (lanes 1), and each dtype's
# bits and kind (`Bool`, `UInt`, `Int`, `Float`, `Complex`).
BY_CODE = {(d[4], d[5]): d[0] for d in DTYPES}
BITS = {d[0]: d[5] for d in DTYPES}
KINDS = {d[0]: d[6] for d in DTYPES}


def element_dtype(name):
    """A NumPy dtype whose items hold one element of dtype `name` bit for
    bit, from its row alone (kind and bits), so that a new row needs no
    model of its own: a byte for `bool`, NumPy's integers of its width,
    NumPy's float of that name or else ml_dtypes' (`bfloat16`, the float8
    types), and a complex number as DLPack lays it out: two IEEE floats of
    half its bits (the row of `float32`'s code with those bits), real
    first."""
    import numpy as np

    kind, bits = KINDS[name], BITS[name]
    if kind == "Bool":
        return np.dtype(np.uint8)
    if kind in ("Int", "UInt"):
        return np.dtype(f"{kind[0].lower()}{bits // 8}")
    if kind == "Complex":
        ieee = BY_CODE[(DTYPES[DTYPE_NAMES.index("float32")][4], bits // 2)]
        part = element_dtype(ieee)
        return np.dtype([("re", part), ("im", part)])
    assert kind == "Float", (name, kind)
    if name in IN_NUMPY:
        return np.dtype(name)
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, name))


def python_values(name, a):
    """The elements of `a` (a NumPy array of `element_dtype(name)`) in C
    order as the test extension's `values` gives them: Python bools, ints,
    floats (every float type widened to a double) or complex numbers."""
    import numpy as np

    flat = np.array(a).ravel()  # a copy: aligned, C order
    kind = KINDS[name]
    if kind == "Bool":
        return (flat != 0).tolist()
    with np.errstate(invalid="ignore"):  # signalling NaNs
        if kind == "Complex":
            parts = flat["re"].astype(np.float64), flat["im"].astype(np.float64)
            return [complex(re, im) for re, im in zip(*(p.tolist() for p in parts))]
        if kind == "Float":
            return flat.astype(np.float64).tolist()
    return flat.tolist()


def arange_values(name, n):
    """The first `n` elements the test extension's `arange_array` makes of
    dtype `name` (`ext.arange_to`, `ext.arange_<option>`), as
    `python_values` gives them: element `i` is `i`, rounded to the dtype;
    for `bool`, whether `i` is odd; for a complex dtype, `i - i*1j`."""
    import numpy as np

    i = np.arange(n)
    if KINDS[name] == "Bool":
        return (i % 2 == 1).tolist()
    a = np.zeros(n, element_dtype(name))
    if KINDS[name] == "Complex":
        a["re"], a["im"] = i, -i
    else:
        a[...] = i
    return python_values(name, a)


def uncovered(wanted, *covers):
    """The rows of `wanted` no mapping or list in `covers` has: a test's
    list checked against a table column (a row added to the table and not to
    the test's list is reported)."""
    covered = set().union(*map(set, covers))
    return sorted(set(wanted) - covered)


def test_file_has(file, test):
    """Whether `tests/python/<file>` defines `test` (an entry of a coverage
    list that names where a row is tested)."""
    import pathlib

    text = (pathlib.Path(__file__).parent / file).read_text()
    return f"def {test}(" in text


def require(option):
    """Skips the test where framework `option` is not installed, outside
    CI; in CI (`CI=true`), where no framework test may skip, fails: its
    package belongs in `scripts/requirements-test.txt`. Nothing imported."""
    import importlib.util
    import os

    import pytest

    module = PYTHON_TYPES[option].rpartition(".")[0]
    if not module or importlib.util.find_spec(module.split(".")[0]) is not None:
        return
    message = (f"{module} ({option}) is not installed: add its package to "
               "scripts/requirements-test.txt")
    if os.environ.get("CI") == "true":
        raise AssertionError(message)
    pytest.skip(message + " (in CI this fails)")


def array_class(option):
    """The class of framework `option`'s arrays, from its row's
    `python_type` (`"torch.Tensor"`: `torch` imported), or where that names
    no attribute (`array_api_strict.Array`), its stub type without type
    arguments (`array_api_strict._array_object.Array`); `require(option)`
    first."""
    import importlib

    require(option)
    module, _, name = PYTHON_TYPES[option].rpartition(".")
    found = getattr(importlib.import_module(module or "builtins"), name, None)
    if found is None:
        module, _, name = STUB_TYPES[option].split("[")[0].rpartition(".")
        found = getattr(importlib.import_module(module), name)
    return found
