"""The driver of test_replaced_attributes.py, run in an interpreter of its
own: `python replacement_harness.py ATTRIBUTE...` prints one JSON line per
(attribute, stand-in, timing) with what the workload saw.

The parent imports NumPy, PyTorch and the test extensions but makes no
dlcast call; each case runs in a forked child, so that "before" means
before dlcast's first call in that process (its caches still empty), and a
crash of one case (a signal) is reported, not fatal to the others.
"""

import array
import ctypes
import json
import os
import sys
import traceback
import warnings

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import dlcast_rnp as rnp
import dlcast_second as second
import dlcast_testext as ext

# What the harness itself uses, taken before any stand-in replaces it.
NDARRAY, ASARRAY, TENSOR, MEMORYVIEW = np.ndarray, np.asarray, torch.Tensor, memoryview
F32, F64 = torch.float32, torch.float64
NO_TORCH_FUNCTION = torch._C.DisableTorchFunction

# torch.frombuffer over a bytes object warns once; the test wants exactly that.
warnings.filterwarnings("ignore", message="The given buffer is not writable")

# ---------------------------------------------------------------------------
# What a stand-in saw: every call dlcast made to it, and whether it came
# inside a call's raw reads (phase 2), where no Python code may run.

CALLS = []
IN_READS = []


def note(label):
    CALLS.append(label)
    if ext.raw_reads_in_progress():
        IN_READS.append(label)


def saboteur(label, original):
    """Answers as `original` does; inside raw reads it also frees what the
    current call's arguments were made of (the damage such a call does)."""

    def standin(*args, **kwargs):
        note(label)
        if ext.raw_reads_in_progress():
            for v in VICTIMS:
                if isinstance(v, NDARRAY):
                    v.resize(0, refcheck=False)
                elif isinstance(v, TENSOR):
                    v.set_()
        return original(*args, **kwargs)

    return standin


def liar(label, answer):
    def standin(*args, **kwargs):
        note(label)
        return answer

    return standin


class NoOpContext:
    """A stand-in for PyTorch's disabling contexts that disables nothing."""

    def __init__(self, *args, **kwargs):
        note("context")

    def __enter__(self):
        note("context.__enter__")
        return self

    def __exit__(self, *exc):
        return False


# C tables made of ctypes callbacks: Python code behind C function pointers.
CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_keep = []


def callback_table(label, header, n_functions, answer):
    """A capsule named like a C table: `header` words, then `n_functions`
    ctypes callbacks that note the call and return `answer`."""
    fns = [CALLBACK(lambda a, b, c, i=i: (note(f"{label}[{i}]"), answer)[1]) for i in range(n_functions)]
    words = (ctypes.c_uint64 * (len(header) + n_functions))(
        *header, *(ctypes.cast(f, ctypes.c_void_p).value for f in fns)
    )
    _keep.append((fns, words))
    return words


def capsule_of(words, name):
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    cname = ctypes.c_char_p(name)
    _keep.append(cname)
    return new(ctypes.addressof(words), cname, None)


# ---------------------------------------------------------------------------
# The attributes: where each lives, and the stand-ins that attack it.


def numpy_core():
    return "numpy._core" if np.__version__.startswith("2") else "numpy.core"


def owner_of(path):
    """(object, attribute name) of a dotted path; `sys.modules[NAME]` for an
    entry of sys.modules."""
    if path.startswith("sys.modules["):
        return sys.modules, path[len("sys.modules[") : -1].strip("'\"")
    module, _, name = path.rpartition(".")
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        mod = ".".join(parts[:i])
        try:
            __import__(mod)
        except ImportError:
            continue
        obj = sys.modules[mod]
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj, name
    raise LookupError(path)


def get(owner, name):
    return owner[name] if isinstance(owner, dict) else getattr(owner, name)


def put(owner, name, value):
    if isinstance(owner, dict):
        owner[name] = value
    else:
        setattr(owner, name, value)


def delete(owner, name):
    if isinstance(owner, dict):
        owner.pop(name, None)
    elif hasattr(owner, name):
        delattr(owner, name)


def standins(path, original):
    """(name, value or DELETE) for each stand-in of the attribute at `path`."""
    label = path.rsplit(".", 1)[-1]
    out = [("deleted", DELETE)]
    if path.endswith("__version__"):
        return out + [("liar 1.0", "1.0.0"), ("liar 3.0", "3.0.0")]
    if path.endswith("__dlpack_c_exchange_api__") or path.endswith("_dlpack_exchange_api"):
        # version 1.3, no prev_api, 5 functions that fail (-1).
        table = callback_table(label, [0x3_00000001, 0], 5, -1)
        cap = capsule_of(table, b"dlpack_exchange_api")
        if path.endswith("_dlpack_exchange_api"):
            return out + [("ctypes table", liar(label, cap))]
        return out + [("ctypes table", cap)]
    if path.endswith("_ARRAY_API"):
        # A table of NULL pointers where NumPy's C API would be.
        table = (ctypes.c_uint64 * 512)()
        _keep.append(table)
        return out + [("null table", capsule_of(table, None))]
    if path.endswith("_RUST_NUMPY_BORROW_CHECKING_API"):
        # rust-numpy's shared table: version, flags, then acquire,
        # acquire_mut, release, release_mut, all "granted".
        table = callback_table(label, [1, 0], 4, 0)
        return out + [("ctypes table", capsule_of(table, b"_RUST_NUMPY_BORROW_CHECKING_API"))]
    if path == "_dlcast_shared.borrow_registry":
        # dlcast's registry: version 1, acquire (grants every borrow: id 7),
        # release, live.
        table = callback_table(label, [1], 3, 7)
        return out + [("ctypes table", capsule_of(table, b"dlcast.borrow_registry"))]
    if path == "sys.modules['_dlcast_shared']":
        import types

        fake = types.ModuleType("_dlcast_shared")
        table = callback_table("registry", [1], 3, 7)
        fake.borrow_registry = capsule_of(table, b"dlcast.borrow_registry")
        return out + [("fake module", fake)]
    if path == "torch.Tensor":
        return out + [("subclass with __torch_function__", EvilSub)]
    if path == "torch._C.TensorBase":
        return out + [("Python class", FakeBase)]
    if path == "numpy.ndarray":
        return out + [("subclass", type("Sub", (np.ndarray,), {}))]
    if isinstance(original, torch.dtype):
        return out + [("another dtype", torch.float64 if original != torch.float64 else torch.float32)]
    if isinstance(original, type):
        return out + [("no-op context", NoOpContext)]
    if callable(original):
        lie = LIES.get(path, None)
        return out + [("liar", liar(label, lie)), ("saboteur", saboteur(label, original))]
    return out


DELETE = object()

# What a liar answers, where one answer is the dangerous one.
LIES = {
    "torch._C._len_torch_function_stack": 0,
    "torch._C._len_torch_dispatch_stack": 0,
    "torch.is_inference_mode_enabled": True,
    "_weakref.getweakrefcount": 0,
    "sys._is_gil_enabled": True,
    "numpy.lib.array_utils.byte_bounds": (0, 1),
    "numpy.asarray": np.zeros(3),
}


# ---------------------------------------------------------------------------
# The workload: every import path and export; each check returns None when
# the call ended with correct values or a Python exception, else what went
# wrong.

VICTIMS = []
IMMUTABLE = bytes(range(1, 33))


def call(f, *args):
    """f(*args), or the exception it raised (never a crash)."""
    VICTIMS[:] = [a for a in args if isinstance(a, (NDARRAY, TENSOR))]
    try:
        return f(*args)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - any Python exception is a valid end
        return e
    finally:
        VICTIMS.clear()


def fails(r):
    return isinstance(r, BaseException)


def expect(r, ok):
    """None if `r` is an exception or passes `ok`."""
    if fails(r):
        return None
    return None if ok(r) else f"wrong result {r!r}"


def check_numpy():
    return expect(call(ext.slice_sum, np.arange(10.0)), lambda r: r == 45.0)


def check_numpy_write():
    a = np.zeros(4)
    r = call(ext.slice_fill, a, 2.0)
    return None if fails(r) or (a == 2.0).all() else f"not written: {a}"


def check_immutable():
    """Writable parameters never write into a `bytes`, however reached."""
    wrong = []
    for f, make in [
        (ext.zero_bytes, lambda: IMMUTABLE),
        (ext.zero_bytes, lambda: MEMORYVIEW(IMMUTABLE)),
        (ext.slice_fill, lambda: np.frombuffer(IMMUTABLE, np.float64)),
        (ext.slice_fill, lambda: torch.frombuffer(bytearray(IMMUTABLE), dtype=F64)),
    ]:
        call(f, *([make()] + ([0.0] if f is ext.slice_fill else [])))
    if IMMUTABLE != bytes(range(1, 33)):
        wrong.append("a bytes object was written")
    return "; ".join(wrong) or None


def check_torch():
    return expect(call(ext.slice_sum, torch.arange(10.0, dtype=F64)), lambda r: r == 45.0)


def check_torch_write():
    t = torch.zeros(4, dtype=F64)
    v0 = t._version
    r = call(ext.slice_fill, t, 2.0)
    if fails(r):
        return None
    if not bool((t == 2.0).all()):
        return f"not written: {t}"
    return None if t._version > v0 else "the version counter did not move"


class EvilMode(TorchFunctionMode):
    """Notes every function it sees and answers `.data` and `contiguous`
    with a tensor over immutable memory."""

    seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", repr(func))
        EvilMode.seen.append(name)
        if "data" in name or "contiguous" in name or name == "__get__":
            return torch.frombuffer(EVIL, dtype=F64)
        return func(*args, **(kwargs or {}))


EVIL = bytes(32)


class EvilSub(TENSOR):
    """A subclass that notes what it sees and answers like EvilMode."""

    seen = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", repr(func))
        EvilSub.seen.append(name)
        if "data" in name or "contiguous" in name or name == "__get__":
            return torch.frombuffer(EVIL, dtype=F64)
        with NO_TORCH_FUNCTION():
            return func(*args, **(kwargs or {}))


class FakeBase:
    """A stand-in for torch._C.TensorBase whose getters lie."""

    @property
    def data(self):
        note("TensorBase.data")
        return torch.frombuffer(EVIL, dtype=F64)

    requires_grad = property(lambda self: (note("requires_grad"), False)[1])
    _python_dispatch = property(lambda self: (note("_python_dispatch"), False)[1])

    def is_neg(self):
        note("is_neg")
        return False

    is_conj = _is_zerotensor = is_inference = is_neg


def check_subclass():
    """A subclass's __torch_function__ never sees (or answers) dlcast's own
    calls."""
    t = torch.zeros(4, dtype=F64).as_subclass(EvilSub)
    EvilSub.seen.clear()
    r = call(ext.slice_fill, t, 5.0)
    wrong = []
    if EVIL != bytes(32):
        wrong.append("a write landed in immutable memory")
    seen = [n for n in EvilSub.seen if n not in ("__eq__", "all", "__bool__")]
    if seen:
        wrong.append(f"the subclass saw dlcast's own calls: {seen}")
    if not fails(r):
        with NO_TORCH_FUNCTION():
            if not bool((t == 5.0).all()):
                wrong.append("not written")
    return "; ".join(wrong) or None


def check_torch_mode():
    t = torch.zeros(4, dtype=F64)
    u = torch.arange(4.0, dtype=F64)
    EvilMode.seen.clear()
    with EvilMode():
        r = call(ext.slice_fill, t, 5.0)
        s = call(ext.slice_sum, u)
    wrong = []
    if EVIL != bytes(32):
        wrong.append("a write landed in immutable memory")
    if EvilMode.seen:
        wrong.append(f"the mode saw dlcast's own calls: {EvilMode.seen}")
    if not fails(r) and not bool((t == 5.0).all()):
        wrong.append(f"not written: {t}")
    if not fails(s) and s != 6.0:
        wrong.append(f"wrong sum {s}")
    return "; ".join(wrong) or None


class SeenOps(TorchDispatchMode):
    """Notes every operator that reaches Python dispatch, and answers each
    with a tensor over immutable memory."""

    seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        SeenOps.seen.append(str(func))
        return torch.frombuffer(EVIL, dtype=F64)


def check_dispatch_mode():
    """An active TorchDispatchMode never sees (or answers) dlcast's own
    reads of a tensor. (A conversion is ordinary PyTorch work that a mode
    sees by design; its result is a read-only copy, read in full.)"""
    u = torch.arange(4.0, dtype=F64)
    w = torch.zeros(4, dtype=F64)
    SeenOps.seen.clear()
    with SeenOps():
        s = call(ext.slice_sum, u)
        r = call(ext.slice_fill, w, 5.0)
    wrong = [expect(s, lambda s: s == 6.0)]
    if EVIL != bytes(32):
        wrong.append("a write landed in immutable memory")
    if not fails(r) and not bool((w == 5.0).all()):
        wrong.append(f"not written: {w}")
    if SeenOps.seen:
        wrong.append(f"the dispatch mode saw dlcast's own operators: {SeenOps.seen}")
    return "; ".join(w for w in wrong if w) or None


def check_capsule():
    a = np.arange(5.0)
    return expect(call(ext.slice_sum, a.__dlpack__()), lambda r: r == 10.0)


def check_buffers():
    wrong = []
    r = call(ext.u8_values, bytearray(b"abc"))
    if not fails(r) and list(r) != [97, 98, 99]:
        wrong.append(f"u8_values {r}")
    for buf in (bytearray(b"\x05" * 8), array.array("d", [1.0, 2.0])):
        r = call(ext.zero_bytes, buf)
        if not fails(r) and any(bytes(buf)):
            wrong.append(f"zero_bytes left {bytes(buf)!r}")
    return "; ".join(wrong) or None


def check_conversion():
    x = np.arange(6, dtype=np.float32).reshape(2, 3).T
    wrong = [expect(call(ext.ordered_sum, x), lambda r: r == 15.0)]
    t = torch.arange(6, dtype=F32).reshape(2, 3).T
    wrong.append(expect(call(ext.ordered_sum, t), lambda r: r == 15.0))
    return "; ".join(w for w in wrong if w) or None


def check_registry():
    """A writable view is exclusive: in this extension, another dlcast
    extension, and rust-numpy."""
    wrong = []
    for who, reader in [
        ("this extension", lambda a: ext.slice_sum(a)),
        ("a second dlcast extension", lambda a: second.fill(a, 9.0)),
        ("rust-numpy", lambda a: rnp.borrow_and_call(a, lambda: None)),
    ]:
        a = np.zeros(4)
        r = call(ext.mut_slice_cb, a, lambda a=a, reader=reader: reader(a))
        if not fails(r):
            wrong.append(f"{who} read an array a body held as &mut")
    if ext.live_borrows() != 0:
        wrong.append(f"{ext.live_borrows()} borrows left")
    return "; ".join(wrong) or None


def check_exports():
    wrong = []
    x = np.arange(4, dtype=np.float32)
    r = call(ext.doubled_like, x)
    if not fails(r) and (type(r) is not NDARRAY or r.tolist() != [0, 2, 4, 6]):
        wrong.append(f"doubled_like(numpy) {r!r}")
    t = torch.arange(4, dtype=F32)
    r = call(ext.doubled_like, t)
    if not fails(r) and (type(r) is not TENSOR or r.tolist() != [0, 2, 4, 6]):
        wrong.append(f"doubled_like(torch) {r!r}")
    r = call(ext.passthrough_f64, np.arange(3.0))
    if not fails(r) and ASARRAY(r).tolist() != [0.0, 1.0, 2.0]:
        wrong.append(f"passthrough {r!r}")
    return "; ".join(wrong) or None


def check_jax():
    import jax.numpy as jnp

    r = call(ext.identity_jax, np.arange(3.0))
    # A replaced `jax.numpy.from_dlpack` answers what it likes (None here).
    if not fails(r) and r is not None and [float(v) for v in r] != [0.0, 1.0, 2.0]:
        return f"identity_jax {r!r}"
    r = call(ext.slice_sum, jnp.arange(4.0))
    return expect(r, lambda r: r == 6.0)


def check_tensorflow():
    import tensorflow as tf

    return expect(call(ext.slice_sum, tf.constant([1.0, 2.0], dtype=tf.float64)), lambda r: r == 3.0)


WORKLOAD = [
    check_numpy,
    check_numpy_write,
    check_immutable,
    check_torch,
    check_torch_write,
    check_torch_mode,
    check_subclass,
    check_dispatch_mode,
    check_capsule,
    check_buffers,
    check_conversion,
    check_registry,
    check_exports,
]
# Frameworks slow to import run only for the attributes that concern them.
EXTRA = {"jax": check_jax, "tensorflow": check_tensorflow}


def run_workload(path):
    problems = {}
    checks = list(WORKLOAD)
    for key, check in EXTRA.items():
        if key in path:
            checks.append(check)
    for check in checks:
        try:
            p = check()
        except Exception:  # the harness itself failed: report, never hide
            p = "harness error: " + traceback.format_exc(limit=3)
        if p:
            problems[check.__name__] = p
    return problems


class Replacer:
    """An argument whose `__dlpack__` applies a replacement: the replacement
    happens in the middle of a call, between two arguments' first steps."""

    def __init__(self, apply):
        self.apply = apply
        self.a = np.arange(2.0)

    def __dlpack__(self, **kw):
        self.apply()
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def case(path, name, value, timing):
    def apply():
        try:
            owner, attr = owner_of(path)
        except (LookupError, AttributeError):
            # dlcast's shared module appears at its first call: before it,
            # plant one.
            import types

            owner, attr = types.ModuleType(path.split(".")[0]), path.rsplit(".", 1)[1]
            sys.modules[path.split(".")[0]] = owner
        if value is DELETE:
            delete(owner, attr)
        else:
            put(owner, attr, value)

    result = {"attribute": path, "standin": name, "timing": timing}
    if timing == "before":
        apply()
    else:
        first = run_workload(path)
        if first:
            result["warm-up"] = first
        r = call(ext.sum_f64_and_len, np.arange(3.0), Replacer(apply))
        if not fails(r) and tuple(r) != (3.0, 2):
            result["replacing call"] = f"wrong result {r!r}"
    problems = run_workload(path)
    if problems:
        result["problems"] = problems
    if IN_READS:
        result["called inside raw reads"] = sorted(set(IN_READS))
    result["calls"] = len(CALLS)
    return result


def main(paths):
    assert ext.raw_reads_in_progress() is not None, "needs a debug build of the test extension"
    for path in paths:
        try:
            original = get(*owner_of(path))
        except (LookupError, AttributeError, KeyError):
            original = None
        for name, value in standins(path, original):
            for timing in ("before", "during"):
                sys.stdout.flush()
                pid = os.fork()
                if pid == 0:
                    code = 0
                    try:
                        print(json.dumps(case(path, name, value, timing)), flush=True)
                    except BaseException:
                        print(json.dumps({"attribute": path, "standin": name, "timing": timing,
                                          "harness": traceback.format_exc()}), flush=True)
                        code = 1
                    os._exit(code)
                _, status = os.waitpid(pid, 0)
                if os.WIFSIGNALED(status):
                    print(json.dumps({"attribute": path, "standin": name, "timing": timing,
                                      "crash": f"signal {os.WTERMSIG(status)}"}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
