#!/usr/bin/env bash
# Creates (or reuses) the project's virtualenv with every framework the tests
# drive. Idempotent: a stamp file records the requirement set it installed.
#
# Kept lean on disk, because CI machines can be short of it:
# - no pip cache (--no-cache-dir): downloaded wheels are not kept twice;
# - PyTorch in a step of its own, so its CUDA wheels (PyPI has no CPU-only
#   build for Linux x86-64) are unpacked and dropped before the rest arrive;
# - PyTorch's `triton` dependency is left out: only torch.compile uses it,
#   `import torch` does not, and it is about 1 GB installed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
REQ=scripts/requirements-test.txt
STAMP="$VENV/.dlcast-req-stamp"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
if [ -f "$STAMP" ] && cmp -s "$REQ" "$STAMP"; then
  exit 0
fi

# A fresh install needs about 8 GB free at its peak (PyTorch's wheels and
# their unpacked files); say so up front rather than fail half-way.
free_kb=$(df -Pk "$VENV" | awk 'NR==2 {print $4}')
if [ "${free_kb:-0}" -lt $((8 * 1024 * 1024)) ]; then
  echo "setup-venv: warning: $((free_kb / 1024)) MiB free where $VENV lives;" \
       "a fresh install needs about 8 GiB" >&2
fi

pip_install() { "$VENV/bin/python" -m pip install -q --no-cache-dir "$@"; }
# After each step below pip's check reports torch's missing triton, which is
# intended: those lines are dropped, any other stays.
pip_install_but_triton() {
  pip_install "$@" 2> >(grep -v \
    -e 'requires triton' -e 'resolver does not currently take into account' >&2)
}
TORCH_LINE='^torch([<>=!~ ]|$)'  # the requirement line that names torch
pip_install --upgrade pip packaging

# 1. PyTorch alone, with its dependencies but without triton.
torch_req=$(grep -E "$TORCH_LINE" "$REQ")
pip_install --no-deps "$torch_req"
mapfile -t torch_deps < <("$VENV/bin/python" - <<'EOF'
from importlib.metadata import requires
from packaging.requirements import Requirement

for line in requires("torch") or []:
    req = Requirement(line)
    if req.name == "triton":
        continue  # only torch.compile imports it
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        print(req)
EOF
)
if [ "${#torch_deps[@]}" -gt 0 ]; then
  pip_install_but_triton "${torch_deps[@]}"
fi

# 2. Everything else (torch is already there; listing it again would make
#    pip install triton after all).
grep -vE "$TORCH_LINE" "$REQ" > "$VENV/.dlcast-req-rest"
pip_install_but_triton -r "$VENV/.dlcast-req-rest"
echo "setup-venv: installed $(wc -l < "$REQ") requirements (torch without triton)"
cp "$REQ" "$STAMP"
