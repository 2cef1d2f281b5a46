"""Instructions per call of one bench function, under callgrind.

Wall times on a shared 2-core machine move by 10-30% between runs;
instruction counts do not. This runs `valgrind --tool=callgrind` twice on a
Python loop of `f(x)` calls (20,000 and 60,000 calls, after a warm-up) and
prints the difference divided by 40,000: the instructions of one call,
including the loop iteration and PyO3's call (so `floor` is the baseline
every other function is compared against). With --keep, the two callgrind
files are kept for `callgrind_annotate --inclusive=yes` (per-function costs:
subtract the 20,000-call file's figure from the 60,000-call one's).

    python bench/callgrind.py dlcast_sum_len numpy
    python bench/callgrind.py dlcast_sum_len torch --keep /tmp/cg
    python bench/callgrind.py floor numpy --module-dir /other/build/py

Inputs: `numpy` (float64 `(10,)`), `torch` (the same as a PyTorch tensor).
The module is bench/target/py's dlcast_bench (bench/build.sh), or the one in
--module-dir.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
N_SMALL, N_LARGE = 20_000, 60_000


def inner(module_dir: str, fn: str, inp: str, n: int) -> None:
    """The measured process: a warm-up, then `n` calls in a loop whose
    function and argument are locals (as timeit's)."""
    sys.path.insert(0, module_dir)
    import numpy as np

    import dlcast_bench as m

    x = np.arange(10, dtype=np.float64)
    if inp == "torch":
        import torch

        x = torch.from_numpy(x.copy())
    f = getattr(m, fn)

    def loop(f, x, n):
        for _ in range(n):
            f(x)

    loop(f, x, 100)
    loop(f, x, n)


def total_ir(path: Path) -> int:
    m = re.search(r"^(?:summary|totals): (\d+)", path.read_text(errors="replace"), re.M)
    if not m:
        raise SystemExit(f"no totals in {path}")
    return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fn")
    ap.add_argument("input", choices=["numpy", "torch"])
    ap.add_argument("--module-dir", default=str(HERE / "target" / "py"))
    ap.add_argument("--keep", help="directory for the callgrind files")
    ap.add_argument("--inner", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.inner is not None:
        inner(a.module_dir, a.fn, a.input, a.inner)
        return
    out = Path(a.keep or tempfile.mkdtemp(prefix="dlcast-cg-"))
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1")
    ir = {}
    for n in (N_SMALL, N_LARGE):
        f = out / f"callgrind.{a.fn}.{a.input}.{n}"
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={f}",
                        sys.executable, __file__, a.fn, a.input, "--module-dir", a.module_dir,
                        "--inner", str(n)], env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        ir[n] = total_ir(f)
    per = (ir[N_LARGE] - ir[N_SMALL]) / (N_LARGE - N_SMALL)
    print(f"{a.fn} {a.input}: {per:,.0f} instructions per call ({a.module_dir})")


if __name__ == "__main__":
    main()
