"""dlcast demo: Rust image filters fed by NumPy, PyTorch and JAX.

Loads the photo that ships with matplotlib (Grace Hopper, 600x512 RGB),
runs the three filters of the `dlcast_demo` extension on it once per
framework, checks that every framework gets the same pixels (and that they
match a NumPy reference), prints shapes and timings, saves a side-by-side
picture to out/demo.png, and shows the errors dlcast raises for wrong inputs.

Build and run with `make demo`. Exits non-zero if anything is unexpected.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import statistics
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.image as mpimg
import matplotlib.pyplot as plt
import numpy as np
import torch
import jax.numpy as jnp

import dlcast_demo as dd

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "out"
RADIUS = 6  # box blur radius: a 13x13 window
RUNS = 7  # timed calls per filter and framework; the median is reported

problems: list[str] = []


def check(ok: bool, what: str) -> None:
    """Records a failed check; the script exits non-zero at the end."""
    if not ok:
        problems.append(what)
        print(f"  UNEXPECTED: {what}")


def median_ms(fn) -> float:
    """Median wall time of `fn()` over RUNS calls, in milliseconds."""
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def as_numpy(x) -> np.ndarray:
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


# --- NumPy references, to check the Rust results pixel for pixel ----------


def ref_grayscale(img: np.ndarray) -> np.ndarray:
    r, g, b = (img[..., k].astype(np.uint32) for k in range(3))
    return ((77 * r + 150 * g + 29 * b + 128) >> 8).astype(np.uint8)


def ref_box_blur(img: np.ndarray, radius: int) -> np.ndarray:
    k = 2 * radius + 1
    p = np.pad(img.astype(np.int64), ((radius, radius), (radius, radius), (0, 0)), mode="edge")
    s = np.zeros((p.shape[0] + 1, p.shape[1] + 1, 3), np.int64)
    s[1:, 1:] = p.cumsum(0).cumsum(1)  # summed-area table
    h, w = img.shape[:2]
    total = s[k : k + h, k : k + w] - s[:h, k : k + w] - s[k : k + h, :w] + s[:h, :w]
    area = k * k
    return ((total + area // 2) // area).astype(np.uint8)


def ref_edges(gray: np.ndarray) -> np.ndarray:
    p = np.pad(gray.astype(np.int32), 1, mode="edge")
    h, w = gray.shape
    a = lambda dy, dx: p[1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w]  # noqa: E731
    gx = (a(-1, 1) + 2 * a(0, 1) + a(1, 1)) - (a(-1, -1) + 2 * a(0, -1) + a(1, -1))
    gy = (a(1, -1) + 2 * a(1, 0) + a(1, 1)) - (a(-1, -1) + 2 * a(-1, 0) + a(-1, 1))
    return np.sqrt((gx * gx + gy * gy).astype(np.float32))


# --- The photo -------------------------------------------------------------

photo = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
img = np.array(mpimg.imread(photo))  # writable, C-contiguous copy
if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
    sys.exit(f"unexpected photo: {img.shape} {img.dtype}")
H, W, _ = img.shape
print(f"photo: {photo.name}  shape={img.shape}  dtype={img.dtype}")

# --- Run every filter with inputs from each framework ----------------------

# Inputs per framework; outputs are NumPy arrays, except for PyTorch where
# they are torch tensors. JAX arrays are immutable, so JAX inputs get NumPy
# outputs.
frameworks = {
    "numpy": (lambda a: a, lambda shape, dt: np.empty(shape, dt)),
    "torch": (
        torch.from_numpy,
        lambda shape, dt: torch.empty(shape, dtype=getattr(torch, np.dtype(dt).name)),
    ),
    "jax": (jnp.asarray, lambda shape, dt: np.empty(shape, dt)),
}

results: dict[str, dict[str, np.ndarray]] = {}
timings: dict[str, dict[str, float]] = {}
for name, (to_input, alloc) in frameworks.items():
    x = to_input(img)
    gray = alloc((H, W), np.uint8)
    blur = alloc((H, W, 3), np.uint8)
    edges = alloc((H, W), np.float32)
    # Edge detection reads the grayscale image, in the same framework.
    gray_in = lambda: to_input(as_numpy(gray)) if name == "jax" else gray  # noqa: E731
    t = {
        "grayscale": median_ms(lambda: dd.grayscale(x, gray)),
        "box_blur": median_ms(lambda: dd.box_blur(x, blur, RADIUS)),
    }
    g = gray_in()
    t["edge_magnitude"] = median_ms(lambda: dd.edge_magnitude(g, edges))
    outs = {"grayscale": gray, "box_blur": blur, "edge_magnitude": edges}
    results[name] = {k: as_numpy(v).copy() for k, v in outs.items()}
    timings[name] = t
    print(f"{name:>6}: input {type(x).__module__}.{type(x).__name__} {tuple(x.shape)} {x.dtype}")

print("\noutputs:")
for k, v in results["numpy"].items():
    print(f"  {k:<15} shape={v.shape}  dtype={v.dtype}  min={v.min():g}  max={v.max():g}")

# --- Correctness -----------------------------------------------------------

print("\nchecks:")
refs = {
    "grayscale": ref_grayscale(img),
    "box_blur": ref_box_blur(img, RADIUS),
}
refs["edge_magnitude"] = ref_edges(refs["grayscale"])
for k, ref in refs.items():
    for name in frameworks:
        same = np.array_equal(results[name][k], results["numpy"][k])
        check(same, f"{k}: {name} differs from numpy")
    check(np.array_equal(results["numpy"][k], ref), f"{k}: differs from the NumPy reference")
print("  numpy, torch and jax give bit-identical results, equal to the NumPy reference")

# Results in the caller's framework: `blurred` allocates the image in Rust
# and hands the buffer over without a copy (returns = like(img)).
print("\nreturned in the caller's framework (blurred, returns = like(img)):")
expected_type = {"numpy": np.ndarray, "torch": torch.Tensor, "jax": type(jnp.zeros(1))}
for name, (to_input, _) in frameworks.items():
    x = to_input(img)
    out = dd.blurred(x, RADIUS)
    ms = median_ms(lambda: dd.blurred(x, RADIUS))
    check(isinstance(out, expected_type[name]), f"blurred({name}) returned {type(out)}")
    check(np.array_equal(as_numpy(out), refs["box_blur"]), f"blurred({name}) differs")
    print(f"  {name:>6} in -> {type(out).__module__}.{type(out).__name__} "
          f"{tuple(out.shape)} {out.dtype}  {ms:.3f} ms")

# Strided views take the element-by-element path: a mirrored (negative
# stride) input and a column-major output.
mirror_out = np.empty((W, H), np.uint8).T
dd.grayscale(img[:, ::-1], mirror_out)
check(np.array_equal(mirror_out, refs["grayscale"][:, ::-1]), "mirrored grayscale is wrong")
mirror_edges = np.empty((W, H), np.float32).T
dd.edge_magnitude(refs["grayscale"][:, ::-1], mirror_edges)
check(np.array_equal(mirror_edges, refs["edge_magnitude"][:, ::-1]), "mirrored edges are wrong")
print("  mirrored input (negative strides) into column-major outputs: correct")

# --- Timings ---------------------------------------------------------------

print(f"\ntimings (median of {RUNS} calls, ms, {H}x{W} image, blur radius {RADIUS}):")
print(f"  {'':<15}" + "".join(f"{n:>9}" for n in frameworks))
for k in refs:
    print(f"  {k:<15}" + "".join(f"{timings[n][k]:>9.3f}" for n in frameworks))

# --- Picture ---------------------------------------------------------------

OUT.mkdir(exist_ok=True)
panels = [
    ("original", img, {}),
    ("grayscale", results["numpy"]["grayscale"], {"cmap": "gray", "vmin": 0, "vmax": 255}),
    (f"box_blur (radius {RADIUS})", results["numpy"]["box_blur"], {}),
    ("edge_magnitude (Sobel)", results["numpy"]["edge_magnitude"], {"cmap": "magma"}),
]
fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 4 * H / W + 0.5))
for ax, (title, data, kw) in zip(axes, panels):
    ax.imshow(data, **kw)
    ax.set_title(title)
    ax.axis("off")
fig.tight_layout()
png = OUT / "demo.png"
fig.savefig(png, dpi=100)
print(f"\nwrote {png.relative_to(REPO)}")

# --- Wrong inputs ----------------------------------------------------------

print("\nwrong inputs (each must be refused before the filter runs):")
rgba = np.concatenate([img, np.full((H, W, 1), 255, np.uint8)], axis=2)
transposed = img.transpose(1, 0, 2)  # (W, H, 3), strides (3, 3 * W, 1)
cases = [
    ("RGBA image (H, W, 4)", lambda out: dd.grayscale(rgba, out), (H, W)),
    ("float64 image", lambda out: dd.grayscale(img.astype(np.float64), out), (H, W)),
    # The output gets the transposed shape, so that only the memory order is wrong.
    ("transposed image under order(c)", lambda out: dd.box_blur(transposed, out), (W, H, 3)),
    ("output one row short", lambda out: dd.grayscale(img, out), (H - 1, W)),
    # JAX arrays are immutable: never a writable output.
    ("JAX array as the output", lambda out: dd.grayscale(img, jnp.asarray(out)), (H, W)),
]
for label, call, out_shape in cases:
    out = np.full(out_shape, 7, np.uint8)
    try:
        call(out)
    except TypeError as e:
        print(f"  {label}:\n    {type(e).__name__}: {e}")
        check(bool(np.all(out == 7)), f"{label}: the output was written to")
    except Exception as e:  # noqa: BLE001 - any other type is unexpected
        print(f"  {label}:\n    {type(e).__name__}: {e}")
        check(False, f"{label}: raised {type(e).__name__}, expected TypeError")
    else:
        check(False, f"{label}: was accepted")

# --- Implicit conversion ----------------------------------------------------

print("\nimplicit conversion (read-only inputs that fit but for dtype or order):")
# `blurred` asks for order(c) without #[noconvert]: NumPy makes a C-order copy.
from_t = np.asarray(dd.blurred(transposed))
want = np.asarray(dd.blurred(np.ascontiguousarray(transposed)))
print(f"  blurred(transposed image): {from_t.shape}, same as from a C-order copy: "
      f"{bool(np.array_equal(from_t, want))}")
check(bool(np.array_equal(from_t, want)), "blurred(transposed) differs from the C-order copy")

if problems:
    print(f"\nFAILED: {len(problems)} unexpected result(s)")
    sys.exit(1)
print("\nall good")
