"""`pipeline.evaluate` on a folder a run wrote (issue 34): no --task, the run's task options
and weights, the stage line's prompts and score; and the `dataset` family's evaluation
rows are held out in a real run."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pipeline.evaluate.cli import main as evaluate
from pipeline.run.cli import main as run

REPO = Path(__file__).resolve().parents[1]


def test_a_stage_folder_is_evaluated_as_its_stage_line(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "sums.jsonl"
    rows = [
        {"question": f"{a}+{b}", "answer": str(a + b), "difficulty": 1 + (a > 4)}
        for a in range(10)
        for b in range(10)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    argv = [
        *("--config", str(REPO / "configs" / "tiny.yaml"), "--model_name_or_path", tiny_model_dir),
        *("--build_tiny_model", "false", "--output_dir", str(out), "--task", "dataset"),
        *("--task_config", json.dumps({"path": str(data), "held_out_fraction": 0.2})),
        *("--reward_signals", '{"correctness": 0.8, "format": 0.2}', "--max_level", "1"),
        *("--warmup_sft_steps", "20", "--warmup_sft_examples", "200"),
        *("--prompts_per_stage", "64", "--eval_prompts", "8", "--per_device_train_batch_size", "8"),
        *("--num_generations", "4", "--max_completion_length", "8"),
        *("--reflection_max_completion_length", "8", "--promote_window", "8"),
        *("--min_stage_steps", "2", "--max_stage_steps", "2", "--save_strategy", "no"),
        *("--disable_tqdm", "true"),
    ]
    assert run(argv) == 0, capsys.readouterr().err
    state = json.loads((out / "curriculum_state.json").read_text())
    stage = state["stages"][0]
    assert json.loads((out / "run_config.json").read_text())["task_class"] == (
        "curriculum.tasks.dataset_task:DatasetTask"
    )
    capsys.readouterr()

    assert evaluate(["--model_name_or_path", str(out / "stage_1"), "--disable_tqdm", "true"]) == 0
    printed = capsys.readouterr().out
    assert "task: dataset  level: 1  n: 8  seed: 1010000" in printed
    assert "weights: correctness=0.8, format=0.2" in printed
    mean = float(re.search(r"mean_reward: (\S+)", printed).group(1))
    assert abs(mean - stage["eval_reward"]) < 5e-5, (printed, stage)
    assert "trained_on" not in printed  # the dataset's held-out rows are never trained on

    # The command line overrides the run's choices: the task reward, another prompt count.
    out_json = tmp_path / "eval.json"
    argv = ["--model_name_or_path", str(out), "--weights", '{"correctness": 1.0}']
    argv += ["--num_prompts", "4", "--output_json", str(out_json), "--disable_tqdm", "true"]
    assert evaluate(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"model: {out / 'final'} (the run's)")
    assert "weights: correctness=1" in printed and "n: 4" in printed
    written = json.loads(out_json.read_text())
    assert written["checkpoint"] == str(out / "final") and written["trained"] == 0
    # Another task than the run's: its model, none of the run's choices (the task reward).
    argv = ["--model_name_or_path", str(out / "stage_1"), "--task", "arithmetic", "--level", "1"]
    assert evaluate([*argv, "--num_prompts", "2", "--disable_tqdm", "true"]) == 0
    printed = capsys.readouterr().out
    assert "task: arithmetic  level: 1  n: 2" in printed and "weights:" not in printed
    # Every evaluated prompt is one of the held-out rows the task keeps apart.
    from curriculum.tasks import get_task
    from curriculum.tasks.base import HELD_OUT_SEED_BASE

    task = get_task("dataset", path=str(data), held_out_fraction=0.2)
    held_out = {r["prompt"][-1]["content"] for r in task.generate(1, 100, HELD_OUT_SEED_BASE)}
    trained = {r["prompt"][-1]["content"] for r in task.generate(1, 500, seed=0)}
    assert len(held_out) == 10 and not held_out & trained
    for sample in written["samples"]:  # the prompt's text ends with the user's question
        assert any(sample["prompt"].endswith(question) for question in held_out), sample


def test_a_run_whose_stage_is_still_running_is_scored_at_its_models_level(tmp_path):
    """The run folder's model is the last finished stage's while the next one runs: its
    level, and its trained prompts, are that stage's, not the running stage's."""
    from curriculum.state import CurriculumState
    from pipeline.evaluate.run_folder import find_run

    root = tmp_path / "run"
    (root / "stage_1").mkdir(parents=True)
    (root / "run_config.json").write_text(json.dumps({"task": "arithmetic"}))
    state = CurriculumState(root / "curriculum_state.json")
    state.start_stage(1)
    state.finish_stage(1, "promoted", steps=4, r1_mean=0.7, controller={}, checkpoint="stage_1")
    state.start_stage(2)

    found = find_run(str(root))
    assert (found.model, found.stage, found.stage_level()) == (root / "stage_1", 1, 1)
    (root / "final").mkdir()  # once the run has finished, its final model and last stage
    found = find_run(str(root))
    assert (found.model, found.stage, found.stage_level()) == (root / "final", None, 2)
