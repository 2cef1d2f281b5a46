"""dtype-generic functions, methods, PyO3 signatures and the signature line
in docstrings."""

import inspect
import re

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import dlcast_testext as ext
import facts_table

# The dtypes `instance` lists (its signature line), each a row of the dtype
# table (facts_table.py) whose Rust type its instance reports.
INSTANCES = ext.instance.__doc__.split("ndarray[")[1].split(",")[0].split(" | ")


def same_rust_type(reported, row):
    """`std::any::type_name`'s path (`half::binary16::f16`) and the row's
    (`half::f16`, as the crate re-exports it) name the same type: compared
    without their module paths."""
    return re.sub(r"\w+::", "", reported) == re.sub(r"\w+::", "", row)


def test_instance_lists_rows_of_the_table():
    assert INSTANCES and set(INSTANCES) <= set(facts_table.DTYPE_NAMES), INSTANCES


@pytest.mark.parametrize("name", INSTANCES)
def test_dispatch_reaches_the_instance_of_each_listed_dtype(name):
    rust = facts_table.RUST_TYPES[name]
    if name not in facts_table.IN_NUMPY:  # (bfloat16) through PyTorch and JAX
        if "torch" not in facts_table.ABSENT_FROM[name]:
            assert same_rust_type(ext.instance(torch.zeros(2, dtype=getattr(torch, name))), rust)
        assert same_rust_type(ext.instance(jnp.zeros(2, dtype=getattr(jnp, name))), rust)
        return
    x = np.zeros(2, dtype=name)
    assert same_rust_type(ext.instance(x), rust)
    assert same_rust_type(ext.instance(jnp.asarray(x)), rust)
    if name not in ("uint16", "uint32", "uint64"):  # torch.from_numpy lacks them
        assert same_rust_type(ext.instance(torch.from_numpy(x)), rust)


@pytest.mark.parametrize("make", [np.ones, lambda n, dtype: torch.ones(n, dtype=getattr(torch, dtype))])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_generic_writable_scale(make, dtype):
    x = make(4, dtype=dtype)
    assert ext.scale(x, 2.5) is None
    assert np.asarray(x).tolist() == [2.5] * 4
    assert str(np.asarray(x).dtype) == dtype


def test_unlisted_dtype_lists_the_accepted_ones():
    with pytest.raises(TypeError) as info:
        ext.scale(np.ones(3, np.int32), 2.0)
    assert str(info.value) == (
        "scale(): argument 'x': expected dtype float32, float64 or float16, got int32"
    )
    # A generic parameter never converts: not even int64 -> float64.
    with pytest.raises(TypeError, match="expected dtype float32 or float64, got int64"):
        ext.doubled(np.arange(3))


def test_parameters_sharing_a_type_parameter_must_match():
    a32, a64 = np.ones(3, np.float32), np.ones(3)
    out = np.zeros(3, np.float32)
    ext.add_into(a32, a32, out)
    assert out.tolist() == [2.0] * 3
    with pytest.raises(TypeError) as info:
        ext.add_into(a32, a64, out)
    assert str(info.value) == (
        "add_into(): arguments 'a' and 'b' must have the same dtype (both are `T`), "
        "got float32 and float64"
    )
    with pytest.raises(TypeError, match="arguments 'a' and 'out' must have the same dtype"):
        ext.add_into(a64, a64, out)
    # Named extents still apply across the generic parameters.
    with pytest.raises(TypeError, match="dimension 'n' is 3 in 'a' but 2 in 'b'"):
        ext.add_into(a32, np.ones(2, np.float32), out)


def test_two_type_parameters_and_an_optional_follower():
    f32, i64, f64, u8 = (np.zeros(1, d) for d in ("float32", "int64", "float64", "uint8"))
    assert ext.instance_pair(f32, None, f64) == ("f32", "f64", False)
    assert ext.instance_pair(i64, u8, u8) == ("i64", "u8", True)
    with pytest.raises(TypeError, match="arguments '_c' and 'b' must have the same dtype"):
        ext.instance_pair(i64, f64, u8)
    with pytest.raises(TypeError, match="argument '_c': expected dtype float64 or uint8, got float32"):
        ext.instance_pair(i64, None, f32)


def test_generic_result_has_the_input_dtype_and_order_still_converts():
    for dt in ("float32", "float64"):
        a = np.arange(6, dtype=dt).reshape(2, 3).T  # F order, order(c) wanted
        out = ext.doubled(a)
        assert out.dtype == dt and out.flags.c_contiguous
        np.testing.assert_array_equal(out, a * 2)


def test_instance_static_and_class_methods():
    acc = ext.Accumulator()
    assert acc.add(np.ones(3)) == 3.0
    assert acc.add(torch.ones(2, dtype=torch.float64)) == 5.0
    assert acc.total() == 5.0
    assert ext.Accumulator.norm(np.array([3.0, 4.0])) == 5.0
    assert acc.norm(jnp.array([6.0, 8.0])) == 10.0
    assert ext.Accumulator.starting_at(np.arange(4.0)).total() == 6.0
    x = np.ones(2, np.float32)
    assert acc.scale_by_total(x) is None
    assert x.tolist() == [5.0, 5.0]
    with pytest.raises(TypeError, match=r"^add\(\): argument 'x': expected shape \(n,\), got \(2, 2\)$"):
        acc.add(np.ones((2, 2)))


def test_pyo3_signature_defaults_keywords_and_options():
    acc = ext.Accumulator.starting_at(np.array([1.0]))
    assert acc.weighted(np.array([1.0, 2.0])) == 4.0
    assert acc.weighted(np.array([1.0, 2.0]), weights=np.array([0.0, 1.0]), scale=3.0) == 7.0
    with pytest.raises(TypeError):
        acc.weighted(np.array([1.0]), np.array([1.0]))  # weights is keyword-only
    with pytest.raises(TypeError, match="dimension 'n' is 2 in 'x' but 1 in 'weights'"):
        acc.weighted(np.array([1.0, 2.0]), weights=np.array([1.0]))
    one = np.ones(3, np.float32)
    assert ext.with_signature(one) == ("sum", 6.0)
    assert ext.with_signature(one, one, scale=1.0, name="both") == ("both", 6.0)
    with pytest.raises(TypeError):
        ext.with_signature(x=one)  # positional-only
    assert ext.mixed("label", np.zeros(4), 7) == "label:4:7"
    assert ext.mixed(k=1, x=np.zeros(2), label=3) == "3:2:1"


def test_method_level_options_apply():
    acc = ext.Accumulator()
    x = np.arange(3, dtype=np.float32)
    out = acc.echo(x)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, x)
    with pytest.raises(TypeError, match=r"^echo\(\): argument 'x': expected dtype float32, got float64$"):
        acc.echo(np.arange(3.0))  # noconvert


SIGNATURES = {
    ext.centroid: "centroid(points: ndarray[float32, (n, 3), cpu], weights: ndarray[float32, (n,), cpu]) -> list[float]",
    ext.scale: "scale(x: ndarray[float32 | float64 | float16, cpu, writable], factor: float) -> None",
    ext.add_into: "add_into(a: ndarray[float32 | float64, (n,), cpu], b: ndarray[float32 | float64, (n,), cpu], out: ndarray[float32 | float64, (n,), cpu, writable]) -> None",
    ext.doubled: "doubled(x: ndarray[float32 | float64, c_contiguous, cpu]) -> numpy.ndarray",
    ext.mixed: "mixed(label: object, x: ndarray[float64, (n,), cpu], k: int) -> str",
    ext.with_signature: 'with_signature(x: ndarray[float32, (n,), cpu], /, y: ndarray[float32, (n,), cpu] | None = None, *, scale: float = 2.0, name: str = "sum") -> tuple[str, float]',
    ext.needs_f: "needs_f(x: ndarray[f_contiguous, cpu]) -> list[int]",
    ext.cuda1_or_cpu: "cuda1_or_cpu(x: ndarray[cuda(1) | cpu]) -> tuple[int, int]",
    ext.batch_of_pairs: "batch_of_pairs(x: ndarray[(..., 2), cpu]) -> list[int]",
    ext.maybe_fill: "maybe_fill(x: ndarray[float64, cpu, writable] | None = None) -> bool",
    ext.Accumulator.add: "add(self, x: ndarray[float64, (n,), cpu]) -> float",
    ext.Accumulator.weighted: "weighted(self, x: ndarray[float64, (n,), cpu], *, weights: ndarray[float64, (n,), cpu] | None = None, scale: float = 1.0) -> float",
    ext.Accumulator.norm: "norm(x: ndarray[float64, c_contiguous, cpu]) -> float",
    ext.Accumulator.starting_at: "starting_at(cls, x: ndarray[float64, cpu]) -> Accumulator",
    # The dtype of a returned array shows where the element type fixes it
    # (not for a type parameter, as in `doubled`).
    ext.Accumulator.echo: "echo(self, x: ndarray[float32, cpu]) -> numpy.ndarray[float32]",
    ext.static_table_numpy: "static_table_numpy() -> numpy.ndarray[uint16]",
    ext.range_paddle: "range_paddle(n: int, read_only: bool = False) -> paddle.Tensor[float32]",
    ext.range_mlx: "range_mlx(n: int, read_only: bool = False) -> mlx.core.array[float32]",
    ext.range_memoryview: "range_memoryview(n: int, read_only: bool = False) -> memoryview[float32]",
}


@pytest.mark.parametrize("fn", SIGNATURES, ids=[f.__name__ for f in SIGNATURES])
def test_docstring_first_line_shows_the_constraints(fn):
    assert fn.__doc__.splitlines()[0] == SIGNATURES[fn]
    # The user's own docstring follows after a blank line.
    lines = fn.__doc__.splitlines()
    assert lines[1] == "" and lines[2]


def test_text_signature_stays_usable_by_inspect():
    assert ext.centroid.__text_signature__ == "(points, weights)"
    assert str(inspect.signature(ext.with_signature)) == "(x, /, y=None, *, scale=2.0, name='sum')"
    assert str(inspect.signature(ext.Accumulator.weighted)) == "(self, /, x, *, weights=None, scale=1.0)"
    # A method without arrays is left to PyO3, but for the signature line
    # its Rust types give (for help() and the stub generator).
    assert ext.Accumulator.total.__text_signature__ == "($self)"
    assert ext.Accumulator.total.__doc__ == "total(self) -> float\n\nA plain method: untouched by dlcast."


def test_python_names_raw_identifiers_and_mut_bindings():
    a, b = np.ones(2, np.float32), np.ones(3, np.float32)
    assert ext.renamed(a, a, 1) == 5
    with pytest.raises(TypeError) as info:
        ext.renamed(a, b, 0)
    assert str(info.value) == "renamed(): dimension 'n' is 2 in 'type' but 3 in 'in'"
    assert ext.renamed.__doc__.splitlines()[0] == (
        "renamed(type: ndarray[float32, (n,), cpu], in: ndarray[float32, (n,), cpu], k: int) -> int"
    )
    # name and signature given in #[pyfunction(..)]
    assert ext.nice_name(np.ones(3)) == 6
    assert ext.nice_name.__doc__.splitlines()[0] == "nice_name(x: ndarray[float64, (3,), cpu], k: int = 2) -> int"
    with pytest.raises(TypeError, match=r"^nice_name\(\): argument 'x': expected shape \(3,\), got \(2,\)$"):
        ext.nice_name(np.ones(2))


def test_pass_module_and_macro_fragments():
    assert ext.module_and_array(np.ones(2, np.float32))[1] == 2
    assert ext.module_and_array.__doc__.splitlines()[0] == "module_and_array(x: ndarray[float32, cpu]) -> tuple[str, int]"
    assert ext.fragments(np.ones(2, np.int16), np.ones(3, np.float32)) == 5
    # An element type behind an alias shows as written.
    assert ext.fragments.__doc__.splitlines()[0] == "fragments(a: ndarray[int16, cpu], b: ndarray[Real32, cpu]) -> int"


def test_special_methods_setters_and_self_receivers_take_arrays():
    bag = ext.Bag()
    bag += np.ones(3)
    assert bag.total == 3.0
    assert np.array([3.0]) in bag and np.array([1.0]) not in bag
    assert bag(np.ones(2)) == 6.0
    bag.values = np.arange(4.0)
    assert bag.total == 6.0
    assert bag.drain(np.ones(2)) == 6.0 and bag.total == 4.0
    assert ext.Bag.drain.__doc__.splitlines()[0] == "drain(self, x: ndarray[float64, (_,), cpu]) -> float"
    with pytest.raises(TypeError, match=r"^__iadd__\(\): argument 'x': expected dtype float64, got complex64"):
        bag += np.ones(2, np.complex64)
