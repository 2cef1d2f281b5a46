"""The stub generator (scripts/dlcast_stubgen.py) writes every framework's
array type as the framework table (dlcast-runtime/src/facts.rs) gives it,
through the block generated from that table (checked against it by
ui-tests/tests/facts.rs): no `returns = <framework>` falls back to `Any`."""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _stubgen():
    spec = importlib.util.spec_from_file_location("dlcast_stubgen", ROOT / "scripts" / "dlcast_stubgen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def stubgen():
    return _stubgen()


@pytest.fixture(scope="module")
def stub_text(stubgen):
    return stubgen.stub("dlcast_testext")


@pytest.mark.parametrize(
    "function, annotation, module, typed",
    [
        ("doubled", "numpy.typing.NDArray[typing.Any]", "numpy.typing", True),
        ("a2_static_tensorflow", "tensorflow.Tensor", "tensorflow", False),
        ("a2_static_mlx", "mlx.core.array", "mlx.core", False),
        ("a2_static_paddle", "paddle.Tensor", "paddle", True),
        ("identity_array_api", "array_api_strict._array_object.Array", "array_api_strict._array_object", True),
        ("a2_static_memoryview", "memoryview", None, True),
    ],
)
def test_stub_names_each_frameworks_array_type(stubgen, stub_text, function, annotation, module, typed):
    lines = stub_text.splitlines()
    (line,) = [line for line in lines if line.startswith(f"def {function}(")]
    assert line.endswith(f"-> {annotation}: ..."), line
    if module is not None:
        imported = f"import {module}" + ("" if typed else stubgen.UNTYPED_IMPORT)
        assert imported in lines


def test_every_framework_of_the_table_has_a_stub_type(stubgen):
    # The generated table holds every framework `returns = ...` accepts,
    # each stub type a valid Python expression in the modules it imports.
    import ast

    assert {"numpy.ndarray", "torch.Tensor", "jax.Array", "memoryview"} < stubgen.FRAMEWORK_TYPES.keys()
    for name, (stub, modules, _typed) in stubgen.FRAMEWORK_TYPES.items():
        ast.parse(stub, mode="eval")
        assert all(stub.startswith(m + ".") for m in modules[:1]), (name, stub, modules)
    assert "bfloat16" not in stubgen.NUMPY_DTYPES
    assert {"bool", "float16", "complex128"} <= stubgen.NUMPY_DTYPES
