"""Arrays kept beyond the call: an `ArrayHandle` stored in a #[pyclass]
(`ext.Stored`, tests/src/stored.rs) is imported and checked again at every
borrow, so a later borrow sees what Python code changed since it was stored
(resized, reshaped, another storage) or refuses it (another dtype,
read-only, requires grad); its views go through the borrow registry like a
call's; the stored object takes part in garbage collection.
"""

import gc
import weakref

import numpy as np
import pytest
import torch

import dlcast_testext as ext

pytestmark = pytest.mark.usefixtures("registry_empty_after")


def collect():
    for _ in range(3):
        gc.collect()


# --- a stored NumPy array ---------------------------------------------------


def test_numpy_borrow_reads_the_stored_array():
    a = np.arange(6, dtype=np.float32)
    s = ext.Stored(a)
    shape, strides, ptr, total = s.describe()
    assert (shape, strides, ptr, total) == ([6], [1], a.ctypes.data, 15.0)
    assert s.array() is a
    s.fill(2.0)
    assert (a == 2.0).all()


def test_numpy_resized_between_calls_is_seen():
    a = np.arange(4, dtype=np.float32)
    s = ext.Stored(a)
    assert s.describe()[0] == [4]
    # The handle holds a reference: NumPy resizes only when told not to check.
    a.resize((1000,), refcheck=False)
    a[:] = 1.0
    shape, _, ptr, total = s.describe()
    assert shape == [1000] and ptr == a.ctypes.data and total == 1000.0
    s.fill(3.0)
    assert (a == 3.0).all()
    a.resize((2,), refcheck=False)
    assert s.values() == [3.0, 3.0]


def test_numpy_reshaped_and_restrided_between_calls_is_seen():
    a = np.arange(6, dtype=np.float32)
    s = ext.Stored(a)
    a.shape = (2, 3)
    assert s.describe()[:2] == ([2, 3], [3, 1])
    a.shape = (3, 2)
    assert s.describe()[:2] == ([3, 2], [2, 1])
    # Another object with other strides stored in its place.
    s.store(a.T)
    assert s.describe()[:2] == ([2, 3], [1, 2])
    assert s.values() == [0.0, 2.0, 4.0, 1.0, 3.0, 5.0]


def test_numpy_dtype_changed_between_calls_is_refused():
    a = np.ones(4, dtype=np.float32)
    s = ext.Stored(a)
    assert s.values() == [1.0] * 4
    a.dtype = np.int32
    with pytest.raises(TypeError, match=r"ArrayHandle.borrow\(\): argument 'array': expected dtype float32, got int32"):
        s.values()
    with pytest.raises(TypeError, match="expected dtype float32, got int32"):
        s.fill(0.0)
    a.dtype = np.float32
    assert s.values() == [1.0] * 4


def test_numpy_made_read_only_between_calls_refuses_writes_only():
    a = np.ones(3, dtype=np.float32)
    s = ext.Stored(a)
    s.fill(5.0)
    a.flags.writeable = False
    with pytest.raises(TypeError, match=r"ArrayHandle.borrow_mut\(\): argument 'array': the array is read-only"):
        s.fill(0.0)
    assert s.values() == [5.0] * 3
    assert (a == 5.0).all()
    a.flags.writeable = True
    s.fill(6.0)
    assert (a == 6.0).all()


def test_a_stored_non_array_is_refused_at_borrow_and_none_at_construction():
    s = ext.Stored([1.0, 2.0])
    with pytest.raises(TypeError, match=r"ArrayHandle.borrow\(\): argument 'array': expected an array"):
        s.values()
    with pytest.raises(TypeError, match="got None"):
        ext.Stored(None)


# --- a stored PyTorch tensor ------------------------------------------------


def test_torch_resized_between_calls_is_seen():
    t = torch.zeros(4)
    s = ext.Stored(t)
    assert s.describe()[0] == [4]
    t.resize_(100)
    t.fill_(1.0)
    shape, _, ptr, total = s.describe()
    assert shape == [100] and ptr == t.data_ptr() and total == 100.0
    t.resize_(2, 3)
    assert s.describe()[:2] == ([2, 3], [3, 1])


def test_torch_storage_swapped_between_calls_is_seen():
    t = torch.zeros(4)
    s = ext.Stored(t)
    old = s.describe()[2]
    other = torch.full((3,), 7.0)
    t.set_(other)
    shape, _, ptr, total = s.describe()
    assert shape == [3] and ptr == other.data_ptr() != old and total == 21.0
    s.fill(2.0)
    assert other.tolist() == [2.0] * 3
    # `t.data = ...` swaps the storage too.
    fresh = torch.full((5,), 1.0)
    t.data = fresh
    assert s.describe()[0] == [5] and s.describe()[2] == fresh.data_ptr()
    s.fill(4.0)
    assert fresh.tolist() == [4.0] * 5


def test_torch_requires_grad_flipped_between_calls_refuses_writes_only():
    t = torch.ones(3)
    s = ext.Stored(t)
    v0 = t._version
    s.fill(2.0)
    assert t.tolist() == [2.0] * 3 and t._version > v0
    t.requires_grad_(True)
    with pytest.raises(TypeError, match=r"ArrayHandle.borrow_mut\(\): argument 'array': the tensor requires grad.*detach\(\)"):
        s.fill(0.0)
    assert s.values() == [2.0] * 3
    t.requires_grad_(False)
    s.fill(3.0)
    assert t.tolist() == [3.0] * 3


def test_torch_dtype_changed_between_calls_is_refused():
    t = torch.ones(3)
    s = ext.Stored(t)
    t.data = torch.ones(3, dtype=torch.float64)
    with pytest.raises(TypeError, match="expected dtype float32, got float64"):
        s.values()


# --- the borrow registry ----------------------------------------------------


def test_second_writable_borrow_while_the_first_lives_is_refused():
    a = np.zeros(3, dtype=np.float32)
    s = ext.Stored(a)
    with pytest.raises(BufferError, match=r"ArrayHandle.borrow_mut\(\).*in use"):
        s.borrow_mut_twice()
    # Both ended: borrows in turn succeed.
    a[:] = 1.0
    assert s.borrow_in_turn() == 3.0
    assert (a == 3.0).all()


def test_borrow_while_a_call_holds_a_writable_view_is_refused():
    a = np.zeros(3, dtype=np.float32)
    s = ext.Stored(a)
    with pytest.raises(BufferError, match=r"ArrayHandle.borrow\(\).*'out' of fill_then_sum_stored\(\)"):
        ext.fill_then_sum_stored(a, s, 1.0)
    # (The body wrote `out` before it borrowed the store.) Other memory: no
    # conflict, and the borrow reads what the stored array holds now.
    assert (a == 1.0).all()
    assert ext.fill_then_sum_stored(np.zeros(2, np.float32), s, 2.0) == 3.0


def test_calls_while_a_borrow_lives_are_refused_as_the_registry_says():
    a = np.ones(3, dtype=np.float32)
    t = torch.ones(3)
    for arr in (a, t):
        s = ext.Stored(arr)
        # A writable borrow excludes every other view of that memory ...
        with pytest.raises(BufferError, match=r"'array' of ArrayHandle.borrow_mut\(\)"):
            s.hold_mut_and_call(lambda: ext.sum_f32(arr))
        # ... a read-only one only writable ones.
        assert s.hold_and_call(lambda: ext.sum_f32(arr)) == 3.0
        with pytest.raises(BufferError, match=r"'array' of ArrayHandle.borrow\(\)"):
            s.hold_and_call(lambda: ext.add_one_f32(arr))
        assert s.values() == [1.0] * 3


# --- garbage collection -----------------------------------------------------


def test_cycle_through_the_store_is_collected():
    a = np.zeros(3, dtype=np.float32)
    s = ext.Stored(a)
    s.extra = s  # a cycle through the pyclass itself ...
    holder = {"store": s}
    t = torch.zeros(2)
    s2 = ext.Stored(t)
    t.store = s2  # ... and one through the stored tensor's attribute
    w, w2, wa = weakref.ref(s), weakref.ref(s2), weakref.ref(t)
    del s, s2, t, holder
    collect()
    assert w() is None and w2() is None and wa() is None


def test_cleared_handle_refuses_borrows():
    s = ext.Stored(np.zeros(2, dtype=np.float32))
    s.clear()
    assert s.array() is None
    with pytest.raises(ValueError, match=r"ArrayHandle.borrow\(\): the array handle was cleared"):
        s.values()
    with pytest.raises(ValueError, match=r"ArrayHandle.borrow_mut\(\): the array handle was cleared"):
        s.fill(1.0)
    s.store(np.ones(2, dtype=np.float32))
    assert s.values() == [1.0, 1.0]


def test_handle_as_a_dlpack_fn_parameter():
    a = np.ones(3, dtype=np.float32)
    t = torch.full((2,), 2.0)
    # Read-only views of one array may coexist; a handle of a tensor too.
    assert ext.sum_with_handle(a, a) == 6.0
    assert ext.sum_with_handle(a, t) == 7.0
    with pytest.raises(TypeError, match=r"ArrayHandle.borrow\(\): argument 'array': expected dtype float32, got float64"):
        ext.sum_with_handle(a, np.ones(2))


# --- a handle's own spec ----------------------------------------------------


def test_spec_with_named_extents_checks_them():
    assert ext.sum_with_spec(np.ones((3, 3), np.float32), "square") == 9.0
    with pytest.raises(TypeError, match=r"square\(\): argument 'm': expected shape \(n, n\), got \(2, 3\)"):
        ext.sum_with_spec(np.ones((2, 3), np.float32), "square")


def test_annotated_handle_parameter_is_checked_when_passed_and_at_each_borrow():
    # `#[shape(n, 2)] weights: Option<ArrayHandle<f32>>` of `#[new]`: checked
    # (and named by the class) when passed, and again when borrowed.
    with pytest.raises(TypeError, match=r"FhLayer\(\): argument 'weights': expected shape \(n, 2\), got \(4, 3\)"):
        ext.FhLayer(1.0, np.zeros((4, 3), np.float32))
    with pytest.raises(TypeError, match=r"FhLayer\(\): argument 'weights': expected dtype float32, got float64"):
        ext.FhLayer(1.0, np.zeros((4, 2)))
    w = np.ones((4, 2), np.float32)
    layer = ext.FhLayer(1.0, w)
    assert layer.weights_sum() == 8.0
    w.resize((4, 3), refcheck=False)
    with pytest.raises(TypeError, match=r"FhLayer\(\): argument 'weights': expected shape \(n, 2\), got \(4, 3\)"):
        layer.weights_sum()
    assert ext.FhLayer(1.0).weights_sum() == 0.0
    # `#[shape(_, 2)] #[order(c)]` on a method's handle.
    layer.store(torch.ones(3, 2))
    assert layer.weights_sum() == 6.0
    with pytest.raises(TypeError, match=r"FhLayer.store\(\): argument 'weights': expected a C-contiguous"):
        layer.store(np.ones((2, 2), np.float32).T)
    assert layer.weights_sum() == 6.0  # the refused array was not stored
    with pytest.raises(TypeError, match=r"FhLayer.store\(\): argument 'weights': expected an array .*got None"):
        layer.store(None)
    # A free function's: `#[shape(3)] w: ArrayHandle<f64>`.
    assert ext.fh_handle_sum(np.ones(3)) == 3.0
    with pytest.raises(TypeError, match=r"fh_handle_sum\(\): argument 'w': expected shape \(3,\), got \(4,\)"):
        ext.fh_handle_sum(np.ones(4))


def test_the_check_when_passed_holds_no_borrow():
    # The check is a read-only borrow dropped at once: a writable borrow
    # of the stored array right after it is not refused.
    w = np.zeros((3, 2), np.float32)
    layer = ext.FhLayer(1.0, w)
    layer.store(w)
    m = np.zeros((2, 2))
    s = ext.StoredMatrix(m)
    s.shift(1.0)
    assert (m == np.eye(2)).all()


# --- a rank-typed handle ----------------------------------------------------


def test_rank_typed_handle_is_checked_when_passed_and_at_each_borrow():
    # `ArrayHandle<f64, 2>`: the rank (and dtype) are checked by `#[new]`,
    # naming the class and parameter, and again by each borrow.
    m = np.arange(9.0).reshape(3, 3)
    s = ext.StoredMatrix(m)
    assert s.trace() == 12.0
    s.shift(1.0)
    assert s.trace() == 15.0 and m[1, 1] == 5.0
    assert ext.StoredMatrix(torch.eye(2, dtype=torch.float64)).trace() == 2.0
    with pytest.raises(TypeError, match=r"StoredMatrix\(\): argument 'm': expected shape \(_, _\), got \(3,\)"):
        ext.StoredMatrix(np.zeros(3))
    with pytest.raises(TypeError, match=r"StoredMatrix\(\): argument 'm': expected dtype float64, got float32"):
        ext.StoredMatrix(np.zeros((2, 2), np.float32))
    m.shape = (9,)
    with pytest.raises(TypeError, match=r"StoredMatrix\(\): argument 'm': expected shape \(_, _\), got \(9,\)"):
        s.trace()
    with pytest.raises(TypeError, match=r"StoredMatrix\(\): argument 'm': expected shape \(_, _\), got \(9,\)"):
        s.shift(1.0)


def test_handle_made_by_hand_with_checked_is_checked_then():
    # `ArrayHandle::<f32, 1>::checked(a)`: refused when made, naming
    # `ArrayHandle.check()`.
    assert ext.checked_handle_len(np.ones(3, np.float32)) == 3
    with pytest.raises(TypeError, match=r"ArrayHandle.check\(\): argument 'array': expected dtype float32, got float64"):
        ext.checked_handle_len(np.ones(3))
    with pytest.raises(TypeError, match=r"ArrayHandle.check\(\): .*1 dimension"):
        ext.checked_handle_len(np.ones((3, 1), np.float32))
    with pytest.raises(TypeError, match=r"ArrayHandle.check\(\): argument 'array': expected an array"):
        ext.checked_handle_len([1.0, 2.0])


@pytest.mark.hostile
def test_careless_spec_raises_never_panics():
    # A spec written by hand for `ArrayHandle::with_spec` that names an
    # extent its `dim_names` lacks, or whose dtype is decided by a parameter
    # it does not have: the borrow is refused with an error, no panic.
    for a in (np.ones((2, 2), np.float32), torch.ones(2, 2)):
        with pytest.raises(TypeError, match=r"unnamed_extent\(\): argument 'm': expected shape \(\?, \?\), got \(2, 2\)"):
            ext.sum_with_spec(a, "unnamed_extent")
    assert ext.sum_with_spec(np.ones(2, np.float32), "no_decider") == 2.0
    with pytest.raises(TypeError, match=r"no_decider\(\): arguments '\?' and 'm' must have the same dtype.*float64"):
        ext.sum_with_spec(np.ones(2), "no_decider")
