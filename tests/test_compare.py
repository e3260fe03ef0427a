"""`python -m pipeline.compare`: every method x seed from one shared warm-up, the figures
with intervals, comparison.json and comparison.png, reading finished runs back, a budget
in tokens, a failing run reported, and one-line refusals before anything is written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_run import TINY_RECIPE

from pipeline.compare.cli import main

# configs/tiny.yaml, shortened (as tests/test_run.py shortens it; ERL's reflections take
# max_completion_length, and an option only erl reads is refused where no run is erl).
FAST = [
    "--warmup_sft_steps", "10", "--warmup_sft_examples", "200", "--prompts_per_stage", "64",
    "--eval_prompts", "8", "--per_device_train_batch_size", "8", "--num_generations", "4",
    "--max_completion_length", "8", "--promote_window", "8", "--min_stage_steps", "2",
    "--disable_tqdm", "true",
]  # fmt: skip


def compare_args(tiny_model_dir, folder, *extra):
    return ["--config", TINY_RECIPE, "--model_name_or_path", tiny_model_dir, *FAST,
            "--output_dir", str(folder), *extra]  # fmt: skip


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--methods", "grpo"], "error: --methods: give at least two different methods (grpo)"),
        (
            ["--methods", "grpo,ppo"],
            "error: --methods: unknown method (ppo): choose among erl, grpo, sdpo",
        ),
        (["--methods", "grpo,grpo"], "--methods: give at least two different methods (grpo,grpo)"),
        (["--seeds", "1"], "--seeds must be >= 2 for an interval (1)"),
        (["--budget_unit", "tokens"], "--budget_unit tokens needs a --budget"),
        (["--learning_rates", "grpo=fast"], "--learning_rates: each item is METHOD=RATE"),
        (["--learning_rates", "sdpo=1e-4"], "for a compared method (sdpo=1e-4)"),
        (
            ["--method", "erl"],
            "error: --method is set by python -m pipeline.compare for each run (erl): leave it "
            "out (--methods gives each run its method)",
        ),
        (
            ["--resume", "true"],
            "error: --resume is set by python -m pipeline.compare for each run (true): leave it "
            "out (a second call reads the finished runs back and trains the others again)",
        ),
        (
            ["--num_stages", "2"],
            "error: --num_stages is set by python -m pipeline.compare for each run (2): leave it "
            "out (--budget_scope first_stage trains each run's first stage only; --budget_scope "
            "curriculum trains the recipe's stages)",
        ),
        (
            ["--budget", "4", "--max_stage_steps", "9"],
            "error: --max_stage_steps is set by python -m pipeline.compare for each run (9): "
            "leave it out (--budget is each run's max_stage_steps in its one stage)",
        ),
        (
            ["--compare_dir", "elsewhere"],
            "error: --compare_dir no longer exists (elsewhere): give --output_dir instead: the "
            "comparison is written where it says (without it, in <the recipe's "
            "output_dir>-compare)",
        ),
        (
            ["--methods", "grpo,sdpo", "--memory_size", "7"],
            "error: --memory_size is an option of erl only, which --methods grpo,sdpo would "
            "ignore (7): leave it out, or choose erl",
        ),
        (["--learning_rate", "-1"], "--learning_rate must be a finite number > 0"),
        (["--task", "chess"], "unknown task (chess)"),
    ],
)
def test_bad_options_are_refused_in_one_line_before_anything_is_written(
    tiny_model_dir, tmp_path, capsys, extra, message
):
    folder = tmp_path / "cmp"
    assert main(compare_args(tiny_model_dir, folder, *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not folder.exists()


def test_a_folder_that_holds_a_run_or_a_live_comparison_is_refused(
    tiny_model_dir, tmp_path, capsys
):
    """`--output_dir` of a run of pipeline.run (live or finished), or of a comparison another
    process is writing, is refused in one line, and nothing is written there."""
    from filelock import FileLock

    run = tmp_path / "run"
    run.mkdir()
    (run / "curriculum_state.json").write_text('{"stages": []}')
    before = sorted(p.name for p in run.iterdir())
    assert main(compare_args(tiny_model_dir, run)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --output_dir holds a run of python -m pipeline.run ({run}): give "
                   "the comparison a folder of its own"]  # fmt: skip
    assert sorted(p.name for p in run.iterdir()) == before
    live = tmp_path / "cmp"
    live.mkdir()
    with FileLock(str(live / ".run.lock"), timeout=0):  # another writer holds it
        assert main(compare_args(tiny_model_dir, live)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another process is writing this folder" in err[0], err
    assert not (live / "warmup").exists() and not (live / "runs").exists()


def test_without_output_dir_it_writes_beside_the_recipes_run_folder(
    tiny_model_dir, tmp_path, monkeypatch
):
    """The recipe's output_dir names a run's folder: without --output_dir on the command line
    the comparison goes to <that>-compare, the shared warm-up first (stopped here)."""
    import pipeline.compare.runs

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(Path(TINY_RECIPE).read_text().replace("runs/tiny", str(tmp_path / "x")))
    warmups = []

    def stop(user_argv, folder, options_for):
        warmups.append(folder)
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.compare.runs, "ensure_warmup", stop)
    assert main(["--config", str(recipe), "--model_name_or_path", tiny_model_dir, *FAST]) == 130
    assert warmups == [tmp_path / "x-compare" / "runs" / "warmup"]


def figures_printed(text: str) -> list[str]:
    """The report's lines (mean [interval] per method, differences, promotion)."""
    start = text.index(" seeds on ")
    return [line for line in text[start:].splitlines() if "[" in line or "promoted" in line]


@pytest.mark.parametrize(
    "task, methods",
    [
        # The three-method and the hidden_code comparisons are slow (~20 s and ~15 s): the
        # quick suite keeps the two-method one, the same flow.
        pytest.param(["--task", "arithmetic"], "grpo,erl,sdpo", marks=pytest.mark.slow),
        (["--task", "hidden_rule"], "grpo,sdpo"),
        pytest.param(
            [
                "--task",
                "hidden_code",
                "--reward_signals",
                '{"correctness": 0.8, "milestones": 0.2}',
            ],
            "erl,sdpo",
            marks=pytest.mark.slow,
        ),
    ],
    ids=["arithmetic", "hidden_rule", "hidden_code"],
)
def test_a_comparison_reports_writes_and_reads_its_runs_back(
    tiny_model_dir, tmp_path, capsys, task, methods
):
    folder = tmp_path / "cmp"
    argv = compare_args(tiny_model_dir, folder, *task, "--methods", methods, "--seeds", "2",
                        "--budget", "4", "--eval_every", "2")  # fmt: skip
    assert main(argv) == 0
    first = capsys.readouterr()
    names = methods.split(",")
    # One warm-up for every run: each run starts from its final/ (and keeps it as warmup/).
    assert first.out.count("SFT warm-up") + first.err.count("SFT warm-up") <= 1
    # --output_dir holds the figures and one folder of runs, the shared warm-up's too.
    assert sorted(p.name for p in folder.iterdir()) == ["comparison.json", "comparison.png", "runs"]
    assert (folder / "runs" / "warmup" / "final").exists()
    result = json.loads((folder / "comparison.json").read_text())
    runs = result["runs"]
    assert sorted((r["method"], r["seed"]) for r in runs) == sorted(
        (m, s) for m in names for s in (0, 1)
    )
    for run in runs:
        assert run["error"] is None and [s["step"] for s in run["steps"]] == [1, 2, 3, 4]
        assert [e["step"] for e in run["evals"]] == [0, 2, 4]
        tokens = [s["tokens"] for s in run["steps"]]
        assert tokens == sorted(tokens) and tokens[0] > 0
        # The same start for every run: one checkpoint, the same held-out prompts.
        assert run["evals"][0] == runs[0]["evals"][0]
        state = json.loads((folder / "runs" / f"{run['method']}-seed{run['seed']}" / "curriculum_state.json").read_text())  # fmt: skip
        assert state["stages"][0]["steps"] == 4
    figures = result["figures"]
    assert figures["equal_steps"] == 4
    assert figures["equal_tokens"] == min(r["steps"][-1]["tokens"] for r in runs)
    assert set(figures["values"]) == set(names)
    pairs = {(d["a"], d["b"]) for d in figures["differences"]}
    assert len(pairs) == len(names) * (len(names) - 1) // 2 and (names[-1], names[0]) in pairs
    for d in figures["differences"]:
        assert d["n"] == 2 and len(d["diffs"]) == 2
    assert (folder / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = figures_printed(first.out)
    assert any(
        re.match(rf"\s+{names[-1]} - {names[0]}, held-out success at equal steps: [+-]", line)
        for line in printed
    )
    assert "held-out success at equal generated tokens" in first.out

    # A second call reads every run back: no training, the same figures.
    mtimes = {p: p.stat().st_mtime_ns for p in folder.glob("runs/*/record.json")}
    assert main(argv) == 0
    second = capsys.readouterr()
    assert figures_printed(second.out) == printed
    assert "[stage" not in second.out + second.err
    assert {p: p.stat().st_mtime_ns for p in folder.glob("runs/*/record.json")} == mtimes

    # Other options than a finished run was trained with: refused, naming the run.
    changed = [*argv, "--learning_rates", f"{names[0]}=0.01"]
    assert main(changed) == 2
    err = capsys.readouterr().err.strip()
    assert "--output_dir: the finished run" in err and "learning_rate: 0.0005 -> 0.01" in err


def test_a_token_budget_stops_runs_and_a_failing_run_is_reported(
    tiny_model_dir, tmp_path, capsys, monkeypatch
):
    """A budget of generated tokens ends each run at the step that spends it; a run that
    raises is reported, the others finish, and the next call trains only the failed one."""
    from pipeline.sdpo.trainer import FeedbackSDPOTrainer

    def broken(self, *args, **kwargs):
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(FeedbackSDPOTrainer, "train", broken)
    folder = tmp_path / "cmp"
    argv = compare_args(tiny_model_dir, folder, "--methods", "grpo,erl,sdpo", "--seeds", "2",
                        "--budget", "200", "--budget_unit", "tokens", "--max_stage_steps", "50")  # fmt: skip
    assert main(argv) == 1  # the comparison is made, and says a run failed
    out = capsys.readouterr().out
    assert "failed: sdpo seed 0: RuntimeError: broken on purpose" in out
    assert "erl - grpo, held-out success at equal generated tokens" in out
    result = json.loads((folder / "comparison.json").read_text())
    for run in result["runs"]:
        if run["method"] == "sdpo":
            assert (
                run["error"]
                and not (folder / "runs" / f"sdpo-seed{run['seed']}" / "record.json").exists()
            )
            continue
        tokens = [s["tokens"] for s in run["steps"]]
        assert tokens[-1] >= 200 > tokens[-2], tokens
    monkeypatch.undo()
    mtimes = {p: p.stat().st_mtime_ns for p in folder.glob("runs/*/record.json")}
    assert main(argv) == 0
    assert {p: p.stat().st_mtime_ns for p in mtimes} == mtimes  # read back, not retrained
    assert len(list(folder.glob("runs/sdpo-seed*/record.json"))) == 2


def test_a_curriculum_budget_spans_stages_and_records_the_first_promotion(
    tiny_model_dir, tmp_path, capsys
):
    """--budget_scope curriculum: the run's stages as they come (stage 1 promotes after its
    2 steps and stage 2 starts), ended by a budget of 3 steps inside stage 2; the first
    promotion is the controller's, at step 2."""
    folder = tmp_path / "cmp"
    argv = compare_args(tiny_model_dir, folder, "--methods", "grpo,sdpo", "--seeds", "2",
                        "--budget", "3", "--budget_scope", "curriculum", "--eval_every", "2",
                        "--promote_threshold", "-0.5", "--max_stage_steps", "4")  # fmt: skip
    assert main(argv) == 0
    assert "2/2 runs promoted; steps 2.0" in capsys.readouterr().out
    for run in json.loads((folder / "comparison.json").read_text())["runs"]:
        assert [s["step"] for s in run["steps"]] == [1, 2, 3]
        assert run["promotion"]["step"] == 2 and [e["step"] for e in run["evals"]] == [0, 2, 3]
        state = json.loads((folder / "runs" / f"{run['method']}-seed{run['seed']}" / "curriculum_state.json").read_text())  # fmt: skip
        assert [(s["level"], s["status"], s["steps"]) for s in state["stages"]] == [
            (1, "promoted", 2),
            (2, "plateau", 1),
        ]
