"""dlcast on a real NVIDIA GPU: run by tests/gpu/run.sh, never by
`make test` (pytest there collects tests/python only).

Every test needs CUDA; a framework that is missing is reported as SKIPPED
with its reason, and run.sh fails when anything was skipped (unless
DLCAST_GPU_ALLOW_SKIPS=1), so nothing is skipped silently.
"""

import importlib

import pytest

import dlcast_testext as ext

CUDA = 2


def need(module):
    """Imports `module` or skips with a reason run.sh prints."""
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure is a reason
        pytest.skip(f"{module} not importable: {type(e).__name__}: {e}")


@pytest.fixture(scope="module")
def torch():
    torch = need("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda.is_available() is False")
    return torch


def uses_exchange_api(torch, t):
    return ext.import_path(t) == "exchange_api"


# ---------------------------------------------------------------------------
# Consuming CUDA arrays


def test_torch_input_default_stream(torch):
    t = torch.arange(8, dtype=torch.float32, device="cuda")
    shape, strides, dtype, device, read_only = ext.describe(t)[:5]
    assert device == (CUDA, 0) and shape == [8]
    # The default stream: torch's current stream is the NULL stream = 1.
    assert ext.chosen_stream(t) == 1
    print("torch import path:", ext.import_path(t))


def test_torch_input_under_a_stream(torch):
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t = torch.ones(1024, device="cuda") * 3
        chosen = ext.chosen_stream(t)
        if uses_exchange_api(torch, t):
            # The producer's current work stream, no synchronisation.
            assert chosen == s.cuda_stream
        else:
            # __dlpack__(stream=1): torch makes stream 1 wait for s.
            assert chosen == 1
    # A function that names its stream: torch synchronises with it.
    with torch.cuda.stream(s):
        assert ext.stream_param(t, t, s.cuda_stream)[:2] == (s.cuda_stream, s.cuda_stream)
        assert ext.stream_per_thread(t) == 2


def test_torch_input_inside_cuda_graph_capture(torch):
    """Consuming must not break a capture on another stream."""
    x = torch.ones(256, device="cuda")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    seen = []
    with torch.cuda.graph(g, stream=s):
        y = x * 2
        seen.append(ext.chosen_stream(y))
        seen.append(ext.import_path(y))
    g.replay()
    torch.cuda.synchronize()
    assert seen[0] == s.cuda_stream, (
        f"inside capture dlcast chose stream {seen[0]} via {seen[1]}; only the exchange API's "
        "current_work_stream keeps a capture intact (torch without it: see the note in run.sh)"
    )
    assert torch.equal(y, torch.full_like(x, 2))


def test_cupy_input(torch):
    cp = need("cupy")
    a = cp.arange(6, dtype=cp.float32)
    assert ext.describe(a)[3] == (CUDA, a.device.id)
    # CuPy has no exchange API: __dlpack__(stream=1), whatever its current stream.
    assert ext.chosen_stream(a) == 1
    with cp.cuda.Stream(non_blocking=True):
        b = a * 2
        assert ext.chosen_stream(b) == 1
        assert ext.stream_param(b, b, cp.cuda.get_current_stream().ptr)[0] == cp.cuda.get_current_stream().ptr


def test_jax_input(torch):
    jax = need("jax")
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError as e:
        pytest.skip(f"JAX has no GPU backend: {e}")
    a = jax.device_put(jax.numpy.arange(5, dtype=jax.numpy.float32), gpu)
    shape, strides, dtype, device, read_only = ext.describe(a)[:5]
    assert device == (CUDA, gpu.id) and read_only
    assert ext.chosen_stream(a) == 1


def test_device_id_checks(torch):
    t = torch.ones(4, device="cuda:0")
    assert ext.cuda0_only(t) == (CUDA, 0)
    with pytest.raises(TypeError, match=r"expected device cuda:1 or cpu, got cuda:0"):
        ext.cuda1_or_cpu(t)
    with pytest.raises(TypeError, match=r"expected device cpu, got cuda:0"):
        ext.sum_f32(t)
    if torch.cuda.device_count() > 1:
        with pytest.raises(TypeError, match=r"expected device cuda:0, got cuda:1"):
            ext.cuda0_only(torch.ones(4, device="cuda:1"))


def test_no_host_access_to_cuda_memory(torch):
    t = torch.ones(4, device="cuda")
    slice_none, get_none, to_vec, nd, ptr = ext.gpu_accessors(t)
    assert slice_none and get_none and "not in memory the CPU can access" in to_vec
    assert ptr == t.data_ptr()


# ---------------------------------------------------------------------------
# Returning CUDA arrays


def test_return_view_to_torch(torch):
    t = torch.arange(10, dtype=torch.float32, device="cuda")
    out = ext.gpu_identity_torch(t)
    assert out.is_cuda and out.data_ptr() == t.data_ptr() and torch.equal(out, t)
    arr = ext.gpu_identity(t)
    assert arr.__dlpack_device__() == (CUDA, 0)
    back = torch.from_dlpack(arr)  # torch passes its current stream (1)
    assert back.data_ptr() == t.data_ptr()


def test_return_view_consumed_on_another_stream(torch):
    t = torch.arange(10, dtype=torch.float32, device="cuda")
    arr = ext.gpu_identity(t)  # ready on stream 1
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        if ext.HAS_CUDARC:
            back = torch.from_dlpack(arr)  # s waits for 1 (an event)
            assert torch.equal(back, t)
        else:
            with pytest.raises(BufferError, match="cudarc"):
                torch.from_dlpack(arr)


def test_return_view_to_cupy(torch):
    cp = need("cupy")
    t = torch.arange(4, dtype=torch.float32, device="cuda")
    c = cp.from_dlpack(ext.gpu_identity(t))
    assert int(c.data.ptr) == t.data_ptr()
    assert cp.asnumpy(c).tolist() == [0.0, 1.0, 2.0, 3.0]


def test_dlpack_keywords_on_cuda_export(torch):
    arr = ext.gpu_identity(torch.ones(3, device="cuda"))
    with pytest.raises(BufferError, match="copy=True is not supported"):
        arr.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="0 is ambiguous"):
        arr.__dlpack__(stream=0)
    with pytest.raises(BufferError, match=r"to device \(1, 0\)"):
        arr.__dlpack__(dl_device=(1, 0))
    assert arr.__dlpack__(stream=-1, max_version=(1, 3)) is not None


# ---------------------------------------------------------------------------
# cudarc


def test_cudarc_round_trip(torch):
    if not ext.HAS_CUDARC:
        pytest.skip("the wheel was built without the cudarc feature")
    x = torch.arange(1000, dtype=torch.float32, device="cuda")
    y = ext.cudarc_copy(x)  # a CudaSlice, copied on x's stream, returned
    back = torch.from_dlpack(y)
    assert back.data_ptr() != x.data_ptr() and torch.equal(back, x)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        z = x * 5
        w = torch.from_dlpack(ext.cudarc_copy(z))  # s waits for the copy's stream
        assert torch.equal(w, z)
    del y, back, w
    torch.cuda.synchronize()
