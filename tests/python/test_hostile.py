"""Hostile producers (issue 6: never crash, never leak): `__dlpack__`
methods that raise, return junk or lie, and capsules from the test producer
with every field at its edge. Every case ends in a Python exception or in
correct values, and every capsule made has its deleter run exactly once.

NumPy only (no torch or JAX imports), so that `make sanitize` can run this
file under valgrind."""

import itertools

import numpy as np
import pytest

import dlcast_testext as ext
from conftest import FROM_OBJ, OWNED, ApiC, HeaderC, capsule, deleters_balanced, owning_export

# ---------------------------------------------------------------------------
# Producers whose __dlpack__ raises


class Raises:
    """`__dlpack__` raises `exc` (a fresh instance per call); counts calls
    and records the keywords of each."""

    def __init__(self, exc_type, msg="hostile producer"):
        self.exc_type = exc_type
        self.msg = msg
        self.calls = []

    def __dlpack__(self, *args, **kwargs):
        self.calls.append(kwargs)
        raise self.exc_type(self.msg)

    def __dlpack_device__(self):
        return (1, 0)


WRAPPED = [BufferError, ValueError, RuntimeError, AssertionError, OSError, LookupError,
           ZeroDivisionError, NotImplementedError, RecursionError, Exception,
           UnicodeDecodeError.__base__, AttributeError]


@pytest.mark.parametrize("exc_type", WRAPPED, ids=lambda e: e.__name__)
def test_raising_producer_becomes_buffer_error_naming_the_parameter(exc_type):
    p = Raises(exc_type)
    out = np.zeros(3)
    with pytest.raises(BufferError) as info:
        ext.copy_into(p, out)
    msg = str(info.value)
    assert msg.startswith("copy_into(): argument 'src': the producer's __dlpack__() raised"), msg
    assert "hostile producer" in msg
    assert type(info.value.__cause__) is exc_type
    assert str(info.value.__cause__) == "hostile producer"
    # Asked once, with max_version (no retry for anything but TypeError).
    assert p.calls == [{"max_version": (1, 3)}]
    assert out.tolist() == [0.0, 0.0, 0.0]


def test_type_error_is_retried_once_without_keywords_then_reported():
    p = Raises(TypeError, "no max_version here")
    with pytest.raises(BufferError) as info:
        ext.values(p)
    assert p.calls == [{"max_version": (1, 3)}, {}]
    assert str(info.value).startswith("values(): argument 'x': the producer's __dlpack__() raised")
    assert type(info.value.__cause__) is TypeError
    assert "no max_version here" in str(info.value)


class TypeErrorThenRaises:
    """Refuses `max_version` with TypeError, then raises `second` without it."""

    def __init__(self, second):
        self.second = second
        self.calls = 0

    def __dlpack__(self, **kwargs):
        self.calls += 1
        if kwargs:
            raise TypeError("unexpected keyword 'max_version'")
        raise self.second


@pytest.mark.parametrize("second", [ValueError("second call"), BufferError("second call")])
def test_retry_reports_the_second_error(second):
    p = TypeErrorThenRaises(second)
    with pytest.raises(BufferError) as info:
        ext.values(p)
    assert p.calls == 2
    assert info.value.__cause__ is second


@pytest.mark.parametrize("second", [KeyboardInterrupt, MemoryError])
def test_retry_lets_interrupts_through(second):
    exc = second("from the retry")
    with pytest.raises(second) as info:
        ext.values(TypeErrorThenRaises(exc))
    assert info.value is exc


@pytest.mark.parametrize("exc_type", [KeyboardInterrupt, MemoryError, SystemExit, GeneratorExit])
def test_interrupts_and_memory_errors_propagate_unchanged(exc_type):
    exc = exc_type("stop")

    class P:
        def __dlpack__(self, **kw):
            raise exc

    with pytest.raises(exc_type) as info:
        ext.centroid(P(), np.ones(1, np.float32))
    assert info.value is exc
    assert info.value.__cause__ is None
    # Subclasses too.
    sub = type("Sub" + exc_type.__name__, (exc_type,), {})
    with pytest.raises(sub):
        ext.values(Raises(sub))


def test_exception_whose_str_raises():
    class BadStr(Exception):
        def __str__(self):
            raise RuntimeError("str() failed too")

    with pytest.raises(BufferError, match=r"raised \S*BadStr: <exception str\(\) failed>") as info:
        ext.values(Raises(BadStr))
    assert type(info.value.__cause__) is BadStr


def test_reentrant_producer():
    class Reenters:
        def __dlpack__(self, **kw):
            # Another dlcast call (and another import) inside the import.
            assert ext.values(np.arange(2.0)) == [0.0, 1.0]
            assert ext.values(capsule(np.arange(1.0))) == [0.0]
            return capsule(np.arange(3.0))

    with deleters_balanced(4):
        out = np.zeros(3)
        ext.copy_into(Reenters(), out)
        assert out.tolist() == [0.0, 1.0, 2.0]
        ext.add_one_into(Reenters(), out)
        assert out.tolist() == [1.0, 2.0, 3.0]


def test_dlpack_not_callable_and_attribute_errors():
    class NotCallable:
        __dlpack__ = 3

    with pytest.raises(BufferError) as info:
        ext.values(NotCallable())
    assert isinstance(info.value.__cause__, TypeError)

    class RaisesAttributeError:
        def __dlpack__(self, **kw):
            raise AttributeError("inside __dlpack__")

    # __dlpack__ exists, so its AttributeError is the producer's error.
    with pytest.raises(BufferError) as info:
        ext.values(RaisesAttributeError())
    assert isinstance(info.value.__cause__, AttributeError)

    class PropertyRaises:
        @property
        def __dlpack__(self):
            raise AttributeError("no dlpack after all")

    # hasattr() is False: not an array at all.
    with pytest.raises(TypeError, match="expected an array"):
        ext.values(PropertyRaises())


# ---------------------------------------------------------------------------
# Producers that return junk


class Returns:
    def __init__(self, make):
        self.make = make
        self.calls = 0

    def __dlpack__(self, **kwargs):
        self.calls += 1
        return self.make()

    def __dlpack_device__(self):
        return (1, 0)


@pytest.mark.parametrize(
    "value,name",
    [(None, "NoneType"), (3, "int"), ("dltensor", "str"), (b"\0" * 64, "bytes"),
     (np.zeros(2), "ndarray"), (memoryview(b"ab"), "memoryview"), (object(), "object")],
)
def test_dlpack_returning_a_non_capsule(value, name):
    with pytest.raises(BufferError, match=rf"argument 'x': __dlpack__\(\) returned {name}, not a DLPack capsule"):
        ext.values(Returns(lambda: value))


def test_dlpack_returning_a_used_capsule():
    with deleters_balanced(2):
        for versioned in (True, False):
            c = capsule(np.arange(3.0), versioned=versioned)
            assert ext.values(c) == [0.0, 1.0, 2.0]
            with pytest.raises(BufferError, match="argument 'x': the DLPack capsule was already consumed"):
                ext.values(Returns(lambda: c))
    # A capsule consumed by NumPy itself.
    c = np.arange(2.0).__dlpack__()
    np.from_dlpack(Returns(lambda: c))
    with pytest.raises(BufferError, match="already consumed"):
        ext.values(Returns(lambda: c))


@pytest.mark.parametrize("name", ["", "DLTENSOR", "dltensor ", "dltensor_versioned_x", "used_",
                                  "used_dltensor_x", "dlpack_exchange_api", "é"])
def test_dlpack_returning_a_capsule_with_a_wrong_name(name):
    with deleters_balanced(1):
        c = ext.make_capsule(bytes(8), [1], [1], name=name)
        deleted0 = ext.producer_counts()[1]
        with pytest.raises(BufferError, match="is not a DLPack capsule"):
            ext.values(Returns(lambda: c))
        with pytest.raises(BufferError, match="is not a DLPack capsule"):
            ext.values(c)
        # dlcast left it alone (no rename, no deleter): the producer's own
        # capsule destructor frees it when the capsule dies.
        assert ext.producer_counts()[1] == deleted0
        del c


def test_dlpack_returning_a_fresh_capsule_each_time_is_consumed_each_time():
    with deleters_balanced(10):
        p = Returns(lambda: capsule(np.arange(4.0)))
        for _ in range(10):
            assert ext.values(p) == [0.0, 1.0, 2.0, 3.0]
        assert p.calls == 10


# ---------------------------------------------------------------------------
# Producers that lie about the device: dlcast trusts the capsule.


class LyingDevice:
    def __init__(self, claimed, make):
        self.claimed = claimed
        self.make = make
        self.device_calls = 0

    def __dlpack__(self, **kwargs):
        return self.make()

    def __dlpack_device__(self):
        self.device_calls += 1
        return self.claimed


def test_capsule_device_wins_over_dlpack_device():
    data = np.arange(3.0)
    with deleters_balanced(4):
        # Claims CPU, sends CUDA: the CPU-only parameter never asks the
        # device and refuses it (its memory is never read); a CUDA parameter
        # asks, passes stream=None as told, and then refuses CUDA memory
        # that was never synchronised (case C16).
        p = LyingDevice((1, 0), lambda: capsule(data, device=(2, 0)))
        with pytest.raises(TypeError, match=r"values\(\): argument 'x': expected device cpu, got cuda:0"):
            ext.values(p)
        assert p.device_calls == 0
        with pytest.raises(BufferError, match=r"cuda_only\(\): argument 'x': .*__dlpack_device__\(\) said cpu, "
                                              r"but the capsule describes memory on cuda:0"):
            ext.cuda_only(p)
        assert p.device_calls == 1
        # Claims CUDA, sends CPU: read as the CPU array it is.
        q = LyingDevice((2, 0), lambda: capsule(data, device=(1, 0)))
        assert ext.values(q) == [0.0, 1.0, 2.0]
        assert q.device_calls == 0
        with pytest.raises(TypeError, match="expected device cuda, got cpu"):
            ext.cuda_only(q)
        assert q.device_calls == 1


def test_dlpack_device_that_raises_is_never_asked():
    class P:
        def __dlpack__(self, **kwargs):
            return np.arange(2.0).__dlpack__(**kwargs)

        def __dlpack_device__(self):
            raise RuntimeError("never called")

    assert ext.values(P()) == [0.0, 1.0]


# ---------------------------------------------------------------------------
# Producers that succeed once, then fail


class OnceThenFails:
    def __init__(self, make, exc):
        self.make = make
        self.exc = exc
        self.calls = 0

    def __dlpack__(self, **kwargs):
        self.calls += 1
        if self.calls > 1:
            raise self.exc
        return self.make()


def test_succeeds_once_then_fails():
    with deleters_balanced(1):
        p = OnceThenFails(lambda: capsule(np.arange(3.0)), BufferError("gone"))
        assert ext.values(p) == [0.0, 1.0, 2.0]
        with pytest.raises(BufferError, match="argument 'x': the producer's __dlpack__\\(\\) raised BufferError: gone"):
            ext.values(p)


def test_failure_on_a_later_parameter_releases_the_earlier_ones():
    # The same producer for both parameters: the first import succeeds
    # (its capsule must still be freed), the second raises.
    with deleters_balanced(1):
        p = OnceThenFails(lambda: capsule(np.ones((2, 3), np.float32)), ValueError("no more"))
        with pytest.raises(BufferError) as info:
            ext.centroid(p, p)
        assert str(info.value).startswith("centroid(): argument 'weights': the producer's __dlpack__() raised")
    with deleters_balanced(1):
        p = OnceThenFails(lambda: capsule(np.ones(2)), KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            ext.copy_into(p, p)
    # A later parameter failing a check, the first one imported fine.
    with deleters_balanced(2):
        with pytest.raises(TypeError, match="dimension 'n' is 2 in 'points' but 3 in 'weights'"):
            ext.centroid(capsule(np.ones((2, 3), np.float32)), capsule(np.ones(3, np.float32)))


def test_producer_returning_the_same_capsule_for_two_parameters():
    with deleters_balanced(1):
        c = capsule(np.ones((2, 3), np.float32))
        with pytest.raises(BufferError, match="argument 'weights': the DLPack capsule was already consumed"):
            ext.centroid(c, c)


# ---------------------------------------------------------------------------
# Capsules from the test producer, field by field


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


@pytest.mark.parametrize("ndim", [64, 65, 100, 1000])
def test_many_dimensions(ndim):
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


def test_null_data_on_an_empty_array_or_a_device():
    with deleters_balanced(3):
        assert ext.values(ext.make_capsule(b"", [0, 5], None, null_data=True)) == []
        # Device memory is never read, so NULL is its business.
        c = ext.make_capsule(b"", [4], [1], null_data=True, device=(2, 0))
        assert ext.describe(c)[0] == [4]
        c = ext.make_capsule(b"", [4], [1], null_data=True, device=(2, 0), dtype=(2, 32, 1))
        with pytest.raises(ValueError, match="not in memory the CPU can access"):
            ext.device_to_vec(c)


def test_byte_offsets_unaligned_and_split():
    raw = np.arange(8.0).tobytes()
    with deleters_balanced(4):
        # data at byte 3, byte_offset 5: element 0 is element 1 of `raw`.
        c = ext.make_capsule(raw, [3], [1], data_offset=3, byte_offset=5)
        assert ext.values(c) == [1.0, 2.0, 3.0]
        # An unaligned element 0: read through unaligned loads, no slice.
        buf = b"\0" + raw
        c = ext.make_capsule(buf, [2], [1], byte_offset=1)
        assert ext.values(c) == [0.0, 1.0]
        c = ext.make_capsule(buf, [2], [1], byte_offset=1)
        assert ext.slice_f64(c) is None
        c = ext.make_capsule(buf, [2], [1], byte_offset=1)
        with pytest.raises(ValueError, match="not aligned"):
            ext.ndarray_f64(c)


# Every dtype class: (code, bits, lanes) over the codes of DLPack 1.3 and
# beyond, odd widths and vector lanes. Supported ones must read correctly,
# every other one must be refused with its raw fields.
SUPPORTED = {
    (0, 8): np.int8, (0, 16): np.int16, (0, 32): np.int32, (0, 64): np.int64,
    (1, 8): np.uint8, (1, 16): np.uint16, (1, 32): np.uint32, (1, 64): np.uint64,
    (2, 16): np.float16, (2, 32): np.float32, (2, 64): np.float64,
    (4, 16): "bfloat16", (5, 64): np.complex64, (5, 128): np.complex128, (6, 8): "bool",
}
CODES = list(range(0, 21)) + [127, 255]
BITS = [0, 1, 4, 6, 8, 16, 32, 64, 128, 255]
LANES = [0, 1, 2, 4, 65535]
RAW = bytes(range(7, 7 + 48))  # no NaNs or infinities at any width


def model_values(code, bits, raw, n):
    """What `ext.values` must return for `n` elements at the start of `raw`."""
    kind = SUPPORTED[(code, bits)]
    if kind == "bool":
        return [b != 0 for b in raw[:n]]
    if kind == "bfloat16":
        u = np.frombuffer(raw, np.uint16, n).astype(np.uint32) << 16
        return u.view(np.float32).astype(np.float64).tolist()
    a = np.frombuffer(raw, kind, n)
    if a.dtype.kind == "f":
        a = a.astype(np.float64)
    return a.tolist()


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


@pytest.mark.parametrize("device_type", [0, 5, 6, 21, 22, 100, 2**31 - 1, 2**31, 2**32 - 1])
def test_unknown_device_types_are_refused(device_type):
    as_i32 = device_type - 2**32 if device_type >= 2**31 else device_type
    with deleters_balanced(2):
        for versioned in (True, False):
            c = ext.make_capsule(bytes(8), [1], [1], device=(device_type, 3), versioned=versioned)
            with pytest.raises(TypeError, match=rf"unsupported device \(device_type={as_i32}, device_id=3\)"):
                ext.describe(c)


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


@pytest.mark.parametrize("minor", [0, 1, 2, 3, 4, 99, 2**32 - 1])
def test_major_version_1_any_minor(minor):
    with deleters_balanced(1):
        assert ext.values(capsule(np.arange(2.0), version=(1, minor))) == [0.0, 1.0]


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
        # Legacy capsules carry no flags: never read-only.
        assert ext.describe(capsule(np.arange(2.0), versioned=False))[4] is False


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


def test_capsules_passed_directly_and_through_dlpack_and_as_writable():
    with deleters_balanced(6):
        for versioned in (True, False):
            data = np.arange(4.0)
            assert ext.values(capsule(data, versioned=versioned)) == data.tolist()
            assert ext.values(Returns(lambda: capsule(data, versioned=versioned))) == data.tolist()
            c = capsule(data, versioned=versioned)
            ext.fill_f64(c, 9.0)  # writes into the producer's own copy


# ---------------------------------------------------------------------------
# Hostile DLPack C exchange API tables (`__dlpack_c_exchange_api__`), built
# with ctypes. The tables stay alive for the process, as the header requires.

import ctypes
import gc


_KEEP = []  # tables, callbacks, shapes and data: alive for the process
_CAPSULE_NEW = ctypes.pythonapi.PyCapsule_New
_CAPSULE_NEW.restype = ctypes.py_object
_CAPSULE_NEW.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def exchange_type(api, fallback=None):
    """A new type publishing `api` (a ctypes struct) as its exchange API;
    its `__dlpack__` returns `fallback()` (or raises if there is none)."""
    name = b"dlpack_exchange_api"
    _KEEP.extend([api, name])
    cap = _CAPSULE_NEW(ctypes.addressof(api), name, None)

    def __dlpack__(self, **kw):
        if fallback is None:
            raise BufferError("no __dlpack__ fallback")
        return fallback()

    return type("Exchanged", (), {"__dlpack_c_exchange_api__": cap, "__dlpack__": __dlpack__})


def table(major, fill=None, result=0, prev=None, owning=True):
    """A version-`major` table whose dltensor_from_py_object_no_sync runs
    `fill(out)` and returns `result` (NULL if `fill` is None), and whose
    managed_tensor_from_py_object_no_sync (unless not `owning`) returns an
    owning tensor that `fill` describes."""
    if fill is None:
        fn = FROM_OBJ()
    else:
        def body(obj, out):
            fill(out.contents)
            return result
        fn = FROM_OBJ(body)
    api = ApiC()
    api.header.major, api.header.minor = major, 0
    if prev is not None:
        api.header.prev_api = ctypes.cast(ctypes.pointer(prev.header), ctypes.POINTER(HeaderC))
    api.dltensor_from_obj = fn
    if owning and fill is not None:
        api.managed_from_obj = owning_export(fill)
    _KEEP.extend([fn, api, prev, api.managed_from_obj])
    return api


def describing(values, shape, strides, device_type=1, ndim=None, code=2, bits=64, byte_offset=0):
    """A `fill` describing float64 `values` (kept alive) with this layout."""
    data = np.asarray(values, np.float64).copy()
    sh = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    st = None if strides is None else (ctypes.c_int64 * max(len(strides), 1))(*strides)
    _KEEP.extend([data, sh, st])

    def fill(t):
        t.data = data.ctypes.data
        t.device_type, t.device_id = device_type, 0
        t.ndim = len(shape) if ndim is None else ndim
        t.code, t.bits, t.lanes = code, bits, 1
        t.shape = sh
        t.strides = st
        t.byte_offset = byte_offset

    return fill


def test_exchange_api_hostile_tables():
    fallback = lambda: capsule(np.arange(2.0))  # noqa: E731
    with deleters_balanced():
        # Major version 2 only: no usable table, the generic path is taken.
        t = exchange_type(table(2, describing([5.0], [1], [1])), fallback)()
        assert ext.import_path(t) == "dlpack" and ext.values(t) == [0.0, 1.0]
        # Major 2 chaining to a major-1 table: the older table is used.
        v1 = table(1, describing([7.0, 8.0], [2], [1]))
        t = exchange_type(table(2, None, prev=v1), fallback)()
        assert ext.import_path(t) == "exchange_api" and ext.values(t) == [7.0, 8.0]
        # Major 0, chaining nowhere.
        t = exchange_type(table(0, describing([5.0], [1], [1])), fallback)()
        assert ext.values(t) == [0.0, 1.0]
        # A major-1 table without dltensor_from_py_object_no_sync.
        t = exchange_type(table(1, None), fallback)()
        assert ext.import_path(t) == "dlpack"
        # Device memory goes to the generic path (which synchronises).
        t = exchange_type(table(1, describing([1.0], [1], [1], device_type=2)), fallback)()
        assert ext.import_path(t) == "dlpack"


def test_a_tensor_subclass_with_a_table_of_its_own_is_read_as_a_tensor():
    # A tensor subclass may publish an exchange table of its own (here one
    # that describes other memory); dlcast reads every PyTorch tensor through
    # a private alias and PyTorch's own table, so the tensor's own values
    # are read, and the checks before a writable view (requires_grad
    # refused, the version counter bumped) are PyTorch's.
    import torch

    api = table(1, describing([1.0, 2.0], [2], [1]))
    name = b"dlpack_exchange_api"
    _KEEP.extend([api, name])
    Sub = type("OwnTable", (torch.Tensor,),
               {"__dlpack_c_exchange_api__": _CAPSULE_NEW(ctypes.addressof(api), name, None)})
    t = torch.zeros(2, dtype=torch.float64).as_subclass(Sub)
    assert ext.import_path(t) == "exchange_api" and ext.values(t) == [0.0, 0.0]
    t.requires_grad_(True)
    with pytest.raises(TypeError, match=r"^fill_f64\(\): argument 'out': the tensor requires grad"):
        ext.fill_f64(t, 9.0)
    t = torch.zeros(2, dtype=torch.float64).as_subclass(Sub)
    before = t._version
    ext.fill_f64(t, 9.0)
    assert t._version == before + 1 and t.tolist() == [9.0, 9.0]


def test_exchange_api_failures_and_invalid_descriptions():
    # Fails without setting an exception.
    t = exchange_type(table(1, lambda out: None, result=-1))()
    with pytest.raises(BufferError, match=r"argument 'x': the producer's __dlpack_c_exchange_api__\(\) raised") as info:
        ext.values(t)
    assert "failed without an error" in str(info.value.__cause__)
    # Impossible descriptions are refused like capsules'.
    for fill, message in [
        (describing([1.0], [-3], [1]), "extent -3"),
        (describing([1.0], [1], [1], ndim=-2), "ndim is -2"),
        (describing([1.0], [2], [2**62]), "beyond the address space"),
        (describing([1.0], [1], [1], byte_offset=2**64 - 1), "overflows"),
    ]:
        t = exchange_type(table(1, fill))()
        with pytest.raises(BufferError, match=message):
            ext.values(t)
    t = exchange_type(table(1, describing([1.0], [1], [1], code=2, bits=8)))()
    with pytest.raises(TypeError, match=r"unsupported dtype \(code=2, bits=8, lanes=1\)"):
        ext.values(t)


def test_exchange_api_views_and_writes():
    fill = describing([1.0, 2.0, 3.0, 4.0], [2, 2], [1, 2])
    t = exchange_type(table(1, fill))()
    assert ext.values(t) == [1.0, 3.0, 2.0, 4.0]
    assert ext.describe(t)[:2] == ([2, 2], [1, 2])
    # Another producer's table is asked for an owning tensor before any
    # read (its functions may run Python code): a view of it can be
    # returned, and the owning tensor is freed once, with the last user.
    made, deleted = OWNED["made"], OWNED["deleted"]
    out = np.asarray(ext.identity(t))
    assert out.tolist() == [[1.0, 3.0], [2.0, 4.0]]
    assert OWNED["made"] == made + 1 and OWNED["deleted"] == deleted
    del out
    gc.collect()
    assert OWNED["deleted"] == deleted + 1
    # A table that cannot give an owning tensor is not read (its
    # dltensor_from_py_object_no_sync describes memory valid only until
    # Python code runs): the type's __dlpack__ is used.
    t = exchange_type(table(1, fill, owning=False), lambda: capsule(np.arange(2.0)))()
    assert ext.import_path(t) == "dlpack" and ext.values(t) == [0.0, 1.0]


_CYCLE = """
import ctypes, numpy as np, sys
sys.path.insert(0, {here!r})
from conftest import ApiC, HeaderC, capsule
import dlcast_testext as ext
api = ApiC()
api.header.major = 2
api.header.prev_api = ctypes.cast(ctypes.pointer(api.header), ctypes.POINTER(HeaderC))
new = ctypes.pythonapi.PyCapsule_New
new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
name = b"dlpack_exchange_api"
cap = new(ctypes.addressof(api), name, None)
T = type("Cycles", (), {{"__dlpack_c_exchange_api__": cap,
                        "__dlpack__": lambda self, **kw: capsule(np.arange(2.0))}})
print(ext.import_path(T()), ext.values(T()))
"""


def test_kind10_a_prev_api_chain_that_cycles_ends():
    # A table whose prev_api points back to itself (major 2, so dlcast walks
    # on looking for major 1) once hung the process with the GIL held; the
    # walk is bounded and the type's __dlpack__ is used.
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, DLCAST_NO_JAX="1")
    out = subprocess.run([sys.executable, "-c", _CYCLE.format(here=here)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["dlpack", "[0.0,", "1.0]"]
