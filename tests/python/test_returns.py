"""Which framework a returned array belongs to: without `returns`, the first
array argument's (the first required one), NumPy for a function without
array arguments, the plain `dlcast.Array` with `returns = dlcast`; and
functions written with the one attribute `#[dlcast::pyfunction]` /
`#[dlcast::pymethods]`, whose PyO3 options (`name`, `signature`) and dlcast
options (`returns`, `noconvert`) both apply.
"""

import array_api_strict as xp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import dlcast_testext as ext
from conftest import run_py


def is_dlcast_array(x):
    return type(x).__name__ == "Array" and type(x).__module__ == "dlcast"


def test_one_attribute_takes_any_producer():
    for x in (np.arange(4, dtype=np.float32), torch.arange(4, dtype=torch.float32),
              jnp.arange(4, dtype=jnp.float32)):
        assert ext.fh_total(x) == 6.0


def test_pyo3_options_pass_through():
    # `name = "fh_first_n"` and `signature = (x, n = 2)` are PyO3's.
    assert not hasattr(ext, "fh_head")
    out = ext.fh_first_n(np.arange(5.0))
    assert isinstance(out, np.ndarray) and out.tolist() == [0.0, 1.0]
    assert ext.fh_first_n(np.arange(5.0), n=3).tolist() == [0.0, 1.0, 2.0]
    assert is_dlcast_array(ext.fh_plain(np.ones(2, np.float32)))


def test_dlcast_options_pass_through():
    assert ext.fh_strict(np.ones(3, np.float32)) == 3
    with pytest.raises(TypeError, match="fh_strict"):
        ext.fh_strict(np.ones(3))


@pytest.mark.parametrize("make, kind", [
    (lambda: np.arange(3.0), np.ndarray),
    (lambda: torch.arange(3.0, dtype=torch.float64), torch.Tensor),
    (lambda: jnp.arange(3.0), jax.Array),
    (lambda: xp.asarray([0.0, 1.0, 2.0], dtype=xp.float64), type(xp.asarray([0.0]))),
])
def test_a_new_array_is_like_the_first_array_argument(make, kind):
    out = ext.fh_first_n(make(), 3)
    assert isinstance(out, kind)
    # What a newcomer does with it first: index it and compute with it.
    assert float(out[1] + 1) == 2.0


def test_a_returned_view_is_like_its_argument_and_zero_copy():
    x = np.arange(4.0)
    out = ext.fh_view(x)
    assert isinstance(out, np.ndarray)
    assert out.ctypes.data == x.ctypes.data
    t = torch.arange(4.0, dtype=torch.float64)
    out = ext.fh_view(t)
    # A view of a read-only export PyTorch refuses stays a dlcast.Array
    # (the default fails a call only for a view of a tensor that requires
    # grad: test_torch_tensors.py); otherwise it is a tensor.
    assert isinstance(out, torch.Tensor) or is_dlcast_array(out)
    assert np.from_dlpack(out).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_without_array_arguments_numpy():
    out = ext.fh_zeros(3)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    assert (out + 1).tolist() == [1.0, 1.0, 1.0]


def test_items_of_a_tuple_and_the_first_required_argument():
    arr, n = ext.fh_pair(torch.ones(2))
    assert isinstance(arr, torch.Tensor) and n == 2
    assert isinstance(ext.fh_second(None, torch.ones(2)), torch.Tensor)
    # `a` is optional: `b` (required) decides even where `a` is given.
    assert isinstance(ext.fh_second(np.ones(2, np.float32), torch.ones(2)), torch.Tensor)


def test_an_argument_of_no_framework_gives_numpy():
    # A buffer (`array.array`) belongs to no framework: NumPy, as without
    # arrays.
    import array

    out = ext.fh_first_n(array.array("d", [0.0, 1.0, 2.0]), 3)
    assert isinstance(out, np.ndarray)


def test_methods_under_the_one_attribute():
    s = ext.FhScale(2.0)
    out = s.apply(torch.ones(2))
    assert isinstance(out, torch.Tensor) and out.tolist() == [2.0, 2.0]
    assert is_dlcast_array(s.raw(np.ones(2, np.float32)))
    assert np.from_dlpack(s.raw(np.ones(2, np.float32))).tolist() == [2.0, 2.0]


def test_a_slice_under_pyo3_alone_takes_only_bytes():
    # The trap the README's troubleshooting lists: `&[u8]` under a plain
    # `#[pyfunction]` compiles, and PyO3 then takes `bytes` and nothing else.
    assert ext.fh_bytes_only(b"abc") == 3
    with pytest.raises(TypeError):
        ext.fh_bytes_only(np.zeros(3, np.uint8))


@pytest.mark.hostile
@pytest.mark.parametrize("fn", ["fp_drop_then_call", "fh_callback_result_numpy"],
                         ids=["default", "returns=numpy"])
def test_results_python_code_built_are_returned_whole(fn):
    """A result the body got from Python code (a callback's value) may hold
    anything: a list that holds itself, lists nested deeper than the thread's
    stack would follow, a named tuple. Under the default return and
    `returns = ...`, the exported arrays in it are handed over, and a tuple
    or list without any is returned itself (it used to be rebuilt, item by
    item without end: a cycle or deep nesting overflowed the stack, a
    segfault, and a named tuple came back a plain tuple)."""
    r = run_py(f"""
        import collections
        import numpy as np
        import dlcast_testext as ext

        fn = getattr(ext, {fn!r})
        call = lambda value: fn(np.zeros(2), lambda: value)
        cyclic = []
        cyclic.append(cyclic)
        assert call(cyclic) is cyclic
        deep = []
        for _ in range(200000):
            deep = [deep]
        assert call(deep) is deep
        point = collections.namedtuple("Point", "x y")(1, [2])
        assert call(point) is point
        # Arrays in it are handed over; a list shared twice stays one list.
        a, _ = ext.arange_default("float32", [2])
        shared = [a, 3]
        out = call((shared, shared, "s"))
        assert type(out[0][0]) is np.ndarray and out[0][0].tolist() == [0.0, 1.0], out
        assert out[0] is out[1] and out[0][1] == 3 and out[2] == "s"
        # A cycle through an array ends at the list already on the path.
        with_array = [a]
        with_array.append(with_array)
        out = call(with_array)
        assert type(out[0]) is np.ndarray and out[1] is with_array
        print("alive")
    """)
    assert r.returncode == 0 and "alive" in r.stdout, r.stderr[-2000:]
