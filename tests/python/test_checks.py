"""The checks a parameter declares (#[shape], #[device], #[order],
writability, cross-parameter extents): what they accept, and errors that say
the function, the parameter, what was expected and what was given.
"""

import numpy as np
import pytest
import torch

import dlcast_testext as ext
import dlcast_testext as t
from conftest import capsule, deleters_balanced


def err(fn, *args):
    with pytest.raises(TypeError) as info:
        fn(*args)
    return str(info.value)


def test_shape_errors_say_expected_and_got():
    pts = np.zeros((5, 4), np.float32)
    assert err(ext.centroid, pts, np.ones(5, np.float32)) == (
        "centroid(): argument 'points': expected shape (n, 3), got (5, 4)"
    )
    assert err(ext.centroid, np.zeros(3, np.float32), np.ones(3, np.float32)) == (
        "centroid(): argument 'points': expected shape (n, 3), got (3,)"
    )


def test_named_extents_agree_across_parameters():
    assert err(ext.centroid, np.zeros((5, 3), np.float32), np.ones(4, np.float32)) == (
        "centroid(): dimension 'n' is 5 in 'points' but 4 in 'weights'"
    )
    a, b, out = np.zeros((2, 3)), np.zeros((3, 4)), np.zeros((2, 4))
    assert ext.matmul_shapes(a, b, out) == (2, 3, 4)
    assert err(ext.matmul_shapes, a, np.zeros((5, 4)), out) == (
        "matmul_shapes(): dimension 'k' is 3 in 'a' but 5 in 'b'"
    )
    assert err(ext.matmul_shapes, a, b, np.zeros((2, 5))) == (
        "matmul_shapes(): dimension 'n' is 4 in 'b' but 5 in 'out'"
    )
    # One name twice in one shape: a plain shape error.
    assert ext.square(np.zeros((3, 3))) == 3
    assert err(ext.square, np.zeros((3, 4))) == (
        "square(): argument 'x': expected shape (n, n), got (3, 4)"
    )


def test_rest_and_zero_d_shapes():
    assert ext.batch_of_pairs(np.zeros(2)) == [2]
    assert ext.batch_of_pairs(np.zeros((4, 5, 2))) == [4, 5, 2]
    assert err(ext.batch_of_pairs, np.zeros((2, 3))) == (
        "batch_of_pairs(): argument 'x': expected shape (..., 2), got (2, 3)"
    )
    assert err(ext.batch_of_pairs, np.zeros(())) == (
        "batch_of_pairs(): argument 'x': expected shape (..., 2), got ()"
    )
    assert ext.scalar_f64(np.float64(2.5).reshape(())) == 2.5
    assert ext.scalar_f64(torch.tensor(1.5, dtype=torch.float64)) == 1.5
    assert err(ext.scalar_f64, np.zeros(1)) == (
        "scalar_f64(): argument 'x': expected shape (), got (1,)"
    )


def test_order_errors_show_the_strides():
    a = np.zeros((2, 3)).T
    assert err(ext.needs_c, a) == (
        "needs_c(): argument 'x': expected a C-contiguous (order c) array, "
        "got shape (3, 2) with strides (1, 3)"
    )
    assert err(ext.needs_f, np.zeros((2, 3))) == (
        "needs_f(): argument 'x': expected a F-contiguous (order f) array, "
        "got shape (2, 3) with strides (3, 1)"
    ).replace("a F", "a F")
    assert "order contiguous" in err(ext.needs_contiguous, np.zeros((4, 4))[::2])
    # Slices that stay contiguous pass.
    assert ext.needs_c(np.zeros((4, 4))[1:3]) == [2, 4]


def test_devices_are_checked_by_type_and_id():
    with deleters_balanced(5):
        # A fake CUDA tensor: its pointer is never dereferenced.
        c = capsule(np.zeros(3, np.float32), device=(2, 0))
        assert err(ext.sum_f32, c) == "sum_f32(): argument 'x': expected device cpu, got cuda:0"
        assert ext.cuda_only(capsule(np.zeros(3), device=(2, 3))) == (2, 3)
        assert ext.cuda1_or_cpu(capsule(np.zeros(3), device=(2, 1))) == (2, 1)
        assert err(ext.cuda1_or_cpu, capsule(np.zeros(3), device=(2, 0))) == (
            "cuda1_or_cpu(): argument 'x': expected device cuda:1 or cpu, got cuda:0"
        )
        assert err(ext.cuda_only, capsule(np.zeros(3), device=(10, 0))) == (
            "cuda_only(): argument 'x': expected device cuda, got rocm:0"
        )
    assert err(ext.cuda_only, np.zeros(3)) == "cuda_only(): argument 'x': expected device cuda, got cpu"


def test_device_memory_gives_no_element_access():
    with deleters_balanced(2):
        c = capsule(np.zeros(3, np.float32), device=(2, 0), null_data=False)
        with pytest.raises(ValueError, match="on cuda:0, not in memory the CPU can access"):
            ext.device_to_vec(c)
        # Pinned host memory can be described by any-device functions.
        c = capsule(np.arange(2.0), device=(3, 0))
        assert ext.describe(c)[3] == (3, 0)


def test_unknown_device_and_dtype_codes_show_raw_codes():
    with deleters_balanced(3):
        c = capsule(np.zeros(2), device=(99, 4))
        assert err(ext.describe, c) == (
            "describe(): argument 'x': unsupported device (device_type=99, device_id=4)"
        )
        c = ext.make_capsule(bytes(16), [2], [1], dtype=(2, 32, 2))
        assert err(ext.describe, c) == (
            "describe(): argument 'x': unsupported dtype (code=2, bits=32, lanes=2)"
        )
        # float4_e2m1fn: packed in memory, no element type.
        c = ext.make_capsule(bytes(16), [2], [1], dtype=(17, 4, 1))
        assert "(code=17, bits=4, lanes=1)" in err(ext.describe, c)


def test_writable_views_refuse_self_overlap():
    b = np.broadcast_to(np.zeros(1), (4,))
    b2 = np.lib.stride_tricks.as_strided(np.zeros(5), (3, 3), (8, 8))
    msg = err(ext.fill_f64, b2, 1.0)
    assert msg == (
        "fill_f64(): argument 'out': a writable array must not reach one element from two "
        "indices, and dlcast cannot rule that out for shape (3, 3) with strides (1, 1) (its "
        "test is conservative for interleaved strides); pass a compact copy, e.g. "
        "numpy.ascontiguousarray(x)"
    )
    # Read-only views of the same layouts are fine.
    assert ext.values(b) == [0.0] * 4
    assert ext.values(b2) == [0.0] * 9
    with deleters_balanced(1):
        c = capsule(np.zeros(1), shape=[5], strides=[0])
        assert "must not reach one element from two indices" in err(ext.fill_f64, c, 0.0)


def test_overlapping_writable_arguments_are_refused():
    a = np.arange(10.0)
    assert err(ext.copy_into, a, a) == (
        "copy_into(): arguments 'dst' and 'src' share memory, and 'dst' is writable"
    )
    assert "share memory" in err(ext.copy_into, a[:6], a[4:])
    assert "share memory" in err(ext.copy_into, a[::-1], a[3:5])
    t = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    assert "share memory" in err(ext.copy_into, t.T, t)
    # Disjoint pieces of one array are fine.
    ext.copy_into(a[:5], a[5:])
    assert a[5:].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("shape", [(), (2,), (1,), (0, 2), (3, 2), (2, 2, 2), (5, 1, 2),
                                   (2, 3), (4,), (1, 1, 1, 1, 1, 1, 1, 1, 1, 2)])
def test_match_shape_with_rest(shape):
    """`batch_of_pairs(#[shape(.., 2)] x)` accepts exactly the shapes ending
    in 2 (at least one dimension)."""
    x = np.zeros(shape)
    if len(shape) >= 1 and shape[-1] == 2:
        assert t.batch_of_pairs(x) == list(shape)
    else:
        with pytest.raises(TypeError, match="expected shape"):
            t.batch_of_pairs(x)


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("a,b,ok", [
    ((2, 3), (3, 4), True), ((2, 3), (4, 4), False), ((0, 3), (3, 0), True),
    ((2,), (2, 2), False), ((2, 3, 1), (3, 4), False)])
def test_named_extents_across_parameters(a, b, ok):
    """`matmul_shapes(#[shape(m, k)] a, #[shape(k, n)] b, #[shape(m, n)] out)`."""
    m, n = a[0], b[-1]
    out = np.zeros((m, n)) if len(a) == 2 and len(b) == 2 else np.zeros((1, 1))
    if ok:
        t.matmul_shapes(np.zeros(a), np.zeros(b), out)
    else:
        with pytest.raises(TypeError):
            t.matmul_shapes(np.zeros(a), np.zeros(b), out)


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("shape,ok", [((3, 3), True), ((0, 0), True), ((2, 3), False),
                                      ((3,), False), ((3, 3, 3), False)])
def test_one_name_twice_in_one_shape(shape, ok):
    if ok:
        assert t.square(np.zeros(shape)) == shape[0]
    else:
        with pytest.raises(TypeError):
            t.square(np.zeros(shape))


@pytest.mark.usefixtures("registry_empty_after_collect")
@pytest.mark.hostile
@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (2, 1, 3), (0, 4)])
def test_rest_alone_matches_any_rank(shape):
    """`copy_into(#[shape(..)] src, dst)`: any rank, values copied."""
    src = np.arange(float(np.prod(shape))).reshape(shape)
    dst = np.zeros(shape)
    t.copy_into(src, dst)
    assert (dst == src).all()
