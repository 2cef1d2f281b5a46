"""Special methods that return any object (`__call__`, `__getitem__`, the
operators) are converted as any method of a `#[dlcast::pymethods]` block: a
returned array goes to the framework of the first array argument, a view of
an argument is returned zero-copy, `returns = ..` applies; their signature
line and doc comment are kept in `__dlcast_<name>__`, which the stub
generator reads. Those whose result Python fixes (`__contains__`) return
the body's value as it is (`ext.FhLayer`, tests/src/first_hour.rs)."""

import numpy as np
import torch

import dlcast_testext as ext


def test_call_returns_a_view_of_the_input_in_its_framework():
    layer = ext.FhLayer(2.0)
    x = np.arange(3, dtype=np.float32)
    out = layer(x)
    assert type(out) is np.ndarray and np.shares_memory(out, x)
    t = torch.arange(3, dtype=torch.float32)
    out = layer(t)
    assert type(out) is torch.Tensor and out.data_ptr() == t.data_ptr()


def test_operator_takes_returns_and_the_default():
    layer = ext.FhLayer(2.0)
    t = torch.ones(3)
    # `returns = numpy` on `__matmul__`.
    out = layer @ t
    assert type(out) is np.ndarray and out.tolist() == [2.0, 2.0, 2.0]
    # The default on `__rmul__`: like the argument.
    out = layer.__rmul__(t)
    assert type(out) is torch.Tensor and out.tolist() == [2.0, 2.0, 2.0]


def test_fixed_result_special_method_returns_its_value():
    layer = ext.FhLayer(2.0)
    assert np.ones(2, np.float32) in layer
    assert np.ones(3, np.float32) not in layer


def test_special_methods_keep_their_line_and_doc():
    assert ext.FhLayer.__dlcast_call__ == (
        "__call__(self, x: ndarray[float32, cpu]) -> like(x, numpy)[float32]\n\n"
        "The input itself, exported zero-copy: like the input."
    )
    assert ext.FhLayer.__dlcast_matmul__.startswith("__matmul__(self, x: ndarray[float32, cpu]) -> numpy.ndarray[float32]")
    assert ext.FhLayer.__dlcast_contains__.startswith("__contains__(self, x: ndarray[float32, cpu]) -> bool")
