"""Generates the test extension's stub and type-checks it with
`mypy --strict`, together with a typed caller (must pass) and a file of
wrong calls (must fail exactly on the lines marked `# E: <code>`)."""

import os
import pathlib
import re
import subprocess
import sys

from mypy import api

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent.parent
STUBS = ROOT / "out" / "stubs"


def mypy(*files: pathlib.Path) -> tuple[str, int]:
    out, err, status = api.run(
        ["--strict", "--cache-dir", str(ROOT / ".mypy_cache"), "--no-error-summary",
         "--python-version", "3.11", *map(str, files)]
    )
    return out + err, status


def main() -> int:
    subprocess.run(
        [sys.executable, str(ROOT / "dlcast-stubgen" / "dlcast_stubgen.py"), "dlcast_testext", "-o", str(STUBS)],
        check=True,
    )
    os.environ["MYPYPATH"] = str(STUBS)
    stub = STUBS / "dlcast_testext.pyi"
    out, status = mypy(stub, HERE / "caller.py")
    if status != 0:
        print(out)
        print("mypy --strict refused the stub or the typed caller")
        return 1
    print("mypy --strict: stub and typed caller pass")

    out, _ = mypy(HERE / "wrong.py")
    wrong = (HERE / "wrong.py").read_text().splitlines()
    expected = {
        (i + 1, m.group(1)) for i, line in enumerate(wrong) if (m := re.search(r"# E: ([\w-]+)", line))
    }
    got = {
        (int(m.group(1)), m.group(2))
        for m in re.finditer(r"wrong\.py:(\d+): error: .*\[([\w-]+)\]", out)
    }
    if got != expected:
        print(out)
        print(f"expected errors {sorted(expected)}, got {sorted(got)}")
        return 1
    print(f"mypy --strict: the {len(expected)} wrong calls are refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
