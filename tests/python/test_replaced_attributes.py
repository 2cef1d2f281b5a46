"""No fact that decides safety comes from an attribute Python code can
replace.

`ATTRIBUTES` lists every Python-level attribute dlcast's runtime looks up
(`test_every_lookup_is_listed` keeps the list complete against the
runtime's sources). For each, `replacement_harness.py` replaces it, one at
a time, with hostile stand-ins — deleted; a liar (a constant answer, a C
table of ctypes callbacks, a fake module or class); a saboteur (answers as
the original, but frees the call's arguments if dlcast calls it inside a
call's raw reads) — once before dlcast's first call in a fresh process and
once in the middle of a call (from an argument's `__dlpack__`), and runs a
workload over every import path and export. Each case must end with:

- every call ending in correct values or a Python exception;
- no write into immutable memory (`bytes`), however reached;
- PyTorch's version counter moved by every write;
- no `__torch_function__` / `__torch_dispatch__` mode or subclass seeing
  or answering dlcast's own reads;
- a writable view exclusive against this extension, a second dlcast
  extension and rust-numpy (one borrow registry), no borrow left behind;
- no stand-in (Python code) called inside a call's raw reads (the debug
  build's tripwire, `raw_reads_in_progress`);
- no crash.

The abi3-py39 build (`make abi3`) runs this file too: its fallbacks
(`_weakref.getweakrefcount`, the buffer import through NumPy) are among
the attributes.
"""

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import dlcast_testext as ext
import facts_table

HERE = pathlib.Path(__file__).parent
RUNTIME = HERE.parent.parent / "dlcast-runtime" / "src"

# Every Python-level attribute dlcast looks up, as a dotted path (an entry
# of sys.modules as `sys.modules['NAME']`).
ATTRIBUTES = [
    # NumPy: its version, types, C API table, functions, rust-numpy's table.
    "numpy.__version__",
    "numpy.ndarray",
    "numpy.asarray",
    "numpy.can_cast",
    "numpy.from_dlpack",
    "numpy.lib.array_utils.byte_bounds",
    "numpy._core._multiarray_umath._ARRAY_API",
    "numpy._core.multiarray._RUST_NUMPY_BORROW_CHECKING_API",
    # dlcast's own borrow registry.
    "sys.modules['_dlcast_shared']",
    "_dlcast_shared.borrow_registry",
    # CPython builtins (the abi3 weak-reference check).
    "_weakref.getweakrefcount",
    "builtins.memoryview",
    "atexit.register",
    # PyTorch.
    "torch.Tensor",
    "torch.Tensor.__dlpack_c_exchange_api__",
    "torch.Tensor.__torch_dispatch__",
    "torch._C.TensorBase",
    "torch._C._len_torch_function_stack",
    "torch._C._len_torch_dispatch_stack",
    "torch._C._increment_version",
    "torch._C.DisableTorchFunction",
    "torch._C._DisableTorchDispatch",
    "torch._C._dlpack_exchange_api",
    "torch._C._to_dlpack_versioned",
    "torch.is_inference_mode_enabled",
    "torch.from_dlpack",
    "torch.float32",
    # PyTorch's direct read: what its layout is learnt and verified with.
    "torch.__version__",
    "torch.float64",
    "torch._C._VariableFunctionsClass",
    "torch._C._dispatch_keys",
    "torch._C.DispatchKeySet",
    "torch._C.DispatchKeySet.raw_repr",
    # Frameworks slow to import last (the harness imports them once).
    "jax.numpy.from_dlpack",
    "tensorflow.experimental.dlpack.to_dlpack",
    "tensorflow.experimental.dlpack.from_dlpack",
]

# Names the runtime looks up that decide nothing about memory, each with
# why a lie there is harmless. `test_every_lookup_is_listed` accepts a
# name found in the sources if it is a component of a path in ATTRIBUTES
# or a key here.
HARMLESS = {
    # The producer's own protocol: called in phase 1, its answer (a capsule)
    # is read and checked in full.
    "__dlpack__": "the producer's own method; its capsule is checked in full",
    "__dlpack_device__": "the producer's own method; the capsule's device decides",
    # Routing: which import path or framework an object takes; each path
    # checks what it reads itself.
    "__module__": "routes an object to an import path whose own checks hold",
    "__mro__": "routes an object to the PyTorch path, which checks TensorBase itself",
    # Conversions: the converted object is a new argument, read and checked
    # in full in phase 2 (read-only in the body).
    "astype": "a conversion; the result is read and checked in full",
    "__array_namespace__": "a conversion; the result is read and checked in full",
    "cast": "tensorflow.cast, a conversion; the result is read and checked in full",
    "detach": "a conversion; the result is read and checked in full",
    "to": "a conversion; the result is read and checked in full",
    "contiguous": "a conversion; the result is read and checked in full",
    "permute": "a conversion; the result is read and checked in full",
    "shape": "the target shape of a conversion, compared with the result's own",
    "dtype": "the source dtype of a conversion, for the same-kind rule's message",
    "char": "numpy.asarray(buffer).dtype.char, whether a buffer NumPy converts is raw bytes: "
            "refused or converted by NumPy's astype, both safe",
    # Methods of NumPy's own static `ndarray` and `memoryview` types (their
    # attributes cannot be replaced), on objects dlcast made.
    "view": "ndarray.view() of NumPy's own array, for a conversion's private view",
    "release": "memoryview.release() of dlcast's memoryview of a held buffer",
    # The message of the refusal of an array NumPy reads but dlcast cannot
    # read in place, by a parameter that does not convert it (writable,
    # noconvert, untyped): the argument is refused whatever these say; they
    # only word why.
    "isnative": "numpy.asarray(x).dtype.isnative, for a refusal's message only",
    "kind": "numpy.asarray(x).dtype.kind, for a refusal's message only",
    "str": "numpy.asarray(x).dtype.str, for a refusal's message only",
    "strides": "numpy.asarray(x).strides, for a refusal's message only",
    # Attributes of objects of static, immutable types (type objects,
    # builtins), read for identity and checked against their C structs.
    # memoryview's getters, below abi3-py311: read only to refuse early
    # (a liar makes dlcast refuse, never read); what is read comes from C
    # (bytes' accessors, or the C struct of NumPy's array over the buffer).
    # test_abi3.py replaces them through the type's dictionary.
    "format": "memoryview's getter, read only to refuse early (abi3 below 3.11)",
    "suboffsets": "memoryview's getter, read only to refuse early (abi3 below 3.11)",
    "itemsize": "memoryview's getter, read only to refuse early (abi3 below 3.11)",
    "data": "TensorBase's own getter (a static, immutable type) / an interface dict's key",
    "__dict__": "the mapping proxy of a static, immutable type",
    "__name__": "a builtin's or static type's own getter",
    "__qualname__": "a static type's own getter",
    "__get__": "a getter of TensorBase's own (static, immutable) descriptors",
    "__func__": "the builtin inside a pybind11 method of PyTorch's dispatch guard, verified",
    "__doc__": "a builtin's own signature text (C-level), checked with it",
    "writeable": "the flags object's own getter of an exact ndarray (a static type)",
    "__enter__": "the disabling contexts of PyTorch, verified with them",
    "__exit__": "the disabling contexts of PyTorch, verified with them",
    "modules": "sys.modules, where dlcast publishes (never reads) its registry's mirror",
    "setdefault": "sys.modules.setdefault, publishing only",
    "register": "atexit.register: a hook that only stops late deleters",
    "_C": "torch._C, the module the verified handles come from",
    "is_inference": "TensorBase's own method (a static, immutable type)",
    # Hand-off functions of exports to frameworks the workload does not
    # import (numpy, torch, jax and tensorflow's are attacked above): the
    # export stays valid whatever they do; their answer is the result.
    "array_api_strict": "an export's hand-off function; its answer is the result",
    "cupy": "an export's hand-off function; its answer is the result",
    "mlx.core": "an export's hand-off function; its answer is the result",
    "paddle": "an export's hand-off function; its answer is the result",
    "numpy.core._multiarray_umath": "NumPy 1.x's place of _ARRAY_API (attacked above for NumPy 2)",
    # Looked up only on a free-threaded CPython, which this suite does not
    # run (`make free-threaded` type-checks it).
    "_is_gil_enabled": "sys._is_gil_enabled, free-threaded builds only",
    "experimental": "a component of tensorflow.experimental.dlpack",
    "dlpack": "a component of tensorflow.experimental.dlpack",
}


def run_harness(paths):
    proc = subprocess.run(
        [sys.executable, str(HERE / "replacement_harness.py"), *paths],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=900,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p),
        },
    )
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc, rows


@pytest.fixture(scope="module")
def results():
    """Every (attribute, stand-in, timing) case, run once for the module."""
    proc, rows = run_harness(ATTRIBUTES)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return rows


def test_the_tripwire_is_armed():
    # The debug build tracks raw reads; the harness refuses a release build.
    assert ext.raw_reads_in_progress() is False


@pytest.mark.hostile
@pytest.mark.parametrize("path", ATTRIBUTES)
def test_a_replaced_attribute_changes_no_safety_fact(results, path):
    rows = [r for r in results if r["attribute"] == path]
    # deleted + at least one stand-in, each before and during calls
    assert len(rows) >= 4, rows
    bad = [
        {k: v for k, v in r.items() if k != "calls"}
        for r in rows
        if set(r) - {"attribute", "standin", "timing", "calls"}
    ]
    assert not bad, json.dumps(bad, indent=1)


def lookups_in_runtime():
    """Every string literal the runtime passes to an attribute lookup,
    import or method call of Python objects."""
    names = set()
    pattern = re.compile(
        r"(?:getattr|import|get_item|hasattr|call_method[01]?)\(\s*(?:pyo3::)?(?:intern!\(\s*\w+(?:\.py\(\))?\s*,\s*)?\"([^\"]+)\""
    )
    for path in RUNTIME.rglob("*.rs"):
        names.update(pattern.findall(path.read_text()))
    # The hand-off functions of `returns = <option>`: looked up from the
    # framework table's `handover` column (as module and attribute), read
    # from the table itself rather than its source text.
    for module, attr in facts_table.HANDOFFS.values():
        names.update([module, attr])
    return names


def unlisted(found):
    """The names of `found` neither ATTRIBUTES nor HARMLESS covers."""
    listed = set()
    for path in ATTRIBUTES:
        listed.update(re.split(r"[.\[\]']+", path))
    return sorted(
        n for n in found if not (set(n.split(".")) <= listed) and n not in HARMLESS and n not in listed
    )


def test_every_lookup_is_listed():
    found = lookups_in_runtime()
    assert len(found) > 30, found  # the scan still finds the lookups
    missing = unlisted(found)
    assert not missing, (
        "the runtime looks these up: add each to ATTRIBUTES (and the harness's "
        f"stand-ins) or to HARMLESS with why a lie there is harmless: {missing}"
    )


def test_the_lookup_check_bites_for_a_new_hand_off():
    # What adding a framework row (`returns = dpnp`, handed to
    # `dpnp.from_dlpack`) looks like: its module is reported until listed.
    found = lookups_in_runtime() | {"dpnp", "from_dlpack"}
    assert unlisted(found) == ["dpnp"]
    # Every hand-off module of the table is among the names checked.
    assert {m for m, _ in facts_table.HANDOFFS.values()} <= lookups_in_runtime()
