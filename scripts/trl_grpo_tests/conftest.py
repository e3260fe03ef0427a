"""Harness: TRL's own tests/test_grpo_trainer.py run against ERLTrainer (see run.sh).

    HARNESS_TRAINER=erl   (default) the test module's GRPOTrainer and GRPOConfig become
                          ERLTrainer and an ERLConfig whose reward_threshold (1e9) gates
                          every first attempt: every row reflects and retries.
    HARNESS_TRAINER=grpo  TRL's GRPOTrainer itself on the same stand-ins (the baseline).
    ERL_BACKEND=transformers|unsloth   the backend (unsloth on a CPU: with
                          ERL_UNSLOTH_CPU_TRAINER=1)

Hub ids resolve to local stand-ins (standins.py) because the working directory becomes
the stand-ins' folder; the zen dataset is served from its zen.json in place of
`datasets.load_dataset`. Nothing of TRL's test code is changed but its imports of the
hub: the comparison is the test's own assertions, on ERLTrainer.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.models.backend import activate_backend  # before trl

activate_backend(os.environ.get("ERL_BACKEND", "transformers"))

from pipeline import ERLConfig, ERLTrainer  # noqa: E402

STANDINS = Path(os.environ["HARNESS_STANDINS"])
HARNESS = os.environ.get("HARNESS_TRAINER", "erl")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.chdir(STANDINS)  # "trl-internal-testing/<name>" now names a local folder
ZEN = json.loads((STANDINS / "zen.json").read_text())


class GatedConfig(ERLConfig):
    """ERLConfig whose threshold gates every row (the tests' rewards are far below 1e9)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("reward_threshold", 1e9)
        super().__init__(*args, **kwargs)


class GatedERLTrainer(ERLTrainer):
    """ERLTrainer that, like GRPOTrainer, builds its default config when given none."""

    def __init__(self, model, reward_funcs=None, args=None, *positional, **kwargs):
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = GatedConfig(output_dir=f"{str(name).rstrip('/').split('/')[-1]}-GRPO")
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
    if HARNESS == "erl" and hasattr(module, "GRPOTrainer"):
        monkeypatch.setattr(module, "GRPOTrainer", GatedERLTrainer)
        monkeypatch.setattr(module, "GRPOConfig", GatedConfig)
