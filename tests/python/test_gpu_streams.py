"""GPU arrays and streams without a GPU.

`ext.FakeGpuArray` is a strict producer of CUDA/ROCm/pinned/managed
memory whose pointer is never dereferenced: it records every `stream` it is
asked for and refuses the values the array API standard forbids for its
device. Fake DLPack C exchange API tables (ctypes) stand in for PyTorch's
`current_work_stream`. Real GPUs are exercised by tests/gpu/run.sh.
"""

import ctypes
import gc

import numpy as np
import pytest

import dlcast_testext as ext
from conftest import FROM_OBJ, OWNED, WORK_STREAM, ApiC, buffer_of, capsule, deleters_balanced, owning_export

CPU, CUDA, CUDA_HOST, ROCM, ROCM_HOST, CUDA_MANAGED = 1, 2, 3, 10, 11, 13


# ---------------------------------------------------------------------------
# The default rule


@pytest.mark.parametrize("device_type, stream", [
    (CUDA, 1),            # legacy default stream, never None
    (CUDA_MANAGED, 1),    # CUDA rules
    (ROCM, 0),            # ROCm's default stream (1 and 2 are CUDA-only)
    (CPU, None),
    (CUDA_HOST, None),    # pinned host memory: None only
    (ROCM_HOST, None),
])
def test_default_stream_per_device(device_type, stream, balanced):
    x = ext.FakeGpuArray(device_type)
    assert ext.chosen_stream(x) == stream
    assert x.streams == [stream]
    # The device was asked once, before __dlpack__.
    assert x.device_calls == 1


def test_cpu_only_parameter_never_asks_the_device(balanced):
    x = ext.FakeGpuArray(CPU)
    assert ext.chosen_stream_cpu(x) is None
    assert x.streams == [None] and x.device_calls == 0
    # CUDA memory for a CPU-only parameter: refused, after stream=None.
    g = ext.FakeGpuArray(CUDA)
    with pytest.raises(TypeError, match=r"chosen_stream_cpu\(\): argument 'x': expected device cpu, got cuda:0"):
        ext.chosen_stream_cpu(g)
    assert g.device_calls == 0


def test_numpy_and_capsules_need_no_device_call():
    assert ext.chosen_stream(np.zeros(3, np.float32)) is None
    # A capsule passed directly was made before the call: no stream to pass.
    with deleters_balanced(1):
        assert ext.chosen_stream(capsule(np.zeros(3, np.float32), device=(CUDA, 0))) is None


# ---------------------------------------------------------------------------
# Function-level choices and #[stream] parameters


def test_function_level_stream_options(balanced):
    x = ext.FakeGpuArray(CUDA)
    assert ext.stream_per_thread(x) == 2 and x.streams == [2]
    assert ext.stream_no_sync(x) == -1 and x.streams[-1] == -1
    assert ext.stream_legacy(x) == 1 and x.streams[-1] == 1
    r = ext.FakeGpuArray(ROCM)
    assert ext.stream_no_sync(r) == -1 and r.streams == [-1]
    assert ext.stream_legacy(r) == 0 and r.streams[-1] == 0
    # Host memory gets None whatever the function asks.
    c = ext.FakeGpuArray(CPU)
    assert ext.stream_per_thread(c) is None and c.streams == [None]


def test_per_thread_stream_is_refused_for_rocm(balanced):
    r = ext.FakeGpuArray(ROCM)
    with pytest.raises(TypeError, match=r"stream_per_thread\(\): argument 'x': stream = per_thread \(2\) "
                                        r"is CUDA-only, but the array is on rocm:0"):
        ext.stream_per_thread(r)
    assert r.streams == []  # the producer was never asked


def test_stream_parameter(balanced):
    x, y = ext.FakeGpuArray(CUDA), ext.FakeGpuArray(CUDA)
    assert ext.stream_param(x, y, 0x7F001234) == (0x7F001234, 0x7F001234, 0x7F001234)
    assert x.streams == y.streams == [0x7F001234]
    # None: the default rule.
    assert ext.stream_param(x, y) == (1, 1, None)
    # -1: no synchronisation; 0 (the NULL cudaStream_t) is passed as 1.
    assert ext.stream_param(x, y, -1)[:2] == (-1, -1)
    assert ext.stream_param(x, y, 0)[:2] == (1, 1)
    assert x.streams == [0x7F001234, 1, -1, 1]
    # CPU input next to a CUDA one: None for the CPU one.
    c = ext.FakeGpuArray(CPU)
    assert ext.stream_param(x, c, 99)[:2] == (99, None)
    assert c.streams == [None]
    # ROCm: 0 is its default stream, a handle passes as it is, 2 is refused.
    r = ext.FakeGpuArray(ROCM)
    assert ext.stream_param(r, c, 0)[0] == 0
    assert ext.stream_param(r, c, 0x5555)[0] == 0x5555
    with pytest.raises(TypeError, match=r"stream_param\(\): argument 'x': stream 2 is a CUDA stream value"):
        ext.stream_param(r, c, 2)


def test_stream_parameter_errors(balanced):
    x = ext.FakeGpuArray(CUDA)
    with pytest.raises(TypeError, match=r"stream_param\(\): argument 'stream': expected a stream handle "
                                        r"\(an integer >= 0, or -1 for no synchronisation\), got -5"):
        ext.stream_param(x, x, -5)
    assert x.streams == []
    with pytest.raises(TypeError):
        ext.stream_param(x, x, "default")


def test_stream_parameter_wins_over_function_option(balanced):
    x = ext.FakeGpuArray(CUDA)
    assert ext.stream_param_over_option(x) == 2
    assert ext.stream_param_over_option(x, 77) == 77
    assert x.streams == [2, 77]


# ---------------------------------------------------------------------------
# Producers that are old, lying or broken


class OldGpuProducer:
    """`__dlpack__` predates max_version but knows `stream` (an old producer on a GPU)."""

    def __init__(self, device_type):
        self.inner = ext.FakeGpuArray(device_type)

    def __dlpack__(self, stream=None):
        return self.inner.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()


def test_old_producer_keeps_the_stream_on_retry(balanced):
    p = OldGpuProducer(CUDA)
    assert ext.chosen_stream(p) == 1
    assert p.inner.streams == [1]


def test_producer_without_dlpack_device_gets_none(balanced):
    class NoDevice:
        def __init__(self):
            self.kwargs = []

        def __dlpack__(self, **kw):
            self.kwargs.append(kw)
            return capsule(np.zeros(2, np.float32), device=(CUDA, 0))

    p = NoDevice()
    # It cannot be told a stream: accepted, and the view says so.
    assert ext.chosen_stream(p) is None
    assert "stream" not in p.kwargs[0]


def test_dlpack_device_failures(balanced):
    class Raising:
        def __dlpack__(self, **kw):
            raise AssertionError("never called")

        def __dlpack_device__(self):
            raise RuntimeError("no device today")

    with pytest.raises(BufferError, match=r"chosen_stream\(\): argument 'x': the producer's "
                                          r"__dlpack_device__\(\) raised") as info:
        ext.chosen_stream(Raising())
    assert isinstance(info.value.__cause__, RuntimeError)

    class Junk(Raising):
        def __dlpack_device__(self):
            return "cuda"

    with pytest.raises(BufferError, match=r"__dlpack_device__\(\) returned 'cuda', not a \(device_type, device_id\)"):
        ext.chosen_stream(Junk())


def test_device_said_cpu_but_sent_cuda(balanced):
    liar = ext.FakeGpuArray(CUDA, claims=(CPU, 0))
    with pytest.raises(BufferError, match=r"__dlpack_device__\(\) said cpu, but the capsule describes memory on cuda:0"):
        ext.chosen_stream(liar)
    assert liar.streams == [None]


# ---------------------------------------------------------------------------
# Devices and ids


def test_device_id_checks(balanced):
    assert ext.cuda0_only(ext.FakeGpuArray(CUDA, 0)) == (CUDA, 0)
    with pytest.raises(TypeError, match=r"cuda0_only\(\): argument 'x': expected device cuda:0, got cuda:1"):
        ext.cuda0_only(ext.FakeGpuArray(CUDA, 1))
    with pytest.raises(TypeError, match=r"expected device cuda:0, got rocm:0"):
        ext.cuda0_only(ext.FakeGpuArray(ROCM, 0))
    with pytest.raises(TypeError, match=r"expected device cuda:0, got cuda_host:0"):
        ext.cuda0_only(ext.FakeGpuArray(CUDA_HOST, 0))


def test_no_host_access_to_gpu_memory(balanced):
    for device_type, name in [(CUDA, "cuda:0"), (ROCM, "rocm:0")]:
        x = ext.FakeGpuArray(device_type)
        msg = f"the array is on {name}, not in memory the CPU can access"

        def at(fn, method, param="x"):
            # View errors name the function, the parameter and the method.
            return f"{fn}(): argument '{param}': {method}(): {msg}"

        slice_none, get_none, to_vec, nd, ptr = ext.gpu_accessors(x)
        assert slice_none and get_none and ptr != 0
        assert to_vec == at("gpu_accessors", "to_vec") and nd == at("gpu_accessors", "as_ndarray")
        slice_none, set_refused, fill, nd = ext.gpu_accessors_mut(x)
        assert slice_none and set_refused
        assert fill == at("gpu_accessors_mut", "fill") and nd == at("gpu_accessors_mut", "as_ndarray_mut")


# ---------------------------------------------------------------------------
# The DLPack C exchange API's current_work_stream


_KEEP = []
_CAPSULE_NEW = ctypes.pythonapi.PyCapsule_New
_CAPSULE_NEW.restype = ctypes.py_object
_CAPSULE_NEW.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def exchange_gpu_type(device_type, current=None, fail=False):
    """A type whose exchange API describes 4 float32 on (device_type, 0)
    (a host buffer, never read) and whose `current_work_stream` answers
    `current` (NULL slot if None; fails if `fail`). Its `__dlpack__`
    records the keywords it gets and returns a capsule of that device."""
    data = np.zeros(4, np.float32)
    shape = (ctypes.c_int64 * 1)(4)
    strides = (ctypes.c_int64 * 1)(1)
    asked = []

    def describe(t):
        t.data, t.device_type, t.device_id, t.ndim = data.ctypes.data, device_type, 0, 1
        t.code, t.bits, t.lanes = 2, 32, 1
        t.shape, t.strides, t.byte_offset = shape, strides, 0

    def fill(obj, out):
        describe(out.contents)
        return 0

    def work_stream(dev_type, dev_id, out):
        asked.append((dev_type, dev_id))
        if fail:
            # Failing without an exception set (a ctypes callback cannot
            # leave one set): dlcast must still raise.
            return -1
        out[0] = current
        return 0

    api = ApiC()
    api.header.major, api.header.minor = 1, 3
    api.dltensor_from_obj = FROM_OBJ(fill)
    api.managed_from_obj = owning_export(describe)
    if current is not None or fail:
        api.current_work_stream = WORK_STREAM(work_stream)
    name = b"dlpack_exchange_api"
    cap = _CAPSULE_NEW(ctypes.addressof(api), name, None)
    _KEEP.extend([data, shape, strides, api, name, api.dltensor_from_obj, api.current_work_stream,
                  api.managed_from_obj])
    calls = []

    def __dlpack__(self, **kw):
        calls.append(kw)
        return capsule(np.zeros(4, np.float32), device=(device_type, 0))

    def __dlpack_device__(self):
        raise AssertionError("the device is known from the exchange API")

    cls = type("ExchangedGpu", (), {"__dlpack_c_exchange_api__": cap, "__dlpack__": __dlpack__,
                                    "__dlpack_device__": __dlpack_device__})
    return cls(), calls, asked


def test_exchange_api_current_work_stream():
    with deleters_balanced(0):
        x, calls, asked = exchange_gpu_type(CUDA, current=0xABC000)
        assert ext.chosen_stream(x) == 0xABC000
        assert calls == [] and asked == [(CUDA, 0)]
        # The NULL stream is the legacy default stream: 1.
        x, calls, _ = exchange_gpu_type(CUDA, current=0)
        assert ext.chosen_stream(x) == 1 and calls == []
        # ROCm: 0 stays 0 (its default stream).
        x, calls, _ = exchange_gpu_type(ROCM, current=0)
        assert ext.chosen_stream(x) == 0 and calls == []


def test_exchange_api_named_stream_goes_through_dlpack():
    with deleters_balanced(2):
        # The function names its stream: __dlpack__ synchronises with it.
        x, calls, asked = exchange_gpu_type(CUDA, current=0xABC000)
        assert ext.stream_per_thread(x) == 2
        assert calls == [dict(stream=2, max_version=(1, 3))] and asked == []
        # No current_work_stream in the table: __dlpack__ with stream 1, and
        # no __dlpack_device__ call (the device is known).
        x, calls, _ = exchange_gpu_type(CUDA, current=None)
        assert ext.chosen_stream(x) == 1
        assert calls == [dict(stream=1, max_version=(1, 3))]


def test_exchange_api_current_work_stream_failure():
    x, calls, _ = exchange_gpu_type(CUDA, fail=True)
    with pytest.raises(BufferError, match=r"chosen_stream\(\): argument 'x': the producer's "
                                          r"__dlpack_c_exchange_api__.current_work_stream\(\) raised") as info:
        ext.chosen_stream(x)
    assert "current_work_stream failed without an error" in str(info.value.__cause__)
    assert calls == []


# ---------------------------------------------------------------------------
# Exporting GPU memory: __dlpack__(stream=..., dl_device=..., copy=...)


def test_export_of_cuda_view_honours_streams(balanced):
    out = ext.gpu_identity(ext.FakeGpuArray(CUDA))
    assert out.__dlpack_device__() == (CUDA, 0)
    # Ready on stream 1 (what the input was asked for): the same stream,
    # None (= 1), -1 and the per-thread stream (implicitly synchronised
    # with the legacy one) need no work.
    for stream in [1, None, -1, 2]:
        cap = out.__dlpack__(stream=stream, max_version=(1, 3))
        assert type(cap).__name__ == "PyCapsule"
        del cap
    with pytest.raises(BufferError, match=r"stream=0 is not supported for an array on cuda:0 .*0 is ambiguous"):
        out.__dlpack__(stream=0)
    with pytest.raises(BufferError, match=r"stream=-2 is not supported"):
        out.__dlpack__(stream=-2)
    # Another stream must wait for stream 1: that needs the CUDA driver
    # (feature cudarc, and a GPU), neither of which the CPU tests have.
    why = "libcuda" if ext.HAS_CUDARC else "without its `cudarc` feature"
    with pytest.raises(BufferError, match=rf"stream=12345: cannot make it wait for stream 1, .*{why}"):
        out.__dlpack__(stream=12345)
    with pytest.raises(BufferError, match=r"cannot export an array on cuda:0 to device \(2, 1\)"):
        out.__dlpack__(dl_device=(CUDA, 1))
    assert out.__dlpack__(dl_device=(CUDA, 0), copy=False) is not None
    with pytest.raises(BufferError, match="copy=True is not supported for an array on cuda:0"):
        out.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="the buffer protocol needs host memory"):
        buffer_of(out)


def test_export_keeps_the_chosen_stream(balanced):
    # Imported on stream 77: the exported view is ready on 77, so a consumer
    # on 77 needs nothing, and one on 1 has to wait for 77.
    x = ext.FakeGpuArray(CUDA)
    out = ext.gpu_identity_on(x, 77)
    assert x.streams == [77]
    assert out.__dlpack__(stream=77) is not None
    with pytest.raises(BufferError, match=r"stream=1: cannot make it wait for stream 77"):
        out.__dlpack__(stream=1)
    # Imported with no synchronisation: no pending work is known.
    out = ext.gpu_identity_on(ext.FakeGpuArray(CUDA), -1)
    assert out.__dlpack__(stream=5) is not None


def test_export_of_exchange_api_view_owns_its_tensor():
    # Another producer's table is asked for an owning tensor before any
    # read, so a view of it can be returned; it is freed once.
    made, deleted = OWNED["made"], OWNED["deleted"]
    x, calls, _ = exchange_gpu_type(CUDA, current=77)
    out = ext.gpu_identity(x)
    assert out.__dlpack_device__() == (CUDA, 0) and calls == []
    assert OWNED["made"] == made + 1 and OWNED["deleted"] == deleted
    del out
    gc.collect()
    assert OWNED["deleted"] == deleted + 1


def test_export_of_rocm_view(balanced):
    out = ext.gpu_identity(ext.FakeGpuArray(ROCM))
    for stream in [0, None, -1]:
        assert out.__dlpack__(stream=stream) is not None
    for stream in [1, 2]:
        with pytest.raises(BufferError, match=rf"stream={stream} is not supported for an array on rocm:0"):
            out.__dlpack__(stream=stream)
    with pytest.raises(BufferError, match="implemented for CUDA only"):
        out.__dlpack__(stream=4096)


def test_export_of_host_memory_unchanged():
    out = ext.gpu_identity(np.arange(3.0, dtype=np.float32))
    assert out.__dlpack__(stream=None) is not None
    assert out.__dlpack__(stream=-1) is not None
    with pytest.raises(BufferError, match="stream=1 is not supported for an array on cpu; pass None"):
        out.__dlpack__(stream=1)
