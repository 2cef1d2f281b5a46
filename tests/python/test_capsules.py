"""Capsules built field by field: legacy and versioned, odd but legal
descriptions read right, impossible ones refused before any read, every
deleter run exactly once; and a property test (Hypothesis) of generated
descriptions against a NumPy model of the memory they describe.
"""

import itertools
import os
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import dlcast_testext as ext
import facts_table
from conftest import capsule, deleters_balanced


@pytest.mark.parametrize("versioned", [True, False])
def test_deleter_runs_once_on_success_and_on_each_error(versioned):
    data = np.arange(6.0)
    with deleters_balanced(4):
        assert ext.values(capsule(data, versioned=versioned)) == data.tolist()
        with pytest.raises(TypeError, match="expected dtype int32"):
            ext.seen_i32(capsule(data, versioned=versioned))
        with pytest.raises(TypeError, match="expected shape"):
            ext.scalar_f64(capsule(data, versioned=versioned))
        # A capsule nobody consumes is freed by its own destructor.
        capsule(data, versioned=versioned)


def test_higher_minor_version_is_read():
    with deleters_balanced(1):
        assert ext.values(capsule(np.arange(2.0), version=(1, 99))) == [0.0, 1.0]


def test_zero_d_with_null_shape_and_strides():
    with deleters_balanced(1):
        c = ext.make_capsule(np.float64(4.5).tobytes(), [], None)
        assert ext.scalar_f64(c) == 4.5


def test_many_dimensions():
    # 70 dimensions of extent 1 plus one of 3: beyond the inline storage.
    shape = [1] * 70 + [3]
    with deleters_balanced(1):
        c = ext.make_capsule(np.arange(3.0).tobytes(), shape, [1] * 71)
        assert ext.describe(c)[0] == shape
    with deleters_balanced(1):
        c = ext.make_capsule(np.arange(3.0).tobytes(), shape, [1] * 71)
        assert ext.values(c) == [0.0, 1.0, 2.0]


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(shape=[3], strides=[1], ndim=-1), "ndim is -1"),
        (dict(shape=[-2], strides=[1]), "extent -2 in dimension 0"),
        (dict(shape=[4], strides=[1], null_data=True), "data is NULL for a non-empty array"),
        (dict(shape=[3], strides=[2**62]), "beyond the address space"),
        (dict(shape=[2**40, 2**40], strides=[1, 1]), "element count overflows"),
        (dict(shape=[2], strides=[1], byte_offset=2**64 - 8), "data + byte_offset overflows"),
        (dict(shape=[2], strides=[-2**58]), "wraps around"),
        (dict(shape=[2**62], strides=None), "beyond the address space"),
    ],
    ids=["neg-ndim", "neg-extent", "null-data", "huge-stride", "count-overflow",
         "offset-wrap", "below-zero", "null-strides-huge"],
)
def test_impossible_descriptions_are_refused(fields, message):
    shape = fields.pop("shape")
    strides = fields.pop("strides")
    with deleters_balanced(1):
        c = ext.make_capsule(bytes(32), shape, strides, **fields)
        with pytest.raises(BufferError, match="the producer described an invalid array") as info:
            ext.values(c)
        assert message in str(info.value)


def test_null_shape_with_dimensions_is_refused():
    with deleters_balanced(1):
        c = ext.make_capsule(bytes(8), [], None, ndim=2)
        with pytest.raises(BufferError, match="shape is NULL with ndim 2"):
            ext.describe(c)


def test_null_deleter_is_allowed():
    c = ext.make_capsule(np.arange(2.0).tobytes(), [2], [1], null_deleter=True)
    assert ext.values(c) == [0.0, 1.0]


def test_foreign_capsules_are_refused():
    c = ext.make_capsule(bytes(8), [1], [1], name="not_dlpack")
    with pytest.raises(BufferError, match='a capsule named "not_dlpack" is not a DLPack capsule'):
        ext.values(c)
    # Still refused the second time (nothing was renamed).
    with pytest.raises(BufferError, match="not_dlpack"):
        ext.values(c)


class Returns:
    def __init__(self, value):
        self.value = value

    def __dlpack__(self, **kw):
        return self.value


def test_dlpack_returning_non_capsules():
    with pytest.raises(BufferError, match=r"__dlpack__\(\) returned int, not a DLPack capsule"):
        ext.values(Returns(3))
    used = np.arange(2.0).__dlpack__()
    ext.consume(used)
    with pytest.raises(BufferError, match="already consumed"):
        ext.values(Returns(used))


def test_numpy_legacy_and_versioned_capsules_directly():
    a = np.arange(4.0)
    assert ext.values(a.__dlpack__()) == [0.0, 1.0, 2.0, 3.0]
    assert ext.values(a.__dlpack__(max_version=(1, 0))) == [0.0, 1.0, 2.0, 3.0]
    ro = np.arange(3.0)
    ro.flags.writeable = False
    assert ext.describe(ro.__dlpack__(max_version=(1, 0)))[4] is True


# ---------------------------------------------------------------------------
# Property test: generated capsule descriptions over a backing
# buffer, checked against a pure NumPy model of the memory they describe.
# `make test` runs DLCAST_HYPOTHESIS_EXAMPLES (default 5,000) cases; `make
# fuzz` the same with 200,000.

EXAMPLES = int(os.environ.get("DLCAST_HYPOTHESIS_EXAMPLES", "5000"))

# (code, bits) -> the dtype's name: every row of the dtype table
# (facts_table.py), each modelled from its kind and bits.
SUPPORTED = facts_table.BY_CODE
SUPPORTED_KEYS = sorted(SUPPORTED)
FAKE_DEVICES = [2, 10]  # CUDA, ROCm: their pointers are never read
INVALID = ["neg_extent", "huge_stride", "null_data", "offset_wrap", "version", "dtype", "device"]


def model_elements(buf, code, bits, shape, byte_strides, start):
    """The elements the description reaches, in C order, as Python values."""
    if 0 in shape:
        return []
    name = SUPPORTED[(code, bits)]
    a = np.ndarray(shape, facts_table.element_dtype(name), buffer=buf, offset=start,
                   strides=byte_strides)
    return facts_table.python_values(name, a)


def same(x, y):
    """Equality that treats NaN as equal to NaN (random bytes make NaNs)."""
    if isinstance(x, complex) or isinstance(y, complex):
        return same(x.real, y.real) and same(x.imag, y.imag)
    return x == y or (x != x and y != y)


def contiguous(shape, strides, c_order):
    if 0 in shape:
        return True
    expected = 1
    dims = zip(reversed(shape), reversed(strides)) if c_order else zip(shape, strides)
    for n, s in dims:
        if n == 1:
            continue
        if s != expected:
            return False
        expected *= n
    return True


UNSUPPORTED_DTYPES = st.one_of(
    st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 65535)),
    st.tuples(st.sampled_from(SUPPORTED_KEYS), st.sampled_from([0, 2, 3, 4, 16, 65535]))
    .map(lambda t: (t[0][0], t[0][1], t[1])),
).filter(lambda c: c[2] != 1 or (c[0], c[1]) not in SUPPORTED)


@st.composite
def descriptions(draw):
    """A capsule description: valid (~85%) or with exactly one defect.

    Hypothesis draws what shapes the case (defect, dtype, extents and
    strides, a seed); the rest comes from a generator seeded by the seed
    (each Hypothesis draw costs ~0.06 ms, so 5,000 cases stay ~10 s)."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    defect = draw(st.sampled_from([None] * 40 + INVALID))
    if defect == "dtype":
        code, bits, lanes = draw(UNSUPPORTED_DTYPES)
    else:
        (code, bits), lanes = draw(st.sampled_from(SUPPORTED_KEYS)), 1
    itemsize = max(bits // 8, 1)
    dims = draw(st.lists(st.tuples(st.integers(0, 4), st.integers(-6, 6)), max_size=5))
    shape = [n for n, _ in dims]
    if defect in ("huge_stride", "null_data", "offset_wrap"):
        shape = [max(n, 1) for n in shape]  # non-empty, so the defect matters
    ndim = len(shape)
    null_strides = rng.random() < 0.2
    if null_strides:
        strides, acc = [0] * ndim, 1
        for i in reversed(range(ndim)):
            strides[i], acc = acc, acc * max(shape[i], 1)
    else:
        strides = [s for _, s in dims]
    # Place element 0 so that every element reached is inside the buffer;
    # `skew` bytes make it unaligned now and then.
    lo = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides) if n > 0)
    hi = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides) if n > 0)
    skew = rng.randrange(itemsize) if rng.random() < 0.25 else 0
    start = (-lo + rng.randrange(3)) * itemsize + skew
    size = start + (hi + 1 + rng.randrange(3)) * itemsize
    versioned = rng.random() < 0.5
    device = (1, 0)
    if rng.random() < 0.1:
        device = (rng.choice(FAKE_DEVICES), rng.randrange(-1, 8))
    d = dict(
        code=code, bits=bits, lanes=lanes, itemsize=itemsize, shape=shape, strides=strides,
        null_strides=null_strides, start=start, size=size,
        split=rng.randrange(start + 1),  # bytes in `data`, the rest in byte_offset
        versioned=versioned, flags=rng.choice([0, 1, 2, 3, 2**63 + 1]) if versioned else 0,
        major=1, minor=rng.randrange(6), device=device, defect=defect, seed=rng.randrange(2**32),
        consumer=rng.choice(["values", "describe", "zero_bytes"]),
        null_data=False, byte_offset_extra=0,
    )
    if device != (1, 0):
        # A fake device address: nothing checks or reads it.
        d["data_offset"] = rng.choice([0, 2**40, 2**63])
        d["null_data"] = rng.random() < 0.5
    if defect == "neg_extent":
        if ndim == 0:
            shape.append(1)
            strides.append(1)
        shape[rng.randrange(len(shape))] = rng.choice([-1, -2, -(2**31), -(2**63)])
        d["null_strides"] = False
    elif defect == "huge_stride":
        if not any(n > 1 for n in shape):
            shape.append(2)
            strides.append(1)
        i = rng.choice([i for i, n in enumerate(shape) if n > 1])
        # Spans beyond isize, or (host memory only: device addresses are
        # not checked for wrapping) below address 0.
        strides[i] = rng.choice([2**63 - 1, -(2**63), -(2**63 - 1)] if device == (1, 0) else [2**63 - 1])
        d["null_strides"] = False
    elif defect == "null_data":
        if device != (1, 0):
            d["defect"] = None  # device pointers are not checked
        d["null_data"] = True
    elif defect == "offset_wrap":
        if device != (1, 0):
            d["defect"] = None  # nor wrapped device offsets
        else:
            # Offsets that wrap past 2**64 (a finite offset into unmapped
            # memory, like any wild pointer, cannot be detected).
            d["byte_offset_extra"] = rng.choice([2**64 - 1 - start, 2**64 - 2**20, 2**64 - 2**12])
    elif defect == "version":
        if versioned:
            d["major"] = rng.choice([0, 2, 99, 2**32 - 1])
        else:
            d["defect"] = None  # legacy capsules carry no version
    elif defect == "device":
        d["device"] = (rng.choice([0, 5, 6, 21, 1000, 2**32 - 1]), 0)
    return d


CASES = [0]


def check_description(d):
    """Builds the capsule, hands it to the chosen consumer and checks the
    result against the model; the deleter runs exactly once."""
    CASES[0] += 1
    buf = np.random.default_rng(d["seed"]).integers(0, 256, d["size"], np.uint8).tobytes()
    shape, strides, itemsize = d["shape"], d["strides"], d["itemsize"]
    data_offset = d.get("data_offset", d["split"])
    byte_offset = (d["start"] - d["split"] + d["byte_offset_extra"]) % 2**64
    created0, deleted0 = ext.producer_counts()
    c = ext.make_capsule(
        buf, shape, None if d["null_strides"] else strides,
        dtype=(d["code"], d["bits"], d["lanes"]), device=(d["device"][0] % 2**32, d["device"][1]),
        byte_offset=byte_offset, data_offset=data_offset, versioned=d["versioned"],
        version=(d["major"], d["minor"]), flags=d["flags"], null_data=d["null_data"],
    )
    consumer = d["consumer"]
    try:
        result = getattr(ext, consumer)(c)
        error = None
    except (TypeError, BufferError) as e:
        result, error = None, e
    del c
    assert ext.producer_counts() == (created0 + 1, deleted0 + 1), d
    msg = str(error)
    defect = d["defect"]
    if defect is not None:
        assert error is not None, (d, result)
        expected = {
            "neg_extent": (BufferError, "extent -"),
            "huge_stride": (BufferError, "the strides reach beyond the address space|wraps around"),
            "null_data": (BufferError, "data is NULL for a non-empty array"),
            "offset_wrap": (BufferError, "overflows"),
            "version": (BufferError, f"unsupported DLPack version {d['major']}.{d['minor']} "),
            "dtype": (TypeError, f"unsupported dtype (code={d['code']}, bits={d['bits']}, lanes={d['lanes']})"),
            "device": (TypeError, "unsupported device (device_type="),
        }[defect]
        assert type(error) is expected[0] and any(m in msg for m in expected[1].split("|")), (d, msg)
        return
    on_cpu = d["device"] == (1, 0)
    if consumer == "describe":
        assert error is None, (d, msg)
        name = SUPPORTED[(d["code"], d["bits"])]
        # A legacy capsule cannot say whether it may be written: read-only.
        read_only = not d["versioned"] or d["flags"] & 1 == 1
        assert result == (shape, strides, name, d["device"], read_only,
                          contiguous(shape, strides, True), contiguous(shape, strides, False)), d
    elif not on_cpu:
        assert type(error) is TypeError and "expected device cpu, got" in msg, (d, msg)
    elif consumer == "values":
        assert error is None, (d, msg)
        want = model_elements(buf, d["code"], d["bits"], shape,
                              [s * itemsize for s in strides], d["start"])
        assert len(result) == len(want) and all(map(same, result, want)), (d, result, want)
    else:  # zero_bytes: writable, C order
        if not contiguous(shape, strides, True):
            assert type(error) is TypeError and "C-contiguous" in msg, (d, msg)
        elif not d["versioned"]:
            assert type(error) is TypeError and "legacy DLPack capsule" in msg, (d, msg)
        elif d["flags"] & 1:
            assert type(error) is TypeError and "read-only" in msg, (d, msg)
        else:
            assert error is None, (d, msg)
            assert result == int(np.prod(shape)) * itemsize


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(descriptions())
def check_generated_descriptions(d):
    check_description(d)


@pytest.mark.slow
def test_generated_capsules_match_the_numpy_model():
    before = CASES[0]
    check_generated_descriptions()
    ran = CASES[0] - before
    print(f"\n{ran} generated capsule descriptions checked")
    assert ran >= EXAMPLES


# Producers that return junk

class ReturnsEachCall:
    def __init__(self, make):
        self.make = make
        self.calls = 0

    def __dlpack__(self, **kwargs):
        self.calls += 1
        return self.make()

    def __dlpack_device__(self):
        return (1, 0)


# Capsules from the test producer, field by field

@pytest.mark.hostile
@pytest.mark.parametrize("versioned", [True, False])
def test_zero_d(versioned):
    with deleters_balanced(4):
        v = np.float64(2.5).tobytes()
        assert ext.scalar_f64(ext.make_capsule(v, [], None, versioned=versioned)) == 2.5
        assert ext.scalar_f64(ext.make_capsule(v, [], [], versioned=versioned)) == 2.5
        assert ext.values(ext.make_capsule(v, [], None, versioned=versioned, byte_offset=0)) == [2.5]
        # A 0-d array has one element: NULL data is refused.
        with pytest.raises(BufferError, match="data is NULL for a non-empty array"):
            ext.values(ext.make_capsule(v, [], None, null_data=True, versioned=versioned))


@pytest.mark.hostile
@pytest.mark.parametrize("ndim", [64, 65, 100, 1000])
def test_many_dimensions_any_strides_and_overflowing_counts(ndim):
    shape = [1] * (ndim - 1) + [3]
    data = np.arange(3.0).tobytes()
    with deleters_balanced(4):
        assert ext.values(ext.make_capsule(data, shape, [7] * (ndim - 1) + [1])) == [0.0, 1.0, 2.0]
        assert ext.values(ext.make_capsule(data, shape, None, versioned=False)) == [0.0, 1.0, 2.0]
        d = ext.describe(ext.make_capsule(data, shape, None))
        assert d[0] == shape and d[1] == [3] * (ndim - 1) + [1] and d[5] and d[6]  # extent-1 dims ignored
        # Many extents of 2: the element count overflows.
        with pytest.raises(BufferError, match="invalid array"):
            ext.values(ext.make_capsule(data, [2] * ndim, [1] * ndim))


@pytest.mark.hostile
@pytest.mark.parametrize(
    "shape,strides,start,expect",
    [
        ([3], [0], 0, [0.0, 0.0, 0.0]),                        # zero stride
        ([2, 3], [0, 1], 0, [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]),  # a broadcast row
        ([4], [-1], 3, [3.0, 2.0, 1.0, 0.0]),                  # negative
        ([2, 2], [-2, -1], 3, [3.0, 2.0, 1.0, 0.0]),
        ([2, 2], [1, 1], 0, [0.0, 1.0, 1.0, 2.0]),             # self-overlapping
        ([1], [2**62], 0, [0.0]),                              # huge, on extent 1
        ([1, 2], [-(2**62), 1], 0, [0.0, 1.0]),
        ([0], [2**62], 0, []),                                 # huge, on an empty array
        ([3, 0], [2**63 - 1, -(2**63)], 0, []),
    ],
)
def test_legal_odd_strides(shape, strides, start, expect):
    data = np.arange(4.0).tobytes()
    with deleters_balanced(2):
        for versioned in (True, False):
            c = ext.make_capsule(data, shape, strides, data_offset=start * 8, versioned=versioned)
            assert ext.values(c) == expect


@pytest.mark.hostile
@pytest.mark.parametrize(
    "shape,strides,fields,message",
    [
        ([3], [2**62], {}, "beyond the address space"),
        ([2], [2**63 - 1], {}, "beyond the address space"),
        ([2], [-(2**63)], {}, "beyond the address space"),
        ([2, 2], [2**61, 2**61], {}, "beyond the address space"),
        ([2], [-(2**50)], {}, "wraps around"),
        ([2**62, 4], None, {}, "overflow"),
        ([2**63 - 1], [1], {}, "beyond the address space"),
        ([-1], [1], {}, "extent -1 in dimension 0"),
        ([3, -(2**63)], [1, 1], {}, "extent -9223372036854775808 in dimension 1"),
        ([2], [1], dict(byte_offset=2**64 - 1), "overflows"),
        ([2], [1], dict(byte_offset=2**64 - 16), "overflows"),
        ([2], [1], dict(null_data=True), "data is NULL"),
        ([2], [1], dict(null_data=True, byte_offset=64), "data is NULL"),
        ([1], [1], dict(ndim=-1), "ndim is -1"),
        ([1], [1], dict(ndim=-(2**31)), "ndim is -2147483648"),
    ],
)
@pytest.mark.parametrize("versioned", [True, False])
def test_impossible_fields_are_refused(shape, strides, fields, message, versioned):
    with deleters_balanced(1):
        c = ext.make_capsule(bytes(64), shape, strides, versioned=versioned, **fields)
        with pytest.raises(BufferError, match="the producer described an invalid array") as info:
            ext.values(c)
        assert message in str(info.value)


@pytest.mark.hostile
def test_null_data_on_an_empty_array_or_a_device():
    with deleters_balanced(3):
        assert ext.values(ext.make_capsule(b"", [0, 5], None, null_data=True)) == []
        # Device memory is never read, so NULL is its business.
        c = ext.make_capsule(b"", [4], [1], null_data=True, device=(2, 0))
        assert ext.describe(c)[0] == [4]
        c = ext.make_capsule(b"", [4], [1], null_data=True, device=(2, 0), dtype=(2, 32, 1))
        with pytest.raises(ValueError, match="not in memory the CPU can access"):
            ext.device_to_vec(c)


@pytest.mark.hostile
def test_byte_offsets_unaligned_and_split():
    raw = np.arange(8.0).tobytes()
    with deleters_balanced(4):
        # data at byte 3, byte_offset 5: element 0 is element 1 of `raw`.
        c = ext.make_capsule(raw, [3], [1], data_offset=3, byte_offset=5)
        assert ext.values(c) == [1.0, 2.0, 3.0]
        # An unaligned element 0: a `TensorDyn` reads it through unaligned
        # loads; a `TensorRef`, whose accessors hand out references, reads an
        # aligned copy of what the capsule's one read described.
        buf = b"\0" + raw
        c = ext.make_capsule(buf, [2], [1], byte_offset=1)
        assert ext.values(c) == [0.0, 1.0]
        for f in (ext.slice_f64, ext.ndarray_f64):
            c = ext.make_capsule(buf, [2], [1], byte_offset=1)
            assert f(c) == [0.0, 1.0]


# Every dtype class: (code, bits, lanes) over the codes of DLPack 1.3 and
# beyond, odd widths and vector lanes. Those of the dtype table's rows
# (lanes 1) must read correctly, every other one (the sub-byte float6 and
# float4 codes, 15 to 17, among them) must be refused with its raw fields.
CODES = list(range(0, 21)) + [127, 255]
BITS = [0, 1, 4, 6, 8, 16, 32, 64, 128, 255]
LANES = [0, 1, 2, 4, 65535]
RAW = bytes(range(7, 7 + 48))  # no NaNs or infinities at any width


def model_values(code, bits, raw, n):
    """What `ext.values` must return for `n` elements at the start of `raw`."""
    name = SUPPORTED[(code, bits)]
    return facts_table.python_values(name, np.frombuffer(raw, facts_table.element_dtype(name), n))


def test_every_row_is_a_dtype_class():
    # A row whose (code, bits) the sweep below does not reach would go
    # untested there.
    assert set(SUPPORTED) <= set(itertools.product(CODES, BITS)), SUPPORTED


@pytest.mark.hostile
def test_every_dtype_class():
    combos = list(itertools.product(CODES, BITS, LANES))
    with deleters_balanced(len(combos)):
        for code, bits, lanes in combos:
            c = ext.make_capsule(RAW, [3], [1], dtype=(code, bits, lanes), versioned=lanes % 2 == 0)
            if lanes == 1 and (code, bits) in SUPPORTED:
                assert ext.values(c) == model_values(code, bits, RAW, 3), (code, bits)
            else:
                with pytest.raises(TypeError, match=rf"argument 'x': unsupported dtype \(code={code}, bits={bits}, lanes={lanes}\)"):
                    ext.values(c)


DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal",
                9: "vpi", 10: "rocm", 11: "rocm_host", 12: "ext_dev", 13: "cuda_managed",
                14: "oneapi", 15: "webgpu", 16: "hexagon", 17: "maia", 18: "trn", 19: "tpu",
                20: "tpu_host"}


@pytest.mark.hostile
@pytest.mark.parametrize("device_type", [0, 5, 6, 21, 22, 100, 2**31 - 1, 2**31, 2**32 - 1])
def test_unknown_device_types_are_refused(device_type):
    as_i32 = device_type - 2**32 if device_type >= 2**31 else device_type
    with deleters_balanced(2):
        for versioned in (True, False):
            c = ext.make_capsule(bytes(8), [1], [1], device=(device_type, 3), versioned=versioned)
            with pytest.raises(TypeError, match=rf"unsupported device \(device_type={as_i32}, device_id=3\)"):
                ext.describe(c)


@pytest.mark.hostile
@pytest.mark.parametrize("device_type", sorted(DEVICE_NAMES))
def test_known_device_types(device_type):
    # A fake device pointer (data_offset far outside the backing buffer)
    # is never read unless the device is host memory.
    host = device_type in (1, 3, 11, 13)
    with deleters_balanced(2):
        c = ext.make_capsule(bytes(16), [2], [1], device=(device_type, 1),
                             data_offset=0 if host else 2**40)
        assert ext.describe(c)[3] == (device_type, 1)
        c = ext.make_capsule(bytes(16), [2], [1], device=(device_type, 1))
        if device_type == 1:
            assert ext.values(c) == [0.0, 0.0]
        else:
            with pytest.raises(TypeError, match=f"expected device cpu, got {DEVICE_NAMES[device_type]}:1"):
                ext.values(c)


@pytest.mark.hostile
@pytest.mark.parametrize("major", [0, 2, 3, 99, 2**32 - 1])
@pytest.mark.parametrize("minor", [0, 1, 2**32 - 1])
def test_unsupported_major_versions_are_refused_after_the_deleter(major, minor):
    with deleters_balanced(1):
        # Garbage everywhere after the header: none of it is read.
        c = ext.make_capsule(b"", [-7], [3], version=(major, minor), ndim=-5,
                             dtype=(200, 3, 0), device=(99, -1), null_data=True,
                             byte_offset=2**64 - 1)
        with pytest.raises(BufferError, match=rf"unsupported DLPack version {major}\.{minor} "):
            ext.values(c)


@pytest.mark.hostile
@pytest.mark.parametrize("minor", [0, 1, 2, 3, 4, 99, 2**32 - 1])
def test_major_version_1_any_minor(minor):
    with deleters_balanced(1):
        assert ext.values(capsule(np.arange(2.0), version=(1, minor))) == [0.0, 1.0]


@pytest.mark.hostile
@pytest.mark.parametrize(
    "flags,read_only",
    [(0, False), (1, True), (2, False), (3, True), (4, False), (2**63, False),
     (2**64 - 1, True), (2**64 - 2, False)],
)
def test_flags(flags, read_only):
    with deleters_balanced(3):
        assert ext.describe(capsule(np.arange(2.0), flags=flags))[4] is read_only
        out = capsule(np.arange(2.0), flags=flags)
        if read_only:
            with pytest.raises(TypeError, match="read-only"):
                ext.fill_f64(out, 1.0)
        else:
            ext.fill_f64(out, 1.0)
        # Legacy capsules carry no flags: they cannot say whether they may
        # be written, so a raw one is read-only whatever it holds.
        assert ext.describe(capsule(np.arange(2.0), versioned=False))[4] is True


@pytest.mark.hostile
def test_null_deleter_is_never_called():
    created0, deleted0 = ext.producer_counts()
    for versioned in (True, False):
        c = ext.make_capsule(np.arange(2.0).tobytes(), [2], [1], null_deleter=True, versioned=versioned)
        assert ext.values(c) == [0.0, 1.0]
        # Error paths too.
        c = ext.make_capsule(b"", [-1], [1], null_deleter=True, versioned=versioned)
        with pytest.raises(BufferError):
            ext.values(c)
    c = ext.make_capsule(b"", [1], [1], null_deleter=True, version=(2, 0))
    with pytest.raises(BufferError, match="version 2.0"):
        ext.values(c)
    assert ext.producer_counts() == (created0 + 5, deleted0)


@pytest.mark.hostile
def test_capsules_passed_directly_and_through_dlpack_writable_only_if_versioned():
    with deleters_balanced(8):
        for versioned in (True, False):
            data = np.arange(4.0)
            assert ext.values(capsule(data, versioned=versioned)) == data.tolist()
            assert ext.values(ReturnsEachCall(lambda: capsule(data, versioned=versioned))) == data.tolist()
            c = capsule(data, versioned=versioned)
            p = ReturnsEachCall(lambda: capsule(data, versioned=versioned))
            if versioned:
                ext.fill_f64(c, 9.0)  # writes into the producer's own copy
                ext.fill_f64(p, 9.0)
                continue
            # A legacy capsule cannot say whether it may be written: a raw
            # one, or an unknown producer's answer to a versioned request,
            # is read-only; the refusal says how it came and what to pass.
            with pytest.raises(TypeError, match=r"passed as a legacy DLPack capsule.*versioned capsule"):
                ext.fill_f64(c, 9.0)
            with pytest.raises(TypeError, match=r"exported by its producer as a legacy DLPack capsule"):
                ext.fill_f64(p, 9.0)


def test_major_version_2_refused_and_deleted():
    with deleters_balanced(2):
        c = capsule(np.arange(3.0), version=(2, 0))
        with pytest.raises(BufferError, match=r"unsupported DLPack version 2\.0"):
            ext.values(c)
        # Nothing else is read: even garbage fields after the header.
        c = ext.make_capsule(b"", [-5], [7], version=(2, 1), ndim=-3, dtype=(99, 3, 9), device=(77, 0))
        with pytest.raises(BufferError, match="version 2.1"):
            ext.values(c)


# --- devices whose data is an opaque handle ---------------------------------


def dlpack_fields(cap):
    """`(data, byte_offset, device_type)` of a versioned capsule, unconsumed."""
    import ctypes

    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    p = get(cap, b"dltensor_versioned")
    # DLManagedTensorVersioned: version (8 bytes), manager_ctx, deleter,
    # flags, then the DLTensor: data at 32, device at 40, byte_offset at 72.
    return (
        ctypes.c_void_p.from_address(p + 32).value,
        ctypes.c_uint64.from_address(p + 72).value,
        ctypes.c_int32.from_address(p + 40).value,
    )


@pytest.mark.parametrize("device_type", [4, 7, 8], ids=["opencl", "vulkan", "metal"])
def test_opaque_handle_keeps_its_byte_offset_apart(device_type):
    # DLPack: on OpenCL, Vulkan and Metal `data` is a handle (cl_mem,
    # VkBuffer, MTLBuffer); `data + byte_offset` is no address. The view's
    # data_ptr() is the handle, byte_offset() the offset, moved by slicing.
    with deleters_balanced():
        cap = ext.make_capsule(bytes(32), [4], None, device=(device_type, 0), byte_offset=8)
        handle = dlpack_fields(cap)[0]
        (ptr, off, dt), (sliced_ptr, sliced_off) = ext.body_offsets(cap)
        assert (ptr, off, dt) == (handle, 8, device_type)
        assert (sliced_ptr, sliced_off) == (handle, 16)
        # Returned, the sliced view is exported with the handle and the offset.
        cap = ext.make_capsule(bytes(32), [4], None, device=(device_type, 0), byte_offset=8)
        handle = dlpack_fields(cap)[0]
        tail = ext.body_tail(cap)
        assert dlpack_fields(tail.__dlpack__(max_version=(1, 0))) == (handle, 16, device_type)
        del tail


def test_byte_offset_is_folded_into_addresses_elsewhere():
    with deleters_balanced():
        cap = ext.make_capsule(bytes(32), [3], None, byte_offset=8)
        data = dlpack_fields(cap)[0]
        (ptr, off, dt), (sliced_ptr, sliced_off) = ext.body_offsets(cap)
        assert (ptr, off, dt) == (data + 8, 0, 1)
        assert (sliced_ptr, sliced_off) == (data + 16, 0)


def test_from_raw_parts_with_offset_exports_the_offset_apart():
    # `Tensor::from_raw_parts_with_offset` on OpenCL: the export carries the
    # handle and the offset, and dlcast imports them back as they were.
    a = ext.body_opencl_tensor(0x1000, 16, 4)
    assert dlpack_fields(a.__dlpack__(max_version=(1, 0))) == (0x1000, 16, 4)
    assert ext.body_offsets(a) == ((0x1000, 16, 4), (0x1000, 20))
    # On the CPU the offset is added to the address.
    t, base = ext.body_cpu_offset_tensor(8)
    assert t.ctypes.data == base + 8 and t.tolist() == [3.0, 4.0]
