#!/usr/bin/env bash
# Creates (or reuses) the project's virtualenv with every framework the tests
# drive. Idempotent: a stamp file records the requirement set it installed.
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
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -r "$REQ"
cp "$REQ" "$STAMP"
