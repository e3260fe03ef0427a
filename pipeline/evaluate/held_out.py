"""Which prompts a run trained on, so that its evaluation holds them out.

A curriculum run draws every stage's prompts deterministically: stage k at level L takes
`stage_rows(task, L, prompts_per_stage, stage_seed(seed, k), ...)`, its own level and
replayed easier ones. So the prompts a run trained on at a level can be drawn again from
the state file (which stage ran which level) and the run's options, without storing them:

    trained = trained_prompts(task, level, [(1, 1), (2, 2)], prompts_per_stage=4096,
                              seed=0, replay_fraction=0.3, start_level=1)
    rows, overlap = held_out_rows(task, level, 64, held_out_seed(level), trained)

Evaluation seeds (from HELD_OUT_SEED_BASE) already keep evaluation draws apart from
training draws, and families with few problems per level split them (hidden_rule,
dataset). `held_out_rows` also skips any prompt the run trained on and draws another;
only where a level has too few distinct problems (arithmetic level 1: 100 sums) does it
keep trained ones, and it counts them, so that the stage line can say so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable

from curriculum.controller import replay_levels
from curriculum.tasks.base import Row, Task, prompt_key

STAGE_SEED_STRIDE = 10_000
"""Seed distance between stages of a run."""
LEVEL_SEED_STRIDE = 1_000
"""Seed distance between the levels of one stage (its own and the replayed ones)."""
REDRAWS = 20
"""How many times `n` candidates `held_out_rows` may draw to replace trained prompts."""


def stage_seed(base_seed: int, stage: int) -> int:
    """The seed of stage `stage`'s prompts in a run seeded `base_seed` (below 10**6)."""
    return base_seed + STAGE_SEED_STRIDE * stage


def stage_rows(
    task: Task, level: int, n: int, seed: int, replay_fraction: float, start_level: int
) -> list[Row]:
    """The `n` training rows of a stage at `level` drawn with `seed`: its level, plus
    replayed easier ones (`curriculum.controller.replay_levels`), sorted by level."""
    rows: list[Row] = []
    counts = Counter(replay_levels(level, n, replay_fraction, seed, start_level))
    for drawn, count in sorted(counts.items()):
        rows += task.generate(drawn, count, seed=seed + LEVEL_SEED_STRIDE * drawn)
    return rows


def trained_prompts(
    task: Task,
    level: int,
    stages: Iterable[tuple[int, int]],
    *,
    prompts_per_stage: int,
    seed: int,
    replay_fraction: float,
    start_level: int,
) -> set[str]:
    """The prompt keys of the rows at `level` that the run's `stages` ((stage, level) pairs,
    as its state file lists them) trained on."""
    keys: set[str] = set()
    for stage, stage_level in stages:
        if stage_level < level:  # a stage replays easier levels only
            continue
        seed_k = stage_seed(seed, stage)
        levels = replay_levels(stage_level, prompts_per_stage, replay_fraction, seed_k, start_level)
        count = levels.count(level)
        if count:  # only this level's part is drawn again, with the seed the stage used
            rows = task.generate(level, count, seed=seed_k + LEVEL_SEED_STRIDE * level)
            keys.update(prompt_key(row["prompt"]) for row in rows)
    return keys


def held_out_rows(
    task: Task, level: int, n: int, seed: int, trained: Collection[str] = ()
) -> tuple[list[Row], int]:
    """`n` evaluation rows drawn from `seed` on, none of whose prompts is in `trained`
    where the level has enough others; returns them and how many trained ones remain."""
    rows = task.generate(level, n, seed=seed)
    kept = [row for row in rows if prompt_key(row["prompt"]) not in trained]
    if len(kept) == n:
        return rows, 0
    # Row i of a family comes from Random(seed + i): the next seeds continue the draw.
    for redraw in range(1, REDRAWS):
        more = task.generate(level, n, seed=seed + redraw * n)
        kept += [row for row in more if prompt_key(row["prompt"]) not in trained]
        if len(kept) >= n:
            return kept[:n], 0
    # Too few distinct problems: the trained rows of the first draw fill the rest.
    overlap = [row for row in rows if prompt_key(row["prompt"]) in trained]
    return kept + overlap[: n - len(kept)], n - len(kept)
