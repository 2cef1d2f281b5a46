"""The tvm-ffi peer of the benchmark: bench/tvmffi/bench.cc, compiled with
`tvm_ffi.cpp.load_inline` (tvm-ffi's own inline build: its headers, g++ through
ninja, both PyPI's `ninja` and the system g++) into bench/target/tvmffi.

    from tvmffi_bench import load
    m = load()          # builds on the first call, then reuses the build
    m.sum_len(torch.zeros(10, dtype=torch.float64))

load_inline writes the source into the build directory only when it
changed and runs ninja, which recompiles only when the source or a flag
did: repeated `make bench` runs do not recompile. `python
bench/tvmffi/tvmffi_bench.py` builds it and prints the library's path
(bench/build.sh does).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "bench.cc"
BUILD_DIR = HERE.parent / "target" / "tvmffi"
FUNCTIONS = ["floor1", "floor4", "sum_len", "args1", "args4"]
# tvm-ffi's defaults are -std=c++17 -fPIC -O2; -O3 as the nanobind module
# (bench/build.sh), later flags win. NDEBUG: no debug-only checks.
CFLAGS = ["-O3", "-DNDEBUG"]


def load():
    """The built module (a tvm_ffi.Module); builds it if needed."""
    import ninja
    import tvm_ffi.cpp

    # tvm-ffi runs `ninja` from PATH: PyPI's, also when the venv is not
    # activated (`.venv/bin/python bench/run.py`); the compiler: $CXX, else
    # g++ as bench/build.sh.
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    os.environ.setdefault("CXX", "g++")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    return tvm_ffi.cpp.load_inline(
        "tvmffi_bench",
        cpp_sources=SOURCE.read_text(),
        functions=FUNCTIONS,
        extra_cflags=CFLAGS,
        build_directory=str(BUILD_DIR),
    )


def library_path() -> Path:
    """The shared library load() builds (for callgrind's symbol names)."""
    return next(BUILD_DIR.glob("tvmffi_bench.*"), BUILD_DIR / "tvmffi_bench.so")


if __name__ == "__main__":
    m = load()
    import tvm_ffi

    print(f"tvm-ffi {tvm_ffi.__version__}: {library_path()} "
          f"({', '.join(FUNCTIONS)})", file=sys.stderr)
