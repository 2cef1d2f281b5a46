#!/usr/bin/env bash
# Builds the benchmark's extension modules into bench/target/py (and a
# second build of dlcast_bench with cargo's default profile, py-default):
#   dlcast_bench  (bench/rust: floor, dlcast, rust-numpy, dlpark functions)
#   nb_bench      (bench/nanobind: the same functions with nanobind)
# and bench/target/tvmffi (bench/tvmffi: the tvm-ffi peer, built by
# tvm-ffi's own tvm_ffi.cpp.load_inline with ninja and g++),
# and installs the bench-only Python packages (bench/requirements.txt) into
# the project venv. Idempotent: cargo rebuilds only what changed, g++ runs
# only when a source, a flag or the nanobind version changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-.venv}
PY="$ROOT/$VENV/bin/python"
[ -x "$PY" ] || { echo "bench/build.sh: no $PY (run: bash scripts/setup-venv.sh)" >&2; exit 1; }
OUT=bench/target
mkdir -p "$OUT/py" "$OUT/nanobind"

# --- bench-only Python packages ------------------------------------------
REQ=bench/requirements.txt
STAMP="$VENV/.dlcast-bench-req-stamp"
if ! { [ -f "$STAMP" ] && cmp -s "$REQ" "$STAMP"; }; then
  echo "bench: installing $(grep -v '^#' "$REQ" | xargs) into $VENV"
  "$PY" -m pip install -q --no-cache-dir -r "$REQ"
  cp "$REQ" "$STAMP"
fi

EXT_SUFFIX=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")

# --- Rust: one cdylib, no abi3, two profiles --------------------------------
# bench/target/py:          bench/rust/Cargo.toml's release profile (fat LTO,
#                           codegen-units 1): the main table.
# bench/target/py-default:  cargo's default release profile (no LTO,
#                           codegen-units 16), for the profile table.
echo "bench: cargo build --release (bench/rust: LTO fat, codegen-units 1)"
PYO3_PYTHON="$PY" CARGO_TARGET_DIR="$ROOT/$OUT" \
  cargo build --release --quiet --manifest-path bench/rust/Cargo.toml
install -m 755 "$OUT/release/libdlcast_bench.so" "$OUT/py/dlcast_bench$EXT_SUFFIX"
echo "bench: cargo build --release (bench/rust: cargo's default profile)"
mkdir -p "$OUT/py-default"
PYO3_PYTHON="$PY" CARGO_TARGET_DIR="$ROOT/$OUT/default-profile" \
  CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
  cargo build --release --quiet --manifest-path bench/rust/Cargo.toml
install -m 755 "$OUT/default-profile/release/libdlcast_bench.so" \
  "$OUT/py-default/dlcast_bench$EXT_SUFFIX"

# --- nanobind: nb_combined.cpp (libnanobind) + the module, system g++ -------
# As nanobind's own instructions for building without CMake (comment at the
# top of src/nb_combined.cpp): libnanobind at -O3 -fno-strict-aliasing, the
# bindings at -O2, -DNDEBUG -DNB_COMPACT_ASSERTIONS, hidden visibility;
# here the bindings at -O3 instead, since they hold the body tables' loops
# (nanobind's CMake build of a Release module uses -O3 too).
NB_DIR=$("$PY" -c "import nanobind, os; print(os.path.dirname(nanobind.__file__))")
NB_VER=$("$PY" -c "import nanobind; print(nanobind.__version__)")
PY_INC=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
CXX=${CXX:-g++}
command -v "$CXX" >/dev/null || { echo "bench/build.sh: no $CXX (apt-get install g++)" >&2; exit 1; }
CXXFLAGS="-std=c++17 -fPIC -fvisibility=hidden -DNDEBUG -DNB_COMPACT_ASSERTIONS \
-I$PY_INC -I$NB_DIR/include -I$NB_DIR/ext/robin_map/include"
LIB_FLAGS="-O3 -fno-strict-aliasing -ffunction-sections -fdata-sections"
MOD_FLAGS="-O3"
SIG="$($CXX --version | head -1) | nanobind $NB_VER | $CXXFLAGS | $LIB_FLAGS | $MOD_FLAGS"
NB_OBJ="$OUT/nanobind/libnanobind.o"
NB_SO="$OUT/py/nb_bench$EXT_SUFFIX"
SIG_FILE="$OUT/nanobind/build-signature"
if [ ! -f "$SIG_FILE" ] || [ "$(cat "$SIG_FILE")" != "$SIG" ]; then
  rm -f "$NB_OBJ" "$NB_SO"
fi
if [ ! -f "$NB_OBJ" ]; then
  echo "bench: $CXX libnanobind (nanobind $NB_VER, once)"
  $CXX "$NB_DIR/src/nb_combined.cpp" $CXXFLAGS $LIB_FLAGS -c -o "$NB_OBJ"
fi
if [ ! -f "$NB_SO" ] || [ bench/nanobind/nb_bench.cpp -nt "$NB_SO" ] || [ "$NB_OBJ" -nt "$NB_SO" ]; then
  echo "bench: $CXX nb_bench"
  $CXX bench/nanobind/nb_bench.cpp $CXXFLAGS $MOD_FLAGS -c -o "$OUT/nanobind/nb_bench.o"
  $CXX -shared -Wl,-s -Wl,--gc-sections "$OUT/nanobind/nb_bench.o" "$NB_OBJ" -o "$NB_SO"
fi
echo "$SIG" > "$SIG_FILE"

# --- tvm-ffi: bench/tvmffi/bench.cc through tvm_ffi.cpp.load_inline ---------
# tvm-ffi's inline build (its headers, `-std=c++17 -fPIC -O2` then ours,
# -O3 -DNDEBUG, linked against libtvm_ffi) with PyPI's ninja and $CXX;
# ninja recompiles only when the source or a flag changed.
echo "bench: tvm-ffi module (tvm_ffi.cpp.load_inline, $CXX)"
CXX="$CXX" "$PY" bench/tvmffi/tvmffi_bench.py
TVM_FFI_VER=$("$PY" -c "import tvm_ffi; print(tvm_ffi.__version__)")
# Build settings, for BENCHMARKS.md.
cat > "$OUT/build-info.txt" <<INFO
rustc: $(rustc --version)
cargo profile: release, opt-level 3, lto = "fat", codegen-units = 1, panic = "unwind" (bench/rust/Cargo.toml); the profile table also uses cargo's default release profile (lto = false, codegen-units = 16)
pyo3 features: extension-module, no abi3 (version-specific build for $("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])'), METH_FASTCALL)
c++: $($CXX --version | head -1)
nanobind: $NB_VER, libnanobind $LIB_FLAGS, module $MOD_FLAGS, -std=c++17 -fvisibility=hidden -DNDEBUG -DNB_COMPACT_ASSERTIONS, linked -shared -Wl,-s -Wl,--gc-sections
tvm-ffi: apache-tvm-ffi $TVM_FFI_VER, bench/tvmffi/bench.cc by tvm_ffi.cpp.load_inline (ninja, $CXX): -std=c++17 -fPIC -O2 then -O3 -DNDEBUG, linked -shared -ltvm_ffi
INFO
echo "bench: modules in $OUT/py"
