"""`__dlpack__` producers: whatever a producer does (raises, is retried,
returns junk, a used capsule or one of another name, lies about its device,
fails on a later call, re-enters dlcast), the call ends in an exception
naming the function and the parameter, interrupts pass unchanged, and every
capsule a producer made is freed exactly once.
"""

import re

import numpy as np
import pytest
import torch

import dlcast_testext as ext
from conftest import capsule, deleters_balanced, run_py


def test_capsule_used_twice():
    with deleters_balanced(1):
        c = capsule(np.arange(3.0))
        assert ext.values(c) == [0.0, 1.0, 2.0]
        with pytest.raises(BufferError, match="already consumed"):
            ext.values(c)
    # A NumPy capsule too.
    c = np.arange(3.0).__dlpack__()
    ext.consume(c)
    with pytest.raises(BufferError, match="argument 'x': the DLPack capsule was already consumed"):
        ext.consume(c)


class OldProducer:
    """A producer whose __dlpack__ predates max_version."""

    def __init__(self, arr):
        self.arr = arr
        self.calls = []

    def __dlpack__(self, stream=None):
        self.calls.append(stream)
        return self.arr.__dlpack__()

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def test_producer_without_max_version():
    p = OldProducer(np.arange(4.0))
    assert ext.values(p) == [0.0, 1.0, 2.0, 3.0]
    assert p.calls == [None]


class FixedCapsuleProducer:
    def __init__(self, make):
        self.make = make
        self.kwargs = None

    def __dlpack__(self, **kwargs):
        self.kwargs = kwargs
        return self.make()


def test_capsule_name_decides_the_struct():
    data = np.arange(5.0)
    with deleters_balanced(2):
        legacy = FixedCapsuleProducer(lambda: capsule(data, versioned=False))
        assert ext.values(legacy) == data.tolist()
        assert legacy.kwargs == {"max_version": (1, 3)}
        versioned = FixedCapsuleProducer(lambda: capsule(data, versioned=True))
        assert ext.values(versioned) == data.tolist()


class RaisingProducer:
    def __init__(self, exc):
        self.exc = exc

    def __dlpack__(self, **kwargs):
        raise self.exc


@pytest.mark.parametrize("exc_type", [BufferError, ValueError, RuntimeError, AssertionError])
def test_producer_exceptions_name_the_parameter(exc_type):
    with pytest.raises(BufferError) as info:
        ext.centroid(RaisingProducer(exc_type("cannot export this")), np.ones(1, np.float32))
    msg = str(info.value)
    assert msg.startswith("centroid(): argument 'points': the producer's __dlpack__() raised")
    assert "cannot export this" in msg
    assert isinstance(info.value.__cause__, exc_type)
    assert str(info.value.__cause__) == "cannot export this"


def test_real_producer_refusals():
    # NumPy refuses byte-swapped data with BufferError: the untyped
    # parameter's TypeError names the byte order, with NumPy's refusal
    # (dlcast's BufferError, NumPy's as its cause) as the cause.
    swapped = np.arange(3.0).astype(">f8")
    with pytest.raises(TypeError, match=r"argument 'x': the array's byte order") as info:
        ext.values(swapped)
    refusal = info.value.__cause__
    assert isinstance(refusal, BufferError)
    assert re.search(r"argument 'x': the producer's __dlpack__\(\) raised", str(refusal))
    assert isinstance(refusal.__cause__, BufferError)
    # PyTorch's __dlpack__ refuses tensors that require grad; its C exchange
    # API (the path dlcast takes for torch.Tensor) reads them, as PyTorch's
    # own C++ extensions do. A subclass that forces __dlpack__ sees the refusal.
    t = torch.ones(3, requires_grad=True)
    assert ext.sum_f32(t) == 3.0

    class ViaDlpack:
        def __dlpack__(self, **kw):
            return t.__dlpack__(**kw)

    with pytest.raises(BufferError, match="argument 'x'") as info:
        ext.sum_f32(ViaDlpack())
    assert "gradient" in str(info.value.__cause__)


def test_interrupts_propagate_unchanged():
    with pytest.raises(KeyboardInterrupt):
        ext.values(RaisingProducer(KeyboardInterrupt()))
    with pytest.raises(MemoryError):
        ext.values(RaisingProducer(MemoryError()))


def test_producer_errors_keep_one_line_and_the_cause():
    # PyTorch's refusal of a sparse tensor carries a C++ backtrace: the
    # message keeps its first line, the exception itself is the cause.
    s = torch.eye(2).to_sparse()
    with pytest.raises(BufferError) as info:
        ext.values(s)
    msg = str(info.value)
    assert msg.startswith("values(): argument 'x': the producer's ")
    assert "\n" not in msg
    assert info.value.__cause__ is not None


def test_interrupts_from_a_later_argument_propagate():
    class Interrupts:
        def __dlpack__(self, **kw):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ext.sum_f64_and_len(torch.ones(3, dtype=torch.float64), Interrupts())


def test_base_exceptions_from_producers_propagate():
    class Exits:
        def __dlpack__(self, **kw):
            raise SystemExit(3)

    with pytest.raises(SystemExit):
        ext.values(Exits())

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


@pytest.mark.hostile
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


@pytest.mark.hostile
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


@pytest.mark.hostile
@pytest.mark.parametrize("second", [ValueError("second call"), BufferError("second call")])
def test_retry_reports_the_second_error(second):
    p = TypeErrorThenRaises(second)
    with pytest.raises(BufferError) as info:
        ext.values(p)
    assert p.calls == 2
    assert info.value.__cause__ is second


@pytest.mark.hostile
@pytest.mark.parametrize("second", [KeyboardInterrupt, MemoryError])
def test_retry_lets_interrupts_through(second):
    exc = second("from the retry")
    with pytest.raises(second) as info:
        ext.values(TypeErrorThenRaises(exc))
    assert info.value is exc


@pytest.mark.hostile
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


@pytest.mark.hostile
def test_exception_whose_str_raises():
    class BadStr(Exception):
        def __str__(self):
            raise RuntimeError("str() failed too")

    with pytest.raises(BufferError, match=r"raised \S*BadStr: <exception str\(\) failed>") as info:
        ext.values(Raises(BadStr))
    assert type(info.value.__cause__) is BadStr


@pytest.mark.hostile
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


@pytest.mark.hostile
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


@pytest.mark.hostile
@pytest.mark.parametrize(
    "value,name",
    [(None, "NoneType"), (3, "int"), ("dltensor", "str"), (b"\0" * 64, "bytes"),
     (np.zeros(2), "ndarray"), (memoryview(b"ab"), "memoryview"), (object(), "object")],
)
def test_dlpack_returning_a_non_capsule(value, name):
    with pytest.raises(BufferError, match=rf"argument 'x': __dlpack__\(\) returned {name}, not a DLPack capsule"):
        ext.values(Returns(lambda: value))


@pytest.mark.hostile
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


@pytest.mark.hostile
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


@pytest.mark.hostile
def test_dlpack_returning_a_fresh_capsule_each_time_is_consumed_each_time():
    with deleters_balanced(10):
        p = Returns(lambda: capsule(np.arange(4.0)))
        for _ in range(10):
            assert ext.values(p) == [0.0, 1.0, 2.0, 3.0]
        assert p.calls == 10


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


@pytest.mark.hostile
def test_capsule_device_wins_over_dlpack_device():
    data = np.arange(3.0)
    with deleters_balanced(4):
        # Claims CPU, sends CUDA: the CPU-only parameter never asks the
        # device and refuses it (its memory is never read); a CUDA parameter
        # asks, passes stream=None as told, and then refuses CUDA memory
        # that was never synchronised.
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


@pytest.mark.hostile
def test_dlpack_device_that_raises_is_never_asked():
    class P:
        def __dlpack__(self, **kwargs):
            return np.arange(2.0).__dlpack__(**kwargs)

        def __dlpack_device__(self):
            raise RuntimeError("never called")

    assert ext.values(P()) == [0.0, 1.0]


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


@pytest.mark.hostile
def test_succeeds_once_then_fails():
    with deleters_balanced(1):
        p = OnceThenFails(lambda: capsule(np.arange(3.0)), BufferError("gone"))
        assert ext.values(p) == [0.0, 1.0, 2.0]
        with pytest.raises(BufferError, match="argument 'x': the producer's __dlpack__\\(\\) raised BufferError: gone"):
            ext.values(p)


@pytest.mark.hostile
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


@pytest.mark.hostile
def test_producer_returning_the_same_capsule_for_two_parameters():
    with deleters_balanced(1):
        c = capsule(np.ones((2, 3), np.float32))
        with pytest.raises(BufferError, match="argument 'weights': the DLPack capsule was already consumed"):
            ext.centroid(c, c)


@pytest.mark.hostile
@pytest.mark.parametrize("via", ["sum_f32", "sum_f64"])
def test_producers_that_call_back_without_end_get_recursion_error_not_a_crash(via):
    """A producer whose `__dlpack__` calls a dlcast function with itself
    recurses through phase 1; each level also holds the driver's frames, so
    the thread's stack used to run out (a segfault at about 270 levels of a
    debug build) before Python's recursion limit. Past the driver's bound
    the call raises `RecursionError`, and the process goes on."""
    r = run_py(f"""
        import numpy as np
        import dlcast_testext as ext

        fn = getattr(ext, {via!r})
        depth = 0

        class Loop:
            def __dlpack__(self, **kw):
                global depth
                depth += 1
                fn(self)
                raise AssertionError("unreachable")

        try:
            fn(Loop())
        except RecursionError as e:
            print("RecursionError", depth, e)
        except Exception as e:
            # Wrapped by an outer level: the innermost cause is the bound.
            c = e
            while c.__cause__ is not None or c.__context__ is not None:
                c = c.__cause__ or c.__context__
            print(type(c).__name__, depth, c)
        assert float(fn(np.ones(3, np.float32 if {via!r} == "sum_f32" else np.float64))) == 3.0
        print("alive")
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "RecursionError" in r.stdout and "nested more than 64 deep" in r.stdout, r.stdout
    assert "alive" in r.stdout


@pytest.mark.hostile
@pytest.mark.parametrize("via", ["conversion", "default return"])
def test_producers_that_call_back_from_other_steps_get_no_crash(via):
    """Phase 1 is not the only step that runs an argument's Python code: a
    conversion calls a method of its class (`astype` of an array that says
    it is JAX's), and the default return's framework look-up reads its
    class's `__module__` (a metaclass property). Either calling the function
    again without end used to overflow the thread's stack (a segfault at
    Python's default recursion limit, debug build); each counts as a level
    of the driver's bound, and the process goes on."""
    r = run_py(f"""
        import numpy as np
        import dlcast_testext as ext

        depth = 0
        if {via!r} == "conversion":
            fn = ext.f16_values

            import torch

            class Loop:
                # bfloat16, which NumPy cannot view: the framework the
                # array says it is converts it, by its own `astype`.
                def __dlpack__(self, **kw):
                    return torch.zeros(2, dtype=torch.bfloat16).__dlpack__(**kw)

                def __dlpack_device__(self):
                    return (1, 0)

                def astype(self, *args, **kwargs):
                    global depth
                    depth += 1
                    return fn(Loop())

            Loop.__module__ = "jax"
        else:
            fn = ext.fh_view

            class Meta(type):
                @property
                def __module__(cls):
                    global depth
                    depth += 1
                    fn(Loop())
                    return "numpy"

            class Loop(metaclass=Meta):
                def __dlpack__(self, **kw):
                    return np.zeros(2).__dlpack__(**kw)

                def __dlpack_device__(self):
                    return (1, 0)

        try:
            fn(Loop())
        except Exception as e:
            # The conversion's refusal, wrapping the levels below.
            print("outer", type(e).__name__)
        print("depth", depth)
        print("alive")
    """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "alive" in r.stdout
    # Ended by the bound, not by Python's limit (1000 frames).
    depth = int(r.stdout.split("depth ")[1].split()[0])
    # Linear in the bound (64): a level may run the argument's code a few
    # times (abi3 builds also read `__module__` in the import), and once the
    # bound trips every further level fails at once.
    assert 0 < depth <= 4 * 64, r.stdout
