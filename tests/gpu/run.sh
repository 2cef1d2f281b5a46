#!/usr/bin/env bash
# dlcast's GPU checks, for a machine with an NVIDIA GPU, Python
# 3.12+, PyTorch, CuPy, JAX (CUDA builds) and pytest, and no Rust toolchain.
#
# It needs a wheel of the test extension built beforehand on the
# development machine (one command, from the repository root; abi3, so it
# loads on CPython 3.12 and later):
#
#     maturin build --release -m tests/Cargo.toml --features abi3,cudarc
#
# which writes target/wheels/dlcast_testext-*-cp312-abi3-*.whl. Copy it
# next to this script (tests/gpu/) or name it in DLCAST_WHEEL, then run
#
#     bash tests/gpu/run.sh
#
# The wheel is installed into a temporary directory (nothing is installed
# into the Python environment, no network is used), then tests/gpu runs
# under a 5-minute limit. Everything that could not run is listed under
# "NOT RUN" and makes the script fail (DLCAST_GPU_ALLOW_SKIPS=1 accepts it).
# Exit status: 0 all ran and passed; 1 failures or skips; 2 set-up missing.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}

echo "== dlcast GPU checks, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
else
  echo "NOT RUN: nvidia-smi not found (is this a GPU machine?)"
fi
"$PY" - <<'PYEOF'
import importlib, sys
print("python", sys.version.split()[0])
for m in ["pytest", "torch", "cupy", "jax", "jaxlib", "numpy"]:
    try:
        mod = importlib.import_module(m)
        extra = ""
        if m == "torch":
            extra = f" cuda={mod.version.cuda} available={mod.cuda.is_available()}"
            extra += f" exchange_api={hasattr(mod.Tensor, '__dlpack_c_exchange_api__')}"
        print(f"{m} {getattr(mod, '__version__', '?')}{extra}")
    except Exception as e:  # noqa: BLE001
        print(f"{m} NOT IMPORTABLE: {type(e).__name__}: {e}")
PYEOF

WHEEL=${DLCAST_WHEEL:-}
if [ -z "$WHEEL" ]; then
  WHEEL=$(ls -t tests/gpu/dlcast_testext-*abi3*.whl target/wheels/dlcast_testext-*abi3*.whl 2>/dev/null | head -1)
fi
if [ -z "$WHEEL" ] || [ ! -f "$WHEEL" ]; then
  echo "NOT RUN: no abi3 wheel of the test extension; build it with"
  echo "  maturin build --release -m tests/Cargo.toml --features abi3,cudarc"
  echo "and copy it to tests/gpu/ (or set DLCAST_WHEEL)."
  exit 2
fi
echo "wheel: $WHEEL"
if ! "$PY" -c "import pytest" 2>/dev/null; then
  echo "NOT RUN: pytest is not installed for $PY"
  exit 2
fi
SITE=$(mktemp -d)
LOG=$(mktemp)
trap 'rm -rf "$SITE" "$LOG"' EXIT
if ! "$PY" -m pip install --quiet --no-index --no-deps --target "$SITE" "$WHEEL"; then
  echo "NOT RUN: the wheel does not install for $PY"
  exit 2
fi
PYTHONPATH="$SITE" "$PY" -c "import dlcast_testext as e; print('dlcast_testext from', e.__file__, '| cudarc feature:', e.HAS_CUDARC)" || exit 2

PYTHONPATH="$SITE" timeout 300 "$PY" -m pytest tests/gpu -v -rs -p no:cacheprovider 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
[ "$rc" = 124 ] && echo "FAILED: the run passed the 5-minute limit"

echo "== summary"
grep -E "::[^ ]+ (PASSED|FAILED|ERROR|SKIPPED)" "$LOG" | sed -E 's/ +\[ *[0-9]+%\]$//; s/^/  /' || true
skips=$(grep -E "^SKIPPED" "$LOG" || true)
if [ -n "$skips" ]; then
  echo "NOT RUN (skipped, with reasons):"
  echo "$skips" | sed 's/^/  /'
  if [ "${DLCAST_GPU_ALLOW_SKIPS:-0}" != 1 ] && [ "$rc" = 0 ]; then
    rc=1
  fi
fi
echo "exit status: $rc"
exit "$rc"
