"""Generates stubs and type-checks them with `mypy --strict`, each together
with a typed caller (must pass) and a file of wrong calls (must fail exactly
on the lines marked `# E: <code>`):

- the test extension's stub, from dlcast's generator
  (dlcast-stubgen/dlcast_stubgen.py): caller.py, wrong.py;
- the inline-module extension's (tests/inspect, built with the `inspect`
  feature), from PyO3's introspection through `maturin generate-stubs`:
  inspect_caller.py, inspect_wrong.py (its `# E:` lines);
- the same extension's from dlcast's generator: the same files, where the
  `# E-dlcast:` lines, which PyO3's stubs cannot refuse, must fail too.

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


def mypy(stubs: pathlib.Path, *files: pathlib.Path) -> tuple[str, int]:
    os.environ["MYPYPATH"] = str(stubs)
    out, err, status = api.run(
        ["--strict", "--cache-dir", str(ROOT / ".mypy_cache" / stubs.name), "--no-error-summary",
         "--python-version", "3.11", *map(str, files)]
    )
    return out + err, status


def check(name: str, stubs: pathlib.Path, stub: pathlib.Path, caller: str, wrong: str, markers: str) -> bool:
    out, status = mypy(stubs, stub, HERE / caller)
    if status != 0:
        print(out)
        print(f"{name}: mypy --strict refused the stub or the typed caller")
        return False
    print(f"{name}: mypy --strict passes the stub and the typed caller")

    out, _ = mypy(stubs, HERE / wrong)
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
