"""Generates stubs and type-checks them with `mypy --strict`, each together
with a typed caller (must pass) and a file of wrong calls (must fail exactly
on the lines marked `# E: <code>`):

- the test extension's stub, from dlcast's generator
  (dlcast-stubgen/dlcast_stubgen.py): caller.py, wrong.py;
- the inline-module extension's (tests/inspect, built with the `inspect`
  feature), from PyO3's introspection through `maturin generate-stubs`:
  inspect_caller.py, inspect_wrong.py (its `# E:` lines);
- the same extension's from dlcast's generator: the same files, where the
  `# E-dlcast:` lines, which PyO3's stubs cannot refuse, must fail too;
- the test extension's stub again where only NumPy and PyTorch are
  installed (the usual case; the others' types are then `Any`):
  numpy_torch_caller.py, numpy_torch_wrong.py, with mypy pointed at an
  interpreter that sees those two only (checked first: it must fail to find
  every other framework).

The extensions must be installed (`make typecheck` does it)."""

import ast
import os
import pathlib
import re
import subprocess
import sys

from mypy import api

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent.parent
OUT = ROOT / "out"
GENERATOR = ROOT / "dlcast-stubgen" / "dlcast_stubgen.py"


def mypy(stubs: pathlib.Path, *files: pathlib.Path, python: pathlib.Path | None = None) -> tuple[str, int]:
    """mypy --strict on `files`, finding installed packages where `python`
    (default: this interpreter) finds them."""
    os.environ["MYPYPATH"] = str(stubs)
    cache = ROOT / ".mypy_cache" / (stubs.name + ("" if python is None else "-" + python.parent.parent.name))
    where = [] if python is None else ["--python-executable", str(python)]
    out, err, status = api.run(
        ["--strict", "--cache-dir", str(cache), "--no-error-summary",
         "--python-version", "3.11", *where, *map(str, files)]
    )
    return out + err, status


# The frameworks the reduced interpreter has, and those it must not find.
NUMPY_TORCH = ("numpy", "torch")
OTHER_FRAMEWORKS = ("jax", "paddle", "array_api_strict", "tensorflow", "mlx.core", "cupy")


def numpy_torch_only() -> pathlib.Path:
    """An interpreter whose packages are NumPy and PyTorch only: a venv
    without the system's packages, whose `.pth` adds a folder of links to
    this interpreter's `numpy` and `torch` (their metadata included)."""
    import numpy
    import torch

    venv = OUT / "numpy-torch-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    links = OUT / "numpy-torch-site"
    links.mkdir(parents=True, exist_ok=True)
    for old in links.iterdir():
        old.unlink()
    for package in (numpy, torch):
        assert package.__file__ is not None
        folder = pathlib.Path(package.__file__).parent
        for path in [folder, *folder.parent.glob(f"{package.__name__}-*.dist-info")]:
            (links / path.name).symlink_to(path)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "numpy_torch.pth").write_text(f"{links}\n")
    return python


def sees_only_numpy_and_torch(stubs: pathlib.Path, python: pathlib.Path) -> bool:
    """mypy, run for `python`, finds NumPy and PyTorch and no other
    framework (else the check with it would show nothing)."""
    probe = OUT / "numpy_torch_probe.py"
    probe.write_text("".join(f"import {m}\n" for m in NUMPY_TORCH + OTHER_FRAMEWORKS))
    out, _ = mypy(stubs, probe, python=python)
    missing = {
        m.group(1)
        for m in re.finditer(r'error: (?:Cannot find implementation or library stub for module named'
                             r'|Library stubs not installed for) "([\w.]+)"', out)
    }
    if not set(OTHER_FRAMEWORKS) <= missing or missing & set(NUMPY_TORCH):
        print(out)
        print(f"{python}: mypy should find {NUMPY_TORCH} and none of {OTHER_FRAMEWORKS}; it missed {sorted(missing)}")
        return False
    print(f"{python}: mypy finds NumPy and PyTorch, no other framework")
    return True


def check(name: str, stubs: pathlib.Path, stub: pathlib.Path, caller: str, wrong: str, markers: str,
          python: pathlib.Path | None = None) -> bool:
    out, status = mypy(stubs, stub, HERE / caller, python=python)
    if status != 0:
        print(out)
        print(f"{name}: mypy --strict refused the stub or the typed caller")
        return False
    print(f"{name}: mypy --strict passes the stub and the typed caller")

    out, _ = mypy(stubs, HERE / wrong, python=python)
    lines = (HERE / wrong).read_text().splitlines()
    expected = {
        (i + 1, m.group(2))
        for i, line in enumerate(lines)
        if (m := re.search(r"# (E|E-dlcast): ([\w-]+)", line)) and m.group(1) in markers.split(",")
    }
    got = {
        (int(m.group(1)), m.group(2))
        for m in re.finditer(rf"{re.escape(wrong)}:(\d+): error: .*\[([\w-]+)\]", out)
    }
    if got != expected:
        print(out)
        print(f"{name}: expected errors {sorted(expected)}, got {sorted(got)}")
        return False
    print(f"{name}: mypy --strict refuses the {len(expected)} wrong calls")
    return True


def _returns(stub: pathlib.Path) -> dict[str, str]:
    """Each top-level function's return annotation, names without their
    modules (PyO3 writes `from numpy import ndarray`, dlcast `numpy.ndarray`)."""

    class Short(ast.NodeTransformer):
        def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
            return ast.Name(node.attr)

    out = {}
    for node in ast.parse(stub.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.returns is not None:
            out[node.name] = ast.unparse(Short().visit(node.returns))
    return out


def same_returns(pyo3_stub: pathlib.Path, own_stub: pathlib.Path) -> bool:
    """The two generators read the same facts: where PyO3's stub types a
    result (not `Any`), dlcast's says the same."""
    pyo3, own = _returns(pyo3_stub), _returns(own_stub)
    typed = {name: ann for name, ann in pyo3.items() if ann != "Any"}
    differ = {name: (ann, own.get(name)) for name, ann in typed.items() if own.get(name) != ann}
    if differ or len(typed) < 3:
        print(f"return types differ between PyO3's stub and dlcast's (PyO3's, dlcast's): {differ}")
        return False
    print(f"the {len(typed)} typed results of PyO3's stub are dlcast's")
    return True


def main() -> int:
    ok = True
    stubs = OUT / "stubs"
    subprocess.run([sys.executable, str(GENERATOR), "dlcast_testext", "-o", str(stubs)], check=True)
    ok &= check("dlcast_testext (dlcast-stubgen)", stubs, stubs / "dlcast_testext.pyi", "caller.py", "wrong.py", "E")

    python = numpy_torch_only()
    ok &= sees_only_numpy_and_torch(stubs, python)
    ok &= check("dlcast_testext (dlcast-stubgen), only NumPy and PyTorch installed", stubs,
                stubs / "dlcast_testext.pyi", "numpy_torch_caller.py", "numpy_torch_wrong.py", "E", python=python)

    pyo3_stubs = OUT / "stubs-pyo3"
    subprocess.run(
        [str(pathlib.Path(sys.executable).parent / "maturin"), "generate-stubs", "-q", "-m", str(ROOT / "tests" / "inspect" / "Cargo.toml"),
         "-i", sys.executable, "-o", str(pyo3_stubs)],
        check=True,
    )
    ok &= check("dlcast_inspect_ext (maturin generate-stubs)", pyo3_stubs,
                pyo3_stubs / "dlcast_inspect_ext" / "__init__.pyi", "inspect_caller.py", "inspect_wrong.py", "E")

    own = OUT / "stubs-inspect"
    subprocess.run([sys.executable, str(GENERATOR), "dlcast_inspect_ext", "-o", str(own)], check=True)
    ok &= check("dlcast_inspect_ext (dlcast-stubgen)", own, own / "dlcast_inspect_ext.pyi",
                "inspect_caller.py", "inspect_wrong.py", "E,E-dlcast")
    ok &= same_returns(pyo3_stubs / "dlcast_inspect_ext" / "__init__.pyi", own / "dlcast_inspect_ext.pyi")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
