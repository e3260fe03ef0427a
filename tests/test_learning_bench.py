"""bench/learning.py: every arm of a comparison trains on one schedule and optimizer, and a
run's cache key changes with anything its result depends on (issue 18)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

learning = pytest.importorskip("learning")  # imports learning_arms (the backend) first
arms = sys.modules["learning_arms"]
report = sys.modules["learning_report"]

PRESETS = [["--task", "hidden_rule"], ["--task", "arithmetic"], ["--stop", "erl=10"]]


def lr_sequence(args, steps: int) -> list[float]:
    """The learning rates Trainer's own optimizer and scheduler give over `steps` steps."""
    import torch
    from transformers import Trainer, get_scheduler

    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    optimizer = cls([torch.nn.Parameter(torch.zeros(1))], **kwargs)
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=args.get_warmup_steps(args.max_steps),
        num_training_steps=args.max_steps,
        scheduler_specific_kwargs=args.lr_scheduler_kwargs or {},
    )
    out = []
    for _ in range(steps):
        out.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return out


@pytest.mark.parametrize("options", PRESETS, ids=["hidden_rule", "arithmetic", "stopped"])
def test_every_arm_gets_the_same_schedule_and_optimizer(options):
    """The defect this guards against: GRPO ran max_steps 300 and ERL 100 on transformers'
    default linear decay, so ERL's learning rate was 0 at step 100 and GRPO's 2/3 of peak."""
    from transformers import Trainer

    _, s = learning.parse_options(options)
    configs = {name: arms.arm_config(name, s, "unused", 0) for name in arms.ALL_ARMS}
    reference = configs["grpo"]
    assert reference.max_steps == s.steps  # the horizon is --steps for every arm
    for name, config in configs.items():
        for field in arms.SCHEDULE_FIELDS:
            assert getattr(config, field) == getattr(reference, field), (name, field)
        assert Trainer.get_optimizer_cls_and_kwargs(config) == (
            Trainer.get_optimizer_cls_and_kwargs(reference)
        ), name
        assert lr_sequence(config, s.steps) == lr_sequence(reference, s.steps), name
    # A stopped arm is cut off on the shared schedule, not given a shorter one.
    assert s.stop_at("erl") == (10 if "--stop" in options else s.steps)


def test_the_trainers_build_the_same_scheduler(tiny_model_dir, arithmetic_dataset):
    """The real trainers (ERLTrainer for grpo and erl, TRL's SDPOTrainer): their own
    create_optimizer_and_scheduler gives the same learning rates, step for step."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, s = learning.parse_options(
        ["--steps", "12", "--lr_warmup_steps", "3", "--lr_scheduler", "linear"]
    )
    task = arms.make_task(s)
    reward_funcs, weights, feedback = arms.make_funcs(task, s)
    rows = Dataset.from_list(arms.train_rows(task, s, 0))
    sequences = {}
    for name in ("grpo", "grpo_matched", "erl", "sdpo"):
        args = arms.arm_config(name, s, "unused", 0, reward_weights=weights)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        if arms.ALL_ARMS[name].trainer == "sdpo":
            trainer = arms.counting_sdpo()(
                model=model, args=args, train_dataset=rows, reward_funcs=reward_funcs,
                processing_class=tokenizer,
            )  # fmt: skip
        else:
            trainer = arms.CountingERL(
                model=model, args=args, train_dataset=rows, reward_funcs=reward_funcs,
                feedback_func=feedback, processing_class=tokenizer,
            )  # fmt: skip
        trainer.create_optimizer_and_scheduler(num_training_steps=args.max_steps)
        lrs = []
        for _ in range(args.max_steps):
            lrs.append(trainer.lr_scheduler.get_last_lr()[0])
            trainer.optimizer.step()
            trainer.lr_scheduler.step()
        sequences[name] = (type(trainer.optimizer).__name__, trainer.optimizer.defaults, lrs)
    assert sequences["grpo"][2][:4] == pytest.approx([0.0, s.lr / 3, 2 * s.lr / 3, s.lr])
    for name, sequence in sequences.items():
        assert sequence == sequences["grpo"], name


def test_the_run_key_changes_with_what_decides_a_result(monkeypatch):
    _, s = learning.parse_options([])
    task = arms.make_task(s)
    rows = arms.train_rows(task, s, 0)

    def key(name="erl", settings=s, seed=0, warm="w", data=rows, extra=None):
        config = arms.arm_config(name, settings, "unused", seed)
        return arms.run_key(name, seed, settings, warm, config, data, extra)

    base = key()
    assert key() == base  # deterministic, whatever the output folder
    assert arms.run_key("erl", 0, s, "w", arms.arm_config("erl", s, "elsewhere", 0), rows) == base
    changed = {
        "schedule": key(settings=dataclasses.replace(s, lr_scheduler="linear")),
        "another arm's stop": key(settings=dataclasses.replace(s, stop="erl=5")),
        "seed": key(seed=1),
        "warm checkpoint": key(warm="v"),
        "rows": key(data=rows[1:]),
        "extra": key(extra={"contexts": {"1#2": "x"}}),
    }
    monkeypatch.setattr(arms, "REFLECTION_TEMPLATE", arms.REFLECTION_TEMPLATE + " ")
    changed["template"] = key()
    monkeypatch.undo()
    monkeypatch.setitem(arms.ALL_ARMS, "erl", arms.arm(train_retries=False))
    changed["the arm's overrides"] = key()
    monkeypatch.undo()
    monkeypatch.setitem(arms.REWARDS, s.reward, {"correctness": 0.5, "format": 0.5})
    changed["reward spec"] = key()
    monkeypatch.undo()
    monkeypatch.setattr(arms, "BENCH_SCHEMA", arms.BENCH_SCHEMA + 1)
    changed["schema"] = key()
    monkeypatch.undo()
    for what, value in changed.items():
        assert value != base, what
    # The unrelated stop of another arm leaves this arm's key alone.
    assert key(name="grpo", settings=dataclasses.replace(s, stop="erl=5")) == key(name="grpo")


def test_the_gap_rule_is_two_sd_of_the_paired_differences():
    wins = report.paired([30, 32, 28, 31, 29], [10, 11, 9, 12, 10])
    assert wins["diffs"] == [20, 21, 19, 19, 19] and wins["exceeds"]
    noisy = report.paired([30, 10, 28, 12, 29], [10, 11, 9, 12, 10])
    assert noisy["mean"] > 0 and not noisy["exceeds"]
    assert not report.paired([10, 10], [20, 20])["exceeds"]  # the arm was slower
