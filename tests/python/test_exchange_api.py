"""The DLPack C exchange API (`__dlpack_c_exchange_api__`): a table is used only
when dlcast can trust it (its identity, its version, where it lives); hostile,
replaced, freed or cycling tables and failing entries end in an exception,
never in a read of memory the table describes wrongly.
"""

import ctypes
import gc
import textwrap

import numpy as np
import pytest
import torch

import dlcast_testext as ext
from conftest import ApiC, FROM_OBJ, HeaderC, OWNED, capsule, deleters_balanced, owning_export, run_py


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


@pytest.mark.hostile
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


@pytest.mark.hostile
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


@pytest.mark.hostile
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


@pytest.mark.hostile
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


@pytest.mark.hostile
def test_a_prev_api_chain_that_cycles_ends():
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


# Formerly a hole: the exchange-API cache (exchange.rs, type_info) keeps a type's
# table pointer forever; replacing the type's `__dlpack_c_exchange_api__`
# is ignored (stale table read), and a replaced table that is freed is
# then called (use after free).

_SWAP_TABLE = """
import ctypes, gc, sys
import numpy as np
from conftest import ApiC, FROM_OBJ, owning_export
import dlcast_testext as ext
new = ctypes.pythonapi.PyCapsule_New
new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
NAME = b"dlpack_exchange_api"
def make_table(values):
    data = np.array(values, dtype=np.float64)
    sh = (ctypes.c_int64 * 1)(len(values)); st = (ctypes.c_int64 * 1)(1)
    def fill(t):
        t.data = data.ctypes.data; t.device_type = 1; t.device_id = 0; t.ndim = 1
        t.code, t.bits, t.lanes = 2, 64, 1; t.shape = sh; t.strides = st; t.byte_offset = 0
    def dl(obj, out):
        fill(out.contents); return 0
    api = ApiC(); api.header.major, api.header.minor = 1, 3
    api.managed_from_obj = owning_export(fill); api.dltensor_from_obj = FROM_OBJ(dl)
    return new(ctypes.addressof(api), NAME, None), [api, data, sh, st, fill, dl]
capA, keepA = make_table([1.0, 2.0])
T = type("Swapped", (), {"__dlpack_c_exchange_api__": capA})
assert ext.values(T()) == [1.0, 2.0]
capB, keepB = make_table([7.0, 8.0, 9.0])
T.__dlpack_c_exchange_api__ = capB
if FREE:
    del capA, keepA
    gc.collect()
    junk = [ctypes.create_string_buffer(256) for _ in range(2000)]
got = ext.values(T())
assert got == [7.0, 8.0, 9.0], got
print("ok")
"""


@pytest.mark.slow
@pytest.mark.hostile
def test_a_replaced_exchange_table_is_ignored():
    proc = run_py("FREE = False\n" + _SWAP_TABLE)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.hostile
def test_a_replaced_and_freed_exchange_table_is_never_called():
    proc = run_py("FREE = True\n" + _SWAP_TABLE)
    assert proc.returncode == 0, f"rc={proc.returncode} {proc.stderr[-2000:]}"


# Formerly a hole: the
# exchange-table cache (exchange.rs `type_info`) trusts the class's version
# tag, but `type(x).__dlpack_c_exchange_api__` may come from the metaclass
# (a property, or a metaclass attribute whose change bumps only the
# metaclass's tag). The class's tag never changes: a stale table is used,
# and once freed, read (FREE=True today: the freed table's slots read as
# NULL from the zeroed junk, so the call fails with "expected an array").

_META_TABLE = """
import ctypes, gc
import numpy as np
from conftest import ApiC, FROM_OBJ, owning_export
import dlcast_testext as ext
new = ctypes.pythonapi.PyCapsule_New
new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
def make_table(values):
    data = np.array(values, dtype=np.float64)
    sh = (ctypes.c_int64 * 1)(len(values)); st = (ctypes.c_int64 * 1)(1)
    def fill(t):
        t.data = data.ctypes.data; t.device_type = 1; t.device_id = 0; t.ndim = 1
        t.code, t.bits, t.lanes = 2, 64, 1; t.shape = sh; t.strides = st; t.byte_offset = 0
    def dl(obj, out):
        fill(out.contents); return 0
    api = ApiC(); api.header.major, api.header.minor = 1, 3
    api.managed_from_obj = owning_export(fill); api.dltensor_from_obj = FROM_OBJ(dl)
    return new(ctypes.addressof(api), b"dlpack_exchange_api", None), [api, data, sh, st, fill, dl]
class Meta(type):
    pass
class T(metaclass=Meta):
    pass
Meta.__dlpack_c_exchange_api__, keepA = make_table([1.0, 2.0])
assert ext.values(T()) == [1.0, 2.0]
Meta.__dlpack_c_exchange_api__, keepB = make_table([7.0, 8.0, 9.0])
if FREE:
    del keepA
    gc.collect()
    junk = [ctypes.create_string_buffer(256) for _ in range(2000)]
got = ext.values(T())
assert got == [7.0, 8.0, 9.0], got
print("ok")
"""


@pytest.mark.hostile
@pytest.mark.parametrize("free", [False, True])
def test_a_metaclass_exchange_table_cannot_bypass_the_version_tag(free):
    r = run_py(f"FREE = {free}\n" + textwrap.dedent(_META_TABLE))
    assert r.returncode == 0 and "ok" in r.stdout, (
        f"rc={r.returncode}\n{r.stdout}\n{r.stderr[-800:]}"
    )
