"""docs/own_task.md as written (issue 34): its files are saved into an empty folder and its
commands run there, so a user's own task trains and evaluates through `--task
module:Class` (and `register_task`) with no file of the project changed."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from doc_pages import page_blocks

from curriculum.tasks import check_task_rows, get_task, list_tasks, register_task
from curriculum.tasks import registry as task_registry

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "own_task.md"


def run_command(line: str, folder: Path) -> subprocess.CompletedProcess:
    words = shlex.split(line)
    assert words[0] == "python", line
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the project, as installed
    return subprocess.run(
        [sys.executable, *words[1:]], cwd=folder, env=env, capture_output=True, text=True
    )


@pytest.fixture(scope="module")
def page_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("own_task")
    files, _ = page_blocks(PAGE)
    assert set(files) == {"reverse_task.py", "reverse.yaml", "launch.py"}
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


@pytest.fixture
def reverse_task(page_folder, monkeypatch):
    monkeypatch.syspath_prepend(str(page_folder))
    import reverse_task

    return reverse_task


def test_the_pages_task_keeps_the_task_api(reverse_task):
    from curriculum.tasks.base import HELD_OUT_SEED_BASE

    task = get_task("reverse_task:ReverseTask")
    check_task_rows(task)  # what a run checks before it writes anything
    for level in task.levels:
        train = {r["answer"] for r in task.generate(level, 2000, seed=0)}
        held_out = {r["answer"] for r in task.generate(level, 200, seed=HELD_OUT_SEED_BASE)}
        assert train and held_out and not train & held_out
    row = task.generate(2, 1, seed=3)[0]
    word = json.loads(row["meta"])["word"]
    assert task.evaluate(row, f"<answer>{word[::-1]}</answer>").reward == 1.0
    wrong = task.evaluate(row, f"Sure: <answer>{word}x</answer>")
    assert wrong.reward == 0.0 and wrong.breakdown["format"] == 0.5
    assert f"the answer has {len(word) + 1}" in wrong.feedback["milestones"]
    assert word[::-1] not in wrong.feedback_text()  # feedback never states the answer
    assert task.evaluate(row, "no tag").error is not None


def test_register_task_checks_the_class(reverse_task, monkeypatch):
    monkeypatch.setattr(task_registry, "_REGISTERED", {})  # this test's registrations only
    register_task("reverse", reverse_task.ReverseTask)
    assert "reverse" in list_tasks() and get_task("reverse").name == "reverse"
    for name, cls, message in [
        ("arithmetic", reverse_task.ReverseTask, "'arithmetic' is a built-in task family"),
        ("my task", reverse_task.ReverseTask, "a task name is an identifier"),
        ("words", dict, "is <class 'dict'>, not a subclass of curriculum.tasks.Task"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            register_task(name, cls)


NO_EVALUATE = """
from curriculum.tasks import Task


class NoEvaluate(Task):
    name = "noeval"

    @property
    def num_levels(self):
        return 1

    def _generate_one(self, level, rng):
        return self.make_row(level, "Answer a.", "a?", "a")

    def reference(self, row):
        return "<answer>a</answer>"
"""


def test_a_task_without_evaluate_is_refused_by_the_class_check(tmp_path, monkeypatch, capsys):
    """`evaluate` and `reference` are abstract on Task itself (not only on SplitTask): a
    user's class that lacks one is refused in one line naming it, before anything runs."""
    from pipeline.run.cli import main as run

    (tmp_path / "noeval.py").write_text(NO_EVALUATE)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=re.escape("NoEvaluate does not implement ['evaluate']")):
        get_task("noeval:NoEvaluate")
    code = run(["--task", "noeval:NoEvaluate", "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "does not implement ['evaluate']" in err[0] and not (tmp_path / "out").exists()


@pytest.mark.slow  # four commands, two short runs: about 90 s on a CPU
def test_the_pages_run_and_evaluation_work_as_written(page_folder):
    """The page's commands, one after the other: the run on --task module:Class, the
    evaluation of a stage without --task (the stage line's weighted eval, on the same
    prompts), the launcher's run by a registered name and its evaluation without it."""
    project = subprocess.run(
        ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True
    ).stdout
    _, commands = page_blocks(PAGE)
    assert commands == [
        "python -m pipeline.run --config reverse.yaml",
        "python -m pipeline.evaluate --model_name_or_path runs/reverse/stage_1",
        "python launch.py",
        "python -m pipeline.evaluate --model_name_or_path runs/reverse-by-name/stage_1",
    ]
    outputs = []
    for line in commands:
        done = run_command(line, page_folder)
        assert done.returncode == 0, (line, done.stderr[-3000:])
        outputs.append(done.stdout + done.stderr)

    for run, printed in (("reverse", outputs[1]), ("reverse-by-name", outputs[3])):
        out = page_folder / "runs" / run
        state = json.loads((out / "curriculum_state.json").read_text())
        config = json.loads((out / "run_config.json").read_text())
        assert config["task_class"] == "reverse_task:ReverseTask"
        stage = state["stages"][0]
        assert stage["level"] == 1 and stage["status"] in ("promoted", "plateau")
        # The evaluation is the stage line's: the run's weights, its prompts, its score.
        assert "weights: correctness=0.6, milestones=0.3, format=0.1" in printed
        assert f"task: reverse  level: 1  n: 16  seed: {10**6 + 10**4}" in printed
        mean = float(re.search(r"mean_reward: (\S+)", printed).group(1))
        assert mean == pytest.approx(stage["eval_reward"], abs=5e-5), printed
        assert "success_rate: " in printed
    assert json.loads((page_folder / "runs/reverse/run_config.json").read_text())["task"] == (
        "reverse_task:ReverseTask"
    )
    assert re.search(r"\[stage 2\] level 2 \| erl \| \d steps \| r1 ", outputs[0])
    # Nothing of the project was changed, and nothing was written into it.
    after = subprocess.run(
        ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True
    ).stdout
    assert after == project


def test_a_registered_task_is_found_again_by_the_class_the_run_recorded(
    reverse_task, tmp_path, monkeypatch
):
    """A process without the launcher (a resume, an evaluation) does not know the name
    `reverse`: it loads the class the run recorded, and only for that run's own name."""
    from types import SimpleNamespace

    from pipeline.evaluate.run_folder import recorded_task
    from pipeline.layout import RunLayout
    from pipeline.run.checks import _task_to_load

    monkeypatch.setattr(task_registry, "_REGISTERED", {})
    recorded = {"task": "reverse", "task_class": "reverse_task:ReverseTask"}
    assert recorded_task(recorded) == "reverse_task:ReverseTask"
    assert recorded_task({"task": "countdown", "task_class": "x:Y"}) == "countdown"
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir()
    layout.run_config.write_text(json.dumps(recorded))
    resume = SimpleNamespace(task="reverse", resume=True)
    assert _task_to_load(resume, layout) == "reverse_task:ReverseTask"
    assert _task_to_load(SimpleNamespace(task="reverse", resume=False), layout) == "reverse"
    assert _task_to_load(SimpleNamespace(task="other", resume=True), layout) == "other"
