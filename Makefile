# One command each: `make demo` and `make test` set themselves up from nothing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup codegen check lint types drift test test-emulated test-vllm bench bench-vllm demo clean

setup: $(STAMP)

# The CPU build of torch goes in first: a bare `torch` requirement would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

codegen: setup
	$(PY) -m codegen

drift: setup
	$(PY) -m codegen --check

lint: setup
	$(PY) -m ruff check engram codegen tests benchmarks scripts
	$(PY) -m ruff format --check engram codegen tests benchmarks scripts

types: setup
	$(PY) -m mypy

test: setup
	$(PY) -m pytest -q

# The CUDA kernels' own .cu files on the CPU, a loop over each grid, under AddressSanitizer (needs g++, not
# nvcc); part of `make test` too.
test-emulated: setup
	$(PY) -m pytest -q tests/test_emulated_kernels.py

check: lint types drift test

# The differential suite against the real vLLM 0.33.0, in a venv of its own (it pulls a CUDA torch of about
# 5 GB; vLLM's Engram code runs on the CPU). Opt-in: not part of `make test`.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q vllm==0.33.0
	$(VLLM_VENV)/bin/python -m pip install -q -e .   # engram beside it: its vllm.general_plugins entry point
	touch $(VLLM_STAMP)

test-vllm: setup $(VLLM_STAMP)
	ENGRAM_VLLM_PYTHON=$(VLLM_VENV)/bin/python $(PY) -m pytest -q tests/vllm

bench-vllm: setup $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python benchmarks/vllm_file_backed.py

bench: setup
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

demo: setup
	$(PY) -m engram demo

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
