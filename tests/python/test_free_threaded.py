"""Free-threaded CPython: every extension module of this repository declares
`#[pymodule(gil_used = true)]`, so that a free-threaded interpreter enables
the GIL when it imports one (dlcast's calls refuse to run without it, and
their error says how to fix that). The flag is read back from the built
extension: PyO3 writes it as the module definition's `Py_mod_gil` slot on
CPython 3.13 and later only, so the suite's interpreter (3.11) sees no slot,
and a slow test builds the quick start for a 3.13+ interpreter of this
machine and reads the slot there.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The `#[pymodule]` of every extension module the repository builds.
MODULE_SOURCES = {
    "dlcast_testext": "tests/src/lib.rs",
    "dlcast_second": "tests/second/src/lib.rs",
    "dlcast_rnp": "tests/rnp/src/lib.rs",
    "quickstart": "examples/quickstart/src/lib.rs",
    "dlcast_demo": "examples/demo/src/lib.rs",
}

# CPython's values (Include/moduleobject.h).
PY_MOD_EXEC = 2
PY_MOD_GIL = 4
PY_MOD_GIL_USED = 0

# Reads a loaded module's definition slots through the C API (run here, and
# in the 3.13+ interpreter of the slow test): `PyModule_GetDef`, then the
# `m_slots` array of `PyModuleDef` ({int slot; void *value}, zero-terminated).
SLOTS_READER = r'''
import ctypes

def module_slots(module):
    api = ctypes.pythonapi
    api.PyModule_GetDef.restype = ctypes.c_void_p
    api.PyModule_GetDef.argtypes = [ctypes.py_object]
    d = api.PyModule_GetDef(module)
    if not d:
        raise AssertionError("PyModule_GetDef gave no definition")
    word = ctypes.sizeof(ctypes.c_void_p)
    # PyModuleDef_Base: the object header, m_init, m_index, m_copy; then
    # m_name, m_doc, m_size, m_methods, m_slots.
    m_slots = d + object.__basicsize__ + 3 * word + 4 * word
    slots = ctypes.c_void_p.from_address(m_slots).value
    out = {}
    while slots:
        slot = ctypes.c_int.from_address(slots).value
        if slot == 0:
            break
        out[slot] = ctypes.c_void_p.from_address(slots + word).value or 0
        slots += 2 * word
    return out

def native_module(name):
    # maturin installs the extension as `name.name` inside a package.
    import importlib
    try:
        return importlib.import_module(f"{name}.{name}")
    except ImportError:
        return importlib.import_module(name)
'''
exec(SLOTS_READER)


def pymodule_attribute(source):
    """The `#[pymodule...]` line of an extension's source."""
    lines = [line for line in (ROOT / source).read_text().splitlines() if line.startswith("#[pymodule")]
    assert len(lines) == 1, source
    return lines[0]


@pytest.mark.parametrize("module, source", sorted(MODULE_SOURCES.items()))
def test_every_extension_declares_gil_used(module, source):
    assert pymodule_attribute(source) == "#[pymodule(gil_used = true)]", (
        f"{source}: the module must keep the GIL on under free-threaded CPython")


@pytest.mark.parametrize("module", ["dlcast_testext", "dlcast_second", "dlcast_rnp", "quickstart"])
def test_built_extension_records_gil_used(module):
    # The extensions `make ext` builds into the virtualenv.
    slots = module_slots(native_module(module))
    assert PY_MOD_EXEC in slots  # the reader found PyO3's slots
    if sys.version_info >= (3, 13):
        assert slots.get(PY_MOD_GIL) == PY_MOD_GIL_USED
    else:
        # PyO3 writes `Py_mod_gil` for 3.13+ only: none to read here (the
        # slow test below reads it from a 3.13+ build).
        assert PY_MOD_GIL not in slots


def newer_interpreter():
    """A CPython 3.13+ of this machine (not the suite's), or None."""
    candidates = [os.environ.get("DLCAST_PY313")]
    candidates += [shutil.which(f"python3.{minor}") for minor in (13, 14, 15)]
    pyenv = pathlib.Path.home() / ".pyenv" / "versions"
    if pyenv.is_dir():
        candidates += [str(p) for p in sorted(pyenv.glob("3.1[3-9]*/bin/python3"))]
    for exe in filter(None, candidates):
        try:
            out = subprocess.run([exe, "-c", "import sys; print(sys.version_info >= (3, 13))"],
                                 capture_output=True, text=True, timeout=60)
        except OSError:
            continue
        if out.stdout.strip() == "True":
            return exe
    return None


@pytest.mark.slow
def test_quickstart_built_for_313_carries_gil_used(tmp_path):
    """The README's quick start, built for CPython 3.13+ (a target dir of its
    own, kept between runs), imported there: its definition's `Py_mod_gil`
    slot says the module uses the GIL."""
    exe = newer_interpreter()
    if exe is None:
        pytest.skip("no CPython 3.13+ on this machine (set DLCAST_PY313 to one)")
    target = ROOT / "target" / "py313"
    env = {**os.environ, "CARGO_TARGET_DIR": str(target)}
    env.pop("PYO3_PYTHON", None)
    env.pop("VIRTUAL_ENV", None)
    maturin = pathlib.Path(sys.executable).parent / "maturin"
    build = subprocess.run(
        [str(maturin), "build", "-q", "--profile", "dev", "-m", str(ROOT / "examples/quickstart/Cargo.toml"),
         "-i", exe, "--out", str(tmp_path / "wheels")],
        capture_output=True, text=True, env=env, timeout=1500)
    assert build.returncode == 0, build.stderr[-4000:]
    (wheel,) = (tmp_path / "wheels").glob("quickstart-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = SLOTS_READER + "print(module_slots(native_module('quickstart')))\n"
    run = subprocess.run([exe, "-c", probe], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(site)})
    assert run.returncode == 0, run.stderr
    slots = eval(run.stdout)
    assert slots.get(PY_MOD_GIL) == PY_MOD_GIL_USED, slots


def test_refusal_says_how_to_fix_it():
    """The first call's error on a free-threaded interpreter with the GIL
    off (compiled only there: `make free-threaded` type-checks it) names the
    attribute that fixes it."""
    source = (ROOT / "dlcast-runtime/src/error/call.rs").read_text()
    start = source.index("#[cfg(Py_GIL_DISABLED)]\n    #[error(")
    message = re.sub(r"\\\n\s*", "", source[start:source.index("FreeThreaded,", start)])
    assert "#[pymodule(gil_used = true)]" in message
    assert "PYTHON_GIL=1" in message
