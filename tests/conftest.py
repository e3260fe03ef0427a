"""Shared fixtures: the offline tiny model and small arithmetic datasets."""

from __future__ import annotations

import pytest

from rewards import completion_text


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """The project's tiny Llama model + tokenizer, built once per test session."""
    from pipeline.models.tiny import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture
def arithmetic_dataset():
    """32 level-1 arithmetic rows (conversational prompts + answer/meta columns)."""
    from datasets import Dataset

    from curriculum.tasks import get_task

    return Dataset.from_list(get_task("arithmetic").generate(1, 32, seed=0))


def pytest_collection_modifyitems(config, items):
    """Skip `gpu` tests on machines without CUDA."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def erl_args(tmp_path):
    """A factory of small CPU ERLConfigs: `erl_args(reward_threshold=2.0, ...)`; with
    `config_cls=GRPOConfig`, the base trainer's config from the same settings."""

    def make(config_cls=None, **overrides):
        from pipeline import ERLConfig

        settings = dict(
            output_dir=str(tmp_path / "out"),
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=12,
            reflection_max_completion_length=12,
            max_steps=2,
            learning_rate=1e-3,
            bf16=False,
            use_cpu=True,
            report_to=[],
            logging_steps=1,
            save_strategy="no",
            seed=0,
        )
        config_cls = config_cls or ERLConfig
        if config_cls is not ERLConfig:
            del settings["reflection_max_completion_length"]  # ERL's own option
        settings.update(overrides)
        return config_cls(**settings)

    return make


def length_reward(completions, **kwargs) -> list[float]:
    """A reward that varies between completions, so GRPO has a gradient to follow."""
    return [(len(completion_text(c)) % 4) / 3 for c in completions]


def alternating_reward():
    """y1 calls score 0 and y2 calls score 1: with every row gated, every retry succeeds."""
    calls = []

    def reward(prompts, completions, answer, **kwargs):
        calls.append(
            {"prompts": list(prompts), "answer": list(answer), "completions": list(completions)}
        )
        value = 0.0 if len(calls) % 2 == 1 else 1.0
        return [value] * len(completions)

    return reward, calls


def first_generation_batch(trainer):
    """One training generation batch and what ERLTrainer makes of it (GRPO's rows + ERL's)."""
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.train()
    return batch, trainer._generate_and_score_completions(batch)
