"""generations.jsonl as a curriculum run writes it: stages and run-global steps, samples
from different prompts, and the retries of a sampled batch (no model: the reward
functions are called the way GRPOTrainer and ERLTrainer call them)."""

from __future__ import annotations

import json

from transformers import TrainerState

from curriculum.tasks import get_task
from rewards import GenerationsLog, build_reward_funcs

WEIGHTS = {"correctness": 0.7, "format": 0.3}


def grpo_batch(rows, num_generations):
    """Each row repeated `num_generations` times in a row, as GRPO's sampler does."""
    return [row for row in rows for _ in range(num_generations)]


def call_all(funcs, rows, completions, step, attempt=None):
    columns = {name: [row[name] for row in rows] for name in ("task", "level", "answer", "meta")}
    columns["prompts"] = [row["prompt"] for row in rows]
    if attempt is not None:  # ERLTrainer scores retries with an `attempt` column
        columns["attempt"] = [attempt] * len(rows)
    for func in funcs:
        func(
            completions=completions,
            completion_ids=[[1]] * len(rows),
            trainer_state=TrainerState(global_step=step),
            **columns,
        )


def read(log: GenerationsLog) -> list[dict]:
    with open(log.path) as f:
        return [json.loads(line) for line in f]


def train_stage(funcs, task, steps, level=1):
    """First attempts every step, and retries of two rows after each (as ERL does)."""
    for step in range(steps):
        rows = grpo_batch(task.generate(level, 3, seed=100 * step), num_generations=4)
        call_all(funcs, rows, [f"<answer>{step}</answer>"] * len(rows), step)
        call_all(funcs, rows[:2] + rows[4:6], ["no tag"] * 4, step, attempt=2)


def test_records_carry_stage_and_run_global_step_and_retries(tmp_path):
    task = get_task("arithmetic")
    log = GenerationsLog(tmp_path, every=2)
    funcs, _ = build_reward_funcs(task, WEIGHTS, generations_log=log)
    log.start_stage(1, step_offset=0)
    train_stage(funcs, task, steps=4)
    log.start_stage(2, step_offset=4)  # stage 1 took 4 steps; global_step restarts at 0
    train_stage(funcs, task, steps=4, level=2)

    records = read(log)
    # Batches 0 and 2 of each stage, two first attempts and their two retries each.
    keys = [(r["stage"], r["step"], r["stage_step"], r["attempt"]) for r in records]
    expected = []
    for stage, offset in ((1, 0), (2, 4)):
        for stage_step in (0, 2):
            expected += [(stage, offset + stage_step, stage_step, a) for a in (1, 1, 2, 2)]
    assert keys == expected
    assert {r["level"] for r in records if r["stage"] == 2} == {2}
    retries = [r for r in records if r["attempt"] == 2]
    assert all(r["completion"] == "no tag" and r["failure"] == "parse_error" for r in retries)

    # The two samples of every batch come from different prompts.
    for i in range(0, len(records), 2):
        assert records[i]["prompt"] != records[i + 1]["prompt"], records[i : i + 2]


def test_samples_repeat_a_prompt_only_when_the_batch_has_one(tmp_path):
    log = GenerationsLog(tmp_path, samples=3)
    a, b = [{"role": "user", "content": "1+1"}], [{"role": "user", "content": "2+2"}]
    assert log.pick([a, a, a, a, b, b, b, b]) == [0, 4, 1]
    assert log.pick([a] * 4) == [0, 1, 2]


def test_a_resumed_stage_drops_the_records_it_writes_again(tmp_path):
    task = get_task("arithmetic")
    log = GenerationsLog(tmp_path, every=1)
    funcs, _ = build_reward_funcs(task, WEIGHTS, generations_log=log)
    log.start_stage(1, step_offset=0)
    train_stage(funcs, task, steps=3)
    log.start_stage(2, step_offset=3)
    train_stage(funcs, task, steps=4, level=2)
    with open(log.path, "a") as f:
        f.write('{"stage": 2, "step": 9, "tor')  # a line torn by a kill

    # A new process resumes stage 2 from its checkpoint at stage step 2.
    resumed = GenerationsLog(tmp_path, every=1)
    resumed.start_stage(2, step_offset=3, stage_step=2)
    kept = [(r["stage"], r["stage_step"]) for r in read(resumed)]
    assert kept == [(1, s) for s in (0, 1, 2) for _ in range(4)] + [
        (2, s) for s in (0, 1) for _ in range(4)
    ]
