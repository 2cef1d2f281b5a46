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

    python bench/callgrind.py --table      # bench/callgrind.md (a few minutes)

--table measures a fixed list of functions (dlcast with NumPy and PyTorch
inputs and `TensorRef`, slice and `ndarray` parameters, one argument and
four, rust-numpy, dlpark and the floors) in two processes per framework,
with collection switched on only inside the extension's functions
(`--toggle-collect` on PyO3's `__pyfunction_*` entry points): the
instructions of one call from its entry to its return, argument extraction
included, the Python-side dispatch (the same for every function) not.
Each figure is the difference between a run of N_LARGE and one of N_SMALL
calls of every function, over the difference in calls, so warm-up and
first-call costs cancel. It also writes the per-call instruction profile
(exclusive cost per function) of `dlcast_sum_len` with a NumPy and with a
PyTorch argument. Then the tvm-ffi functions (bench/tvmffi) with PyTorch
inputs, in two more processes, counted differently (see TVM_TABLE) and
compared above each library's own floor. Writes bench/callgrind.md, which
bench/run.py puts into BENCHMARKS.md.

    python bench/callgrind.py --tvm-only   # only the tvm-ffi rows, printed
"""

from __future__ import annotations

import argparse
import json
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


# --table: (label, function, input) per framework. Inputs: v10 float64
# (10,); pts float32 (1000, 3); args: a, b (1000, 3), w, out (1000,) float32.
TABLE = {
    "numpy": [
        ("floor (bare PyO3 call, one argument)", "floor", "v10"),
        ("dlcast `TensorRef<f64>` (`sum_len`)", "dlcast_sum_len", "v10"),
        ("dlcast `#[shape(_, 3)] #[order(c)] TensorRef<f32>` (`sum_pts`)", "dlcast_sum_pts", "pts"),
        ("dlcast `&[f64]` (`slice_len`)", "dlcast_slice_len", "v10"),
        ("dlcast `ArrayView2<f32>` (`view_first`)", "dlcast_view_first", "pts"),
        ("rust-numpy `PyReadonlyArrayDyn<f64>` (`sum_len`)", "rnp_sum_len", "v10"),
        ("rust-numpy `PyReadonlyArray2<f32>` + checks (`sum_pts`)", "rnp_sum_pts", "pts"),
        ("rust-numpy `PyReadonlyArray1<f64>::as_slice` (`slice_len`)", "rnp_slice_len", "v10"),
        ("rust-numpy `as_array()` (`view_first`)", "rnp_view_first", "pts"),
        ("dlcast `TensorMut<f64>` (`sum_len_mut`)", "dlcast_sum_len_mut", "v10"),
        ("dlcast `&mut [f64]` (`slice_len_mut`)", "dlcast_slice_len_mut", "v10"),
        ("rust-numpy `PyReadwriteArrayDyn<f64>` (`sum_len_mut`)", "rnp_sum_len_mut", "v10"),
        ("sound limit, hand-written `&[f64]` (`limit_slice_len`, bench/rust/src/limit.rs)",
         "limit_slice_len", "v10"),
        ("sound limit, hand-written `&mut [f64]` (`limit_slice_len_mut`)",
         "limit_slice_len_mut", "v10"),
        ("floor4 (bare PyO3 call, four arguments)", "floor4", "args4"),
        ("dlcast `args1` (one `#[shape(n, 3)]`)", "dlcast_args1", "args1"),
        ("dlcast `args4` (3 `TensorRef` + 1 `TensorMut`, shared `n`)", "dlcast_args4", "args4"),
        ("dlcast `args1_native` (one `ArrayView2`)", "dlcast_args1_native", "args1"),
        ("dlcast `args4_native` (2 `ArrayView2`, `&[f32]`, `&mut [f32]`)",
         "dlcast_args4_native", "args4"),
        ("rust-numpy `args1`", "rnp_args1", "args1"),
        ("rust-numpy `args4`", "rnp_args4", "args4"),
        ("dlcast `make_f32(1000)` -> NumPy", "dlcast_make_f32_numpy", "n"),
        ("rust-numpy `make_f32(1000)`", "rnp_make_f32_numpy", "n"),
    ],
    # rust-numpy on its own: a process that calls no dlcast function, so
    # rust-numpy's own borrow table is the one in use (in the "numpy"
    # process dlcast's registry, published first, serves rust-numpy too).
    "numpy-own": [
        ("rust-numpy `PyReadonlyArrayDyn<f64>` (`sum_len`)", "rnp_sum_len", "v10"),
        ("rust-numpy `PyReadonlyArray2<f32>` + checks (`sum_pts`)", "rnp_sum_pts", "pts"),
        ("rust-numpy `PyReadonlyArray1<f64>::as_slice` (`slice_len`)", "rnp_slice_len", "v10"),
        ("rust-numpy `as_array()` (`view_first`)", "rnp_view_first", "pts"),
        ("rust-numpy `PyReadwriteArrayDyn<f64>` (`sum_len_mut`)", "rnp_sum_len_mut", "v10"),
        ("rust-numpy `args1`", "rnp_args1", "args1"),
        ("rust-numpy `args4`", "rnp_args4", "args4"),
    ],
    "torch": [
        ("floor (bare PyO3 call, one argument)", "floor", "v10"),
        ("dlcast `TensorRef<f64>` (`sum_len`)", "dlcast_sum_len", "v10"),
        ("dlcast `#[shape(_, 3)] #[order(c)] TensorRef<f32>` (`sum_pts`)", "dlcast_sum_pts", "pts"),
        ("dlcast `&[f64]` (`slice_len`)", "dlcast_slice_len", "v10"),
        ("dlcast `ArrayView2<f32>` (`view_first`)", "dlcast_view_first", "pts"),
        ("dlcast `TensorMut<f64>` (`sum_len_mut`)", "dlcast_sum_len_mut", "v10"),
        ("dlcast `&mut [f64]` (`slice_len_mut`)", "dlcast_slice_len_mut", "v10"),
        ("dlpark `from_dlpack` (`sum_len`)", "dlpark_sum_len", "v10"),
        ("dlpark + checks (`sum_pts`)", "dlpark_sum_pts", "pts"),
        ("dlpark `cpu_slice` (`slice_len`)", "dlpark_slice_len", "v10"),
        ("dlpark `ArrayViewD` (`view_first`)", "dlpark_view_first", "pts"),
        ("dlpark `args1`", "dlpark_args1", "args1"),
        ("dlpark `args4`", "dlpark_args4", "args4"),
        ("floor4 (bare PyO3 call, four arguments)", "floor4", "args4"),
        ("dlcast `args1` (one `#[shape(n, 3)]`)", "dlcast_args1", "args1"),
        ("dlcast `args4` (3 `TensorRef` + 1 `TensorMut`, shared `n`)", "dlcast_args4", "args4"),
        ("dlcast `args1_native` (one `ArrayView2`)", "dlcast_args1_native", "args1"),
        ("dlcast `args4_native` (2 `ArrayView2`, `&[f32]`, `&mut [f32]`)",
         "dlcast_args4_native", "args4"),
    ],
}
T_SMALL, T_LARGE = 1_000, 3_000
# tvm-ffi (bench/tvmffi), PyTorch inputs: its functions are not PyO3's, so
# there is no `__pyfunction_*` entry to toggle on, and tvm-ffi's own entry
# (the Cython `Function.__call__` in tvm_ffi/core*.so) has no symbol: the
# wheel's module is stripped, and its `Function` is called by vectorcall
# straight from the eval loop (no named CPython function in between). What
# is comparable is the cost above each library's own floor. So the calls
# are made by `map` (consumed by a zero-length deque): collection is
# switched on inside CPython's `map_next`, which takes the next arguments
# from `itertools.repeat` iterators and makes the whole call (tvm-ffi's
# `Function.__call__`, the argument setters and the tensor conversion, the
# packed C call, the result's conversion, the temporaries' release, and
# the result's decref by the deque); `map_next`'s own work is the same for
# every function of one arity and cancels above the floor. The functions of
# one process are told apart by a dump (`--dump-before=os_getpid`) before
# each one's loop.
TVM_TABLE = [
    ("tvm-ffi floor `floor1(0)` (one int)", "floor1", "int1"),
    ("tvm-ffi floor `floor4(0, 0, 0, 0)` (four ints)", "floor4", "int4"),
    ("tvm-ffi `TensorView` (`sum_len`)", "sum_len", "v10"),
    ("tvm-ffi `args1`", "args1", "args1"),
    ("tvm-ffi `args4` (4 `TensorView`)", "args4", "args4"),
]
TVM_TOGGLE = "map_next"
TVM_MARKER = "os_getpid"
# Measured as whole calls (see table_mode): the returning functions and the
# bare call (all in TABLE["numpy"]).
WHOLE = ["floor", "dlcast_make_f32_numpy", "rnp_make_f32_numpy"]
PROFILE_N = 3_000


def inputs(fw: str) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    d = {
        "v10": np.arange(10, dtype=np.float64),
        "pts": rng.random((1000, 3), dtype=np.float32),
        "a": rng.random((1000, 3), dtype=np.float32),
        "b": rng.random((1000, 3), dtype=np.float32),
        "w": rng.random(1000, dtype=np.float32),
        "out": np.zeros(1000, np.float32),
    }
    if fw == "torch":
        import torch

        d = {k: torch.from_numpy(v.copy()) for k, v in d.items()}
    d["args1"] = (d["a"],)
    d["args4"] = (d["a"], d["b"], d["w"], d["out"])
    d["v10"], d["pts"], d["n"] = (d["v10"],), (d["pts"],), (1000,)
    d["int1"], d["int4"] = (0,), (0, 0, 0, 0)
    return d


def inner_tvm(fw: str, n: int) -> None:
    """The measured process of the tvm-ffi table: `os.getpid()` (the dump
    marker) before each function's n + 10 calls and after the last."""
    sys.path.insert(0, str(HERE / "tvmffi"))
    from tvmffi_bench import load

    from collections import deque
    from itertools import repeat

    m = load()
    d = inputs(fw)
    for _, fn, inp in TVM_TABLE:
        f, a = getattr(m, fn), d[inp]
        os.getpid()
        deque(map(f, *[repeat(v, n + 10) for v in a]), maxlen=0)
    os.getpid()


def inner_table(module_dir: str, fw: str, n: int, only: str | None) -> None:
    """The measured process of --table: every function of TABLE[fw] (or
    only `only`), called n + 10 times each."""
    sys.path.insert(0, module_dir)
    import dlcast_bench as m

    d = inputs(fw)
    for _, fn, inp in TABLE[fw]:
        if only and fn != only:
            continue
        f, a = getattr(m, fn), d[inp]
        for _ in range(n + 10):
            f(*a)


def annotate(path: Path, inclusive: bool) -> dict:
    """{function: Ir} from callgrind_annotate."""
    out = subprocess.run(["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}",
                          "--threshold=100", str(path)], capture_output=True, text=True,
                         check=True).stdout
    costs = {}
    for line in out.splitlines():
        mm = re.match(r"^\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(?:[^\s:]+:(?!:))?(.+?)(?:\s+\[.*\])?$", line)
        if mm and not line.lstrip().startswith(("Ir", "--")) and "PROGRAM TOTALS" not in line:
            name = mm.group(2).strip()
            costs[name] = costs.get(name, 0) + int(mm.group(1).replace(",", ""))
    return costs


def run_cg(out: Path, tag: str, args: list[str], toggle: str | None,
           extra: tuple = ()) -> Path:
    """One callgrind run of this script with `args`; collection only inside
    functions matching `toggle`, or everywhere when it is None."""
    f = out / f"callgrind.{tag}"
    env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1")
    collect = ["--collect-atstart=no", f"--toggle-collect={toggle}"] if toggle else []
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={f}", *collect, *extra,
                    sys.executable, __file__, *args], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return f


def table_mode(module_dir: str, out: Path) -> None:
    import datetime as dt

    lines_by_fw = {}
    for fw, items in TABLE.items():
        incl = {}
        for n in (T_SMALL, T_LARGE):
            f = run_cg(out, f"{fw}.{n}", ["-", fw, "--module-dir", module_dir, "--table-inner",
                                         str(n)], "*__pyfunction_*")
            incl[n] = annotate(f, inclusive=True)
        rows = []
        for label, fn, _ in items:
            key = next((k for k in incl[T_LARGE] if k.endswith(f"__pyfunction_{fn}")), None)
            if key is None:
                rows.append((label, None))
                continue
            per = (incl[T_LARGE][key] - incl[T_SMALL].get(key, 0)) / (T_LARGE - T_SMALL)
            rows.append((label, per))
        lines_by_fw[fw] = rows
        print(f"{fw}: " + ", ".join(f"{fn}={p:,.0f}" if p else f"{fn}=?"
                                    for (_, fn, _), (_, p) in zip(items, rows)), flush=True)
    # Returning: whole calls, so that the result's deallocation (after the
    # extension function returned) counts too; the bare call's figure is
    # subtracted when compared.
    whole = {}
    for fn in WHOLE:
        ir = {n: total_ir(run_cg(out, f"whole.{fn}.{n}", ["-", "numpy", "--module-dir", module_dir,
                                                           "--table-inner", str(n), "--only", fn],
                                 None)) for n in (T_SMALL, T_LARGE)}
        whole[fn] = (ir[T_LARGE] - ir[T_SMALL]) / (T_LARGE - T_SMALL)
    print("whole calls: " + ", ".join(f"{fn}={v:,.0f}" for fn, v in whole.items()), flush=True)
    tvm = tvm_table(out)
    print("tvm-ffi (torch): " + ", ".join(f"{fn}={v:,.0f}" for fn, v in tvm.items()), flush=True)
    profiles = {}
    for fw in ("numpy", "torch"):
        f = run_cg(out, f"profile.{fw}", ["-", fw, "--module-dir", module_dir, "--table-inner",
                                          str(PROFILE_N), "--only", "dlcast_sum_len"],
                   "*__pyfunction_dlcast_sum_len")
        excl = annotate(f, inclusive=False)
        incl = annotate(f, inclusive=True)
        total = sum(excl.values())
        calls = PROFILE_N + 10
        top = sorted(excl.items(), key=lambda kv: -kv[1])[:12]
        # Inclusive costs of the callers above the measured function are
        # the function's own (or, with recursion, more): leave them out.
        entry = max(v for k, v in incl.items() if k.endswith("__pyfunction_dlcast_sum_len"))
        itop = sorted(((k, v) for k, v in incl.items() if v < 0.98 * entry),
                      key=lambda kv: -kv[1])[:16]
        profiles[fw] = (total / calls, [(k, v / calls) for k, v in top],
                        [(k, v / calls) for k, v in itop])
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=HERE.parent).stdout.strip()
    md = [
        f"Measured by `python bench/callgrind.py --table` on "
        f"{dt.datetime.now().strftime('%Y-%m-%d %H:%M')} at {rev} (bench/rust's LTO "
        "build). Instructions per call **inside the extension function**: from PyO3's "
        "`__pyfunction_*` entry to its return, argument extraction, dlcast's checks, the "
        "body and the result included; Python's dispatch of the call (the same for every "
        "function of one arity) not. The difference between runs of "
        f"{T_LARGE:,} and {T_SMALL:,} calls of each, over {T_LARGE - T_SMALL:,}: "
        "stable to a few instructions whatever the machine's load. rust-numpy's rows "
        "are measured twice: in the process of the dlcast rows, where dlcast's "
        "registry, published first, is rust-numpy's borrow table too (the setting of the "
        "NumPy targets), and in a process that calls no dlcast function, on rust-numpy's "
        "own table.",
        "",
        "| function | NumPy input | NumPy input, rust-numpy on its own registry | "
        "PyTorch input |",
        "|---|---|---|---|",
    ]
    by_label: dict = {}
    for fw, rows in lines_by_fw.items():
        for label, per in rows:
            by_label.setdefault(label, {})[fw] = per
    for label, d in by_label.items():
        md.append(f"| {label} | " + " | ".join(
            (f"{d[fw]:,.0f}" if d.get(fw) is not None else "—")
            for fw in ("numpy", "numpy-own", "torch"))
                  + " |")
    md += [
        "",
        "Returning: whole calls from Python (`f(1000)` in a loop: dispatch, the function, "
        "and the returned array's deallocation), above the bare call's "
        f"({whole['floor']:,.0f}):",
        "",
        "| function | instructions above the bare call, deallocation included |",
        "|---|---|",
        *[f"| `{fn}` | {v - whole['floor']:,.0f} |" for fn, v in whole.items() if fn != "floor"],
    ]
    md += tvm_md(tvm, {fn: per for (_, fn, _), (_, per) in zip(TABLE["torch"],
                                                                lines_by_fw["torch"])})
    for fw, (total, top, itop) in profiles.items():
        name = "NumPy" if fw == "numpy" else "PyTorch"
        md += [
            "",
            f"Where the {total:,.0f} instructions of one `dlcast_sum_len` call with a {name} "
            f"float64 `(10,)` argument go ({PROFILE_N:,} calls, warm-up included): the top "
            "12 functions by their own (exclusive) cost, and the top 16 by inclusive cost "
            "(a function with its callees; nested, so they do not add up):",
            "",
            "| exclusive | function | | inclusive | function |",
            "|---|---|---|---|---|",
            *[f"| {a[1]:,.0f} | `{short(a[0])}` | | {b[1]:,.0f} | `{short(b[0])}` |"
              if a else f"| | | | {b[1]:,.0f} | `{short(b[0])}` |"
              for a, b in zip([*top, *[None] * (len(itop) - len(top))], itop)],
        ]
    (HERE / "callgrind.md").write_text("\n".join(md) + "\n")
    # The figures by function, for bench/run.py's targets table.
    (HERE / "callgrind.json").write_text(json.dumps(
        {"commit": rev, "per_call": {fw: {fn: per for (_, fn, _), (_, per) in zip(TABLE[fw], rows)}
                                     for fw, rows in lines_by_fw.items()},
         "whole": whole, "tvm-ffi": {"torch": tvm}}, indent=1) + "\n")
    print("\n".join(md))
    print(f"wrote {HERE / 'callgrind.md'}")


def tvm_table(out: Path) -> dict:
    """{function: instructions per call inside `map_next`} for
    TVM_TABLE with PyTorch inputs (see TVM_TABLE)."""
    seg = {}
    for n in (T_SMALL, T_LARGE):
        f = run_cg(out, f"tvm.torch.{n}", ["-", "torch", "--tvm-inner", str(n)], TVM_TOGGLE,
                   (f"--dump-before={TVM_MARKER}",))
        # One dump per marker call: imports may call os.getpid() too, so
        # the loops' dumps are the last ones (the last marker's dump holds
        # the last function's loop).
        dumps = sorted(f.parent.glob(f.name + ".*"), key=lambda p: int(p.suffix[1:]))
        seg[n] = [total_ir(p) for p in dumps[-len(TVM_TABLE):]]
    return {fn: (seg[T_LARGE][i] - seg[T_SMALL][i]) / (T_LARGE - T_SMALL)
            for i, (_, fn, _) in enumerate(TVM_TABLE)}


def tvm_md(tvm: dict, pyo3: dict) -> list[str]:
    """The tvm-ffi table and the per-tensor-above-its-floor table (PyTorch)."""
    def above(d, fn, fl, k=1):
        return f"{(d[fn] - d[fl]) / k:,.0f}" if d.get(fn) and d.get(fl) else "—"

    return [
        "",
        "tvm-ffi (bench/tvmffi), PyTorch input: instructions per call of "
        "`deque(map(f, repeat(a, n), ...), maxlen=0)`, collected inside CPython's "
        f"`{TVM_TOGGLE}`: the whole call (tvm-ffi's Cython `Function.__call__`, the "
        "argument setters with the tensors' conversion through PyTorch's C exchange "
        "table, the packed C function, the result's conversion and release, the "
        "temporaries' release) plus `map_next`'s own steps, the same for every function "
        "of one arity. tvm-ffi's own entry has no symbol to toggle on (the wheel's "
        "`core` module is stripped), so these are not the PyO3 rows' `__pyfunction_*` "
        "region: compare the figures above each library's own floor (next table), not "
        "these with the PyO3 rows. One difference remains above the floor: a float "
        "result's deallocation (`args1`, `args4`) is counted here (the deque drops it "
        "inside `map_next`), not in the PyO3 rows.",
        "",
        "| function | PyTorch input |",
        "|---|---|",
        *[f"| {label} | {tvm[fn]:,.0f} |" for label, fn, _ in TVM_TABLE if fn in tvm],
        "",
        "Per tensor above each library's own floor, PyTorch input, instructions: dlcast "
        "and dlpark above the PyO3 floor (`floor`, `floor4`), tvm-ffi above its own "
        "(`floor1(0)`, `floor4(0, 0, 0, 0)`); four arguments divided by 4:",
        "",
        "| input | dlcast | dlpark | tvm-ffi |",
        "|---|---|---|---|",
        "| `sum_len`, float64 (10,) | " + " | ".join([
            above(pyo3, "dlcast_sum_len", "floor"), above(pyo3, "dlpark_sum_len", "floor"),
            above(tvm, "sum_len", "floor1")]) + " |",
        "| `args1`, float32 (1000, 3) | " + " | ".join([
            above(pyo3, "dlcast_args1", "floor"), above(pyo3, "dlpark_args1", "floor"),
            above(tvm, "args1", "floor1")]) + " |",
        "| `args4`, per argument | " + " | ".join([
            above(pyo3, "dlcast_args4", "floor4", 4), above(pyo3, "dlpark_args4", "floor4", 4),
            above(tvm, "args4", "floor4", 4)]) + " |",
    ]


def short(name: str) -> str:
    """A demangled Rust/C++ name without hashes and long paths."""
    name = re.sub(r"::h[0-9a-f]{16}$", "", name)
    name = name.replace("`", "'")
    return name if len(name) <= 110 else name[:107] + "..."


def total_ir(path: Path) -> int:
    m = re.search(r"^(?:summary|totals): (\d+)", path.read_text(errors="replace"), re.M)
    if not m:
        raise SystemExit(f"no totals in {path}")
    return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fn", nargs="?")
    ap.add_argument("input", nargs="?", choices=["numpy", "numpy-own", "torch"])
    ap.add_argument("--module-dir", default=str(HERE / "target" / "py"))
    ap.add_argument("--keep", help="directory for the callgrind files")
    ap.add_argument("--table", action="store_true", help="write bench/callgrind.md")
    ap.add_argument("--inner", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--table-inner", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--only", help=argparse.SUPPRESS)
    ap.add_argument("--tvm-inner", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--tvm-only", action="store_true",
                    help="only the tvm-ffi rows (PyTorch), printed, nothing written")
    a = ap.parse_args()
    if a.tvm_inner is not None:
        inner_tvm(a.input, a.tvm_inner)
        return
    if a.tvm_only:
        out = Path(a.keep or tempfile.mkdtemp(prefix="dlcast-cg-"))
        out.mkdir(parents=True, exist_ok=True)
        tvm = tvm_table(out)
        print("\n".join(tvm_md(tvm, {})))
        return
    if a.table_inner is not None:
        inner_table(a.module_dir, a.input, a.table_inner, a.only)
        return
    if a.table:
        out = Path(a.keep or tempfile.mkdtemp(prefix="dlcast-cg-"))
        out.mkdir(parents=True, exist_ok=True)
        table_mode(a.module_dir, out)
        return
    if a.fn is None or a.input is None:
        ap.error("give FN and INPUT, or --table")
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
