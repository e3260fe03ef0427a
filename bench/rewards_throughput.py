"""How many completions per second the reward and feedback functions score, per family.

Usage (from the repository root; single process, so the figure is per core):

    python -m bench.rewards_throughput [--rows-per-level 32] [--batch 64] [--repeats 3]

For every built-in family that runs offline it generates rows at every level, pairs each
row with four completions (the reference, garbage, the reference cut in half, and another
row's reference as a wrong answer), and scores them in GRPO-sized batches exactly as a
training step does: every reward function, then the feedback function. Each repeat uses a
fresh `Scorer`, so every completion is really verified once (the cache only removes the
repeats across signals, as in training). Prints `completions_per_s[<family>]: N`; the
target is at least 2,000 per family.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from curriculum.tasks import Row, Task, get_task, list_tasks
from rewards import Scorer, build_feedback_func, build_reward_funcs

GARBAGE = "Well, let me think step by step... the answer should be banana, probably."

# ----------------------------------------------------------------------------- families


def family_config(name: str, data_dir: Path) -> dict | None:
    """The offline config of a family; None for a family that cannot run offline here."""
    if name == "reasoning_gym":
        return {"dataset": "chain_sum"}
    if name == "dataset":
        try:
            import datasets
        except ImportError:
            return None
        records = [
            {"question": f"What is {a} * {b}?", "answer": str(a * b), "difficulty": d}
            for d in (1, 2, 3)
            for a in range(10 * d)
            for b in range(3)
        ]
        datasets.disable_progress_bars()
        datasets.Dataset.from_list(records).save_to_disk(str(data_dir / "bench_dataset"))
        return {"path": str(data_dir / "bench_dataset")}
    return {}


def load_task(name: str, data_dir: Path) -> Task | None:
    """The family's task, or None (with a printed note) when it cannot be loaded yet."""
    config = family_config(name, data_dir)
    if config is None:
        print(f"# {name}: skipped (needs the `datasets` package)")
        return None
    try:
        return get_task(name, **config)
    except ImportError as exc:
        print(f"# {name}: skipped ({type(exc).__name__}: {exc})")
        return None


def workload(task: Task, rows_per_level: int) -> tuple[list[Row], list[str]]:
    """Rows and a mix of valid and invalid completions for them, all levels together."""
    rows, completions = [], []
    for level in task.levels:
        level_rows = task.generate(level, rows_per_level, seed=1234)
        references = [task.reference(row) for row in level_rows]
        for i, row in enumerate(level_rows):
            reference = references[i]
            wrong = references[(i + 1) % len(references)]
            for completion in (reference, GARBAGE, reference[: len(reference) // 2], wrong):
                rows.append(row)
                completions.append(completion)
    return rows, completions


# ----------------------------------------------------------------------------- measuring


def score_all(task: Task, rows: list[Row], completions: list[str], batch: int) -> None:
    """Score everything once, batch by batch, as GRPOTrainer and ERLTrainer call it."""
    weights = {**dict.fromkeys(task.signals, 1.0), "length": 0.1}
    scorer = Scorer(task)
    reward_funcs, _ = build_reward_funcs(task, weights, scorer=scorer)
    feedback_func = build_feedback_func(task, weights, scorer=scorer)
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        kwargs = {
            "prompts": [row["prompt"] for row in chunk],
            "completions": [
                [{"role": "assistant", "content": c}] for c in completions[start : start + batch]
            ],
            **{name: [row[name] for row in chunk] for name in ("task", "level", "answer", "meta")},
        }
        for func in reward_funcs:
            func(**kwargs)
        feedback_func(**kwargs)


def completions_per_second(task: Task, rows_per_level: int, batch: int, repeats: int) -> float:
    """The best of `repeats` timed passes over the family's workload."""
    rows, completions = workload(task, rows_per_level)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        score_all(task, rows, completions, batch)
        best = min(best, time.perf_counter() - start)
    return len(rows) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows-per-level", type=int, default=32)
    parser.add_argument("--batch", type=int, default=64, help="completions per reward call")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in list_tasks():
            task = load_task(name, Path(tmp))
            if task is not None:
                rate = completions_per_second(task, args.rows_per_level, args.batch, args.repeats)
                print(f"completions_per_s[{name}]: {rate:,.0f}", flush=True)


if __name__ == "__main__":
    main()
