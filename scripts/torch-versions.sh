#!/usr/bin/env bash
# Runs the project's PyTorch tests under each PyTorch release listed in
# scripts/torch-versions.txt (or the versions given as arguments), each in a
# virtualenv of its own: target/torch-versions/<version>/.
#
# Such a virtualenv holds only that release of torch (installed --no-deps)
# and whichever of its requirements the project's virtualenv does not
# satisfy; everything else (pytest, NumPy, the other frameworks, the test
# extensions built by `make ext`, which do not link torch) comes from the
# project's virtualenv through a .pth file. A .pth entry is appended to
# sys.path, after the virtualenv's own site-packages, so its torch shadows
# the project's. PyTorch's `triton` is left out, as in setup-venv.sh.
#
# The test files are every tests/python/test_*.py that imports torch, run
# with CI=true (no framework test may skip). Prints one line per release
# and fails if any release failed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
LIST=scripts/torch-versions.txt
ROOT=target/torch-versions

if [ "$#" -gt 0 ]; then
  versions=("$@")
else
  mapfile -t versions < <(grep -vE '^\s*(#|$)' "$LIST" | tr -d '[:space:]')
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "torch-versions: no $VENV; run 'make venv ext' first" >&2
  exit 2
fi

# Every site-packages directory the project's interpreter sees (its own and
# any a .pth of it adds, e.g. a worktree's thin venv over a main one).
mapfile -t project_sites < <("$VENV/bin/python" - <<'PY'
import sys
for p in sys.path:
    if p.endswith("site-packages"):
        print(p)
PY
)
mapfile -t test_files < <(grep -lE '^\s*import torch\b|importorskip\(["'"'"']torch["'"'"']\)' \
  tests/python/test_*.py)

pip_in() {  # pip_in <venv> <pip args...>: the project's pip, acting on <venv>
  local venv=$1
  shift
  "$VENV/bin/python" -m pip --python "$venv/bin/python" "$@"
}

make_env() {  # make_env <version> <dir>
  local version=$1 dir=$2
  local stamp="$dir/.dlcast-torch-stamp"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version" ]; then
    return 0
  fi
  rm -rf "$dir"
  "$VENV/bin/python" -m venv --without-pip "$dir"
  local site
  site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # site.addsitedir also runs the .pth files of those directories.
  {
    echo "# The project's packages, after this virtualenv's own (torch $version)."
    for p in "${project_sites[@]}"; do
      echo "import site; site.addsitedir('$(realpath "$p")')"
    done
  } > "$site/dlcast-project.pth"
  echo "torch-versions: installing torch==$version into $dir"
  pip_in "$dir" install -q --no-cache-dir --no-deps "torch==$version"
  # The release's requirements the project's packages do not satisfy, each
  # installed as written (a CUDA pin that differs brings that CUDA stack).
  local missing
  mapfile -t missing < <("$dir/bin/python" - <<'PY'
from importlib.metadata import PackageNotFoundError, requires, version
from packaging.requirements import Requirement

for line in requires("torch") or []:
    req = Requirement(line)
    if req.name == "triton":
        continue  # only torch.compile imports it (setup-venv.sh)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    try:
        have = version(req.name)
    except PackageNotFoundError:
        have = None
    if have is None or not req.specifier.contains(have, prereleases=True):
        print(req)
PY
)
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "torch-versions: torch $version needs, unlike the project's venv: ${missing[*]}"
    pip_in "$dir" install -q --no-cache-dir "${missing[@]}" 2> >(grep -v \
      -e 'requires triton' -e 'resolver does not currently take into account' \
      -e 'outside environment' >&2)
  fi
  local got
  got=$("$dir/bin/python" -c 'import torch; print(torch.__version__)')
  case "$got" in
    "$version" | "$version"+*) ;;
    *)
      echo "torch-versions: $dir imports torch $got, not $version" >&2
      return 1
      ;;
  esac
  echo "$version" > "$stamp"
}

declare -a results
status=0
for version in "${versions[@]}"; do
  dir="$ROOT/$version"
  if ! make_env "$version" "$dir"; then
    results+=("torch $version: FAILED to set up $dir")
    status=1
    continue
  fi
  echo "torch-versions: torch $("$dir/bin/python" -c 'import torch; print(torch.__version__)')," \
    "${#test_files[@]} test files"
  if CI=true "$dir/bin/python" -m pytest -q -p no:cacheprovider "${test_files[@]}"; then
    results+=("torch $version: passed")
  else
    results+=("torch $version: FAILED")
    status=1
  fi
done
printf '%s\n' "${results[@]}"
exit $status
