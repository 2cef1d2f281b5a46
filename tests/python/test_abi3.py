"""What depends on the stable-ABI level the test extension was built for.

`make abi3` builds the test extension for PyO3's lowest abi3 level
(`abi3-py39`), whose limited API has no buffer protocol
(`ext.BUFFER_PROTOCOL` is false), and runs the pytest suite against it;
`make py-test` runs these tests against the normal build, where the C
paths are taken. Each test asserts what both builds must do, and what
only one of them does.
"""

import array
import gc
import struct

import numpy as np
import pytest

import dlcast_testext as ext
from conftest import run_py


def test_exported_array_shares_its_memory_with_numpy():
    a, _ = ext.arange_default("float64", [2, 3])
    n = np.asarray(a)
    assert n.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    n[1, 2] = 42.0
    assert np.from_dlpack(a)[1, 2] == 42.0
    if ext.BUFFER_PROTOCOL:
        assert memoryview(a).tolist()[1][2] == 42.0
        assert not hasattr(a, "__array_interface__")
    else:
        with pytest.raises(TypeError):
            memoryview(a)
        i = a.__array_interface__
        assert i["version"] == 3 and i["shape"] == (2, 3) and i["strides"] == (24, 8)
        assert i["typestr"] == "<f8" and i["data"][1] is False


def test_numpy_array_over_an_export_keeps_it_alive():
    freed0 = ext.export_stats()[1]
    a, _ = ext.arange_default("int32", [4])
    n = np.asarray(a)
    del a
    gc.collect()
    assert ext.export_stats()[1] == freed0
    assert n.tolist() == [0, 1, 2, 3]
    del n
    gc.collect()
    assert ext.export_stats()[1] == freed0 + 1


def test_read_only_export_stays_read_only_through_numpy():
    ro = np.arange(3.0)
    ro.flags.writeable = False
    n = np.asarray(ext.identity(ro))
    assert not n.flags.writeable
    with pytest.raises(ValueError):
        n[0] = 1.0


def test_bytes_and_bytearray_are_read_in_place():
    b = bytes([1, 2, 3, 4])
    assert ext.import_path(b) == "buffer" and ext.values(b) == [1, 2, 3, 4]
    with pytest.raises(TypeError, match="read-only"):
        ext.zero_bytes(b)
    ba = bytearray([1, 2, 3, 4])
    assert ext.values(ba) == [1, 2, 3, 4]
    assert ext.zero_bytes(ba) == 4
    assert ba == bytearray(4)


@pytest.mark.parametrize("kind", ["memoryview", "array", "strided", "read-only"])
def test_other_buffer_objects_are_read_in_place_or_refused_below_3_11(kind):
    ba = bytearray(struct.pack("4d", 1.0, 2.0, 3.0, 4.0))
    arr = array.array("d", [1.0, 2.0, 3.0, 4.0])
    x = {
        "memoryview": lambda: memoryview(ba).cast("d"),
        "array": lambda: arr,
        "strided": lambda: memoryview(ba).cast("d")[::-2],
        "read-only": lambda: memoryview(bytes(ba)).cast("d")[1:],
    }[kind]()
    if not ext.BUFFER_PROTOCOL:
        # Below abi3-py311: only bytes and bytearray (their C accessors).
        with pytest.raises(BufferError, match="abi3-py311"):
            ext.values(x)
        return
    assert ext.import_path(x) == "buffer"
    assert ext.values(x) == {"strided": [4.0, 2.0], "read-only": [2.0, 3.0, 4.0]}.get(
        kind, [1.0, 2.0, 3.0, 4.0])
    if kind == "read-only":
        with pytest.raises(TypeError, match="read-only"):
            ext.fill_f64(x, 7.5)
        return
    ext.fill_f64(x, 7.5)
    # Written in place: the exporter's own memory changed.
    after = list(arr) if kind == "array" else list(struct.unpack("4d", ba))
    assert after == ([1.0, 7.5, 3.0, 7.5] if kind == "strided" else [7.5] * 4)


def test_buffer_input_pins_its_exporter_while_viewed():
    # A callback resizes the bytearray the view reads: the exporter must
    # refuse while dlcast holds its buffer, even once the caller's own
    # memoryview is released.
    ba = bytearray(struct.pack("3d", 1.0, 2.0, 3.0))
    mv = memoryview(ba).cast("d")

    def grow():
        try:
            mv.release()  # refused on the C path: dlcast holds an export of it
        except BufferError:
            pass
        ba.extend(b"\0" * 8 * 100)

    if not ext.BUFFER_PROTOCOL:
        # Below abi3-py311 a memoryview is not read in place: this
        # parameter converts, so the body reads NumPy's copy, whatever the
        # callback does to the exporter.
        assert ext.sum_around_call(mv, grow) == (6.0, 6.0)
        return
    with pytest.raises(BufferError):
        ext.sum_around_call(mv, grow)
    assert len(ba) == 24


def test_buffer_inputs_without_numpy():
    # bytes and bytearray never need NumPy; below Python 3.11 in abi3
    # builds, other buffer objects are refused with a message that says
    # what to pass instead.
    r = run_py("""
        import array, struct, sys
        sys.modules["numpy"] = None
        import dlcast_testext as ext
        ba = bytearray(b"ab")
        ext.zero_bytes(ba)
        print(ba == bytearray(2))
        print(ext.values(b"ab") == [97, 98])
        try:
            print(ext.values(array.array("d", [1.0, 2.0])))
        except BufferError as e:
            print("BufferError:", e)
        print(ext.BUFFER_PROTOCOL)
    """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:2] == ["True", "True"]
    if lines[3] == "True":
        assert lines[2] == "[1.0, 2.0]"
    else:
        assert lines[2].startswith("BufferError: values(): argument 'x': ")
        assert "numpy.asarray(x)" in lines[2] and "abi3-py311" in lines[2]


@pytest.mark.hostile
def test_replaced_numpy_asarray_cannot_redirect_a_writable_buffer():
    # Below Python 3.11 in abi3 builds, a buffer's address is found through
    # NumPy: a replaced `numpy.asarray` that hands back an array over other
    # memory (an immutable `bytes`, same shape and strides) must not make
    # the body's `&mut` point there. The call is refused, or writes the
    # argument's own memory (the C path, which never asks NumPy).
    r = run_py("""
        import array
        import numpy as np
        import dlcast_testext as ext
        victim = bytes(bytearray(b"\\x07" * 16))
        real = np.asarray
        np.asarray = lambda *a, **k: real(memoryview(victim))
        target = array.array("B", b"\\x07" * 16)
        try:
            print("wrote", ext.zero_bytes(target))
        except BufferError as e:
            print("BufferError", e)
        print(victim == b"\\x07" * 16, bytes(target) == b"\\x07" * 16)
        print(ext.BUFFER_PROTOCOL)
    """)
    assert r.returncode == 0, r.stderr
    first, untouched, c_path = r.stdout.splitlines()
    if c_path == "True":
        assert first == "wrote 16" and untouched == "True False"
    else:
        assert first.startswith("BufferError zero_bytes(): argument 'x': "), first
        assert "numpy.asarray" in first
        assert untouched == "True True"


@pytest.mark.hostile
def test_replaced_memoryview_getters_cannot_widen_or_unlock_a_buffer():
    # Below Python 3.11 in abi3 builds, buffers are held through a private
    # memoryview. memoryview's getters are C code of a static type, but
    # Python code can replace them through the type's dictionary (reached
    # with the garbage collector): liars claiming a larger shape, other
    # strides, a larger item size or a writable buffer must not widen what
    # the body reads, nor let it write read-only memory, even with NumPy's
    # array getters lying alike. Either build: every call reads exactly the
    # argument's own bytes, or is refused.
    r = run_py("""
        import array, gc, sys
        import numpy as np
        import dlcast_testext as ext
        for tp in (memoryview, np.ndarray):
            d = gc.get_referents(tp.__dict__)[0]
            d["shape"] = property(lambda self: (1 << 16,))
            d["strides"] = property(lambda self: (1,))
            d["itemsize"] = property(lambda self: 1)
        d = gc.get_referents(memoryview.__dict__)[0]
        d["format"] = property(lambda self: "B")
        d["readonly"] = property(lambda self: False)
        sys._clear_type_cache()
        frozen = bytes(range(16))
        for x in (array.array("d", [1.0, 2.0]), frozen, bytearray(b"ab")):
            try:
                print("values", len(ext.values(x)))
            except Exception as e:
                print("values", type(e).__name__)
        try:
            print("zero", ext.zero_bytes(frozen))
        except Exception as e:
            print("zero", type(e).__name__)
        print("frozen intact", frozen == bytes(range(16)))
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    # The array.array of two float64 (or refused), 16 bytes, 2 bytes.
    assert lines[0] in ("values 2", "values BufferError"), lines
    assert lines[1:3] == ["values 16", "values 2"], lines
    assert lines[3] != "zero 16", lines
    assert lines[4] == "frozen intact True", lines


@pytest.mark.hostile
def test_a_builtin_renamed_through_gc_runs_no_python_code_in_the_raw_reads():
    # The limited API (any abi3 level) cannot read an object's weak-reference
    # list, so the private-alias check calls `_weakref.getweakrefcount`'s C
    # function in phase 2: a builtin renamed through the garbage collector
    # must not pass for it (names are read from the C struct).
    r = run_py("""
        import gc, sys, builtins, _weakref, torch
        import dlcast_testext as ext
        real = gc.get_referents(type(len).__dict__)[0]
        orig = real["__name__"]
        class Name:
            def __get__(self, obj, tp=None):
                return "getweakrefcount" if obj is builtins.len else orig.__get__(obj, tp)
            def __set__(self, obj, value):
                orig.__set__(obj, value)
        real["__name__"] = Name()
        sys._clear_type_cache()
        _weakref.getweakrefcount = builtins.len
        seen = []
        def tensor_len(self):
            seen.append(ext.raw_reads_in_progress())
            return 0
        torch.Tensor.__len__ = tensor_len
        try:
            ext.sum_f64(torch.ones(3, dtype=torch.float64))
        except (BufferError, TypeError) as e:
            pass
        print("python code inside the raw reads:", True in seen)
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[-1] == "python code inside the raw reads: False", r.stdout


# Where the runtime's code differs by abi3 level (`cfg(Py_LIMITED_API)`,
# `cfg(Py_3_x)`), what differs, and the test files that exercise each
# branch. `make abi3` runs the files the Makefile lists in
# ABI3_PYTEST_FILES against the abi3-py39 build, not the whole suite.
ABI3_BRANCHES = {
    "borrow/rust_numpy/place.rs": ("whether a data descriptor shadows rust-numpy's table: the "
                            "classes' dictionaries read in C, or the look-up itself in abi3 "
                            "builds (phase 1 only)",
                            ["test_rust_numpy", "test_registry_is_one",
                             "test_replaced_attributes"]),
    "borrow/rust_numpy/seen.rs": ("the dictionaries' version tags (none under abi3: looked up every "
                           "time, in phase 2 too)",
                           ["test_rust_numpy", "test_registry_is_one", "test_replaced_attributes"]),
    "error/export.rs": ("the buffer protocol's refusals, or `__array_interface__`'s below 3.11",
                        ["test_abi3", "test_exports"]),
    "export/array.rs": ("the buffer protocol, or `__array_interface__` below 3.11",
                        ["test_abi3", "test_exports", "test_export_constructions", "test_ownership"]),
    "import/buffer_protocol.rs": ("buffer inputs: the C buffer protocol, or a private "
                                  "memoryview (and NumPy) below 3.11; conversions of a held "
                                  "buffer through a memoryview of it, or none below 3.11",
                                  ["test_abi3", "test_frameworks", "test_producers",
                                   "test_conversions"]),
    "import/capsule.rs": ("`__dlpack__` by vectorcall, or with a keyword dict below 3.12",
                          ["test_producers", "test_gpu_streams"]),
    "import/exchange.rs": ("the exchange table's per-type cache (no version tags under abi3)",
                           ["test_exchange_api", "test_torch_paths"]),
    "import/mod.rs": ("the private alias's weak-reference check",
                      ["test_torch_tensors", "test_torch_modes", "test_torch_trusts_c_state"]),
    "import/numpy.rs": ("how the ndarray type's name is read", ["test_fast_paths"]),
    "import/torch/direct/mod.rs": ("the classes whose tensors are read directly, by version "
                                   "tag; none under abi3 (no tags): the general path",
                                   ["test_torch_paths", "test_torch_tensors"]),
    "import/torch/mod.rs": ("TensorBase's getters through `tp_descr_get` or `__get__`",
                            ["test_torch_paths", "test_torch_modes", "test_torch_trusts_c_state"]),
    "lib.rs": ("abi3t refused at compile time (`make abi3-check`)", []),
    "trust.rs": ("a type's real MRO: `tp_mro`, or `type`'s own `__mro__` member descriptor "
                 "(checked) read through `PyMember_GetOne`",
                 ["test_torch_tensors", "test_torch_paths"]),
}
# The soundness files, whose checked fallbacks differ under abi3, and the
# buffer import's leak test.
ABI3_ALSO = ["test_replaced_attributes", "test_registry_is_one", "test_copies_respect_borrows",
             "test_leaks"]


def test_the_abi3_subset_covers_every_branch():
    import pathlib
    import re

    root = pathlib.Path(__file__).parent.parent.parent
    src = root / "dlcast-runtime" / "src"
    branches = {
        str(p.relative_to(src))
        for p in src.rglob("*.rs")
        if re.search(r"cfg!?\(.*Py_(?:LIMITED_API|3_\d+)", p.read_text())
    }
    assert branches == set(ABI3_BRANCHES), "a runtime file gained or lost an abi3 branch: map it"
    make = (root / "Makefile").read_text()
    listed = re.search(r"ABI3_PYTEST_FILES := ((?:.*\\\n)*.*)", make).group(1)
    listed = set(listed.replace("\\", " ").split())
    wanted = {f for _, files in ABI3_BRANCHES.values() for f in files} | set(ABI3_ALSO)
    assert wanted <= listed, sorted(wanted - listed)
    for name in listed:
        assert (pathlib.Path(__file__).parent / f"{name}.py").exists(), name


# Below abi3-py311 a bytearray input is kept from resizing by a memoryview
# of dlcast's, which the garbage collector would list: Python code that
# finds it (`gc.get_objects()`) and `release()`s it would let the bytearray
# reallocate while dlcast holds its address. Other buffers are refused
# there (they would be read through memoryview objects NumPy makes).
RELEASED_HOLDERS = """
import array, gc
import numpy as np
import dlcast_testext as ext

def release_and_grow(obj, out):
    for o in gc.get_objects():
        if type(o) is memoryview and o.obj is obj:
            o.release()
    try:
        obj.extend(obj[:1] * (1 << 18))  # reallocates, if allowed
        out.append("moved")
    except BufferError:
        out.append("pinned")

# In the body: a `&mut` of an array.array's memory, and a callback.
a = array.array("d", [0.0] * 8)
body = []
try:
    ext.hold_mut_and_call(a, lambda: release_and_grow(a, body))
except BufferError:
    body.append("refused")
print("body", body)

# In phase 1 of a later argument, before phase 2 reads the first one.
b = bytearray(64)
early = []

class Later:
    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, **kw):
        release_and_grow(b, early)
        return np.zeros(4, np.uint8).__dlpack__(**kw)

try:
    ext.u8_mut_pair(b, Later())
except Exception:
    pass
print("early", early)
"""


@pytest.mark.hostile
def test_buffer_input_stays_pinned_when_python_code_releases_every_memoryview():
    r = run_py(RELEASED_HOLDERS)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "moved" not in r.stdout, r.stdout
    body = "body ['pinned']" if ext.BUFFER_PROTOCOL else "body ['refused']"
    assert body in r.stdout and "early ['pinned']" in r.stdout, r.stdout
