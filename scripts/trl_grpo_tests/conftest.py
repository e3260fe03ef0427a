"""Harness: TRL's own tests/test_grpo_trainer.py run against ERLTrainer (see run.sh).

    HARNESS_TRAINER=erl   (default) the test module's GRPOTrainer and GRPOConfig become
                          ERLTrainer and an ERLConfig whose reward_threshold (1e9) gates
                          every first attempt, with reflections_per_group 0: every row
                          reflects and retries with its own reflection. So ERL's
                          reflection and retry generate calls have the batch size of
                          GRPO's, which the tests that fake `model.generate` by batch size
                          (TRL's tool tests) serve; with one reflection per group the
                          reflection call has fewer rows and their fake returns the wrong
                          number. (Before issue 41 this mode ran at ERLConfig's default, 1.)
                          For the same reason a test that fakes `model.generate` gets one
                          generate call a phase, as GRPO makes (peak_memory_factor 1e6):
                          ERL's memory budget would otherwise split the stand-ins' calls
                          (151k-token vocabulary) into single rows.
    HARNESS_TRAINER=erl_closed   the same with the gate closed (reward_threshold -1e9): no
                          row reflects, so ERLTrainer must give GRPOTrainer's results.
    HARNESS_TRAINER=grpo  TRL's GRPOTrainer itself on the same stand-ins (the baseline).
    ERL_BACKEND=transformers|unsloth   the backend (unsloth on a CPU: with
                          ERL_UNSLOTH_CPU_TRAINER=1)

Hub ids resolve to local stand-ins (standins.py: tiny random models; the Qwen ones carry
Qwen's real tokenizer and TRL's own Qwen2.5/Qwen3 chat templates, so the token ids TRL's
tool tests hard-code and its tool-call parsing hold) because the working directory becomes
the stand-ins' folder; the zen dataset is served from its zen.json in place of
`datasets.load_dataset`. Nothing of TRL's test code is changed but its imports of the
hub: the comparison is the test's own assertions, on ERLTrainer.

TRL's tool and environment tests are skipped where jmespath is missing; the harness
refuses to run without it (it is in the dev extras), so that none is silently skipped.

Without a CUDA GPU, every config of every mode (the baseline's too) defaults to
`use_cpu=True`: TRL's tests leave `bf16` at its default True, which TrainingArguments
refuses on a CPU unless CPU training is asked for.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
from pathlib import Path

import pytest
import torch

from pipeline.models.backend import activate_backend  # before trl

activate_backend(os.environ.get("ERL_BACKEND", "transformers"))

from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from pipeline import ERLConfig, ERLTrainer  # noqa: E402

STANDINS = Path(os.environ["HARNESS_STANDINS"])
HARNESS = os.environ.get("HARNESS_TRAINER", "erl")
if HARNESS not in ("erl", "erl_closed", "grpo"):
    raise ValueError(f"HARNESS_TRAINER must be erl, erl_closed or grpo, got {HARNESS!r}")
if importlib.util.find_spec("jmespath") is None:
    raise RuntimeError("TRL's tool tests would be skipped: pip install jmespath (a dev extra)")
THRESHOLD = -1e9 if HARNESS == "erl_closed" else 1e9
CPU = not torch.cuda.is_available()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.chdir(STANDINS)  # "trl-internal-testing/<name>" now names a local folder
ZEN = json.loads((STANDINS / "zen.json").read_text())


class GatedConfig(ERLConfig):
    """ERLConfig whose threshold gates every row (the tests' rewards are far below 1e9), each
    reflecting for itself, or, with erl_closed, none (far above -1e9)."""

    fakes_generate = False  # set per test by `_harness`

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("reward_threshold", THRESHOLD)
        kwargs.setdefault("reflections_per_group", 0)
        if GatedConfig.fakes_generate:
            kwargs.setdefault("peak_memory_factor", 1e6)
        if CPU:
            kwargs.setdefault("use_cpu", True)
        super().__init__(*args, **kwargs)


class CPUConfig(GRPOConfig):
    """GRPOConfig defaulting to use_cpu=True (the baseline's, on a CPU)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("use_cpu", True)
        super().__init__(*args, **kwargs)


def default_args(model, config):
    """The config GRPOTrainer builds when given none, of class `config`."""
    name = model if isinstance(model, str) else model.config._name_or_path
    return config(output_dir=f"{str(name).rstrip('/').split('/')[-1]}-GRPO")


class CPUGRPOTrainer(GRPOTrainer):
    """GRPOTrainer whose default config is a CPUConfig."""

    def __init__(self, model, reward_funcs=None, args=None, *positional, **kwargs):
        args = default_args(model, CPUConfig) if args is None else args
        super().__init__(model, reward_funcs, args, *positional, **kwargs)


class GatedERLTrainer(ERLTrainer):
    """ERLTrainer that, like GRPOTrainer, builds its default config when given none."""

    def __init__(self, model, reward_funcs=None, args=None, *positional, **kwargs):
        args = default_args(model, GatedConfig) if args is None else args
        super().__init__(model, reward_funcs, args, *positional, **kwargs)


def local_zen(path, name=None, split=None, streaming=False, **kwargs):
    """`datasets.load_dataset` for trl-internal-testing/zen, from the stand-ins' zen.json."""
    from datasets import Dataset, DatasetDict, IterableDatasetDict

    if path != "trl-internal-testing/zen" or name not in ZEN:
        raise FileNotFoundError(f"no local stand-in for dataset {path!r} config {name!r}")
    rows = ZEN[name]
    splits = {"train": Dataset.from_list(rows[:17]), "test": Dataset.from_list(rows[17:])}
    if streaming:
        splits = {k: v.to_iterable_dataset() for k, v in splits.items()}
    if split is not None:
        return splits[split]
    return IterableDatasetDict(splits) if streaming else DatasetDict(splits)


@pytest.fixture(autouse=True)
def _harness(request, monkeypatch):
    module = request.module
    if hasattr(module, "load_dataset"):
        monkeypatch.setattr(module, "load_dataset", local_zen)
    if HARNESS != "grpo" and hasattr(module, "GRPOTrainer"):
        monkeypatch.setattr(module, "GRPOTrainer", GatedERLTrainer)
        monkeypatch.setattr(module, "GRPOConfig", GatedConfig)
        source = inspect.getsource(request.function)
        monkeypatch.setattr(GatedConfig, "fakes_generate", '"generate", side_effect' in source)
    elif CPU and hasattr(module, "GRPOTrainer"):
        monkeypatch.setattr(module, "GRPOTrainer", CPUGRPOTrainer)
        monkeypatch.setattr(module, "GRPOConfig", CPUConfig)
