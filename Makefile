# Every entry point sets itself up: a fresh machine needs only Rust, Python 3
# and network access to crates.io and PyPI.
VENV ?= .venv
PY := $(abspath $(VENV))/bin/python
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(VIRTUAL_ENV)/bin:$(PATH)
export PYO3_PYTHON := $(PY)
# Keep test runs deterministic and quiet on a 2-core machine.
export JAX_PLATFORMS ?= cpu
export CARGO_TERM_COLOR ?= never

.PHONY: all venv ext test lint doc guide rust-test free-threaded abi3-check abi3 py-test typecheck demo demo-ext bench fuzz sanitize torch-versions clean

all: test

venv:
	bash scripts/setup-venv.sh

# The PyO3 test extension, built once into the virtualenv, and a second
# extension built separately (the cross-module borrow tests), one built
# with rust-numpy instead (tests/python/test_rust_numpy.py), and the
# README's quick start (tests/python/test_quickstart.py, test_guide.py).
ext: venv
	maturin develop -q -m tests/Cargo.toml
	maturin develop -q -m tests/second/Cargo.toml
	maturin develop -q -m tests/rnp/Cargo.toml
	maturin develop -q -m examples/quickstart/Cargo.toml

## scripts/structure.py: no function over 80 lines and no import circle
## between files in the two published crates.
lint: venv
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(PY) scripts/structure.py

## The API documentation of the two published crates as docs.rs builds it
## (every feature), warnings (broken or private intra-doc links) as
## errors. Their doc examples and every Rust block of the README (the
## runtime's crate documentation) and of the guide (guide/src, a doctest
## module per chapter) run in rust-test.
doc:
	RUSTDOCFLAGS="-D warnings" cargo doc -q --no-deps -p dlcast-macros -p dlcast-runtime --all-features

## The guide as a book (guide/, mdBook) in target/guide/index.html. Not part
## of `make test`: its blocks are checked there already (rust-test, and
## tests/python/test_guide.py). mdBook, a crates.io binary, is installed
## into target/tools on first use (a few minutes' build; no server or
## watcher features, which `mdbook build` does not use).
MDBOOK_VERSION := 0.5.4
MDBOOK := target/tools/bin/mdbook
guide:
	@$(MDBOOK) --version 2>/dev/null | grep -qF "v$(MDBOOK_VERSION)" || \
		cargo install mdbook --locked --version $(MDBOOK_VERSION) --no-default-features --features search \
			--root $(abspath target/tools)
	$(MDBOOK) build guide
	@echo "the guide: target/guide/index.html"

rust-test:
	cargo test --workspace

## The runtime and both test extensions type-check against a free-threaded
## CPython (3.14t, Py_GIL_DISABLED) through a PyO3 config file: there,
## #[dlpack_fn] functions refuse to run unless the GIL is on (guide,
## Safety). A target dir of its own, kept between runs.
free-threaded:
	PYO3_CONFIG_FILE=$(abspath scripts/pyo3-free-threaded.cfg) CARGO_TARGET_DIR=target/free-threaded \
		cargo check -q -p dlcast-runtime -p dlcast-testext -p dlcast-second

## Every abi3 level PyO3 0.30 offers: the runtime and the test extension
## type-check at each (guide, Supported versions), against a CPython 3.15
## config file so that no interpreter of each version is needed. One target
## dir for all levels, kept between runs (each level is cached apart).
ABI3_LEVELS := abi3-py39 abi3-py310 abi3-py311 abi3-py312 abi3-py313 abi3-py314 abi3-py315 abi3
abi3-check:
	@for level in $(ABI3_LEVELS); do \
		echo "cargo check --features pyo3/$$level"; \
		PYO3_CONFIG_FILE=$(abspath scripts/pyo3-cpython315.cfg) CARGO_TARGET_DIR=target/abi3-check \
			cargo check -q -p dlcast-runtime -p dlcast-testext --features pyo3/$$level || exit 1; \
	done

## The test extension built for the lowest abi3 level (abi3-py39), where
## dlcast takes its fallbacks for what the limited API lacks, into a target
## dir of its own (kept between runs) and target/abi3/site, not the
## virtualenv; then the pytest files below against it (PYTHONPATH puts it
## first; the other test modules come from `make ext`).
ABI3_LOWEST := abi3-py39
## Not the whole suite again: the files that exercise the runtime's code that
## differs by abi3 level (each `cfg(Py_LIMITED_API)` / `cfg(Py_3_x)` branch;
## test_abi3.py's ABI3_BRANCHES maps each branch to its files and checks
## this list against it), the soundness files whose fallbacks differ there,
## and, of the leak tests, the buffer import's.
ABI3_PYTEST_FILES := test_abi3 test_exports test_export_constructions test_ownership \
	test_frameworks test_producers test_gpu_streams test_exchange_api test_torch_paths \
	test_torch_tensors test_torch_modes test_fast_paths test_replaced_attributes test_conversions \
	test_torch_trusts_c_state test_registry_is_one test_copies_respect_borrows test_leaks \
	test_rust_numpy
ABI3_PYTEST_ARGS ?= -k "not test_leaks or test_import_path_does_not_leak and buffer"
abi3: ext abi3-check
	rm -rf target/abi3/wheels target/abi3/site
	CARGO_TARGET_DIR=target/abi3 maturin build -q --profile dev -m tests/Cargo.toml \
		-F pyo3/$(ABI3_LOWEST) -i $(PY) --out target/abi3/wheels
	$(PY) -m pip install -q --no-deps --no-index --target target/abi3/site target/abi3/wheels/*.whl
	PYTHONPATH=$(abspath target/abi3/site) $(PY) -m pytest -q -p no:cacheprovider \
		$(patsubst %,tests/python/%.py,$(ABI3_PYTEST_FILES)) $(ABI3_PYTEST_ARGS)

## The pytest suite, then every PyTorch test (every test whose id names
## torch) again with PyTorch's direct read off (DLCAST_TORCH_DIRECT=off:
## the general path alone).
py-test: ext
	$(PY) -m pytest tests/python -q
	DLCAST_TORCH_DIRECT=off $(PY) -m pytest tests/python -q -k torch

## The stubs of the test extension (dlcast-stubgen) and of the inline-module
## extension tests/inspect (maturin generate-stubs and dlcast-stubgen), each
## under `mypy --strict` with a typed caller and a file of calls it must
## refuse (tests/typing/).
typecheck: ext
	maturin develop -q -m tests/inspect/Cargo.toml
	$(PY) tests/typing/check.py

## Run every test: formatting, clippy, the API documentation, Rust
## unit/property tests and doc examples (the README's and the guide's included), ui-tests,
## the free-threaded and abi3 type checks, the pytest suite against NumPy,
## PyTorch, JAX and array-api-strict (also against an abi3-py39 build), and
## the generated stubs under mypy --strict.
test: venv lint doc rust-test free-threaded abi3 py-test typecheck

demo-ext: venv
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q --no-cache-dir "matplotlib>=3.8"
	maturin develop -q --release -m examples/demo/Cargo.toml

## The demo on a real photo (examples/demo).
demo: demo-ext
	$(PY) examples/demo/demo.py

## Call-overhead benchmark against rust-numpy, dlpark, nanobind and a
## hand-written sound limit (bench/): builds its own modules, counts
## instructions per call under callgrind (bench/callgrind.md and .json; needs
## valgrind), times every case, and writes BENCHMARKS.md (both side by side)
## and bench/bench.png. Not part of `make test` or CI.
bench: venv
	bash bench/build.sh && $(PY) bench/callgrind.py --table && $(PY) bench/run.py

## The property test of generated capsule descriptions (tests/python/
## test_capsules.py) with DLCAST_FUZZ_EXAMPLES cases (default 200,000;
## `make test` runs 5,000). Not part of `make test`.
DLCAST_FUZZ_EXAMPLES ?= 200000
fuzz: ext
	DLCAST_HYPOTHESIS_EXAMPLES=$(DLCAST_FUZZ_EXAMPLES) $(PY) -m pytest tests/python/test_capsules.py \
		-q -s -p no:cacheprovider -k generated_capsules

## The NumPy, capsule, buffer, PyTorch-soundness and borrow tests under valgrind memcheck with
## PYTHONMALLOC=malloc (scripts/sanitize.py): prints the number of errors
## whose stacks include dlcast code, and fails if there is one. Needs
## valgrind. DLCAST_SANITIZE_FILES="tests/python/x.py ..." picks other
## NumPy-only test files. Not part of `make test`.
sanitize: ext
	$(PY) scripts/sanitize.py

## The PyTorch tests (every tests/python file that imports torch, CI=true)
## under each other PyTorch release listed in scripts/torch-versions.txt,
## each in a virtualenv of its own, target/torch-versions/<version>, that
## sees the project's packages (scripts/torch-versions.sh; a release whose
## CUDA pins differ brings its own CUDA wheels: about 4 GB each). Not part
## of `make test`.
torch-versions: ext
	bash scripts/torch-versions.sh

clean:
	cargo clean
	rm -rf $(VENV) out
