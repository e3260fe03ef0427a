"""`--method grpo | erl | sdpo`: every method runs the curriculum with everything the run
promises (stages, promotion, the output folder, the console, SIGKILL and resume, 4-bit
LoRA), on both backends; a bad or changed method is refused in one line."""

from __future__ import annotations

import json
import re
import sys

import pytest
from test_run import run_args, run_process, stage_files

from pipeline.run.cli import main
from pipeline.run.plots import read_metrics

# Promotion whatever the tiny model answers after a short warm-up (every reward >= -0.5):
# what is tested is that the method's first attempts reach the controller.
PROMOTES = ["--promote_threshold", "-0.5", "--min_stage_steps", "2", "--max_stage_steps", "2"]
QLORA = ["--use_lora", "true", "--lora_r", "4", "--load_in_4bit", "true"]


def test_an_unknown_method_is_refused_before_anything_is_written(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(run_args(tiny_model_dir, out, "--method", "ppo")) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --method: unknown method (ppo): choose erl, grpo, sdpo"
    assert not out.exists()


@pytest.mark.slow  # ~35 s each: a curriculum killed in stage 2 and resumed, per method
@pytest.mark.parametrize("method", ["grpo", "sdpo"])
def test_a_method_runs_the_curriculum_is_killed_in_stage_2_and_resumes(
    tiny_model_dir, tmp_path, method, capsys
):
    """A 4-bit LoRA run of `method`, SIGKILLed right after stage 2's first checkpoint and
    resumed: stage 1 is never retrained or rewritten, the run finishes with the output
    folder's contract, its stages promote, and the console and plots name the method. A
    resume with another method is refused in one line."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "pipeline.run"]
    command += run_args(tiny_model_dir, out, "--method", method, *QLORA, *PROMOTES)
    command += [
        "--save_steps",
        "1",
        "--warmup_sft_steps",
        "2",
        "--per_device_train_batch_size",
        "8",
    ]
    killed = run_process(command, ("checkpoint", 2))
    assert f"[stage 1] level 1 | {method} | 2 steps" in killed.stdout + killed.stderr
    state = json.loads((out / "curriculum_state.json").read_text())
    assert [s["status"] for s in state["stages"]] == ["promoted", "running"]
    stage_1 = stage_files(out / "stage_1")
    checkpoint = out / "stage_2" / "checkpoints" / "checkpoint-1"
    assert {"adapter_model.safetensors", "optimizer.pt", "base_quantization.json"} <= {
        p.name for p in checkpoint.iterdir()
    }

    resumed = run_process(command, None, "--resume", "true")
    printed = resumed.stdout + resumed.stderr
    assert "resuming" in printed and "[stage 1]" not in printed  # stage 1 is not trained again
    assert re.search(rf"\[stage 2\] level 2 \| {method} \| 2 steps \| r1 -?[\d.]+ ", printed)
    state = json.loads((out / "curriculum_state.json").read_text())
    assert state["finished"] and [s["status"] for s in state["stages"]] == ["promoted"] * 2
    assert stage_files(out / "stage_1") == stage_1
    for stage in (1, 2):
        folder = out / f"stage_{stage}"
        names = {p.name for p in folder.iterdir()}
        assert {"adapter_model.safetensors", "base_quantization.json", "metrics.jsonl"} <= names
        assert {"tokenizer_config.json", "reward_curve.png"} <= names
        assert not (folder / "checkpoints").exists()
        metrics = read_metrics(folder / "metrics.jsonl")
        assert [m["stage_step"] for m in metrics if "loss" in m] == [1, 2]
    assert {"adapter_model.safetensors", "base_quantization.json"} <= {
        p.name for p in (out / "final").iterdir()
    }
    assert (out / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "run_config.json").read_text())["method"] == method
    generations = [json.loads(line) for line in (out / "generations.jsonl").open()]
    assert {g["stage"] for g in generations} == {1, 2} and {g["attempt"] for g in generations} == {
        1
    }

    # The resume is checked against the method the run started with.
    argv = command[3:]
    argv[argv.index("--method") + 1] = "erl"
    assert main([*argv, "--resume", "true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"method: '{method}' -> 'erl'" in err[0], err


@pytest.mark.slow
@pytest.mark.parametrize("method", ["grpo", "sdpo"])
def test_a_method_runs_the_curriculum_on_unsloths_backend(tiny_model_dir, tmp_path, method):
    """`--backend unsloth` with the CPU opt-in: grpo trains Unsloth's generated
    UnslothGRPOTrainer (the run fails loudly if its base is not Unsloth's), sdpo trains
    TRL's SDPOTrainer on Unsloth's loaded model; both run the curriculum to its end."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "pipeline.run", "--backend", "unsloth"]
    command += run_args(tiny_model_dir, out, "--method", method, *PROMOTES)
    env = {"ERL_UNSLOTH_CPU_TRAINER": "1"}
    done = run_process(command, None, env=env)
    printed = done.stdout + done.stderr
    assert re.search(rf"\[stage 2\] level 2 \| {method} \| 2 steps \| r1 -?[\d.]+ ", printed)
    config = json.loads((out / "run_config.json").read_text())
    assert config["backend"] == "unsloth" and config["method"] == method
    state = json.loads((out / "curriculum_state.json").read_text())
    assert state["finished"] and [s["status"] for s in state["stages"]] == ["promoted"] * 2
    if method == "grpo":
        assert "Unsloth" in printed  # its generated trainer's notes


def test_each_methods_r1_is_read_and_the_plots_name_the_method(tmp_path, monkeypatch):
    """r1 under the key each trainer logs it (ERL's own, GRPO's `reward`, SDPO's
    diagnostics), and the run's plot titled with the method of its run_config.json."""
    from pipeline.layout import RunLayout
    from pipeline.run import plots

    assert plots.first_attempt_reward({"erl/r1_mean": 0.25, "reward": 0.5}) == 0.25
    assert plots.first_attempt_reward({"reward": 0.5}) == 0.5
    assert plots.first_attempt_reward({"self_distillation/reward_mean": 0.75}) == 0.75
    assert plots.first_attempt_reward({"loss": 1.0}) is None
    layout = RunLayout(tmp_path)
    (tmp_path / "run_config.json").write_text(json.dumps({"method": "sdpo"}))
    layout.stage(1).mkdir()
    records = [{"step": s, "self_distillation/reward_mean": s / 10} for s in (1, 2, 3)]
    layout.stage_metrics(1).write_text("".join(json.dumps(r) + "\n" for r in records))
    titles = []
    real = plots.build_figure

    def spy(history, **kwargs):
        fig = real(history, **kwargs)
        titles.append((kwargs.get("title"), [list(line.get_ydata()) for line in fig.axes[0].lines]))
        return fig

    monkeypatch.setattr(plots, "build_figure", spy)
    plots.plot_run(tmp_path)
    assert titles[0][0] == f"SDPO reward curves: {tmp_path.name}" and titles[1][0].endswith(
        "· SDPO"
    )
    assert [0.1, 0.2, 0.3] in titles[0][1]  # SDPO's r1 is drawn
