"""Harness: TRL's own tests/test_grpo_trainer.py run against ERLTrainer (see run.sh).

    HARNESS_TRAINER=erl   (default) the test module's GRPOTrainer and GRPOConfig become
                          ERLTrainer and an ERLConfig whose reward_threshold (1e9) gates
                          every first attempt: every row reflects and retries.
    HARNESS_TRAINER=erl_closed   the same with the gate closed (reward_threshold -1e9): no
                          row reflects, so ERLTrainer must give GRPOTrainer's results.
    HARNESS_TRAINER=grpo  TRL's GRPOTrainer itself on the same stand-ins (the baseline).
    ERL_BACKEND=transformers|unsloth   the backend (unsloth on a CPU: with
                          ERL_UNSLOTH_CPU_TRAINER=1)

Hub ids resolve to local stand-ins (standins.py) because the working directory becomes
the stand-ins' folder; the zen dataset is served from its zen.json in place of
`datasets.load_dataset`. Nothing of TRL's test code is changed but its imports of the
hub: the comparison is the test's own assertions, on ERLTrainer.

Without a CUDA GPU, every config of every mode (the baseline's too) defaults to
`use_cpu=True`: TRL's tests leave `bf16` at its default True, which TrainingArguments
refuses on a CPU unless CPU training is asked for.
"""

from __future__ import annotations

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
THRESHOLD = -1e9 if HARNESS == "erl_closed" else 1e9
CPU = not torch.cuda.is_available()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.chdir(STANDINS)  # "trl-internal-testing/<name>" now names a local folder
ZEN = json.loads((STANDINS / "zen.json").read_text())


class GatedConfig(ERLConfig):
    """ERLConfig whose threshold gates every row (the tests' rewards are far below 1e9), or,
    with erl_closed, none (far above -1e9)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("reward_threshold", THRESHOLD)
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
    elif CPU and hasattr(module, "GRPOTrainer"):
        monkeypatch.setattr(module, "GRPOTrainer", CPUGRPOTrainer)
        monkeypatch.setattr(module, "GRPOConfig", CPUConfig)
