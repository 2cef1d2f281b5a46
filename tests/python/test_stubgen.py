"""The stub generator (dlcast-stubgen/dlcast_stubgen.py) writes every
framework's array type as the framework table (dlcast-runtime/src/facts.rs)
gives it, through the block generated from that table (checked against it by
ui-tests/tests/facts.rs): no `returns = <framework>` falls back to `Any`. The
signature lines `#[dlpack_fn]` writes, which the generator reads, say what
the call enforces: the rank the parameter's type fixes, the `like(x)`
parameter, and the other methods and `#[new]` of a class with dlcast
methods; the generator keeps it (a type variable for `like(x)`, bound to a
protocol rather than to frameworks that may be missing where the stub is
checked; NumPy's shape type and dlcast.Array's shape for a return of fixed
rank; special methods from their kept lines, without the other halves of
their slots)."""

import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _stubgen():
    spec = importlib.util.spec_from_file_location("dlcast_stubgen", ROOT / "dlcast-stubgen" / "dlcast_stubgen.py")
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
        imported = f"import {module}" + (stubgen.TYPED_IMPORT if typed else stubgen.UNTYPED_IMPORT)
        assert imported in lines


def test_every_framework_of_the_table_has_a_stub_type(stubgen):
    # The generated table holds every framework `returns = ...` accepts,
    # each stub type a valid Python expression in the modules it imports.
    import ast

    import facts_table

    assert stubgen.FRAMEWORK_TYPES.keys() == set(facts_table.PYTHON_TYPES.values())
    for name, (stub, modules, _typed, _like) in stubgen.FRAMEWORK_TYPES.items():
        ast.parse(stub, mode="eval")
        assert all(stub.startswith(m + ".") for m in modules[:1]), (name, stub, modules)
    # NumPy's scalar types: the dtype table's `numpy` column (ml_dtypes'
    # bfloat16 and float8 types are not NumPy's).
    assert stubgen.NUMPY_DTYPES == set(facts_table.IN_NUMPY)
    assert {"bool", "float16", "complex128"} <= stubgen.NUMPY_DTYPES


def _first_line(obj):
    return obj.__doc__.splitlines()[0]


def test_signature_line_shows_the_rank_the_type_fixes():
    import dlcast_testext as ext

    # ArrayView2 and TensorRef<'_, f64, 2> refuse other ranks; the line says so.
    assert _first_line(ext.st_row_sums) == "st_row_sums(x: ndarray[float32, (_, _), cpu]) -> like(x)[float32]"
    assert _first_line(ext.st_same_matrix) == (
        "st_same_matrix(x: ndarray[float64, (_, _), cpu]) -> numpy.ndarray[float64, (_, _)]"
    )
    assert _first_line(ext.rk_get0).startswith("rk_get0(x: ndarray[float64, (), cpu])")


def test_like_return_is_a_type_variable(stub_text):
    lines = stub_text.splitlines()
    defs = [i for i, line in enumerate(lines) if line.startswith("def st_row_sums(")]
    assert [lines[i] for i in defs] == [
        "def st_row_sums(x: _Like) -> _Like: ...  # type: ignore[overload-overlap, unused-ignore]",
        "def st_row_sums(x: Annotated[ArrayLike, 'ndarray[float32, (_, _), cpu]'])"
        " -> _DLCastArray[tuple[int, ...]]: ...",
    ]
    assert all(lines[i - 1] == "@typing.overload" for i in defs)


def test_like_type_variable_names_no_framework(stub_text):
    # A framework the checker cannot find is `Any` there, and `Any` in the
    # bound lets `None`, lists and strings through (tests/typing checks it
    # with only NumPy and PyTorch installed): the bound is a protocol every
    # DLPack array meets.
    lines = stub_text.splitlines()
    (typevar,) = [line for line in lines if line.startswith("_Like = ")]
    assert typevar == '_Like = typing.TypeVar("_Like", bound=_DLPackArray)'
    start = lines.index("class _DLPackArray(Protocol):")
    end = lines.index(typevar)
    assert [line.strip().split("(")[0] for line in lines[start:end] if line.strip().startswith("def ")] == [
        "def __dlpack__",
        "def __dlpack_device__",
    ]


def test_like_needs_no_framework_import(stubgen):
    # `like(x)` alone makes the stub import no framework.
    rewrite = stubgen._Rewrite()
    lines = stubgen._from_line("f(x: ndarray[float32, cpu], k: int = 2) -> like(x)[float32, (_,)]", rewrite)
    assert rewrite.uses_like and rewrite.imports == set()
    assert lines[1] == "def f(x: _Like, k: int=...) -> _Like: ...  # type: ignore[overload-overlap, unused-ignore]"
    assert lines[3] == (
        "def f(x: Annotated[ArrayLike, 'ndarray[float32, cpu]'], k: int=...) -> _DLCastArray[tuple[int]]: ..."
    )


def test_ranked_dlcast_results_have_their_rank(stub_text):
    lines = stub_text.splitlines()
    (line,) = [line for line in lines if line.startswith("def st_same_matrix_dlcast(")]
    assert line.endswith("-> _DLCastArray[tuple[int, int]]: ..."), line


def test_default_return_of_a_buffer_is_numpy_in_stub_and_call(stub_text):
    import array

    import numpy as np

    import dlcast_testext as ext

    # The default return (no `returns`) hands an argument of no framework
    # (a buffer) NumPy's array; the line says so (`like(x, numpy)`), and
    # the overload for such an argument is NumPy's type of that rank.
    assert _first_line(ext.st_same_matrix_like).endswith("-> like(x, numpy)[float64, (_, _)]")
    other = [line for line in stub_text.splitlines() if line.startswith("def st_same_matrix_like(")][1]
    assert other.endswith("-> numpy.ndarray[tuple[int, int], numpy.dtype[numpy.float64]]: ..."), other
    buffer = memoryview(array.array("d", [1.0, 2.0, 3.0, 4.0])).cast("B").cast("d", [2, 2])
    assert type(ext.st_same_matrix_like(buffer)) is np.ndarray
    # `returns = like(x)` keeps a dlcast.Array for it, in the stub and the call.
    assert _first_line(ext.st_row_sums).endswith("-> like(x)[float32]")
    sums = ext.st_row_sums(memoryview(array.array("f", [1.0, 2.0, 3.0, 4.0])).cast("B").cast("f", [2, 2]))
    assert type(sums).__module__ == "dlcast" and type(sums).__name__ == "Array"


def test_default_return_fallback_types(stubgen):
    rewrite = stubgen._Rewrite()
    lines = stubgen._from_line("f(x: ndarray[float32, cpu]) -> like(x, numpy)[float32, (_,)]", rewrite)
    assert lines[1] == "def f(x: _Like) -> _Like: ...  # type: ignore[overload-overlap, unused-ignore]"
    assert lines[3] == (
        "def f(x: Annotated[ArrayLike, 'ndarray[float32, cpu]']) -> numpy.ndarray[tuple[int], numpy.dtype[numpy.float32]]: ..."
    )
    assert any("import numpy" in line for line in rewrite.imports)
    # No dtype or rank fixed: NumPy's array of any; a dtype NumPy lacks
    # (bfloat16), which the call keeps as a dlcast.Array: that.
    assert stubgen._from_line("f(x: ndarray[cpu]) -> like(x, numpy)", stubgen._Rewrite())[3].endswith(
        "-> numpy.typing.NDArray[typing.Any]: ..."
    )
    assert stubgen._from_line("f(x: ndarray[cpu]) -> like(x, numpy)[bfloat16]", stubgen._Rewrite())[3].endswith(
        "-> _DLCastArray[tuple[int, ...]]: ..."
    )


def test_read_only_getter_has_no_setter_in_stub(stub_text):
    import dlcast_testext as ext

    # Python shows a `__set__` on every getset descriptor; PyO3's read-only
    # `#[getter]` raises there, so the stub must not declare a setter.
    with pytest.raises(AttributeError):
        ext.StScaler().k = 3.0
    lines = stub_text.splitlines()

    def body(cls):
        start = lines.index(f"class {cls}:")
        return lines[start + 1 : lines.index("", start)]

    assert "    def k(self) -> float: ..." in body("StScaler")
    assert not any("setter" in line for line in body("StScaler"))
    # A `#[setter]` keeps one; `Bag.total` has only a getter.
    assert "    @values.setter" in body("Bag") and "    @total.setter" not in body("Bag")


def test_numpy_return_of_fixed_rank_has_numpys_shape_type(stub_text):
    (line,) = [line for line in stub_text.splitlines() if line.startswith("def st_same_matrix(")]
    assert line.endswith("-> numpy.ndarray[tuple[int, int], numpy.dtype[numpy.float64]]: ..."), line


def test_plain_methods_and_new_are_typed(stub_text):
    import dlcast_testext as ext

    assert ext.StScaler.__dlcast_new__ == "__init__(self, k: float = 1.0) -> None"
    assert _first_line(ext.StScaler.scale) == "scale(self, v: float) -> float"
    lines = stub_text.splitlines()
    start = lines.index("class StScaler:")
    body = lines[start + 1 : lines.index("", start)]
    assert "    def __init__(self, k: float=...) -> None: ..." in body
    assert "    def scale(self, v: float) -> float: ..." in body
    assert "    def k(self) -> float: ..." in body


def test_special_methods_are_typed_from_their_kept_line(stub_text):
    lines = stub_text.splitlines()
    start = lines.index("class FhLayer:")
    body = lines[start + 1 : lines.index("", start)]
    assert "    def __call__(self, x: _Like) -> _Like: ...  # type: ignore[overload-overlap, unused-ignore]" in body
    assert (
        "    def __matmul__(self, x: Annotated[ArrayLike, 'ndarray[float32, cpu]'])"
        " -> numpy.typing.NDArray[numpy.float32]: ..."
    ) in body
    assert "    def __contains__(self, x: Annotated[ArrayLike, 'ndarray[float32, cpu]']) -> bool: ..." in body


def test_other_halves_of_a_special_methods_slot_are_left_out(stub_text):
    # FhLayer defines `__matmul__` and `__rmul__`; Python shows `__rmatmul__`
    # and `__mul__` too (one slot each), which answer NotImplemented. Typed
    # `Any` they would let `layer * x` and `"x" @ layer` through.
    import dlcast_testext as ext

    assert "__mul__" in vars(ext.FhLayer) and "__rmatmul__" in vars(ext.FhLayer)
    lines = stub_text.splitlines()
    start = lines.index("class FhLayer:")
    body = lines[start + 1 : lines.index("", start)]
    names = {line.strip().split("(")[0].removeprefix("def ") for line in body if line.strip().startswith("def ")}
    assert {"__matmul__", "__rmul__", "__call__", "__contains__"} <= names
    assert not names & {"__mul__", "__rmatmul__"}, names


def test_ranked_owned_results_have_their_rank(stub_text):
    # `Tensor<f32, 2>` (tests/src/windows.rs) fixes the result's rank as
    # `TensorRef<'_, f32, 2>` does: the stub says it.
    lines = stub_text.splitlines()
    owned = [line for line in lines if line.startswith("def win_frames_owned(")]
    # (the default return: a buffer gets NumPy's array of that rank)
    assert owned[1].endswith("-> numpy.ndarray[tuple[int, int], numpy.dtype[numpy.float32]]: ..."), owned
    (numpy_like,) = [line for line in lines if line.startswith("def win_wrong_rank(")]
    assert numpy_like.endswith("-> numpy.ndarray[tuple[int, int], numpy.dtype[numpy.float32]]: ..."), numpy_like
