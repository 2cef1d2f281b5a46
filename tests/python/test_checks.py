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


def _misaligned(n, dtype=np.float64):
    """A NumPy array whose data address is not a multiple of its itemsize."""
    item = np.dtype(dtype).itemsize
    a = np.zeros(n * item + 1, np.uint8)[1:].view(dtype)
    a[:] = np.arange(n)
    assert a.ctypes.data % item != 0
    return a


def _misaligned_field(n):
    """Field `b` of a packed structured array: float64 elements at byte 1 of
    16-byte records (strides of whole elements, a misaligned address)."""
    rec = np.zeros(n, np.dtype([("a", "u1"), ("b", "<f8"), ("c", "u1", (7,))]))
    rec["b"] = np.arange(n)
    b = rec["b"]
    assert b.strides == (16,) and b.ctypes.data % 8 != 0
    return b


def _packed_field(n):
    """Field `b` of 9-byte records: strides that are not whole float64s."""
    rec = np.zeros(n, np.dtype([("a", "u1"), ("b", "<f8")]))
    return rec["b"]


def _read_only(a):
    a.flags.writeable = False
    return a


def _inference():
    with torch.inference_mode():
        return torch.zeros(4, dtype=torch.float64)


def _on_cuda():
    return ext.make_capsule(b"", [4], [1], null_data=True, device=(2, 0), dtype=(2, 64, 1))


# Every reason a writable parameter refuses an argument: (function, argument,
# what the message must name). One exception type for all (TypeError).
WRITABLE_REFUSALS = {
    "read-only": ("fill_f64", lambda: _read_only(np.zeros(4)), "the array is read-only"),
    "requires grad": ("fill_f64", lambda: torch.zeros(4, dtype=torch.float64, requires_grad=True),
                      r"requires grad.*pass x\.detach\(\)"),
    "inference tensor": ("fill_f64", _inference, "inference tensor"),
    "byte order": ("fill_f64", lambda: np.zeros(4, ">f8"),
                   r"byte order is not the machine's \(dtype >f8\)"),
    "byte order, a buffer": ("fill_f64", lambda: memoryview(np.zeros(4, ">f8")),
                             r"byte order is not the machine's \(dtype >f8\)"),
    "byte order, a slice": ("slice_fill", lambda: np.zeros(4, ">f8"), "byte order"),
    "misaligned": ("fill_f64", lambda: _misaligned(4), "not aligned to 8 bytes for float64"),
    "misaligned field": ("fill_f64", lambda: _misaligned_field(4), "not aligned to 8 bytes"),
    "misaligned tensor": ("fill_f64", lambda: torch.frombuffer(bytearray(33), dtype=torch.float64, offset=1),
                          "not aligned to 8 bytes"),
    "misaligned, the README's scale": ("scale", lambda: _misaligned(4), "not aligned to 8 bytes"),
    "strides not whole elements": ("fill_f64", lambda: _packed_field(4),
                                   r"strides \(9,\) \(bytes\) are not whole elements of 8 bytes"),
    "order": ("fill_c_f32", lambda: np.zeros((3, 4), np.float32).T, "C-contiguous"),
    "self-overlap": ("fill_f64", lambda: np.lib.stride_tricks.as_strided(np.zeros(4), (3, 2), (8, 8)),
                     "one element from two indices"),
    "dtype": ("fill_f64", lambda: np.zeros(4, np.float32), "expected dtype float64, got float32"),
    "dtype without a DLPack code": ("fill_f64", lambda: np.zeros(4, object),
                                    "dtype object has no DLPack type code"),
    "device": ("fill_f64", _on_cuda, "expected device cpu, got cuda:0"),
}


@pytest.mark.parametrize("case", sorted(WRITABLE_REFUSALS))
def test_every_writable_refusal_is_a_type_error_naming_its_cause(case):
    fn, make, cause = WRITABLE_REFUSALS[case]
    x = make()
    before = x.clone() if isinstance(x, torch.Tensor) else None
    args = (x, 2.0) if fn == "scale" else (x, 1.0)
    with pytest.raises(TypeError, match=rf"^{fn}\(\): argument '\w+': .*{cause}") as info:
        getattr(ext, fn)(*args)
    if isinstance(x, torch.Tensor):
        assert torch.equal(x, before)
    # Where the producer refused, its exception is the cause.
    if case.startswith(("byte order", "strides")):
        assert isinstance(info.value.__cause__, BufferError)


@pytest.mark.parametrize("make", [_misaligned, _misaligned_field], ids=["view", "field"])
def test_typed_views_get_aligned_memory_at_the_boundary(make):
    # A writable typed view refuses misaligned memory before the body, so
    # its slice and ndarray accessors never fail on alignment: nothing is
    # written, and the error is the writable refusal's TypeError.
    x = make(4)
    for fn in ("acc_as_ndarray_mut", "fill_f64"):
        with pytest.raises(TypeError, match="not aligned to 8 bytes.*writable parameter never converts"):
            getattr(ext, fn)(x, 7.0)
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]
    # A read-only one reads an aligned copy: its accessors succeed.
    assert ext.acc_as_slice(x) == [0.0, 1.0, 2.0, 3.0]
    assert ext.acc_as_ndarray(x) == ([4], [0.0, 1.0, 2.0, 3.0])
    assert ext.slice_f64(x) == [0.0, 1.0, 2.0, 3.0]
    # Where it may not convert, it is refused there too.
    with pytest.raises(TypeError, match=r"strict_pair\(\): argument 'x': .*not aligned to 4 bytes"):
        ext.strict_pair(_misaligned(4, np.float32), np.zeros(4, np.float32))
    # An untyped view still reads it in place (no reference handed out).
    assert ext.values(x) == [0.0, 1.0, 2.0, 3.0]


# Every argument NumPy reads but dlcast cannot read in place, for a
# read-only parameter that does not convert it: (function, argument, what
# the message names, the fix it gives). One exception type for all, the
# README table's TypeError, as for a writable parameter.
IN_PLACE_ONLY_REFUSALS = {
    "byte order, #[noconvert] slice": (
        "slice_sum_nc", lambda: np.zeros(4, ">f8"),
        r"byte order is not the machine's \(dtype >f8\)",
        r"the parameter does not convert \(noconvert\): .*newbyteorder\(\"=\"\).*remove noconvert"),
    "byte order, #[noconvert] ndarray view": (
        "nd2_sum_nc", lambda: np.zeros((2, 3), ">f8"), "byte order", "remove noconvert"),
    "byte order, noconvert on the function": (
        "strict_pair", lambda: np.zeros(4, ">f4"), r"\(dtype >f4\)", "remove noconvert"),
    "byte order, a buffer, #[noconvert]": (
        "slice_sum_nc", lambda: memoryview(np.zeros(4, ">f8")), r"\(dtype >f8\)", "remove noconvert"),
    "byte order, untyped": (
        "values", lambda: np.zeros(4, ">f8"), r"\(dtype >f8\)",
        r"untyped or dtype-generic parameter reads arrays only in place.*newbyteorder"),
    "strides not whole elements, #[noconvert]": (
        "slice_sum_nc", lambda: _packed_field(4), r"strides \(9,\) \(bytes\) are not whole elements",
        r"numpy\.ascontiguousarray\(x\), or remove noconvert"),
}


def _call_in_place_only(fn, x):
    f = getattr(ext, fn)
    return f(x, np.zeros(4, np.float32)) if fn == "strict_pair" else f(x)


@pytest.mark.parametrize("case", sorted(IN_PLACE_ONLY_REFUSALS))
def test_every_refusal_of_a_parameter_that_does_not_convert_is_a_type_error_with_the_fix(case):
    fn, make, cause, fix = IN_PLACE_ONLY_REFUSALS[case]
    with pytest.raises(TypeError, match=rf"^{fn}\(\): argument 'x': .*{cause}.*; .*{fix}") as info:
        _call_in_place_only(fn, make())
    # The producer's refusal (NumPy's, or the buffer's) is the cause.
    assert isinstance(info.value.__cause__, BufferError)
    # What the message says to pass is taken.
    if "byte order" in case:
        x = make()
        x = np.asarray(x)
        _call_in_place_only(fn, x.astype(x.dtype.newbyteorder("=")))


def test_a_dtype_numpy_cannot_export_keeps_numpys_refusal_for_a_read_only_parameter():
    # Not a fact of layout the caller can fix for this parameter: NumPy's
    # BufferError, as the README's float8 section says.
    import ml_dtypes

    for x in (np.zeros(4, object), np.ones(4, ml_dtypes.bfloat16)):
        with pytest.raises(BufferError, match=r"^values\(\): argument 'x': the producer's __dlpack__\(\) raised"):
            ext.values(x)


@pytest.mark.hostile
def test_a_subclass_claiming_native_byte_order_is_refused_by_its_real_order():
    """The refusal comes from NumPy's own array of the argument, not from the
    argument's attributes: a subclass whose `dtype` says native order is
    still refused (never read as garbage), and the message names `>f8`."""

    class Liar(np.ndarray):
        @property
        def dtype(self):
            return np.dtype("<f8")

    x = np.arange(4.0).astype(">f8").view(Liar)
    with pytest.raises(TypeError, match=r"^slice_sum_nc\(\): argument 'x': .*\(dtype >f8\)"):
        ext.slice_sum_nc(x)
    # A converting parameter reads its values (converted), not the bytes.
    assert ext.slice_f64(x) == [0.0, 1.0, 2.0, 3.0]


def _readme():
    """README.md and the guide (guide/src), line breaks and indentation
    folded to spaces."""
    import re

    from doc_text import all_text

    return re.sub(r"\s+", " ", all_text())


def _cpu_array():
    a, _ = ext.arange_default("float32", [2])
    return a


# Where the README or the guide states an exception type (a pattern whose group is the
# name it states), and calls it says raise that type.
README_CLAIMS = {
    "writable refusals": (
        r"\| an argument a writable parameter cannot take in place [^|]*\| `(\w+)`",
        [(lambda make=make, fn=fn: getattr(ext, fn)(make(), 2.0)) for fn, make, _ in
         WRITABLE_REFUSALS.values()],
    ),
    "a parameter that does not convert, given what it cannot read in place": (
        r"\| shape, dtype, device, order, [^|]*\| `(\w+)`",
        [(lambda make=make, fn=fn: _call_in_place_only(fn, make())) for fn, make, _, _ in
         IN_PLACE_ONLY_REFUSALS.values()],
    ),
    "alignment": (
        r"\| host memory not aligned for a typed view's element type [^|]*\| `(\w+)`",
        [lambda: ext.fill_f64(_misaligned(4), 1.0),
         lambda: ext.strict_pair(_misaligned(4, np.float32), np.zeros(4, np.float32))],
    ),
    "returns = torch of a view of a tensor that requires grad": (
        r"A view of a tensor that\s+requires grad never comes back as a `torch.Tensor`: the default "
        r"return\s+for a PyTorch argument, `returns = torch`, `returns = like\(x\)` and items\s+"
        r"of returned tuples and lists raise `(\w+)` naming `requires_grad`",
        [lambda: ext.passthrough_f64(torch.ones(2, dtype=torch.float64, requires_grad=True)),
         lambda: ext.transposed(torch.ones(2, 2, requires_grad=True))],
    ),
    "__dlpack__ values": (
        r"A value that cannot be honoured raises `(\w+)`",
        [lambda: _cpu_array().__dlpack__(dl_device=(1, 2**40)),
         lambda: _cpu_array().__dlpack__(dl_device=(2**40, 0)),
         lambda: _cpu_array().__dlpack__(dl_device=(2, 0)),
         lambda: _cpu_array().__dlpack__(stream=1),
         lambda: _cpu_array().__dlpack__(stream=2**70)],
    ),
    "__dlpack__ dl_device of another device": (
        r"`dl_device` must be the array's device \(any other pair of integers: `(\w+)`\)",
        [lambda: _cpu_array().__dlpack__(dl_device=(2**40, 0))],
    ),
    "__dlpack__ argument types": (
        r"an argument of the wrong type \(a `stream` that is not an integer, such as `\"0\"`; "
        r"a `max_version` or `dl_device` that is not a tuple of two integers; a `copy` that is "
        r"not a bool\), and positional or unknown arguments, raise `(\w+)`",
        [lambda: _cpu_array().__dlpack__(stream="0"),
         lambda: _cpu_array().__dlpack__(max_version="1.0"),
         lambda: _cpu_array().__dlpack__(dl_device="cpu"),
         lambda: _cpu_array().__dlpack__(dl_device=(1.0, 0)),
         lambda: _cpu_array().__dlpack__(copy="yes"),
         lambda: _cpu_array().__dlpack__(None),
         lambda: _cpu_array().__dlpack__(strem=None)],
    ),
}


@pytest.mark.parametrize("claim", sorted(README_CLAIMS))
def test_the_readme_states_the_exception_each_refusal_raises(claim):
    import builtins
    import re

    pattern, calls = README_CLAIMS[claim]
    found = re.findall(pattern, _readme())
    assert len(found) == 1, f"the README and the guide no longer say it (once): {pattern}"
    stated = getattr(builtins, found[0])
    for call in calls:
        with pytest.raises(Exception) as info:
            call()
        assert type(info.value) is stated, (claim, info.value)
