"""Overlapping windows of a read-only view (`TensorRef::sliding_windows`):
they frame an axis without a copy, agree with NumPy's
`sliding_window_view` and PyTorch's `unfold`, are read-only wherever they
go, are refused by writable parameters, and refuse sizes that do not fit
with an error, never a panic. An owned result's rank (`Tensor<T, N>`) is
in its signature line.
"""

import gc

import numpy as np
import pytest
import torch
import jax.numpy as jnp
from numpy.lib.stride_tricks import sliding_window_view

import dlcast_testext as ext

WINDOWS = [(1, 1), (3, 1), (3, 2), (4, 3), (10, 1), (2, 100)]


def address(a):
    return np.asarray(a).__array_interface__["data"][0]


def collect():
    for _ in range(3):
        gc.collect()


@pytest.mark.parametrize("window,step", WINDOWS)
def test_window_sums_agree_with_numpy_and_torch(window, step):
    x = np.arange(10.0, dtype=np.float32) ** 2
    want = sliding_window_view(x, window)[::step].sum(axis=1)
    assert ext.win_sums(x, window, step) == pytest.approx(want.tolist())
    t = torch.from_numpy(x.copy())
    assert ext.win_sums(t, window, step) == pytest.approx(t.unfold(0, window, step).sum(1).tolist())
    assert ext.live_borrows() == 0


@pytest.mark.parametrize("window,step", WINDOWS)
def test_returned_windows_are_the_callers_memory(window, step):
    x = np.arange(10.0, dtype=np.float32)
    frames = np.asarray(ext.win_frames(x, 0, window, step))
    want = sliding_window_view(x, window)[::step]
    assert frames.tolist() == want.tolist()
    assert address(frames) == address(x)
    if want.shape[0] > 1:
        assert frames.strides == want.strides
    # PyTorch's unfold: the same values; PyTorch has no read-only tensors,
    # so a tensor argument gets them as a copy of its own.
    t = torch.arange(10.0)
    out = ext.win_frames(t, 0, window, step)
    unfolded = t.unfold(0, window, step)
    assert out.tolist() == unfolded.tolist()
    assert out.data_ptr() != t.data_ptr()
    del frames, out
    collect()
    assert ext.live_borrows() == 0


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_windows_along_any_axis_of_any_layout(axis):
    base = np.arange(4.0 * 5 * 6, dtype=np.float32).reshape(4, 5, 6)
    for x in (base, base[::-1, :, ::2], base.transpose(2, 0, 1)):
        window = min(3, x.shape[axis])
        got = np.asarray(ext.win_frames(x, axis, window, 2))
        sl = [slice(None)] * x.ndim
        sl[axis] = slice(None, None, 2)
        want = sliding_window_view(x, window, axis=axis)[tuple(sl)]
        assert got.shape == want.shape and (got == want).all()
        assert np.shares_memory(got, x)
        t = torch.from_numpy(np.ascontiguousarray(x))
        assert (torch.from_dlpack(ext.win_frames(t, axis, window, 2)) == t.unfold(axis, window, 2)).all()
    # The untyped view frames any dtype.
    i16 = np.arange(10, dtype=np.int16)
    assert ext.win_frames_dyn(i16, 0, 4, 3).tolist() == sliding_window_view(i16, 4)[::3].tolist()


def test_returned_windows_are_read_only():
    x = np.arange(10.0, dtype=np.float32)
    assert x.flags.writeable
    frames = np.asarray(ext.win_frames(x, 0, 3, 1))
    assert not frames.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        frames[0, 1] = 5.0
    # PyTorch has no read-only tensors: it gets a writable copy (below).
    assert type(ext.win_frames(torch.arange(10.0), 0, 3, 1)) is torch.Tensor
    assert memoryview(ext.win_frames(x, 0, 3, 1)).readonly
    assert not ext.win_frames_numpy(x.astype(np.float64), 4, 1).flags.writeable
    assert not ext.win_frames_dyn(x, 0, 2, 1).flags.writeable
    # A converted temporary (float64 given to a float32 parameter) is
    # exported writable as a rule; its overlapping windows are not.
    converted = ext.win_frames(np.arange(6.0), 0, 3, 1)
    assert converted.dtype == np.float32 and not converted.flags.writeable
    assert x.tolist() == list(range(10))


@pytest.mark.hostile
def test_writable_parameters_refuse_windows_hostile():
    # Overlapping windows written through a writable view would alias:
    # dlcast's own windows are read-only, NumPy's writable windows and
    # PyTorch's unfold (writable, overlapping) are refused as overlapping.
    x = np.arange(10.0)
    ours = ext.win_frames_dyn(x, 0, 3, 1)
    for f in (lambda v: ext.fill_f64(v, -1.0), ext.double_slice_f64):
        with pytest.raises(TypeError, match="read-only"):
            f(ours)
    numpys = sliding_window_view(x, 3, writeable=True)
    with pytest.raises(TypeError, match="must not reach one element from two indices"):
        ext.fill_f64(numpys, -1.0)
    t = torch.arange(10.0, dtype=torch.float64)
    with pytest.raises(TypeError, match="must not reach one element from two indices"):
        ext.fill_f64(t.unfold(0, 3, 1), -1.0)
    assert x.tolist() == list(range(10)) and t.tolist() == list(range(10))
    assert ext.live_borrows() == 0


@pytest.mark.hostile
@pytest.mark.parametrize(
    "axis,window,step,match",
    [
        (0, 0, 1, "a window holds at least one element"),
        (0, 1, 0, "the step is at least 1"),
        (0, 11, 1, "the window is longer than the axis"),
        (0, 2**64 - 1, 1, "the window is longer than the axis"),
        (0, 2**64 - 1, 2**64 - 1, "the window is longer than the axis"),
        (1, 1, 1, r"invalid axes \[1\]"),
        (2**64 - 1, 1, 1, "invalid axes"),
    ],
)
def test_windows_that_do_not_fit_raise_hostile(axis, window, step, match):
    x = np.arange(10.0, dtype=np.float32)
    with pytest.raises(ValueError, match=r"win_frames\(\): argument 'x': sliding_windows\(\): .*" + match):
        ext.win_frames(x, axis, window, step)
    with pytest.raises(ValueError, match=match):
        ext.win_sums(x, window, step) if axis == 0 else ext.win_frames_dyn(x, axis, window, step)
    assert ext.live_borrows() == 0


@pytest.mark.hostile
def test_window_sizes_that_overflow_raise_hostile():
    x = np.arange(10.0, dtype=np.float32)
    # A step far past the end: one window (its stride is never used).
    assert np.asarray(ext.win_frames(x, 0, 4, 2**64 - 1)).tolist() == [[0.0, 1.0, 2.0, 3.0]]
    with pytest.raises(OverflowError):
        ext.win_frames(x, 0, 2**64, 1)
    # A broadcast axis of 2**62 elements framed with windows of 2**20: more
    # elements than a usize counts.
    b = np.broadcast_to(np.uint8(1), (2**62,))
    with pytest.raises(ValueError, match="the windows' element count overflows"):
        ext.win_frames_dyn(b, 0, 2**20, 1)
    # Long windows of it that do fit: no copy, so no memory asked for.
    big = ext.win_frames_dyn(b, 0, 2**40, 2**61)
    assert big.shape == (2, 2**40) and big.strides == (0, 0)
    assert ext.live_borrows() == 0


def test_owned_result_states_its_rank():
    x = np.arange(6.0, dtype=np.float32)
    out = np.asarray(ext.win_frames_owned(x, 3, 1))
    assert out.tolist() == sliding_window_view(x, 3).tolist()
    assert out.flags.writeable and not np.shares_memory(out, x)
    assert ext.win_frames_owned.__doc__.splitlines()[0] == (
        "win_frames_owned(x: ndarray[float32, (_,), cpu], window: int, step: int) -> like(x, numpy)[float32, (_, _)]"
    )
    with pytest.raises(TypeError, match=r"into_rank\(\): expected a tensor of 2 dimensions, got shape \[3\]"):
        ext.win_wrong_rank(3)


def _is_own_copy(out, x):
    """`out` is a torch.Tensor of memory that is not `x`'s: writing it
    leaves `x` as it was."""
    assert type(out) is torch.Tensor and not out.requires_grad
    before = x.clone()
    xs = x.untyped_storage()
    lo, hi = xs.data_ptr(), xs.data_ptr() + xs.nbytes()
    assert not lo <= out.data_ptr() < hi
    out.fill_(-7.0)
    assert torch.equal(x, before)


def test_torch_in_torch_out_for_read_only_windows():
    """torch in, torch out in every corner: a read-only view (overlapping
    windows) going to PyTorch, which has no read-only tensors, comes back
    as a torch.Tensor holding a materialised copy, the caller's alone, by
    the default return, returns = like(x) and returns = torch alike, and in
    tuples and lists; a later call given it returns torch again."""
    x = torch.arange(10.0)
    want = x.unfold(0, 4, 2)
    for call in (
        lambda: ext.win_frames(x, 0, 4, 2),
        lambda: ext.win_frames_like(x, x, 4, 2),
        lambda: ext.win_frames_torch(x, 4, 2),
    ):
        out = call()
        assert type(out) is torch.Tensor and out.shape == (4, 4)
        assert torch.equal(out, want) and out.is_contiguous()
        _is_own_copy(out, x)
    # The pipeline stays in PyTorch.
    again = ext.win_frames(ext.win_frames(x, 0, 4, 2).reshape(-1), 0, 2, 2)
    assert type(again) is torch.Tensor
    a, (b,) = ext.win_frames_nested(x, x, 3)
    assert torch.equal(a, x.unfold(0, 3, 1)) and torch.equal(b, x.unfold(0, 3, 3))
    _is_own_copy(a, x)
    _is_own_copy(b, x)


def test_read_only_input_returned_like_a_tensor_is_a_copy():
    """A view of a read-only NumPy (or JAX) input returned like a torch
    argument: a torch.Tensor of its own; the input is never written."""
    ro = np.arange(8.0, dtype=np.float32)
    ro.flags.writeable = False
    t = torch.zeros(1)
    out = ext.win_frames_like(ro, t, 4, 4)
    assert type(out) is torch.Tensor and out.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    out.fill_(-1.0)
    assert ro.tolist() == list(range(8))
    j = jnp.arange(6.0, dtype=jnp.float32)
    out = ext.win_frames_like(j, t, 3, 1)
    assert type(out) is torch.Tensor and out.tolist() == [[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5]]
    out.fill_(-1.0)
    assert j.tolist() == list(range(6))
    # NumPy in: the view itself, read-only, as before.
    assert not ext.win_frames_like(ro, ro, 4, 4).flags.writeable

