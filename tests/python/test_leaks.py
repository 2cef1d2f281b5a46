"""Leaks: a million calls through each import path
and into each export framework leave the resident set size flat (after a
warm-up) and every buffer, capsule and producer deleter balanced.

Call counts: DLCAST_LEAK_CALLS (default 1,000,000) per path, except the
three slow ones against this debug build, so that the whole file stays
near 2.5 minutes on an idle 2-core machine (at 1,000,000 each it takes
over 5): the JAX import (`__dlpack__`, ~20 µs a call) runs a fifth
(DLCAST_LEAK_CALLS_JAX_IMPORT, default 200,000), the JAX export (`returns =
jax`, ~200 µs) a tenth (DLCAST_LEAK_CALLS_JAX_EXPORT, 100,000) and the
array API export (`returns = array_api`, ~55 µs, nearly all of it in
array_api_strict's Python; dlcast's side is the NumPy export's) a quarter
(DLCAST_LEAK_CALLS_ARRAY_API, 250,000).

Every 10,000 calls the loop runs a generation-0 collection, as Python's
collector would in any program that allocates containers: JAX frees the
buffers of dead arrays only from a `gc` callback (`_xla_gc_callback`,
jax-ml/jax#14882), so a loop that allocates no containers never lets it
run, and RSS grows by ~100-600 bytes a call with pure JAX too
(`jnp.from_dlpack` of a NumPy array, no dlcast involved)."""

import array
import gc
import os
import time

import array_api_strict as xp  # noqa: F401 - imported by arange_array_api too
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import dlcast_testext as ext

# A million calls per path: every test here is slow.
pytestmark = pytest.mark.slow

CALLS = int(os.environ.get("DLCAST_LEAK_CALLS", "1000000"))
JAX_IMPORT_CALLS = int(os.environ.get("DLCAST_LEAK_CALLS_JAX_IMPORT", str(max(CALLS // 5, 1))))
JAX_EXPORT_CALLS = int(os.environ.get("DLCAST_LEAK_CALLS_JAX_EXPORT", str(max(CALLS // 10, 1))))
ARRAY_API_CALLS = int(os.environ.get("DLCAST_LEAK_CALLS_ARRAY_API", str(max(CALLS // 4, 1))))
COLLECT_EVERY = 10_000
WARMUP = min(20_000, max(CALLS // 10, 100))
RSS_TOLERANCE = 4 << 20  # bytes: a leak of 4 bytes a call over 1,000,000 calls
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def counts():
    gc.collect()
    return ext.export_stats(), ext.producer_counts()


def hammer(call, n):
    """Warms up, then runs `call()` `n` times; returns the RSS growth in
    bytes and the export/producer counters before and after."""
    for _ in range(WARMUP):
        call()
    before = counts()
    rss0 = rss()
    t0 = time.perf_counter()
    done = 0
    while done < n:
        chunk = min(COLLECT_EVERY, n - done)
        for _ in range(chunk):
            call()
        gc.collect(0)  # cheap; lets JAX's gc callback free dead arrays
        done += chunk
    elapsed = time.perf_counter() - t0
    after = counts()
    growth = rss() - rss0
    print(f"\n{n} calls in {elapsed:.1f} s ({elapsed / n * 1e6:.1f} µs each), "
          f"RSS {growth / 1024:+.0f} KiB")
    return growth, before, after


def assert_balanced(before, after):
    (b0, bf0, c0, cd0), (pc0, pd0) = before
    (b1, bf1, c1, cd1), (pc1, pd1) = after
    assert b1 - b0 == bf1 - bf0, f"export buffers: {b1 - b0} created, {bf1 - bf0} freed"
    assert c1 - c0 == cd1 - cd0, f"export capsules: {c1 - c0} created, {cd1 - cd0} deleted"
    assert pc1 - pc0 == pd1 - pd0, f"producer capsules: {pc1 - pc0} made, {pd1 - pd0} deleted"


DATA = np.arange(6.0).tobytes()

IMPORTS = {
    "numpy": (lambda: np.arange(6.0).reshape(2, 3), "numpy", CALLS),
    "torch": (lambda: torch.arange(6, dtype=torch.float64).reshape(2, 3), "exchange_api", CALLS),
    "jax": (lambda: jnp.arange(6.0).reshape(2, 3), "dlpack", JAX_IMPORT_CALLS),
    # (Below abi3-py311 only bytes and bytearray are read in place.)
    "buffer": (lambda: array.array("d", range(6)) if ext.BUFFER_PROTOCOL else bytearray(48),
               "buffer", CALLS),
}


@pytest.mark.parametrize("path", IMPORTS)
def test_import_path_does_not_leak(path):
    make, expected_path, n = IMPORTS[path]
    x = make()
    assert ext.import_path(x) == expected_path
    first = ext.first_f64
    if isinstance(x, bytearray):
        # Raw bytes are never converted to float64: read them as bytes.
        def first(x):
            return float(ext.u8_values(x)[0])
    growth, before, after = hammer(lambda: first(x), n)
    assert first(x) == 0.0
    assert_balanced(before, after)
    assert growth < RSS_TOLERANCE, f"RSS grew by {growth} bytes over {n} calls"


def test_raw_capsule_does_not_leak():
    make, first = ext.make_capsule, ext.first_f64
    assert ext.import_path(make(DATA, [2, 3], None)) == "capsule"
    growth, before, after = hammer(lambda: first(make(DATA, [2, 3], None)), CALLS)
    assert_balanced(before, after)
    _, (pc0, _) = before
    _, (pc1, _) = after
    assert pc1 - pc0 == CALLS
    assert growth < RSS_TOLERANCE, f"RSS grew by {growth} bytes over {CALLS} calls"


EXPORTS = {
    "default": (ext.arange_default, CALLS),
    "numpy": (ext.arange_numpy, CALLS),
    "torch": (ext.arange_torch, CALLS),
    "jax": (ext.arange_jax, JAX_EXPORT_CALLS),
    "array_api": (ext.arange_array_api, ARRAY_API_CALLS),
}


@pytest.mark.parametrize("framework", EXPORTS)
def test_export_does_not_leak(framework):
    make, n = EXPORTS[framework]
    shape = [2, 3]
    growth, before, after = hammer(lambda: make("float32", shape), n)
    assert_balanced(before, after)
    (b0, _, _, _), _ = before
    (b1, _, _, _), _ = after
    # One Rust buffer a call (two when returns = jax needs an aligned
    # copy), every one freed.
    assert n <= b1 - b0 <= 2 * n
    assert growth < RSS_TOLERANCE, f"RSS grew by {growth} bytes over {n} calls"
