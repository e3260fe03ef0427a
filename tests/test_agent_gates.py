"""bench/agent_gates.py: gate a on an agent task, end to end on a small probe (slow): the
counts and the paired intervals it prints hang together, and its warm-up leaves out every
probe row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from curriculum.tasks import get_task
from curriculum.tasks.base import prompt_key

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from agent_gates import PROBE_SEED, WARM_SEED  # noqa: E402


@pytest.mark.slow
def test_the_probe_pairs_retries_with_fresh_episodes_and_keeps_probe_rows_out_of_the_warmup():
    n, examples = 24, 40
    done = subprocess.run(
        [sys.executable, "bench/agent_gates.py", "--task", "frozenlake_agent", "--level", "1",
         "--n", str(n), "--warmup_steps", "20", "--warmup_examples", str(examples),
         "--budget", "96", "--reflection_tokens", "8"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout[done.stdout.index("{\n") :])
    assert out["probe_rows"] == n
    assert out["failed_first_attempts"] == round(n * (1 - out["first_attempt_success"]))
    for name in ("retry_success_after_reflection", "retry_success_from_raw_feedback"):
        low, high = out[f"{name}_minus_fresh_95"]
        difference = out[name] - out["resample_success"]  # paired over the same failed rows
        assert out[f"{name}_minus_fresh"] == pytest.approx(difference)
        assert low <= out[f"{name}_minus_fresh"] <= high
    fixed, fresh = out["retry_success_after_reflection"], out["resample_success"]
    assert out["gate_a_passes"] == (fixed >= max(2 * fresh, fresh + 0.1))

    task = get_task("frozenlake_agent")
    probe = {prompt_key(r["prompt"]) for r in task.generate(1, n, seed=PROBE_SEED)}
    warm = task.generate(1, examples, seed=WARM_SEED)
    assert out["warmup_rows_left_out_as_probe_rows"] == sum(
        prompt_key(r["prompt"]) in probe for r in warm
    )


def test_a_code_tasks_warmup_teaches_lessons_on_other_codes_only():
    """hidden_code_agent warms up on codes of its own (never the probe's, whose answers it
    would teach): a wrong episode's reflection -> the lesson its feedback names, the retry
    from that lesson (or the raw feedback) in the system message -> the solution, and a
    plain solved episode."""
    from agent_gates import code_warmup, tool_calls

    task = get_task("hidden_code_agent", rule_seed=1)
    copies, episodes, untooled = code_warmup(task, 1, 12)
    assert len(untooled) == 12 and len(episodes) == 24 and len(copies) == 12
    for copy, kind in zip(copies, ["lesson", "rulebook"] * 6):  # the rulebook: a whole code
        lesson = copy[0]["content"].split("Advice from a previous attempt: ")[1]
        assert len(lesson.split()) == (5 if kind == "rulebook" else len(set(lesson.split())))
    for reflection, retry in zip(untooled, episodes[::2]):
        assert reflection[-1]["role"] == "assistant"
        lesson = reflection[-1]["content"]
        assert "Feedback: Entered" in reflection[-2]["content"]
        system = retry[0]["content"]
        assert "Advice from a previous attempt: " in system
        # the retry enters the digits its lesson (or the feedback, which names them) gives
        entries = [
            c["function"]["arguments"]["entry"]
            for m in retry if m.get("tool_calls") for c in m["tool_calls"]
        ]  # fmt: skip
        assert all(pair in system for pair in entries) and tool_calls(retry) == len(entries)
        assert set(lesson.split()) == set(entries)
    probe_code = task.rule_text(1)
    shown = json.dumps([copies, episodes, untooled])
    assert probe_code not in shown
    # No conversation enters the probe code's digits for all of a row's letters, beyond chance.
    code = task.code(1)
    agree = [
        all(code.get(c["function"]["arguments"]["entry"][0]) == c["function"]["arguments"]["entry"][2]
            for m in e if m.get("tool_calls") for c in m["tool_calls"])
        for e in episodes + copies
    ]  # fmt: skip
    assert sum(agree) <= 2
