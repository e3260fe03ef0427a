"""bench/copy_phase.py: the retries it trains on are held apart from those it evaluates,
the hint is what its mode says, and a short run prints every figure. Whether and when the
loss falls (the phase change) is a benchmark figure (docs/log.md), not a test."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import copy_phase  # noqa: E402


def _hint(row) -> str:
    return row["prompt"][-1]["content"].rpartition("\nHint: ")[2]


def test_copy_hints_are_the_answer_and_lookup_hints_the_whole_code():
    for row in copy_phase.retry_rows("copy", 20, seed=3):
        assert f"<answer>{_hint(row)}</answer>" == row["completion"][0]["content"]
    for row in copy_phase.retry_rows("lookup", 20, seed=3):
        hint = _hint(row)
        assert hint == row["code"] and len(re.findall(r"[A-Z]=\d", hint)) == 5
        code = dict(re.findall(r"([A-Z])=(\d)", hint))
        answer = re.findall(r"([A-Z])=(\d)", row["completion"][0]["content"])
        assert len(answer) == 3 and all(code[letter] == digit for letter, digit in answer)


def test_phase_change_step_is_the_halving_of_the_plateau_not_the_first_descent():
    # The run of docs/log.md, shortened: 2.1 at the start, 0.76 on the plateau, then the fall.
    losses = [(50, 2.1), (100, 0.9), (200, 0.76), (900, 0.73), (1000, 0.47), (1100, 0.369)]
    assert copy_phase.phase_change_step(losses, plateau_from=200) == 1100
    assert copy_phase.phase_change_step(losses[:5], plateau_from=200) is None
    assert copy_phase.phase_change_step(losses, plateau_from=5000) is None
    assert copy_phase.phase_change_step([], plateau_from=200) is None


def test_a_short_run_prints_every_figure_and_evaluates_unseen_codes(capsys):
    figures = copy_phase.main(
        ["--steps", "2", "--rows", "64", "--eval_n", "4", "--batch", "8", "--log_every", "1"]
    )
    out = capsys.readouterr().out
    assert re.search(r"^loss\[2\]: \d", out, re.M)
    for name in ("final_loss", "solved", "letters_right", "replies_repeating_the_letters"):
        assert re.search(rf"^{name}: \d", out, re.M) and 0 <= figures[name] < 20
    # Training keeps the rows whose code no evaluated retry uses.
    evaluated = {r["code"] for r in copy_phase.retry_rows("copy", 4, copy_phase.EVAL_SEED)}
    kept = [r for r in copy_phase.retry_rows("copy", 64, copy_phase.TRAIN_SEED)
            if r["code"] not in evaluated]  # fmt: skip
    assert f"batch 8, {len(kept)} rows" in out
