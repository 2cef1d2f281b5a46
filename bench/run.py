"""Array-boundary call overhead, side by side (`make bench`).

Times, in one Python process, functions that take one array and return a
scalar (with dlcast's `TensorRef`, slice and `ndarray` view parameters),
functions that return a new array, one argument against four, and two
bodies (a 5x5 convolution, a strided sum) in each access style, written once
per library:

- floor:      a bare PyO3 function taking `&Bound<PyAny>` (no conversion);
- dlcast:     `#[dlpack_fn]` with `TensorRef` / `Tensor` (this repository);
- rust-numpy: `PyReadonlyArray` / `PyArray1` (crate `numpy` 0.30);
- dlpark:     `dlpark::python::from_dlpack` (crate `dlpark` 0.10);
- nanobind:   `nb::ndarray` (PyPI `nanobind`, compiled with the system g++);
- tvm-ffi:    `tvm::ffi::TensorView` (PyPI `apache-tvm-ffi`, bench/tvmffi,
              built by `tvm_ffi.cpp.load_inline`), with its own floors
              (`floor1(0)`, `floor4(0, 0, 0, 0)`: int arguments).

The rows of a table take turns (one repeat of every cell of a row before
the next repeat of any), and the whole table is timed PASSES (3) times: a
figure is the median of the passes' medians, and every ratio is given with
its spread, the lowest and highest of its per-pass values.

The modules are built by bench/build.sh into bench/target/py. Writes the
tables to stdout and to BENCHMARKS.md (repository root, with bench/
callgrind.md, the instruction counts of bench/callgrind.py --table, and
bench/ANALYSIS.md appended), the headline ratios against the
targets into the guide's guide/src/performance.md (between the
`bench:headline` comment markers), the
chart to bench/bench.png and the raw figures to bench/target/results.json.

    python bench/run.py            # the full run (about 3-4 minutes)
    python bench/run.py --quick    # a fast smoke run (noisier; the guide untouched)
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
sys.path.insert(0, str(HERE / "tvmffi"))
from tvmffi_bench import load as _load_tvmffi  # noqa: E402

# The tvm-ffi module (bench/tvmffi/bench.cc): built by bench/build.sh, or
# here on first use (ninja skips the compile when nothing changed).
tv = _load_tvmffi()

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

LIBS = ["floor", "dlcast", "rust-numpy", "dlpark", "nanobind", "tvm-ffi"]
RUST_LIBS = ["floor", "dlcast", "rust-numpy", "dlpark"]
# Reference columns, no ratios: what the producer's own export costs.
EXTRA = {"__dlpack__": "`x.__dlpack__(max_version=(1, 3))` alone",
         "limit": "sound limit (hand-written, bench/rust/src/limit.rs)",
         "tvm-ffi floor": "tvm-ffi's floor (`floor1(0)`, an int argument)"}
PEERS = ["rust-numpy", "dlpark", "nanobind", "tvm-ffi"]


# ------------------------------------------------------------------ timing


class Timing:
    """Per-call times over `repeat` runs of `number` calls each."""

    def __init__(self, per_repeat_s: float, repeat: int, max_number: int):
        self.per_repeat_s = per_repeat_s
        self.repeat = repeat
        self.max_number = max_number
        self._cache: dict = {}  # (row, key) -> (timer, number), kept across passes

    def _timer(self, stmt: str, names: dict):
        # Names become locals of timeit's inner function (LOAD_FAST), so the
        # loop adds only the call itself.
        setup = "; ".join(f"{k} = _{k}" for k in names) or "pass"
        timer = timeit.Timer(stmt, setup=setup, globals={f"_{k}": v for k, v in names.items()})
        # Calibrate (also the warm-up): the number of calls that takes
        # about per_repeat_s, capped at max_number; slow calls (the body
        # tables, milliseconds) start from one call.
        number = 1
        while True:
            t = timer.timeit(number)
            if t >= 0.002 or number >= self.max_number:
                break
            number *= 10
        number = int(min(self.max_number, max(1, number * self.per_repeat_s / max(t, 1e-9))))
        return timer, number

    def row(self, cases: dict, row: str = "") -> dict:
        """Times every `key: (stmt, names)` of one row, round-robin: repeat r
        of every case runs before repeat r + 1 of any, so a disturbance from
        outside hits the whole row rather than one library. The calibration
        of `(row, key)` is kept for later passes (pass `row=""` not to)."""
        timers = {}
        for k, (stmt, names) in cases.items():
            ck = (row, k) if row else None
            if ck is None or ck not in self._cache:
                t = self._timer(stmt, names)
                if ck is not None:
                    self._cache[ck] = t
            timers[k] = self._cache[ck] if ck is not None else t
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
        "tvm-ffi": tv.sum_len,
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
    slice_fns = {
        "floor": rs.floor,
        "dlcast": rs.dlcast_slice_len,
        "rust-numpy": rs.rnp_slice_len,
        "dlpark": rs.dlpark_slice_len,
        "nanobind": nb.slice_len,
    }
    view_fns = {
        "floor": rs.floor,
        "dlcast": rs.dlcast_view_first,
        "rust-numpy": rs.rnp_view_first,
        "dlpark": rs.dlpark_view_first,
        "nanobind": nb.view_first,
    }
    mut_fns = {
        "floor": rs.floor,
        "dlcast": rs.dlcast_sum_len_mut,
        "rust-numpy": rs.rnp_sum_len_mut,
        "nanobind": nb.sum_len_mut,
    }
    slice_mut_fns = {
        "floor": rs.floor,
        "dlcast": rs.dlcast_slice_len_mut,
        "rust-numpy": rs.rnp_sum_len_mut,
        "nanobind": nb.slice_len_mut,
        "limit": rs.limit_slice_len_mut,
    }
    slice_fns["limit"] = rs.limit_slice_len
    rows += [
        ("inputs", "sum_len_mut `TensorMut<f64>`: NumPy float64 (10,)", v10.copy(), mut_fns),
        ("inputs", "sum_len_mut `TensorMut<f64>`: PyTorch float64 (10,)",
         torch.from_numpy(v10.copy()), {k: f for k, f in mut_fns.items() if k != "rust-numpy"}),
        ("native", "slice `&mut [f64]`: NumPy float64 (10,)", v10.copy(), slice_mut_fns),
    ]
    rows += [
        ("native", "slice `&[f64]`: NumPy float64 (10,)", v10, slice_fns),
        ("native", "slice `&[f64]`: PyTorch float64 (10,)", torch.from_numpy(v10.copy()), slice_fns),
        ("native", "`ArrayView2<f32>`: NumPy float32 (1000, 3)", pts, view_fns),
        ("native", "`ArrayView2<f32>`: NumPy float32 (1000, 3), transposed (F-order)",
         np.ascontiguousarray(pts.T).T, view_fns),
        ("native", "`ArrayView2<f32>`: PyTorch float32 (1000, 3)", torch.from_numpy(pts.copy()),
         view_fns),
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


# The several-arguments table: one (n, 3) argument against four.
# tvm-ffi's figures above its own floor (`tvm-ffi floor`: `floor1(0)` and
# `floor4(0, 0, 0, 0)`, int arguments), the others' above the PyO3 floor.
ARGS_COLS = ["floor", "dlcast", "dlcast (native types)", "rust-numpy", "dlpark", "nanobind",
             "tvm-ffi floor", "tvm-ffi"]
ARGS_LIBS = [c for c in ARGS_COLS if "floor" not in c]


def own_floor(col: str) -> str:
    """The floor column a library's figures are taken above."""
    return "tvm-ffi floor" if col == "tvm-ffi" else "floor"


def args_rows():
    """(input, {col: (f1, f4)}, (a, b, w, out)) for NumPy and PyTorch, n = 1000."""
    rng = np.random.default_rng(1)
    a = rng.random((1000, 3), dtype=np.float32)
    b = rng.random((1000, 3), dtype=np.float32)
    w = rng.random(1000, dtype=np.float32)
    out = np.zeros(1000, np.float32)
    fns = {
        "floor": (rs.floor, rs.floor4),
        "dlcast": (rs.dlcast_args1, rs.dlcast_args4),
        "dlcast (native types)": (rs.dlcast_args1_native, rs.dlcast_args4_native),
        "rust-numpy": (rs.rnp_args1, rs.rnp_args4),
        "dlpark": (rs.dlpark_args1, rs.dlpark_args4),
        "nanobind": (nb.args1, nb.args4),
        "tvm-ffi floor": (tv.floor1, tv.floor4),
        "tvm-ffi": (tv.args1, tv.args4),
    }
    t = [torch.from_numpy(v.copy()) for v in (a, b, w, out)]
    return [("NumPy", fns, (a, b, w, out)), ("PyTorch", fns, tuple(t))]


# The body tables: columns are access styles; `peer` marks the others'.
CONV_COLS = {
    "dlcast slices": (rs.dlcast_conv5_slices, False),
    "dlcast indexed": (rs.dlcast_conv5_indexed, False),
    "dlcast ndarray": (rs.dlcast_conv5_ndarray, False),
    "rust-numpy ArrayView2": (rs.rnp_conv5, True),
    "nanobind .view()": (nb.conv5, True),
}
SUM_COLS = {
    "dlcast slices, #[order(c)]": (rs.dlcast_sum_slices_c, False),
    "dlcast slices, #[order(f)]": (rs.dlcast_sum_slices_f, False),
    "dlcast indexed": (rs.dlcast_sum_indexed, False),
    "dlcast ndarray": (rs.dlcast_sum_ndarray, False),
    "rust-numpy ArrayView2": (rs.rnp_strided_sum, True),
    "nanobind .view()": (nb.strided_sum, True),
}


def body_inputs():
    """The conv image and kernel, one output per column, the transposed array."""
    rng = np.random.default_rng(2)
    img = rng.random((512, 512), dtype=np.float32)
    k = rng.random((5, 5), dtype=np.float32)
    outs = {col: np.zeros((508, 508), np.float32) for col in CONV_COLS}
    xt = rng.random((3, 1000)).T  # float64 (1000, 3), strides (1, 1000) elements
    return img, k, outs, xt


def check_bodies(img, k, outs, xt) -> list[str]:
    """Calls every body once; the lines for BENCHMARKS.md saying whether the
    results agree (exactly, and with a float64 NumPy reference). Raises if
    they do not: a table of different computations would mean nothing."""
    from numpy.lib.stride_tricks import sliding_window_view

    for col, (f, _) in CONV_COLS.items():
        f(img, k, outs[col])
    ref = np.einsum("ijkl,kl->ij", sliding_window_view(img.astype(np.float64), (5, 5)),
                    k.astype(np.float64))
    first = next(iter(outs.values()))
    same = all(np.array_equal(o, first) for o in outs.values())
    err = max(float(np.max(np.abs(o - ref) / np.abs(ref))) for o in outs.values())
    sums = {col: f(xt) for col, (f, _) in SUM_COLS.items()}
    s_same = len(set(sums.values())) == 1
    s_ref = float(np.sum(xt, dtype=np.float64))
    s_err = max(abs(v - s_ref) / abs(s_ref) for v in sums.values())
    lines = [
        f"- conv5: the {len(outs)} outputs are {'bit-identical' if same else 'NOT identical'}; "
        f"largest relative difference to a float64 NumPy reference {err:.1e}.",
        f"- strided_sum: the {len(sums)} results are {'bit-identical' if s_same else 'NOT identical'} "
        f"({next(iter(sums.values())):.6f}); relative difference to `np.sum` {s_err:.1e}.",
    ]
    if not (same and s_same) or err > 1e-5 or s_err > 1e-12:
        raise SystemExit("bench/run.py: the body functions disagree:\n" + "\n".join(lines))
    return lines


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
    for dist in ("numpy", "torch", "jax", "jaxlib", "array-api-strict", "nanobind",
                 "apache-tvm-ffi", "ninja", "matplotlib"):
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


def rstats(a, b):
    """dlcast's figure over another's, pass by pass: (median, min, max) of
    the per-pass ratios, or None."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return None
    rs_ = [x / y for x, y in zip(a.get("passes", [a["median"]]), b.get("passes", [b["median"]]))]
    return statistics.median(rs_), min(rs_), max(rs_)


def fmt_r(st, digits: int = 2) -> str:
    """`0.85 (0.80–0.90)`: the median ratio and its spread over the passes."""
    if st is None:
        return "—"
    m, lo, hi = st
    if f"{lo:.{digits}f}" == f"{hi:.{digits}f}":
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"


def ratio(a, b) -> str:
    return fmt_r(rstats(a, b))


def table(rows: list, first: str) -> list[str]:
    extra = [c for c in EXTRA if any(c in cells for _, cells in rows)]
    head = [first, *LIBS, "dlcast / floor", *[f"dlcast / {p}" for p in PEERS],
            *[EXTRA[c] for c in extra]]
    if not rows:
        return []
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
    label = re.sub(r"^([^:]+): ", r"\1\n", label).replace("`", "")
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
              "dlpark": "#2ca02c", "nanobind": "#9467bd", "tvm-ffi": "#ff7f0e"}
    panels = [("inputs", "Take one array, return a scalar (TensorRef, slice, ArrayView2) / "
               "return a new array"),
              ("sizes", "sum_len by array size"), ("ndim", "sum_len on NumPy by ndim")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(15, 15),
                             gridspec_kw={"height_ratios": [1.6, 1, 1]})
    for ax, (section, title) in zip(axes, panels):
        rows = results[section]
        if section == "inputs":
            rows = rows + results["native"] + results["returns"]
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


# ------------------------------------------------------------ the passes

PASSES = 3
SCALAR_SECTIONS = ["inputs", "native", "sizes", "ndim"]


def combine(passes: list) -> list:
    """One section's rows over the passes: each cell's figure is the median
    of the passes' medians; `passes` keeps them, for the ratios' spread."""
    out = []
    for i, (label, cells) in enumerate(passes[0]):
        comb = {}
        for lib, c in cells.items():
            if isinstance(c, dict):
                ms = [p[i][1][lib]["median"] for p in passes if isinstance(p[i][1].get(lib), dict)]
                comb[lib] = {"median": statistics.median(ms), "min": min(ms), "max": max(ms),
                             "passes": ms, "calls": c["calls"], "repeats": c["repeats"]}
            else:
                comb[lib] = c
        out.append((label, comb))
    return out


def per_pass(cells: dict, fn) -> tuple | None:
    """(median, min, max) over the passes of `fn(figures)`, where figures
    maps each timed cell to its per-pass figure."""
    timed = {k: c["passes"] for k, c in cells.items() if isinstance(c, dict)}
    if not timed:
        return None
    n = min(len(v) for v in timed.values())
    vals = []
    for i in range(n):
        v = fn({k: p[i] for k, p in timed.items()})
        if v is not None:
            vals.append(v)
    return (statistics.median(vals), min(vals), max(vals)) if vals else None


def args_stats(rows: list, inp: str, col: str):
    """(one argument above the floor, per argument of four above the floor,
    their ratio), each (median, min, max) over the passes; ns."""
    one = dict(rows)[f"{inp}: 1 argument"]
    four = dict(rows)[f"{inp}: 4 arguments"]
    fl = own_floor(col)
    if not all(isinstance(c.get(k), dict) for c in (one, four) for k in (col, fl)):
        return None
    cells = {("1", k): one[k] for k in (col, fl)} | {("4", k): four[k] for k in (col, fl)}
    c1 = per_pass(cells, lambda f: f[("1", col)] - f[("1", fl)])
    c4 = per_pass(cells, lambda f: (f[("4", col)] - f[("4", fl)]) / 4)
    r = per_pass(cells, lambda f: ((f[("4", col)] - f[("4", fl)]) / 4)
                 / max(f[("1", col)] - f[("1", fl)], 1e-9))
    return c1, c4, r


def body_stats(cells: dict, cols: dict):
    """Per column: (its figure / the fastest peer's, / the fastest dlcast
    slice style's), and the two targets' ratios, each over the passes."""
    peers = [c for c, (_, peer) in cols.items() if peer]
    mine = [c for c, (_, peer) in cols.items() if not peer]
    slices = [c for c in mine if "slices" in c]
    out = {}
    for col in cols:
        out[col] = (per_pass(cells, lambda f, col=col: f[col] / min(f[p] for p in peers)),
                    per_pass(cells, lambda f, col=col: f[col] / min(f[p] for p in slices)))
    best = per_pass(cells, lambda f: min(f[c] for c in mine) / min(f[p] for p in peers))
    indexed = per_pass(cells, lambda f: f["dlcast indexed"] / min(f[p] for p in slices))
    return out, best, indexed


def verdict(st, thr: float) -> str:
    if st is None:
        return "not measured"
    m, lo, hi = st
    if m <= thr:
        return "**met**" if hi <= thr else "**met** (missed in some passes)"
    return "missed" if lo > thr else "missed (met in some passes)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="a fast smoke run, noisier figures; the guide is left alone")
    ap.add_argument("--passes", type=int, default=PASSES, help="times the whole table is timed")
    ap.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"))
    ap.add_argument("--png", default=str(HERE / "bench.png"))
    args = ap.parse_args()

    # One core for the whole run: no migrations between repeats.
    pinned = None
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        pinned = cpus[-1]
        os.sched_setaffinity(0, {pinned})

    timing = Timing(0.01, 3, 100_000) if args.quick else Timing(0.04, 7, 2_000_000)
    notes: dict = {}  # (row, lib) -> why not timed

    load_start = loadavg()
    loop = timing.ns_per_call("pass")
    started = _dt.datetime.now()

    def time_row(row: str, cases: dict, order: list) -> dict:
        """Calls each case once; times those that did not raise, together."""
        cells, ok = {}, {}
        for lib, (stmt, names) in cases.items():
            err = attempt(lambda: eval(stmt, {}, names))
            if err:
                notes[(row, lib)] = err
                cells[lib] = err
            else:
                ok[lib] = (stmt, names)
        cells.update(timing.row(ok, row))
        return {lib: cells[lib] for lib in order if lib in cells}

    def show(label: str, cells: dict) -> None:
        print(f"  {label[:58]:<58}" + "".join(f"{lib.replace(' floor', '-floor').split()[0]}={fmt_ns(c):>7} "
                                               for lib, c in cells.items()), flush=True)

    img, k, outs, xt = body_inputs()
    body_check = check_bodies(img, k, outs, xt)
    conv_out = np.zeros_like(next(iter(outs.values())))
    srows, rrows, arows = scalar_rows(), return_rows(), args_rows()
    passes = []
    for n_pass in range(args.passes):
        print(f"pass {n_pass + 1} of {args.passes}", flush=True)
        res: dict = {s: [] for s in [*SCALAR_SECTIONS, "returns", "args", "conv", "sum"]}
        for section, label, x, fns in srows:
            cases = {lib: ("f(x)", {"f": f, "x": x}) for lib, f in fns.items()}
            if section == "inputs" and "dlcast" in fns:
                # The producer's Python-level export on its own (the capsule
                # is dropped unconsumed, so its deleter runs: a round trip).
                cases["__dlpack__"] = ("f(x, max_version=v)",
                                       {"f": type(x).__dlpack__, "x": x, "v": (1, 3)})
            if section == "inputs" and "tvm-ffi" in fns:
                # tvm-ffi's own floor in the same row: its cost above it.
                cases["tvm-ffi floor"] = ("f(z)", {"f": tv.floor1, "z": 0})
            res[section].append((label, time_row(label, cases, [*LIBS, *EXTRA])))
            show(label, res[section][-1][1])
        for label, fns in rrows:
            cells = time_row(label, {lib: (stmt, {**names, "n": 1000})
                                     for lib, (stmt, names) in fns.items()}, LIBS)
            for lib in LIBS:
                if (label, lib) in NOT_OFFERED:
                    notes[(label, lib)] = NOT_OFFERED[(label, lib)]
            res["returns"].append((label, cells))
            show(label, cells)
        for inp, fns, (a, b, w, o) in arows:
            one = {col: ("f(a)", {"f": f1, "a": a}) for col, (f1, _) in fns.items()}
            four = {col: ("f(a, b, w, o)", {"f": f4, "a": a, "b": b, "w": w, "o": o})
                    for col, (_, f4) in fns.items()}
            # tvm-ffi's floors take ints: an array would be converted.
            one["tvm-ffi floor"] = ("f(z)", {"f": tv.floor1, "z": 0})
            four["tvm-ffi floor"] = ("f(z, z, z, z)", {"f": tv.floor4, "z": 0})
            for label, cases in ((f"{inp}: 1 argument", one), (f"{inp}: 4 arguments", four)):
                res["args"].append((label, time_row(label, cases, ARGS_COLS)))
                show(label, res["args"][-1][1])
        # One output array for every column while timing (the checked
        # results are in `outs`): the same addresses for every style.
        conv = {col: ("f(img, k, o)", {"f": f, "img": img, "k": k, "o": conv_out})
                for col, (f, _) in CONV_COLS.items()}
        res["conv"].append(("conv5", time_row("conv5", conv, list(CONV_COLS))))
        show("conv5", res["conv"][-1][1])
        ssum = {col: ("f(x)", {"f": f, "x": xt}) for col, (f, _) in SUM_COLS.items()}
        res["sum"].append(("strided_sum", time_row("strided_sum", ssum, list(SUM_COLS))))
        show("strided_sum", res["sum"][-1][1])
        passes.append(res)
    results = {sec: combine([p[sec] for p in passes]) for sec in passes[0]}

    # The same Rust functions from the two builds, timed together (one pass).
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
        "timing": {k: v for k, v in vars(timing).items() if not k.startswith("_")},
        "passes": args.passes,
        "elapsed_s": elapsed,
        "loadavg": [load_start, load_end],
    }

    # ------------------------------------------------------------ output
    json_path = TARGET / "results.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({"meta": meta, "results": results, "passes": passes,
                                     "profile": profile,
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
        return rstats(cell(row, "dlcast"), cell(row, peer))

    # ---------------------------------------------------------- targets
    # (case, timed row, bench function suffix): every NumPy parameter kind.
    np_rows = [("`TensorRef<f64>` `(10,)`", "sum_len: NumPy float64 (10,)", "sum_len"),
               ("`TensorMut<f64>` `(10,)`", "sum_len_mut `TensorMut<f64>`: NumPy float64 (10,)",
                "sum_len_mut"),
               ("`&[f64]` `(10,)`", "slice `&[f64]`: NumPy float64 (10,)", "slice_len"),
               ("`&mut [f64]` `(10,)`", "slice `&mut [f64]`: NumPy float64 (10,)",
                "slice_len_mut"),
               ("`ArrayView2<f32>` `(1000, 3)`", "`ArrayView2<f32>`: NumPy float32 (1000, 3)",
                "view_first"),
               ("`#[shape(_, 3)] #[order(c)]` `(1000, 3)`", "sum_pts: NumPy float32 (1000, 3)",
                "sum_pts")]
    pt_rows = [("`TensorRef<f64>` `(10,)`", "sum_len: PyTorch float64 (10,)", "sum_len"),
               ("`#[shape(_, 3)] #[order(c)]` `(1000, 3)`", "sum_pts: PyTorch float32 (1000, 3)",
                "sum_pts"),
               ("`&[f64]` `(10,)`", "slice `&[f64]`: PyTorch float64 (10,)", "slice_len"),
               ("`ArrayView2<f32>` `(1000, 3)`", "`ArrayView2<f32>`: PyTorch float32 (1000, 3)",
                "view_first")]
    cg_json = HERE / "callgrind.json"
    cg_all = json.loads(cg_json.read_text()) if cg_json.exists() else {}
    cg = cg_all.get("per_call", {})

    def cg_stat(fw: str, a: str, b: str):
        """dlcast's instructions per call over the reference's (callgrind), as
        a (ratio, ratio, ratio) triple (no spread), or None."""
        x, y = cg.get(fw, {}).get(a), cg.get(fw, {}).get(b)
        return (x / y,) * 3 if x and y else None

    def cgr(fw: str, a: str, b: str) -> str:
        x, y = cg.get(fw, {}).get(a), cg.get(fw, {}).get(b)
        return f"{x / y:.2f} ({x:,.0f} / {y:,.0f})" if x and y else "—"

    def cg_args_stat(fw: str, suffix: str):
        d = cg.get(fw, {})
        keys = (f"dlcast_args1{suffix}", f"dlcast_args4{suffix}", "floor", "floor4")
        if not all(d.get(k) for k in keys):
            return None, "—"
        one, four = d[keys[0]] - d["floor"], (d[keys[1]] - d["floor4"]) / 4
        return (four / one,) * 3, f"{four / one:.2f} ({four:,.0f} / {one:,.0f})"

    def cg_whole(a: str, b: str):
        """Whole calls, deallocation of the result included, above the bare
        call's (bench/callgrind.py's `whole` figures)."""
        w = cg_all.get("whole", {})
        if not all(w.get(k) for k in (a, b, "floor")):
            return None, "—"
        x, y = w[a] - w["floor"], w[b] - w["floor"]
        return (x / y,) * 3, f"{x / y:.2f} ({x:,.0f} / {y:,.0f})"
    conv_cells, sum_cells = dict(results["conv"])["conv5"], dict(results["sum"])["strided_sum"]
    conv_by, conv_best, conv_idx = body_stats(conv_cells, CONV_COLS)
    sum_by, sum_best, sum_idx = body_stats(sum_cells, SUM_COLS)
    a_stats = {(inp, col): args_stats(results["args"], inp, col)
               for inp in ("NumPy", "PyTorch") for col in ARGS_LIBS}
    ret_np = cg_whole("dlcast_make_f32_numpy", "rnp_make_f32_numpy")
    # (target, threshold, [(case, measured (median, min, max), shown beside)]):
    # a verdict per case; instruction targets from bench/callgrind.json.
    targets = [
        ("NumPy input ≤ 0.67x rust-numpy in instructions (rust-numpy on dlcast's registry)",
         0.67, [(w, cg_stat("numpy", f"dlcast_{fn}", f"rnp_{fn.replace('slice_len_mut', 'sum_len_mut')}"),
                 cgr("numpy", f"dlcast_{fn}", f"rnp_{fn.replace('slice_len_mut', 'sum_len_mut')}"))
                for w, _, fn in np_rows]),
        ("NumPy input ≤ 3.7x the bare PyO3 call in instructions", 3.7,
         [(w, cg_stat("numpy", f"dlcast_{fn}", "floor"), cgr("numpy", f"dlcast_{fn}", "floor"))
          for w, _, fn in np_rows]),
        ("NumPy input ≤ 0.85x rust-numpy in time", 0.85,
         [(w, r(row, "rust-numpy"), "") for w, row, _ in np_rows]),
        ("NumPy input ≤ 0.6x nanobind in time", 0.6,
         [(w, r(row, "nanobind"), "") for w, row, _ in np_rows]),
        # The PyTorch speed issue's targets (#29): read directly.
        ("PyTorch input ≤ 0.35x dlpark in instructions", 0.35,
         [(w, cg_stat("torch", f"dlcast_{fn}", f"dlpark_{fn}"),
           cgr("torch", f"dlcast_{fn}", f"dlpark_{fn}"))
          for w, _, fn in pt_rows if fn in ("sum_len", "slice_len")]),
        ("PyTorch input ≤ 0.5x dlpark in time", 0.5,
         [(w, r(row, "dlpark"), "") for w, row, fn in pt_rows if fn in ("sum_len", "slice_len")]),
        ("PyTorch writable and 2-D inputs ≤ 0.4x dlpark in instructions", 0.4,
         [(w, cg_stat("torch", f"dlcast_{fn}", f"dlpark_{ref}"),
           cgr("torch", f"dlcast_{fn}", f"dlpark_{ref}"))
          for w, fn, ref in (("`TensorMut<f64>` `(10,)`", "sum_len_mut", "sum_len"),
                             ("`&mut [f64]` `(10,)`", "slice_len_mut", "slice_len"),
                             ("`ArrayView2<f32>` `(1000, 3)`", "view_first", "view_first"),
                             ("`#[shape(_, 3)] #[order(c)]` `(1000, 3)`", "sum_pts", "sum_pts"))]),
        ("4 array parameters (named extents, a writable output): per argument ≤ a "
         "one-argument function (above the floor), in instructions", 1.0,
         [(f"{inp}, {'`TensorRef`/`TensorMut`' if sfx == '' else 'views and slices'}",
           *cg_args_stat(fw, sfx))
          for inp, fw in (("NumPy", "numpy"), ("PyTorch", "torch")) for sfx in ("", "_native")]),
        ("4 array parameters: per argument ≤ a one-argument function, in time", 1.0,
         [(f"{inp}, {'`TensorRef`/`TensorMut`' if col == 'dlcast' else 'views and slices'}",
           a_stats[(inp, col)][2] if a_stats[(inp, col)] else None, "")
          for inp in ("NumPy", "PyTorch") for col in ("dlcast", "dlcast (native types)")]),
        ("returning NumPy ≤ 1.0x rust-numpy in instructions, deallocation included", 1.0,
         [("`make_f32(1000)`", *ret_np)]),
        ("returning NumPy ≤ 0.9x rust-numpy in time", 0.9,
         [("`make_f32(1000)`", r("make_f32(1000) -> NumPy", "rust-numpy"), "")]),
        ("returning PyTorch ≤ 0.9x dlpark in time", 0.9,
         [("`make_f32(1000)`", r("make_f32(1000) -> PyTorch", "dlpark"), "")]),
        ("body: dlcast's fastest style ≤ 1.1x the fastest peer", 1.1,
         [("5x5 convolution", conv_best, ""), ("strided sum", sum_best, "")]),
        ("body: rank-typed indexing ≤ 1.5x slices", 1.5,
         [("5x5 convolution", conv_idx, ""), ("strided sum", sum_idx, "")]),
    ]
    target_lines = ["| target | case | dlcast / reference | | instructions (callgrind): "
                    "dlcast / reference |",
                    "|---|---|---|---|---|"]
    summary = ["| target | measured: median (min–max of the passes) | |", "|---|---|---|"]
    for text, thr, items in targets:
        for j, (what, st, ir) in enumerate(items):
            target_lines.append(f"| {text if j == 0 else ''} | {what} | {fmt_r(st)} | "
                                f"{verdict(st, thr)} | {ir} |")
        all_met = all(st is not None and st[0] <= thr for _, st, _ in items)
        summary.append(f"| {text} | " + "; ".join(f"{w}: {fmt_r(st)}" for w, st, _ in items)
                       + f" | {'**met**' if all_met else 'missed'} |")

    def args_table() -> list[str]:
        head = ["", *ARGS_COLS]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for inp in ("NumPy", "PyTorch"):
            for n_args in ("1 argument", "4 arguments"):
                cells = dict(results["args"])[f"{inp}: {n_args}"]
                lines.append(f"| {inp}: {n_args}, ns | "
                             + " | ".join(fmt_ns(cells.get(c)) for c in ARGS_COLS) + " |")
            st = {c: args_stats(results["args"], inp, c) for c in ARGS_LIBS}
            for name, i, fmt in (("1 argument, above its floor, ns", 0, 0),
                                 ("4 arguments, above its floor, per argument, ns", 1, 0),
                                 ("per argument of 4 / 1 argument", 2, 2)):
                vals = []
                for c in ARGS_COLS:
                    s_ = st[c][i] if st.get(c) else None
                    vals.append(fmt_r(s_) if fmt else (f"{s_[0]:,.0f}" if s_ else "—"))
                lines.append(f"| {inp}: {name} | " + " | ".join(vals) + " |")
        return lines

    def floor_table() -> list[str]:
        """Per tensor above each library's own floor: dlcast and dlpark above
        the bare PyO3 call, tvm-ffi above its own (an int argument), for
        one float64 (10,) argument (`sum_len`), one float32 (n, 3) (`args1`)
        and four (`args4`, per argument); ns, median (min–max of the passes)."""
        libs = ["dlcast", "dlpark", "tvm-ffi"]
        head = ["input", *[f"{lib} (above {'its own floor' if lib == 'tvm-ffi' else 'the PyO3 floor'})"
                           for lib in libs]]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for inp in ("PyTorch", "NumPy"):
            row = dict(results["inputs"]).get(f"sum_len: {inp} float64 (10,)", {})
            vals = []
            for lib in libs:
                fl = own_floor(lib)
                cells = {k: row[k] for k in (lib, fl) if isinstance(row.get(k), dict)}
                st = (per_pass(cells, lambda f, lib=lib, fl=fl: f[lib] - f[fl])
                      if len(cells) == 2 else None)
                vals.append(fmt_r(st, 0))
            lines.append(f"| {inp}: `sum_len`, 1 argument float64 (10,) | " + " | ".join(vals)
                         + " |")
            st = {lib: args_stats(results["args"], inp, lib) for lib in libs}
            lines.append(f"| {inp}: `args1`, 1 argument float32 (1000, 3) | "
                         + " | ".join(fmt_r(st[lib][0], 0) if st[lib] else "—" for lib in libs)
                         + " |")
            lines.append(f"| {inp}: `args4`, 4 arguments, per argument | "
                         + " | ".join(fmt_r(st[lib][1], 0) if st[lib] else "—" for lib in libs)
                         + " |")
        fl_lines = []
        for inp in ("PyTorch", "NumPy"):
            one = dict(results["args"])[f"{inp}: 1 argument"]
            four = dict(results["args"])[f"{inp}: 4 arguments"]
            fl_lines.append(
                f"{inp} rows: the PyO3 floor {fmt_ns(one.get('floor'))} ns (one argument), "
                f"{fmt_ns(four.get('floor'))} ns (four); tvm-ffi's "
                f"{fmt_ns(one.get('tvm-ffi floor'))} ns and "
                f"{fmt_ns(four.get('tvm-ffi floor'))} ns.")
        return lines + ["", " ".join(fl_lines)]

    def body_table(cells: dict, by: dict, unit: str, scale: float) -> list[str]:
        lines = [f"| style | {unit} per call | / fastest peer | / fastest dlcast slices |",
                 "|---|---|---|---|"]
        for col, c in cells.items():
            fig = f"{c['median'] / scale:,.3g}" if isinstance(c, dict) else "n/a"
            lines.append(f"| {col} | {fig} | {fmt_r(by[col][0])} | {fmt_r(by[col][1])} |")
        return lines

    np10, t10 = "sum_len: NumPy float64 (10,)", "sum_len: PyTorch float64 (10,)"
    headline = [
        f"- NumPy float64 `(10,)`: dlcast {fmt_ns(cell(np10, 'dlcast'))} ns, "
        f"{ratio(cell(np10, 'dlcast'), cell(np10, 'floor'))}x the bare PyO3 call, "
        f"{ratio(cell(np10, 'dlcast'), cell(np10, 'rust-numpy'))}x rust-numpy, "
        f"{ratio(cell(np10, 'dlcast'), cell(np10, 'nanobind'))}x nanobind.",
        f"- PyTorch float64 `(10,)`: dlcast {fmt_ns(cell(t10, 'dlcast'))} ns, "
        f"{ratio(cell(t10, 'dlcast'), cell(t10, 'dlpark'))}x dlpark, "
        f"{ratio(cell(t10, 'dlcast'), cell(t10, 'nanobind'))}x nanobind.",
    ]
    m = meta["machine"]
    cpu = f"{m.get('Model name', '?')}, {m.get('CPU(s)', '?')} CPUs"
    if m.get("Hypervisor vendor"):
        cpu += f" ({m['Hypervisor vendor']} guest)"
    noisy = (
        f"**A noisy machine**: {m.get('CPU(s)', '?')} CPUs shared with other engineers' "
        f"builds and tests (1-minute load average {load_start:.2f} at the start of the run, "
        f"{load_end:.2f} at the end). Nanoseconds move between rows and runs; the ratios "
        "within a row, timed in turns, move less, and their spread over the "
        f"{args.passes} passes is given with each. The instruction counts (callgrind, "
        "below) do not depend on the load: rely on them for the stable figures."
    )
    cg_path = HERE / "callgrind.md"
    callgrind = cg_path.read_text().strip().splitlines() if cg_path.exists() else [
        "(not measured: run `python bench/callgrind.py --table`)"]
    md_lines = [
        "# Benchmarks: array-boundary call overhead",
        "",
        "Generated by `make bench` (bench/build.sh, bench/run.py) on "
        f"{meta['date']}; dlcast at commit {meta['git']}. Figures are **ns per call** "
        "(body tables: ms or µs), the median over "
        f"{args.passes} passes of the whole table of each pass's median of the per-repeat means "
        "(lower is better); the ratios divide dlcast's figure by the other column's "
        "(below 1: dlcast is faster), pass by pass, and give the median with the lowest and "
        f"highest of the {args.passes} passes in brackets.",
        "",
        noisy,
        "",
        "## The targets",
        "",
        "A target is met when the median ratio is at or under it; a verdict notes where "
        "some passes fell on the other side. Targets in time use the timed tables below; "
        "targets in instructions use the instructions per call inside the extension "
        "function (bench/callgrind.md, measured at "
        f"{cg_all.get('commit', '—')}; for the several-arguments target, the instructions "
        "per argument of `args4` above `floor4` over those of `args1` above `floor`; for "
        "returns, whole calls with the result's deallocation, above the bare call's), which "
        "the last column shows beside every target: stable where the times are not, but "
        "without Python's dispatch of the call, which the times include. The NumPy "
        "instruction targets compare with rust-numpy on dlcast's registry (the process "
        "that runs the dlcast rows); bench/callgrind.md shows rust-numpy on its own "
        "registry too.",
        "",
        *target_lines,
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
        "## Slice and `ndarray` view parameters",
        "",
        "`slice_len(x)`: dlcast `x: &[f64]` (1-D, contiguous); rust-numpy "
        "`PyReadonlyArray1<f64>` and `as_slice()`; dlpark `from_dlpack`, checks and "
        "`cpu_slice`; nanobind `nb::ndarray<const double, nb::ndim<1>, nb::c_contig>`. "
        "Returns the length. `view_first(x)`: dlcast `x: ArrayView2<'_, f32>` (any "
        "strides); rust-numpy `PyReadonlyArray2<f32>::as_array()`; dlpark "
        "`ArrayViewD::try_from_dlpack` and `into_dimensionality`; nanobind "
        "`nb::ndarray<const float, nb::ndim<2>>` and `.view()`. Returns the first element.",
        "",
        *table(results["native"], "input"),
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
        "## Several arguments",
        "",
        "`args1(a)` against `args4(a, b, w, out)`: `a`, `b` float32 `(n, 3)`, `w` float32 "
        "`(n,)`, `out` a writable float32 `(n,)`, `n` = 1000 shared (dlcast "
        "`#[shape(n, 3)]` / `#[shape(n)]`; the others compare the extents by hand); each "
        "body reads the first element of every input and writes the first of `out`. "
        "dlcast: `TensorRef`/`TensorMut`; dlcast (native types): `ArrayView2`, "
        "`&[f32]`, `&mut [f32]`; rust-numpy `PyReadonlyArray2/1` and `PyReadwriteArray1`; "
        "nanobind `nb::ndarray<const float, nb::shape<-1, 3>>` ... and a writable "
        "`nb::ndarray<float, nb::ndim<1>>`; dlpark `from_dlpack` and `validate` per "
        "argument, dtype, device, rank, `n` and `out`'s read-only flag checked by hand "
        "(bench/rust/src/lib.rs); tvm-ffi four `tvm::ffi::TensorView` parameters, the "
        "same checks by hand except the read-only flag, which a `TensorView` does not "
        "carry (bench/tvmffi/bench.cc). The floor is a bare PyO3 function with one "
        "argument and one with four (`floor4`); tvm-ffi's own floor is `floor1(0)` / "
        "`floor4(0, 0, 0, 0)` (ints: a tensor argument is converted whatever the "
        "parameter type), and its figures above the floor are above that one. The "
        "target compares the cost above the "
        "floor: per argument of the four-argument call, `(args4 - floor4) / 4`, against "
        "the one-argument call's `args1 - floor`.",
        "",
        *args_table(),
        "",
        "### Per tensor above each library's own floor",
        "",
        "The cost of the conversion alone: each library's figure minus its own floor's "
        "in the same row (pass by pass; the median and, in brackets, the lowest and "
        "highest pass), for four arguments divided by 4. dlcast and dlpark are PyO3 "
        "functions and take the PyO3 floor (`floor(x)`, `floor4(a, b, w, out)`); "
        "tvm-ffi calls go through its own dispatch (a Cython `Function.__call__`, "
        "argument setters, a packed C call, the GIL released), so it takes its own "
        "floor: `floor1(0)` and `floor4(0, 0, 0, 0)`, int arguments that need no "
        "conversion.",
        "",
        *floor_table(),
        "",
        "## The body: access styles",
        "",
        "`conv5(img, k, out)`: a valid 5x5 correlation of a float32 `(512, 512)` image "
        "into a writable float32 `(508, 508)` output, `out[i, j] = Σ img[i + di, j + dj] "
        "* k[di, dj]` accumulated from 0 with `di` outer and `dj` inner (one multiply and "
        "one add each, no fused multiply-add). `strided_sum(x)`: the sum of a float64 "
        "`(1000, 3)` array, the transpose of a C-ordered `(3, 1000)` one (strides 1 and "
        "1000 elements), in C index order. The same arithmetic in every style "
        "(bench/rust/src/body.rs, bench/nanobind/nb_bench.cpp, the module at -O3):",
        "",
        "- dlcast slices: `#[order(c)]` parameters and `as_slice()` / `as_slice_mut()` "
        "(`strided_sum`: `#[order(c)]`, where the boundary copies the transposed input to C "
        "order, and `#[order(f)]`, where the body reads the transpose `x.t().as_slice()`);",
        "- dlcast indexed: rank-typed `TensorRef<'_, T, 2>` / `TensorMut<'_, T, 2>` "
        "parameters, `get([i, j])?` / `set([i, j], v)?` per element (an out-of-range index "
        "is an `IndexError` naming the parameter; bench/rust/src/body.rs, module "
        "`rank_typed`);",
        "- dlcast ndarray: `ArrayView2` / `ArrayViewMut2` parameters, `x[[i, j]]`;",
        "- rust-numpy: `PyReadonlyArray2::as_array()` / `PyReadwriteArray2::as_array_mut()`, "
        "the same `ndarray` body; nanobind: `nb::ndarray<..., nb::ndim<2>>` and `.view()`, "
        "`v(i, j)` (`conv5`'s parameters with `nb::c_contig`).",
        "",
        "Results, checked in the run before timing:",
        "",
        *body_check,
        "",
        *body_table(conv_cells, conv_by, "ms", 1e6),
        "",
        *body_table(sum_cells, sum_by, "µs", 1e3),
        "",
        "## Instructions per call (callgrind)",
        "",
        *callgrind,
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
        "The same Rust functions from two builds of bench/rust, timed back to back in one "
        "pass: the main tables' profile (fat LTO, one codegen unit) and cargo's default "
        "release profile (no LTO, 16 codegen units). ns per call, LTO / default:",
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
        f"- The whole table is timed {args.passes} times (passes); a figure is the median of "
        "the passes' figures, a ratio the median of the per-pass ratios, with the lowest "
        "and highest in brackets.",
        f"- `timeit`: each cell is calibrated once to about {timing.per_repeat_s:g} s per "
        f"repeat (at most {timing.max_number:,} calls, at least one), run {timing.repeat} "
        "times per pass; a pass's figure is the median of the per-repeat ns/call. "
        "The cells of one row take turns, one repeat each, so that a disturbance from "
        "outside the process hits the whole row and the ratios stay put. "
        "Function and argument are locals of timeit's loop; the loop itself "
        f"(`pass`) costs {loop['median']:.1f} ns per iteration and is not subtracted. "
        "Garbage collection is off during timing (timeit's default).",
        "- Every function was called once before timing; a call that raised is reported "
        "as n/a, not timed.",
        "- JAX runs on CPU with `jax_enable_x64` (float64 arrays); PyTorch is the CPU build.",
        "- The Rust functions (bench/rust/src) and the C++ ones "
        "(bench/nanobind/nb_bench.cpp, bench/tvmffi/bench.cc) do the same work per "
        "library: the conversion at the "
        "boundary, the checks the signature states, and a minimal touch of the data (the "
        "body tables: the same loops).",
        "- tvm-ffi (PyPI `apache-tvm-ffi`, Apache TVM's stand-alone FFI: a C ABI for "
        "packed functions, a Cython call path, DLPack tensors as `tvm::ffi::TensorView`): "
        "bench/tvmffi/bench.cc, compiled by tvm-ffi's own `tvm_ffi.cpp.load_inline` "
        "(its headers, PyPI's ninja, the system g++, `-O3 -DNDEBUG` after its "
        "`-O2`) into bench/target/tvmffi; every function exported with "
        "`TVM_FFI_DLL_EXPORT_TYPED_FUNC` and called as tvm-ffi ships it (the GIL "
        "released around the call, its default). It takes a PyTorch tensor through the "
        "C exchange table of `type(x).__dlpack_c_exchange_api__` and any other array "
        "through `x.__dlpack__()`; it checks no dtype, rank or device (the functions do, "
        "as the dlpark ones), and neither it nor PyTorch's table refuses a "
        "`requires_grad` tensor, a conj or neg view, or (having no flag to look at) a "
        "`out` its producer flagged read-only.",
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
    # The hand-written analysis (bench/ANALYSIS.md) follows the generated tables.
    analysis = ROOT / "bench" / "ANALYSIS.md"
    if analysis.exists():
        md_lines += [analysis.read_text()]
    Path(args.out).write_text("\n".join(md_lines))

    readme_block = [
        f"Measured by `make bench` on {meta['date']} at {meta['git']} "
        f"({args.passes} passes; ratio = dlcast / reference, median and the lowest–highest "
        f"pass; a noisy {m.get('CPU(s)', '?')}-CPU machine, load {load_start:.1f}–"
        f"{load_end:.1f}: see BENCHMARKS.md for the tables and the instruction counts):",
        "",
        *summary,
    ]
    if not args.quick:
        write_readme(readme_block)

    print()
    print("\n".join(target_lines))
    print()
    for sec in ("inputs", "native", "returns"):
        print("\n".join(table(results[sec], sec)))
        print()
    print("\n".join(args_table()))
    print()
    print("\n".join(floor_table()))
    print()
    print("\n".join(body_table(conv_cells, conv_by, "ms", 1e6)))
    print()
    print("\n".join(body_table(sum_cells, sum_by, "µs", 1e3)))
    print()
    if busy:
        print(f"warning: load average {load_start:.2f} / {load_end:.2f}: the machine was busy, "
              "figures are inflated", file=sys.stderr)
    print(f"wrote {Path(args.out).relative_to(ROOT) if Path(args.out).is_relative_to(ROOT) else args.out}, "
          f"{args.png}, {json_path}{'' if args.quick else ', ' + HEADLINE_PATH.relative_to(ROOT).as_posix()} ({elapsed:.0f} s)")


README_START = "<!-- bench:headline:start (written by bench/run.py; edits here are replaced) -->"
README_END = "<!-- bench:headline:end -->"
# The headline sits in the guide's Performance chapter (the README links it).
HEADLINE_PATH = ROOT / "guide" / "src" / "performance.md"


def write_readme(block: list[str]) -> None:
    """Replaces the text between the Performance chapter's bench:headline markers."""
    path = HEADLINE_PATH
    text = path.read_text()
    if README_START not in text or README_END not in text:
        print(f"warning: {path.relative_to(ROOT)} has no {README_START!r} ... {README_END!r} block; "
              "headline not written", file=sys.stderr)
        return
    pre, rest = text.split(README_START, 1)
    _, post = rest.split(README_END, 1)
    path.write_text(pre + README_START + "\n" + "\n".join(block) + "\n" + README_END + post)


if __name__ == "__main__":
    main()
