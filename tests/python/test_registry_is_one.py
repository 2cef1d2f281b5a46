"""One borrow registry per process, whatever Python code does to the places
it is published, and NumPy's facts from C, not from `numpy.__version__`
(`borrow`, `borrow::rust_numpy` and `npapi` in the runtime).

dlcast's own registry is found through the interpreter's C-level state
dictionary, which Python code cannot reach; rust-numpy's shared table (an
attribute of NumPy's `multiarray` module, where rust-numpy looks) is checked
again by every dlcast call that reads a NumPy array, republished when it is
gone, adopted when another valid one took its place, and refused when
something else did. A table of C functions dlcast would call is trusted only
when all of it lies in one loaded image: a table made with ctypes is never
called.

Every case runs in a fresh interpreter: each tampers with process-wide state
before (or between) the first calls of the extensions involved.
"""

import pytest

from conftest import run_py

pytestmark = pytest.mark.hostile

PRELUDE = """
import ctypes, sys, types
import numpy as np
import dlcast_testext as ext
import dlcast_second as second
noop = lambda: None

def outcome(f, *args):
    try:
        f(*args)
    except (BufferError, TypeError) as e:
        return "refused: " + str(e)
    return "allowed"

core = sys.modules["numpy._core.multiarray"]
RNP = "_RUST_NUMPY_BORROW_CHECKING_API"
"""


def run(code):
    out = run_py(PRELUDE + code)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.strip().splitlines()


TAMPER_REGISTRY = {
    "delete the module": 'sys.modules.pop("_dlcast_shared", None)',
    "replace the module": 'sys.modules["_dlcast_shared"] = types.ModuleType("_dlcast_shared")',
    "delete its attribute": (
        'm = sys.modules.get("_dlcast_shared")\n'
        'if m is not None and hasattr(m, "borrow_registry"): del m.borrow_registry'
    ),
}


@pytest.mark.parametrize("tamper", list(TAMPER_REGISTRY))
def test_registry_survives_tampering_with_sys_modules(tamper):
    # `dlcast_testext` finds (or publishes) the registry; `dlcast_second`
    # has made no call yet when its place is tampered with, so it looks
    # for the registry afterwards: it must find the same one.
    # The memory is a PyTorch tensor, so that no NumPy-specific check is
    # involved (and every abi3 level reads it: buffers other than bytes are
    # refused below abi3-py311).
    lines = run(
        f"""
import torch
a = torch.zeros(4, dtype=torch.float64)
ext.fill_f64(a, 1.0)
{TAMPER_REGISTRY[tamper]}
def callback():
    print(outcome(second.fill, a, 5.0))
    print("live", second.live_borrows())
ext.hold_mut_and_call(a, callback)
print("after", a.tolist(), ext.live_borrows(), second.live_borrows())
"""
    )
    assert lines[0].startswith("refused: fill(): argument 'x': the array's memory is in use"), lines
    assert lines[1] == "live 1", lines
    assert lines[2] == "after [1.0, 1.0, 1.0, 1.0] 0 0", lines


def test_registry_is_out_of_reach_of_python_objects():
    # No object the garbage collector knows (every container Python code
    # can find) holds the registry's capsule, so no Python code can delete
    # it; it is read here from the interpreter's state through the C API.
    lines = run(
        """
import gc
ext.fill_f64(np.zeros(2), 1.0)
api = ctypes.pythonapi
api.PyInterpreterState_Get.restype = ctypes.c_void_p
# A borrowed reference: a plain pointer, then an object (a `py_object`
# result type would steal a reference it does not own).
api.PyInterpreterState_GetDict.restype = ctypes.c_void_p
api.PyInterpreterState_GetDict.argtypes = [ctypes.c_void_p]
d = ctypes.cast(api.PyInterpreterState_GetDict(api.PyInterpreterState_Get()), ctypes.py_object).value
cap = d.get("dlcast.borrow_registry")
print(type(cap).__name__, "dlcast.borrow_registry" in repr(cap))
print("reachable", gc.is_tracked(d) or any(o is d for o in gc.get_objects()))
print("referrers", [type(r).__name__ for r in gc.get_referrers(cap) if r is not d and r is not globals()])
"""
    )
    assert lines == ["PyCapsule True", "reachable False", "referrers []"], lines


# A capsule made with ctypes whose functions are Python callbacks: dlcast
# must never call them (they would run Python code between a raw read and
# the body).
FAKE_REGISTRY = """
calls = []
ACQ = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p)
REL = ctypes.CFUNCTYPE(None, ctypes.c_uint64)
LIVE = ctypes.CFUNCTYPE(ctypes.c_size_t)
acq = ACQ(lambda r, c: calls.append("acquire") or 1)
rel = REL(lambda i: calls.append("release"))
live = LIVE(lambda: calls.append("live") or 0)
class Api(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint64), ("acquire", ACQ), ("release", REL), ("live", LIVE)]
table = Api(1, acq, rel, live)
name = ctypes.c_char_p(b"dlcast.borrow_registry")
new = ctypes.pythonapi.PyCapsule_New
new.restype = ctypes.py_object
new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
fake = new(ctypes.addressof(table), name.value, None)
"""


def test_a_registry_made_with_ctypes_is_never_called():
    # Put where the registry is looked up, before any dlcast call: in
    # `sys.modules` and in the interpreter's state dictionary (through the
    # C API, which only ctypes reaches).
    lines = run(
        FAKE_REGISTRY
        + """
shared = types.ModuleType("_dlcast_shared")
shared.borrow_registry = fake
sys.modules["_dlcast_shared"] = shared
api = ctypes.pythonapi
api.PyInterpreterState_Get.restype = ctypes.c_void_p
# A borrowed reference: a plain pointer, then an object (a `py_object`
# result type would steal a reference it does not own).
api.PyInterpreterState_GetDict.restype = ctypes.c_void_p
api.PyInterpreterState_GetDict.argtypes = [ctypes.c_void_p]
ctypes.cast(api.PyInterpreterState_GetDict(api.PyInterpreterState_Get()), ctypes.py_object).value["dlcast.borrow_registry"] = fake
try:
    ext.fill_f64(np.zeros(3), 1.0)
    print("ran")
except RuntimeError as e:
    print("refused:", e)
print("calls", calls)
"""
    )
    assert lines[0].startswith("refused:") and "borrow registry" in lines[0], lines
    assert lines[1] == "calls []", lines


RNP_TAMPER = {
    "deleted": "delattr(core, RNP)",
    "deleted, then a dlcast call": "delattr(core, RNP)\next.fill_f64(np.zeros(2), 1.0)",
}


@pytest.mark.parametrize("tamper", list(RNP_TAMPER))
def test_rust_numpy_table_survives_deletion(tamper):
    # dlcast published its registry as rust-numpy's table; it is deleted
    # before the rust-numpy extension's first borrow. Either dlcast puts it
    # back (at its next call) or it finds the table rust-numpy published
    # instead and acquires its views there too: either way both see each
    # other's borrows, both ways round.
    lines = run(
        f"""
import dlcast_rnp as rnp
ext.hold_ref_and_call(np.zeros(3), noop)
assert hasattr(core, RNP)
{RNP_TAMPER[tamper]}
a = np.zeros(4)
print(rnp.hold_mut_and_call(a, lambda: print(outcome(ext.hold_ref_and_call, a, noop))))
print(ext.hold_mut_and_call(a, lambda: print(outcome(rnp.hold_ref_and_call, a, noop))))
print(rnp.hold_ref_and_call(a, lambda: print(outcome(second.fill, a, 3.0))))
print(ext.live_borrows(), a.tolist())
"""
    )
    assert lines[0].startswith("refused: hold_ref_and_call(): argument 'x'"), lines
    assert "rust-numpy" in lines[0], lines
    assert lines[2].startswith("refused:") and "already borrowed" in lines[2], lines
    assert lines[4].startswith("refused: fill(): argument 'x'"), lines
    assert lines[6] == "0 [1.0, 1.0, 1.0, 1.0]", lines


FAKE_RNP = """
calls = []
FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
RFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
fa = FN(lambda f, a: calls.append("acquire") or 0)
fm = FN(lambda f, a: calls.append("acquire_mut") or 0)
fr = RFN(lambda f, a: calls.append("release"))
fq = RFN(lambda f, a: calls.append("release_mut"))
class Shared(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint64), ("flags", ctypes.c_void_p),
                ("acquire", FN), ("acquire_mut", FN), ("release", RFN), ("release_mut", RFN)]
table = Shared(1, None, fa, fm, fr, fq)
name = ctypes.c_char_p(RNP.encode())
new = ctypes.pythonapi.PyCapsule_New
new.restype = ctypes.py_object
new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
fake = new(ctypes.addressof(table), name.value, None)
"""


@pytest.mark.parametrize("when", ["before the first call", "after a call"])
def test_a_rust_numpy_table_made_with_ctypes_is_never_called(when):
    # rust-numpy's extensions would use such a table (its name is right),
    # so dlcast cannot see their borrows: it refuses NumPy arrays rather
    # than call it.
    first = "" if when == "before the first call" else "ext.fill_f64(np.zeros(2), 1.0)"
    lines = run(
        FAKE_RNP
        + f"""
{first}
setattr(core, RNP, fake)
try:
    ext.fill_f64(np.zeros(3), 1.0)
    print("ran")
except RuntimeError as e:
    print("refused:", e)
print("calls", calls)
"""
    )
    assert lines[0].startswith("refused:") and "_RUST_NUMPY_BORROW_CHECKING_API" in lines[0], lines
    assert lines[1] == "calls []", lines


def test_an_object_in_rust_numpys_place_refuses_numpy_arrays():
    # Something that is no table at all: no rust-numpy extension can borrow
    # through it either, but dlcast cannot tell where their borrows are.
    lines = run(
        """
ext.fill_f64(np.zeros(2), 1.0)
setattr(core, RNP, "not a capsule")
try:
    ext.fill_f64(np.zeros(3), 1.0)
    print("ran")
except RuntimeError as e:
    print("refused:", e)
delattr(core, RNP)
ext.fill_f64(np.zeros(3), 1.0)
print("republished", getattr(core, RNP) is not None)
"""
    )
    assert lines[0].startswith("refused:") and "_RUST_NUMPY_BORROW_CHECKING_API" in lines[0], lines
    assert lines[1] == "republished True", lines


REDIRECT = {
    "sys.modules entry replaced": (
        'sys.modules["numpy._core.multiarray"] = types.ModuleType("numpy._core.multiarray")',
        'sys.modules["numpy._core.multiarray"] = core',
    ),
    "sys.modules entry deleted": (
        'del sys.modules["numpy._core.multiarray"]',
        'sys.modules["numpy._core.multiarray"] = core',
    ),
    "module class replaced": (
        "class Module(types.ModuleType): pass\ncore.__class__ = Module",
        "core.__class__ = types.ModuleType",
    ),
}


@pytest.mark.parametrize("redirect", list(REDIRECT))
def test_a_redirected_rust_numpy_lookup_refuses_numpy_arrays(redirect):
    # After dlcast's table is in place (a first call), Python code changes
    # where a rust-numpy extension's next first look-up would go (its
    # `import` of NumPy's module, then an attribute of whatever it finds):
    # every later call's check sees it, NumPy arrays are refused until it is
    # put back, and then accepted again.
    change, restore = REDIRECT[redirect]
    lines = run(
        f"""
ext.fill_f64(np.zeros(2), 1.0)
{change}
try:
    ext.fill_f64(np.zeros(3), 1.0)
    print("ran")
except RuntimeError as e:
    print("refused:", e)
{restore}
a = np.zeros(3)
ext.fill_f64(a, 1.0)
print(a.tolist())
"""
    )
    assert lines[0].startswith("refused: dlcast cannot see rust-numpy's borrows"), lines
    assert lines[1] == "[1.0, 1.0, 1.0]", lines


@pytest.mark.parametrize("version", ["1.0.0", "3.0"])
def test_a_faked_numpy_version_changes_nothing(version):
    # Faked before dlcast's first call: dlcast still publishes rust-numpy's
    # table on the module NumPy 2 has (where rust-numpy, which learned the
    # module before, looks) and reads dtypes with NumPy 2's layout.
    lines = run(
        f"""
import warnings
warnings.simplefilter("ignore")
import dlcast_rnp as rnp
# rust-numpy learns its module from the real version (a refused argument:
# no borrow, so no table yet), then the version is faked.
print(outcome(rnp.hold_mut_and_call, [1.0], noop))
np.__version__ = {version!r}
a = np.zeros(4)
print(ext.hold_ref_and_call(a, noop))
print("published on numpy._core", RNP in vars(core))
print(rnp.hold_mut_and_call(a, lambda: print(outcome(ext.hold_ref_and_call, a, noop))))
print(ext.hold_mut_and_call(a, lambda: print(outcome(rnp.hold_ref_and_call, a, noop))))
print(ext.live_borrows())
"""
    )
    assert lines[0].startswith("refused:"), lines
    assert lines[2] == "published on numpy._core True", lines
    assert lines[3].startswith("refused: hold_ref_and_call(): argument 'x'"), lines
    assert lines[5].startswith("refused:") and "already borrowed" in lines[5], lines
    assert lines[7] == "0", lines


def test_a_fake_array_api_is_never_called():
    # NumPy's `_ARRAY_API` capsule replaced before dlcast's first call by a
    # table made with ctypes that names the real `numpy.ndarray` type: dlcast
    # reads NumPy's ABI and makes arrays through NumPy's C API only from a
    # table that lies in NumPy's own image.
    lines = run(
        """
calls = []
umath = sys.modules["numpy._core._multiarray_umath"]
real = ctypes.pythonapi.PyCapsule_GetPointer
real.restype = ctypes.c_void_p
real.argtypes = [ctypes.py_object, ctypes.c_char_p]
real_table = (ctypes.c_void_p * 400).from_address(real(umath._ARRAY_API, None))
table = (ctypes.c_void_p * 400)(*real_table)
V = ctypes.CFUNCTYPE(ctypes.c_uint)
version = V(lambda: calls.append("version") or 0x01000009)
P = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_int)
descr = P(lambda n: calls.append("descr") or 0)
for i, f in ((0, version), (211, version), (45, descr), (94, descr), (282, descr)):
    table[i] = ctypes.cast(f, ctypes.c_void_p).value
new = ctypes.pythonapi.PyCapsule_New
new.restype = ctypes.py_object
new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
umath._ARRAY_API = new(ctypes.addressof(table), None, None)
import dlcast_rnp as rnp
a = np.zeros(4)
out = ext.doubled(np.ones(3))
print(type(out).__name__, out.tolist())
print(rnp.hold_mut_and_call(a, lambda: print(outcome(ext.hold_ref_and_call, a, noop))))
print("calls", calls)
"""
    )
    assert lines[0] == "ndarray [2.0, 2.0, 2.0]", lines
    assert lines[1].startswith("refused: hold_ref_and_call(): argument 'x'"), lines
    assert lines[-1] == "calls []", lines


def test_a_registry_of_another_librarys_static_data_is_never_trusted():
    # The capsule points into NumPy's own C API table (static data of
    # `_multiarray_umath`, which Python code cannot write): entries 209..212
    # read as (version, acquire, release, live) are real C functions of that
    # library, so the image check passes. The "registry" then grants every
    # borrow: a `&mut [f64]` and a `&[f64]` of one array coexist in a body.
    lines = run(
        """
import numpy._core._multiarray_umath as mu
api = ctypes.pythonapi
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
numpy_table = api.PyCapsule_GetPointer(mu._ARRAY_API, None)
new = api.PyCapsule_New
new.restype = ctypes.py_object
new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
api.PyInterpreterState_Get.restype = ctypes.c_void_p
api.PyInterpreterState_GetDict.restype = ctypes.py_object
api.PyInterpreterState_GetDict.argtypes = [ctypes.c_void_p]
state = api.PyInterpreterState_GetDict(api.PyInterpreterState_Get())
api.Py_IncRef(ctypes.py_object(state))  # ctypes takes the borrowed reference as its own
name = ctypes.c_char_p(b"dlcast.borrow_registry")
state["dlcast.borrow_registry"] = new(numpy_table + 8 * 209, name, None)
a = np.zeros(4)
try:
    print(outcome(ext.mut_and_ref, a, a))
except RuntimeError as e:
    print("refused:", e)
"""
    )
    assert lines[0].startswith("refused:"), lines


def test_a_rust_numpy_table_of_another_librarys_functions_is_never_called():
    # rust-numpy's table with every function set to libpython's
    # `PyObject_Hash` and `flags` to a Python object: a real C function in
    # one library's image, so dlcast adopts the table and calls "acquire"
    # in phase 2, which runs the object's `__hash__` (Python code) between
    # the raw read and the body. Returning 0 there means "granted"; the
    # code could as well have freed the array's memory.
    lines = run(
        """
seen = []
class Evil:
    def __hash__(self):
        seen.append(ext.raw_reads_in_progress())
        return 0
evil = Evil()
class Shared(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint64), ("flags", ctypes.c_void_p)] + [
        (n, ctypes.c_void_p) for n in ("acquire", "acquire_mut", "release", "release_mut")]
h = ctypes.cast(ctypes.pythonapi.PyObject_Hash, ctypes.c_void_p).value
table = Shared(1, id(evil), h, h, h, h)
new = ctypes.pythonapi.PyCapsule_New
new.restype = ctypes.py_object
new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
name = ctypes.c_char_p(RNP.encode())
setattr(core, RNP, new(ctypes.addressof(table), name, None))
try:
    ext.fill_f64(np.zeros(3), 1.0)
    print("ran")
except RuntimeError as e:
    print("refused:", e)
print("python code inside the raw reads:", True in seen)
"""
    )
    assert lines[1] == "python code inside the raw reads: False", lines
