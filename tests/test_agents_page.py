"""docs/agents.md as written: its files are saved into an empty folder and its commands run
there, so a user's own environment trains and evaluates through `--task module:Class`
with no file of the project changed. Also: first attempts played as whole episodes
(`pipeline.evaluate.episodes`) by a model that calls tools."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from doc_pages import page_blocks

from curriculum.tasks import check_task_rows, get_task
from curriculum.tasks.base import HELD_OUT_SEED_BASE

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "agents.md"


@pytest.fixture(scope="module")
def page_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("agents_page")
    files, _ = page_blocks(PAGE)
    assert set(files) == {"guess_task.py", "guess.yaml"}
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


@pytest.fixture
def guess_task(page_folder, monkeypatch):
    monkeypatch.syspath_prepend(str(page_folder))
    return get_task("guess_task:GuessTask")


def test_the_pages_task_keeps_the_agent_task_api(guess_task):
    check_task_rows(guess_task)  # what a run checks before it writes anything
    for level in guess_task.levels:
        for row in guess_task.generate(level, 50, seed=1):
            episode = guess_task.reference(row)
            calls = [m for m in episode if m.get("tool_calls")]
            assert len(calls) <= guess_task.turn_limit(level)
            assert guess_task.evaluate(row, episode).solved
    row = guess_task.generate(2, 1, seed=HELD_OUT_SEED_BASE)[0]
    wrong = [
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "guess", "arguments": {"number": "x"}}}
        ]},
        {"role": "tool", "name": "guess", "content": "error"},
        {"role": "assistant", "content": "I give up."},
    ]  # fmt: skip
    evaluation = guess_task.evaluate(row, wrong)
    assert evaluation.reward == 0.0 and evaluation.breakdown["format"] == 0.0
    assert "invalid" in evaluation.feedback["format"]


def test_first_attempts_are_whole_episodes_run_as_trl_runs_them(guess_task, tool_model_dir):
    """A model warmed up to call `guess` plays the page's task: every tool reply in an
    episode is what the environment answers, no episode passes the turn cap, and the
    evaluation scores the episodes as the task's verdict does."""
    from pipeline.evaluate.episodes import play_episodes
    from pipeline.evaluate.first_attempts import load_for_evaluation, score_completions

    model, tokenizer = load_for_evaluation(tool_model_dir)
    rows = guess_task.generate(1, 16, seed=HELD_OUT_SEED_BASE)
    episodes = play_episodes(
        model, tokenizer, guess_task, rows, max_completion_length=160, max_turns=3, progress=False
    )
    called = 0
    for row, episode in zip(rows, episodes, strict=True):
        _, played = guess_task.play(row, episode)
        replies = [m["content"] for m in episode if m["role"] == "tool"]
        assert replies == [call.reply for call in played.calls]
        rounds = sum(1 for m in episode if m.get("tool_calls") and m is not episode[-1])
        assert rounds <= 3 and episode[-1]["role"] == "assistant"
        called += any(call.valid for call in played.calls)
    assert called, "the warmed-up model made no valid call"
    result = score_completions(guess_task, rows, episodes)
    assert result.rewards == [guess_task.evaluate(r, e).reward for r, e in zip(rows, episodes)]
    assert result.samples[0]["completion"] == episodes[0]


@pytest.mark.slow
def test_the_pages_commands_train_and_evaluate_the_task(page_folder):
    _, commands = page_blocks(PAGE)
    assert commands == [
        "python -m pipeline.run --config guess.yaml",
        "python -m pipeline.evaluate --model_name_or_path runs/guess/final",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the project, as installed
    outputs = []
    for line in commands:
        words = shlex.split(line)
        done = subprocess.run(
            [sys.executable, *words[1:]], cwd=page_folder, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, (line, done.stderr[-3000:])
        outputs.append(done.stdout + done.stderr)
    state = json.loads((page_folder / "runs" / "guess" / "curriculum_state.json").read_text())
    assert state["finished"] and [s["level"] for s in state["stages"]] == [1, 2]
    assert "[stage 2] level 2 | erl" in outputs[0]
    assert "task: guess  level: 2" in outputs[1] and "mean_reward:" in outputs[1]
    recorded = json.loads((page_folder / "runs" / "guess" / "run_config.json").read_text())
    assert recorded["task_class"] == "guess_task:GuessTask"
