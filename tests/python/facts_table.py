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
# options of the frameworks without it).
DTYPES = [
    ("bool", "bool", True, ()),
    ("int8", "i8", True, ()),
    ("int16", "i16", True, ()),
    ("int32", "i32", True, ()),
    ("int64", "i64", True, ()),
    ("uint8", "u8", True, ()),
    ("uint16", "u16", True, ()),
    ("uint32", "u32", True, ()),
    ("uint64", "u64", True, ()),
    ("float16", "f16", True, ("array_api",)),
    ("bfloat16", "bf16", False, ("numpy", "array_api")),
    ("float32", "f32", True, ()),
    ("float64", "f64", True, ()),
    ("complex64", "c64", True, ()),
    ("complex128", "c128", True, ()),
    ("float8_e3m4", "f8e3m4", False, ("numpy", "array_api", "torch")),
    ("float8_e4m3", "f8e4m3", False, ("numpy", "array_api", "torch")),
    ("float8_e4m3b11fnuz", "f8e4m3b11fnuz", False, ("numpy", "array_api", "torch")),
    ("float8_e4m3fn", "f8e4m3fn", False, ("numpy", "array_api")),
    ("float8_e4m3fnuz", "f8e4m3fnuz", False, ("numpy", "array_api")),
    ("float8_e5m2", "f8e5m2", False, ("numpy", "array_api")),
    ("float8_e5m2fnuz", "f8e5m2fnuz", False, ("numpy", "array_api")),
    ("float8_e8m0fnu", "f8e8m0fnu", False, ("numpy", "array_api")),
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
ABSENT_FROM = {d[0]: set(d[3]) for d in DTYPES}


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
