"""Array-boundary call overhead, side by side (`make bench`).

Times, in one Python process, functions that take one array and return a
scalar, and functions that return a new array, written once per library:

- floor:      a bare PyO3 function taking `&Bound<PyAny>` (no conversion);
- dlcast:     `#[dlpack_fn]` with `TensorRef` / `Tensor` (this repository);
- rust-numpy: `PyReadonlyArray` / `PyArray1` (crate `numpy` 0.30);
- dlpark:     `dlpark::python::from_dlpack` (crate `dlpark` 0.10);
- nanobind:   `nb::ndarray` (PyPI `nanobind`, compiled with the system g++).

The modules are built by bench/build.sh into bench/target/py. Writes the
table to stdout and to BENCHMARKS.md (repository root), the chart to
bench/bench.png and the raw figures to bench/target/results.json.

    python bench/run.py            # the full run (about 2-3 minutes)
    python bench/run.py --quick    # a fast smoke run (noisier figures)
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import timeit
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TARGET = HERE / "target"
sys.path.insert(0, str(TARGET / "py"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)  # float64 JAX arrays
import jax.numpy as jnp  # noqa: E402
import array_api_strict as xp  # noqa: E402

try:
    import dlcast_bench as rs  # noqa: E402
    import nb_bench as nb  # noqa: E402
except ImportError as e:  # pragma: no cover - a message, not a test
    sys.exit(f"bench/run.py: {e}; build the modules first: bash bench/build.sh")

def _load_default_profile():
    """dlcast_bench built with cargo's default release profile (a second copy
    of the module, from bench/target/py-default), or None if not built."""
    import importlib.machinery
    import importlib.util

    path = next((TARGET / "py-default").glob("dlcast_bench.*"), None)
    if path is None:
        return None
    loader = importlib.machinery.ExtensionFileLoader("dlcast_bench", str(path))
    spec = importlib.util.spec_from_file_location("dlcast_bench", path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


rs_default = _load_default_profile()

LIBS = ["floor", "dlcast", "rust-numpy", "dlpark", "nanobind"]
RUST_LIBS = ["floor", "dlcast", "rust-numpy", "dlpark"]
# Reference columns, no ratios: what the producer's own export costs.
EXTRA = {"__dlpack__": "`x.__dlpack__(max_version=(1, 3))` alone"}
PEERS = ["rust-numpy", "dlpark", "nanobind"]


# ------------------------------------------------------------------ timing


class Timing:
    """Per-call times over `repeat` runs of `number` calls each."""

    def __init__(self, per_repeat_s: float, repeat: int, max_number: int):
        self.per_repeat_s = per_repeat_s
        self.repeat = repeat
        self.max_number = max_number

    def _timer(self, stmt: str, names: dict):
        # Names become locals of timeit's inner function (LOAD_FAST), so the
        # loop adds only the call itself.
        setup = "; ".join(f"{k} = _{k}" for k in names) or "pass"
        timer = timeit.Timer(stmt, setup=setup, globals={f"_{k}": v for k, v in names.items()})
        # Calibrate (also the warm-up): the number of calls that takes
        # about per_repeat_s, capped at max_number.
        number = 1000
        t = timer.timeit(number)
        number = int(min(self.max_number, max(1000, number * self.per_repeat_s / max(t, 1e-9))))
        return timer, number

    def row(self, cases: dict) -> dict:
        """Times every `key: (stmt, names)` of one row, round-robin: repeat r
        of every case runs before repeat r + 1 of any, so a disturbance from
        outside hits the whole row rather than one library."""
        timers = {k: self._timer(stmt, names) for k, (stmt, names) in cases.items()}
        runs: dict = {k: [] for k in cases}
        for _ in range(self.repeat):
            for k, (timer, number) in timers.items():
                runs[k].append(timer.timeit(number) / number * 1e9)
        return {
            k: {
                "median": statistics.median(r),
                "min": min(r),
                "max": max(r),
                "calls": timers[k][1],
                "repeats": self.repeat,
            }
            for k, r in runs.items()
        }

    def ns_per_call(self, stmt: str, **names) -> dict:
        return self.row({0: (stmt, names)})[0]


def attempt(fn, *args):
    """None if `fn(*args)` works, else `'ExcType: message'` (one line)."""
    try:
        fn(*args)
        return None
    except Exception as e:  # noqa: BLE001 - reported, not swallowed
        msg = " ".join(str(e).split())
        if len(msg) > 110:
            msg = msg[:107] + "..."
        return f"{type(e).__name__}: {msg}"


# ----------------------------------------------------------------- inputs


def scalar_rows():
    """(section, label, input, {lib: function}) for the array -> scalar cases."""
    pts = np.random.default_rng(0).random((1000, 3), dtype=np.float64).astype(np.float32)
    v10 = np.arange(10, dtype=np.float64)
    len_fns = {
        "floor": rs.floor,
        "dlcast": rs.dlcast_sum_len,
        "rust-numpy": rs.rnp_sum_len,
        "dlpark": rs.dlpark_sum_len,
        "nanobind": nb.sum_len,
    }
    pts_fns = {
        "floor": rs.floor,
        "dlcast": rs.dlcast_sum_pts,
        "rust-numpy": rs.rnp_sum_pts,
        "dlpark": rs.dlpark_sum_pts,
        "nanobind": nb.sum_pts,
    }
    rows = [
        ("inputs", "no conversion (`&Bound<PyAny>` / `nb::handle`)", v10,
         {"floor": rs.floor, "nanobind": nb.floor}),
        ("inputs", "sum_len: NumPy float64 (10,)", v10, len_fns),
        ("inputs", "sum_len: PyTorch float64 (10,)", torch.from_numpy(v10.copy()), len_fns),
        ("inputs", "sum_len: JAX float64 (10,)", jnp.asarray(v10), len_fns),
        ("inputs", "sum_len: array-api-strict float64 (10,)", xp.asarray(v10), len_fns),
        ("inputs", "sum_len: NumPy float64 (1000, 3), transposed (F-order)",
         np.zeros((3, 1000)).T, len_fns),
        ("inputs", "sum_pts: NumPy float32 (1000, 3)", pts, pts_fns),
        ("inputs", "sum_pts: PyTorch float32 (1000, 3)", torch.from_numpy(pts.copy()), pts_fns),
        ("inputs", "sum_pts: JAX float32 (1000, 3)", jnp.asarray(pts), pts_fns),
        ("inputs", "sum_pts: array-api-strict float32 (1000, 3)", xp.asarray(pts), pts_fns),
    ]
    for n in (10, 10**3, 10**6):
        rows.append(("sizes", f"sum_len: NumPy float64 ({n:,},)", np.zeros(n), len_fns))
    for n in (10, 10**3, 10**6):
        rows.append(("sizes", f"sum_len: PyTorch float64 ({n:,},)",
                     torch.zeros(n, dtype=torch.float64), len_fns))
    for d in range(1, 9):
        shape = (2,) * d
        rows.append(("ndim", f"sum_len: NumPy float64 ndim {d} {shape}", np.zeros(shape), len_fns))
    return rows


def return_rows():
    """(label, {lib: (stmt, names)}) for the functions returning new arrays."""
    to_torch = torch.from_dlpack
    return [
        ("make_f32(1000) -> NumPy", {
            "floor": ("f(n)", {"f": rs.floor}),
            "dlcast": ("f(n)", {"f": rs.dlcast_make_f32_numpy}),
            "rust-numpy": ("f(n)", {"f": rs.rnp_make_f32_numpy}),
            "nanobind": ("f(n)", {"f": nb.make_f32_numpy}),
        }),
        ("make_f32(1000) -> PyTorch", {
            "floor": ("f(n)", {"f": rs.floor}),
            "dlcast": ("f(n)", {"f": rs.dlcast_make_f32_torch}),
            # dlpark returns a DLPack capsule; the caller converts it.
            "dlpark": ("g(f(n))", {"f": rs.dlpark_make_f32_capsule, "g": to_torch}),
            "nanobind": ("f(n)", {"f": nb.make_f32_torch}),
        }),
    ]


NOT_OFFERED = {
    ("make_f32(1000) -> NumPy", "dlpark"):
        "dlpark returns DLPack capsules only, and `numpy.from_dlpack` takes no capsules",
    ("make_f32(1000) -> PyTorch", "rust-numpy"): "rust-numpy makes NumPy arrays only",
}


def profile_rows():
    """(label, stmt, {lib: names for the LTO build}, {lib: for the default build})."""
    pts = np.ones((1000, 3), np.float32)
    v10 = np.arange(10, dtype=np.float64)

    def fns(m):
        return {
            "sum_len": {"floor": m.floor, "dlcast": m.dlcast_sum_len, "rust-numpy": m.rnp_sum_len,
                        "dlpark": m.dlpark_sum_len},
            "sum_pts": {"floor": m.floor, "dlcast": m.dlcast_sum_pts, "rust-numpy": m.rnp_sum_pts,
                        "dlpark": m.dlpark_sum_pts},
            "make": {"floor": m.floor, "dlcast": m.dlcast_make_f32_numpy,
                     "rust-numpy": m.rnp_make_f32_numpy},
        }

    rows = []
    for label, kind, x in [("sum_len: NumPy float64 (10,)", "sum_len", v10),
                           ("sum_len: PyTorch float64 (10,)", "sum_len", torch.from_numpy(v10.copy())),
                           ("sum_pts: NumPy float32 (1000, 3)", "sum_pts", pts),
                           ("make_f32(1000) -> NumPy", "make", 1000)]:
        per = []
        for m in (rs, rs_default):
            per.append({lib: {"f": f, "x": x} for lib, f in fns(m)[kind].items()
                        if not (lib == "rust-numpy" and isinstance(x, torch.Tensor))})
        rows.append((label, per[0], per[1]))
    return rows


def behaviour_cases():
    """Inputs that break `sum_pts`'s contract: (label, input). Not timed."""
    return [
        ("float32 (1000, 3) transposed view of (3, 1000) (F-order)",
         np.ones((3, 1000), np.float32).T),
        ("float64 (1000, 3)", np.ones((1000, 3))),
        ("float32 (1000, 4)", np.ones((1000, 4), np.float32)),
        ("PyTorch float32 (1000, 3) transposed (F-order)", torch.ones(3, 1000).T),
    ]


# ------------------------------------------------------------ environment


def sh(*cmd) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout
    except (OSError, subprocess.CalledProcessError):
        return ""


def machine() -> dict:
    info = {}
    lscpu = sh("lscpu")
    for key in ("Model name", "CPU(s)", "Thread(s) per core", "Hypervisor vendor", "CPU max MHz",
                "L2 cache", "L3 cache"):
        m = re.search(rf"^{re.escape(key)}:\s*(.+)$", lscpu, re.M)
        if m:
            info[key] = m.group(1).strip()
    if "Model name" not in info:
        try:
            m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
            info["Model name"] = m.group(1).strip() if m else platform.processor()
        except OSError:
            info["Model name"] = platform.processor()
    try:
        m = re.search(r"^MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
        if m:
            info["Memory"] = f"{int(m.group(1)) / 2**20:.0f} GiB"
    except OSError:
        pass
    info["OS"] = f"{platform.system()} {platform.release()} ({platform.machine()})"
    return info


def crate_versions() -> dict:
    lock = (HERE / "rust" / "Cargo.lock").read_text()
    out = {}
    for name in ("pyo3", "numpy", "dlpark", "dlcast-runtime"):
        m = re.search(rf'name = "{re.escape(name)}"\nversion = "([^"]+)"', lock)
        out[name] = m.group(1) if m else "?"
    return out


def py_versions() -> dict:
    import importlib.metadata as md

    out = {"Python": platform.python_version() + f" ({platform.python_implementation()})"}
    for dist in ("numpy", "torch", "jax", "jaxlib", "array-api-strict", "nanobind", "matplotlib"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def loadavg() -> float:
    """The 1-minute load average (0 where unknown)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def git_rev() -> str:
    rev = sh("git", "rev-parse", "--short", "HEAD").strip() or "?"
    dirty = sh("git", "status", "--porcelain", "--", "dlcast-runtime", "dlcast-macros").strip()
    return rev + (" + uncommitted dlcast-runtime/macros changes" if dirty else "")


# ------------------------------------------------------------------ report


def fmt_ns(cell) -> str:
    if cell is None:
        return "—"
    if isinstance(cell, str):
        return "n/a"
    v = cell["median"]
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}" if v < 10 else f"{v:.0f}"


def ratio(a, b) -> str:
    if not isinstance(a, dict) or not isinstance(b, dict):
        return "—"
    return f"{a['median'] / b['median']:.2f}"


def table(rows: list, first: str) -> list[str]:
    extra = [c for c in EXTRA if any(c in cells for _, cells in rows)]
    head = [first, *LIBS, "dlcast / floor", *[f"dlcast / {p}" for p in PEERS],
            *[EXTRA[c] for c in extra]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, cells in rows:
        d = cells.get("dlcast")
        r = [ratio(d, cells.get("floor"))] + [ratio(d, cells.get(p)) for p in PEERS]
        lines.append("| " + " | ".join([label, *[fmt_ns(cells.get(l)) for l in LIBS], *r,
                                        *[fmt_ns(cells.get(c)) for c in extra]]) + " |")
    return lines


def short_label(label: str) -> str:
    """A two- or three-line tick label for the chart."""
    if label.startswith("no conversion"):
        return "no conversion\n(floor)"
    m = re.match(r"sum_len: NumPy float64 ndim (\d+)", label)
    if m:
        return f"ndim {m.group(1)}"
    label = re.sub(r"^(sum_len|sum_pts|make_f32\(1000\)): ", r"\1\n", label)
    label = label.replace("make_f32(1000) -> ", "make_f32(1000)\n-> ")
    label = label.replace("array-api-strict", "array-api-\nstrict")
    return label.replace(", transposed (F-order)", "\ntransposed").replace(" float", "\nfloat")


def spread_note(results: dict) -> list[str]:
    floors = [c["floor"]["median"] for sec in results.values() for _, c in sec
              if isinstance(c.get("floor"), dict)]
    if not floors or max(floors) < 1.25 * min(floors):
        return []
    return [
        f"The floor column, the same call in every row, ranged from {min(floors):.0f} to "
        f"{max(floors):.0f} ns across rows in this run: the machine's speed shifted between "
        "rows (a shared virtual machine). The libraries of a row were timed in turns, so "
        "compare ratios within a row rather than nanoseconds across rows.",
        "",
    ]


def profile_table(profile: list) -> list[str]:
    if not profile:
        return ["(bench/target/py-default was not built: no profile table)"]
    head = ["input", *[f"{lib} LTO / default" for lib in RUST_LIBS]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, cells in profile:
        row = [label]
        for lib in RUST_LIBS:
            if lib in cells:
                a, b = cells[lib]
                row.append(f"{fmt_ns(a)} / {fmt_ns(b)}")
            else:
                row.append("—")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def chart(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"floor": "#888888", "dlcast": "#d62728", "rust-numpy": "#1f77b4",
              "dlpark": "#2ca02c", "nanobind": "#9467bd"}
    panels = [("inputs", "Take one array, return a scalar / return a new array"),
              ("sizes", "sum_len by array size"), ("ndim", "sum_len on NumPy by ndim")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(15, 15),
                             gridspec_kw={"height_ratios": [1.6, 1, 1]})
    for ax, (section, title) in zip(axes, panels):
        rows = results[section]
        if section == "inputs":
            rows = rows + results["returns"]
        width = 0.8 / len(LIBS)
        for i, lib in enumerate(LIBS):
            xs, ys = [], []
            for j, (_, cells) in enumerate(rows):
                c = cells.get(lib)
                if isinstance(c, dict):
                    xs.append(j + (i - (len(LIBS) - 1) / 2) * width)
                    ys.append(c["median"])
            ax.bar(xs, ys, width, label=lib, color=colors[lib])
        ax.set_yscale("log")
        ax.set_ylabel("ns per call (median)")
        ax.set_title(title)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([short_label(lab) for lab, _ in rows], fontsize=7)
        # Mark the cells that raised (n/a) at the bottom of their slot.
        for i, lib in enumerate(LIBS):
            for j, (_, cells) in enumerate(rows):
                if isinstance(cells.get(lib), str):
                    ax.text(j + (i - (len(LIBS) - 1) / 2) * width, 0.02, "n/a", rotation=90,
                            transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                            fontsize=6, color=colors[lib])
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0].legend(ncol=len(LIBS), loc="upper left", fontsize=8)
    fig.suptitle("Array-boundary call overhead, ns per call (log scale; lower is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a fast smoke run, noisier figures")
    ap.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    ap.add_argument("--png", default=str(HERE / "bench.png"))
    args = ap.parse_args()

    # One core for the whole run: no migrations between repeats.
    pinned = None
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        pinned = cpus[-1]
        os.sched_setaffinity(0, {pinned})

    timing = Timing(0.02, 3, 20_000) if args.quick else Timing(0.08, 7, 200_000)
    results: dict = {"inputs": [], "sizes": [], "ndim": [], "returns": []}
    notes: dict = {}  # (row, lib) -> why not timed

    load_start = loadavg()
    loop = timing.ns_per_call("pass")
    started = _dt.datetime.now()

    def time_row(row: str, cases: dict) -> dict:
        """Calls each case once; times those that did not raise, together."""
        cells, ok = {}, {}
        for lib, (stmt, names) in cases.items():
            err = attempt(lambda: eval(stmt, {}, names))
            if err:
                notes[(row, lib)] = err
                cells[lib] = err
            else:
                ok[lib] = (stmt, names)
        cells.update(timing.row(ok))
        return {lib: cells[lib] for lib in [*LIBS, *EXTRA] if lib in cells}

    for section, label, x, fns in scalar_rows():
        cases = {lib: ("f(x)", {"f": f, "x": x}) for lib, f in fns.items()}
        if section == "inputs" and "dlcast" in fns:
            # The producer's Python-level export on its own (the capsule is
            # dropped unconsumed, so its deleter runs: a full round trip).
            cases["__dlpack__"] = ("f(x, max_version=v)",
                                   {"f": type(x).__dlpack__, "x": x, "v": (1, 3)})
        cells = time_row(label, cases)
        results[section].append((label, cells))
        print(f"  {label:<58}" + "".join(f"{lib}={fmt_ns(cells.get(lib)):>7} " for lib in LIBS),
              flush=True)

    for label, fns in return_rows():
        cells = time_row(label, {lib: (stmt, {**names, "n": 1000})
                                 for lib, (stmt, names) in fns.items()})
        for lib in LIBS:
            if (label, lib) in NOT_OFFERED:
                notes[(label, lib)] = NOT_OFFERED[(label, lib)]
        results["returns"].append((label, cells))
        print(f"  {label:<58}" + "".join(f"{lib}={fmt_ns(cells.get(lib)):>7} " for lib in LIBS),
              flush=True)

    # The same Rust functions from the two builds, timed together.
    profile = []
    if rs_default is not None:
        for label, lto, dflt in profile_rows():
            cases = {}
            for lib in RUST_LIBS:
                if lib in lto:
                    cases[(lib, "lto")] = ("f(x)", lto[lib])
                    cases[(lib, "default")] = ("f(x)", dflt[lib])
            t = timing.row(cases)
            cells = {lib: (t[(lib, "lto")], t[(lib, "default")]) for lib in RUST_LIBS if lib in lto}
            profile.append((label, cells))
            print(f"  profiles: {label:<48}" + "".join(
                f"{lib}={fmt_ns(a)}/{fmt_ns(b)} " for lib, (a, b) in cells.items()), flush=True)

    behaviour = []
    fns = {"dlcast": rs.dlcast_sum_pts, "rust-numpy": rs.rnp_sum_pts,
           "dlpark": rs.dlpark_sum_pts, "nanobind": nb.sum_pts}
    for label, x in behaviour_cases():
        row = {}
        for lib, f in fns.items():
            err = attempt(f, x)
            row[lib] = "accepted" if err is None else err.split(":")[0]
            if lib == "nanobind" and err is None:
                row[lib] = "accepted (converted: a copy)"
        behaviour.append((label, row))

    elapsed = (_dt.datetime.now() - started).total_seconds()
    load_end = loadavg()
    busy = max(load_start, load_end) > 1.5
    bi = (TARGET / "build-info.txt").read_text().strip() if (TARGET / "build-info.txt").exists() else ""
    meta = {
        "date": started.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "crates": crate_versions(),
        "python": py_versions(),
        "git": git_rev(),
        "build": bi,
        "loop_ns": loop["median"],
        "pinned_cpu": pinned,
        "timing": vars(timing),
        "elapsed_s": elapsed,
        "loadavg": [load_start, load_end],
    }

    # ------------------------------------------------------------ output
    json_path = TARGET / "results.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({"meta": meta, "results": results, "profile": profile,
                                     "notes": {f"{r} | {l}": v for (r, l), v in notes.items()},
                                     "behaviour": behaviour}, indent=1, default=str))
    chart(results, Path(args.png))

    def cell(row, lib):
        for sec in results.values():
            for lab, cells in sec:
                if lab == row:
                    return cells.get(lib)
        return None

    def r(row, peer):
        return ratio(cell(row, "dlcast"), cell(row, peer))

    np10, t10 = "sum_len: NumPy float64 (10,)", "sum_len: PyTorch float64 (10,)"
    npts, tpts = "sum_pts: NumPy float32 (1000, 3)", "sum_pts: PyTorch float32 (1000, 3)"
    headline = [
        f"- NumPy float64 `(10,)`: dlcast {fmt_ns(cell(np10, 'dlcast'))} ns, "
        f"{r(np10, 'floor')}x the bare PyO3 call, {r(np10, 'rust-numpy')}x rust-numpy, "
        f"{r(np10, 'nanobind')}x nanobind, {r(np10, 'dlpark')}x dlpark.",
        f"- PyTorch float64 `(10,)`: dlcast {fmt_ns(cell(t10, 'dlcast'))} ns, "
        f"{r(t10, 'floor')}x the floor, {r(t10, 'nanobind')}x nanobind, {r(t10, 'dlpark')}x dlpark "
        "(rust-numpy takes NumPy arrays only).",
        f"- `#[shape(_, 3)] #[order(c)]` float32 `(1000, 3)`: NumPy {r(npts, 'rust-numpy')}x "
        f"rust-numpy and {r(npts, 'nanobind')}x nanobind; PyTorch {r(tpts, 'nanobind')}x nanobind, "
        f"{r(tpts, 'dlpark')}x dlpark.",
    ]
    m = meta["machine"]
    cpu = f"{m.get('Model name', '?')}, {m.get('CPU(s)', '?')} CPUs"
    if m.get("Hypervisor vendor"):
        cpu += f" ({m['Hypervisor vendor']} guest)"
    md_lines = [
        "# Benchmarks: array-boundary call overhead",
        "",
        "Generated by `make bench` (bench/build.sh, bench/run.py) on "
        f"{meta['date']}; dlcast at commit {meta['git']}. Figures are **ns per call**, "
        "the median of the per-repeat means (lower is better); the ratios divide "
        "dlcast's figure by the other column's (below 1: dlcast is faster).",
        "",
        "## Headline",
        "",
        *headline,
        "",
        "## Take one array, return a scalar",
        "",
        "`sum_len(x)`: any float64 CPU array, any shape and strides, returns the element "
        "count (metadata only). `sum_pts(x)`: float32 `(n, 3)` C-contiguous "
        "(dlcast: `#[shape(_, 3)] #[order(c)] TensorRef<f32>`; the others check the same "
        "by hand or in their type), returns the sum of the first row. The floor column "
        "calls the bare PyO3 function with the same argument.",
        "",
        *table(results["inputs"], "input"),
        "",
        *spread_note(results),
        "## Return a new array",
        "",
        "`make_f32(1000)`: a new zero-filled float32 array of 1000 elements from Rust/C++ "
        "memory, handed over without a copy (dlcast `Tensor::<f32>::zeros` with "
        "`returns = numpy` / `returns = torch`; rust-numpy `PyArray1::zeros`; nanobind "
        "`nb::ndarray<nb::numpy|nb::pytorch, float>` owned by a capsule; dlpark returns a "
        "versioned DLPack capsule and the Python caller runs `torch.from_dlpack` on it, "
        "which is timed with it). The floor column is `floor(1000)`.",
        "",
        *table(results["returns"], "result"),
        "",
        "## How the cost grows",
        "",
        "`sum_len` on zero-filled float64 arrays of 10, 10^3 and 10^6 elements, and on "
        "NumPy arrays of shape `(2,) * ndim`.",
        "",
        *table(results["sizes"], "input"),
        "",
        *table(results["ndim"], "input"),
        "",
        "## Build profile",
        "",
        "The same Rust functions from two builds of bench/rust, timed back to back: "
        "the main tables' profile (fat LTO, one codegen unit) and cargo's default release "
        "profile (no LTO, 16 codegen units). ns per call, LTO / default:",
        "",
        *profile_table(profile),
        "",
        "## Not timed: what each library does with a wrong input to `sum_pts`",
        "",
        "| input | " + " | ".join(fns) + " |",
        "|" + "---|" * (len(fns) + 1),
        *["| " + " | ".join([lab, *[row[l] for l in fns]]) + " |" for lab, row in behaviour],
        "",
        "nanobind converts arguments that miss an `nb::ndarray` constraint (dtype, order) "
        "by asking the framework for a copy, unless the argument is marked "
        "`.noconvert()`; dlcast, rust-numpy and the hand-written dlpark checks refuse them.",
        "",
        "## Cells without a figure",
        "",
        "`—`: the library has no such function (the row does not apply); `n/a`: the call "
        "was made once and raised, so it was not timed:",
        "",
        *[f"- {row} / {lib}: {why}" for (row, lib), why in notes.items()],
        "",
        "## Method",
        "",
        f"- One Python process, pinned to CPU {pinned}." if pinned is not None else "- One Python process.",
        f"- `timeit`: each cell is calibrated to about {timing.per_repeat_s:g} s per repeat "
        f"(at most {timing.max_number:,} calls), run {timing.repeat} times; the figure is "
        "the median of the per-repeat ns/call (min and max are in bench/target/results.json). "
        "The libraries of one row take turns, one repeat each, so that a disturbance from "
        "outside the process hits the whole row and the ratios stay put. "
        "Function and argument are locals of timeit's loop; the loop itself "
        f"(`pass`) costs {loop['median']:.1f} ns per iteration and is not subtracted. "
        "Garbage collection is off during timing (timeit's default).",
        "- Every function was called once before timing; a call that raised is reported "
        "as n/a, not timed.",
        "- JAX runs on CPU with `jax_enable_x64` (float64 arrays); PyTorch is the CPU build.",
        "- The Rust functions (bench/rust/src/lib.rs) and the C++ ones "
        "(bench/nanobind/nb_bench.cpp) do the same work per library: the conversion at the "
        "boundary, the checks the signature states, and a minimal touch of the data.",
        f"- Whole run: {elapsed:.0f} s; 1-minute load average {load_start:.2f} at the start, "
        f"{load_end:.2f} at the end"
        + (" (other processes were busy on this machine: every figure is inflated, re-run "
           "`make bench` on an idle machine)." if busy else "."),
        "",
        "## Build settings",
        "",
        "All Rust libraries are in one extension module (bench/rust), so they share one "
        "build: `cargo build --release` (what `maturin build --release` runs), fat LTO and "
        "one codegen unit (see the build-profile table for cargo's defaults), and no abi3 "
        "feature, i.e. a version-specific build that uses the `METH_FASTCALL` calling "
        "convention (abi3 below 3.10 has none and adds about 30 ns per call).",
        "",
        "```",
        bi,
        "```",
        "",
        "## Machine and versions",
        "",
        f"- CPU: {cpu}; " + ", ".join(f"{k}: {v}" for k, v in m.items()
                                       if k not in ("Model name", "CPU(s)", "Hypervisor vendor")),
        "- Rust crates: " + ", ".join(f"{k} {v}" for k, v in meta["crates"].items()),
        "- Python packages: " + ", ".join(f"{k} {v}" for k, v in meta["python"].items()),
        "",
        "![chart](bench/bench.png)",
        "",
    ]
    # The hand-written analysis of the targets (bench/ANALYSIS.md) follows
    # the generated tables.
    analysis = ROOT / "bench" / "ANALYSIS.md"
    if analysis.exists():
        md_lines += [analysis.read_text()]
    Path(args.out).write_text("\n".join(md_lines))

    print()
    print("\n".join(headline))
    print()
    for sec in ("inputs", "returns", "sizes", "ndim"):
        print("\n".join(table(results[sec], sec)))
        print()
    print("\n".join(profile_table(profile)))
    print()
    if busy:
        print(f"warning: load average {load_start:.2f} / {load_end:.2f}: the machine was busy, "
              "figures are inflated", file=sys.stderr)
    print(f"wrote {Path(args.out).relative_to(ROOT) if Path(args.out).is_relative_to(ROOT) else args.out}, "
          f"{args.png}, {json_path} ({elapsed:.0f} s)")


if __name__ == "__main__":
    main()
