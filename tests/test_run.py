"""`python -m pipeline.run`: config handling, the output contract, and kill-and-resume."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.run.checkpoints import KILL_POINT_ENV
from pipeline.run.cli import main
from pipeline.run.plots import read_metrics

REPO = Path(__file__).resolve().parents[1]
CUDA = torch.cuda.is_available()
TINY_RECIPE = str(REPO / "configs" / "tiny.yaml")
# configs/tiny.yaml, shortened: a few steps per stage, two levels. No option only erl reads:
# tests/test_methods.py trains grpo and sdpo with these, which refuse one.
FAST = [
    "--warmup_sft_steps",
    "10",
    "--warmup_sft_examples",
    "200",
    "--prompts_per_stage",
    "64",
    "--eval_prompts",
    "8",
    "--per_device_train_batch_size",
    "16",
    "--num_generations",
    "4",
    "--max_completion_length",
    "8",
    "--promote_window",
    "8",
    "--min_stage_steps",
    "3",
    "--max_stage_steps",
    "4",
    "--max_level",
    "2",
    "--save_steps",
    "2",
    "--disable_tqdm",
    "true",
]


def run_args(tiny_model_dir, output_dir, *extra):
    return [
        "--config",
        TINY_RECIPE,
        "--model_name_or_path",
        tiny_model_dir,
        "--output_dir",
        str(output_dir),
        *FAST,
        *extra,
    ]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--promote_treshold", "0.5"], "promote_treshold"),
        (["--promote_thresh", "0.5"], "unknown option(s) (--promote_thresh)"),  # no abbreviations
        (["--prompts_per_stage", "0"], "prompts_per_stage must be >= 1, got 0"),
        (["--reward_signals", "{not json"], "reward_signals must be a JSON object"),
        (["--max_steps", "10"], "give --max_stage_steps instead"),
        (["--save_total_limit", "1"], "save_total_limit must be >= 2"),
        (["--plateau_policy", "retry"], "plateau_policy"),
        (["--task", "chess"], "unknown task (chess)"),
        (["--reward_signals", '{"style": 1.0}'], "style"),
    ],
)
def test_bad_options_are_rejected_with_their_name(tiny_model_dir, tmp_path, extra, message, capsys):
    assert main(run_args(tiny_model_dir, tmp_path / "out", *extra)) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--load_in_4bit", "true", "--use_lora", "false"], "load_in_4bit needs use_lora"),
        (
            ["--fast_inference", "true"],
            "fast_inference (vLLM generation) needs the unsloth backend",
        ),
        pytest.param(
            ["--fp16", "true", "--bf16", "false"],
            "fp16 needs a GPU: on a CPU accelerate ignores it",
            marks=pytest.mark.skipif(CUDA, reason="a GPU runs fp16"),
        ),
    ],
    ids=["4bit-without-lora", "vllm-here", "fp16-on-cpu"],
)
def test_what_cannot_work_here_is_refused_before_the_run_writes_anything(
    tiny_model_dir, tmp_path, extra, message, capsys
):
    """Refused with the reason and what to use instead, not dropped silently, and before
    the output folder exists: fixing the option and running again needs no --resume."""
    out = tmp_path / "out"
    assert main(run_args(tiny_model_dir, out, *extra)) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_unknown_key_in_a_recipe_is_rejected(tmp_path, capsys):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(Path(TINY_RECIPE).read_text() + "\nmemory_sise: 10\n")
    assert main(["--config", str(recipe), "--output_dir", str(tmp_path / "out")]) == 2
    assert "unknown option(s) in the recipe (memory_sise)" in capsys.readouterr().err


def test_help_lists_every_option_with_its_help(capsys):
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    for option, help_words in [
        ("--promote_threshold", "rolling mean"),
        ("--reward_signals", "weight"),
        ("--reward_threshold", "Gating threshold"),
        ("--lora_r", "LoRA rank"),
        ("--warmup_sft_steps", "SFT steps"),
    ]:
        assert option in text and help_words in text


def tensorboard_scalars(folder: Path) -> set[str]:
    """The scalar tags in the TensorBoard event files of `folder`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return set(events.Tags()["scalars"])


def test_tiny_run_writes_the_output_contract(tiny_model_dir, tmp_path, capfd, caplog):
    from transformers import AutoModelForCausalLM

    # report_to from a recipe, offline; the progress bars on, as a user sees them.
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        Path(TINY_RECIPE).read_text().replace("report_to: none", "report_to: tensorboard")
    )
    out = tmp_path / "run"
    argv = run_args(tiny_model_dir, out, "--disable_tqdm", "false", "--log_generations_every", "2")
    argv[1] = str(recipe)
    capfd.readouterr()
    caplog.set_level(logging.INFO, logger="pipeline.run")  # pytest holds the root handler
    assert main(argv) == 0
    console = capfd.readouterr()
    console = console.out + console.err + caplog.text

    state = json.loads((out / "curriculum_state.json").read_text())
    assert state["finished"] is True and state["current_stage"] == len(state["stages"])
    assert [s["stage"] for s in state["stages"]] == list(range(1, len(state["stages"]) + 1))
    assert [s["level"] for s in state["stages"]][:2] == [1, 2]
    for entry in state["stages"]:
        assert entry["status"] in ("promoted", "plateau") and 3 <= entry["steps"] <= 4
        assert entry["checkpoint"] == f"stage_{entry['stage']}"
        assert isinstance(entry["eval_reward"], float) and isinstance(entry["r1_mean"], float)
        stage_dir = out / entry["checkpoint"]
        AutoModelForCausalLM.from_pretrained(stage_dir)
        assert (stage_dir / "erl_memory.json").exists() and (
            stage_dir / "tokenizer_config.json"
        ).exists()
        metrics = read_metrics(stage_dir / "metrics.jsonl")
        assert [m["stage_step"] for m in metrics if "loss" in m] == list(
            range(1, entry["steps"] + 1)
        )
        assert (stage_dir / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert not (stage_dir / "checkpoints").exists()
        # Every report_to sink gets the full metrics: TensorBoard, one run per stage.
        scalars = tensorboard_scalars(out / "tensorboard" / entry["checkpoint"])
        assert {"train/erl/r1_mean", "train/erl/gated_fraction", "train/loss"} <= scalars
    assert "train/loss" in tensorboard_scalars(out / "tensorboard" / "warmup")
    AutoModelForCausalLM.from_pretrained(out / "final")
    assert (out / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = json.loads((out / "run_config.json").read_text())
    assert config["report_to"] == ["tensorboard"] and config["max_stage_steps"] == 4

    # generations.jsonl: stage and run-global step; first attempts and their retries;
    # the two samples of a batch from different prompts.
    generations = [
        json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()
    ]
    assert {"stage", "step", "level", "completion", "reward", "feedback", "attempt"} <= set(
        generations[0]
    )
    stage_one_steps = state["stages"][0]["steps"]
    assert {(g["stage"], g["step"]) for g in generations if g["attempt"] == 1} == {
        (1, 0),
        (1, 2),
        (2, stage_one_steps),
        (2, stage_one_steps + 2),
    }
    assert {g["attempt"] for g in generations} == {1, 2}  # the tiny model always retries
    batches = {}
    for g in generations:
        batches.setdefault((g["stage"], g["step"], g["attempt"]), []).append(g["prompt"])
    assert all(len(p) == 2 and p[0] != p[1] for p in batches.values()), batches

    # The console: a bar per stage and the warm-up, the stage lines, warnings; no dicts.
    for stage in (1, 2):
        assert f"stage {stage} · level {stage} · erl " in console
        assert re.search(rf"\[stage {stage}\] level {stage} \| erl \| \d steps \| r1 ", console)
    assert "warm-up 10/10" in console and "r1=" in console and "gated=" in console
    # Each stage's reflections: the tiny model reflects on every failed attempt.
    assert re.search(r"\[stage 1\] reflections: [1-9]\d* written; memory: \d+ stored", console)
    assert "s/step" in console
    assert "'loss'" not in console and "completions/mean_length" not in console, console
    fallback = [
        m.get("rewards/fallback_rate", 0.0)
        for m in read_metrics(out / "stage_1" / "metrics.jsonl")
        if "loss" in m
    ]
    warned = "[stage 1] warning: " in console and "fallback reward" in console
    assert warned == (sum(fallback[-10:]) / len(fallback[-10:]) > 0.05)

    # A finished run's folder is not overwritten by accident.
    assert main(run_args(tiny_model_dir, out)) == 2
    assert "pass --resume true to continue the run there" in capfd.readouterr().err


# Kill points, in the order a run passes them: (point, stage). Each process of the chain
# below is SIGKILLed at one of them and the next one resumes the folder.
KILL_POINTS = [
    ("trained", 1),  # after the stage's last step
    ("evaluated", 1),  # after its evaluation
    ("saved", 1),  # after its folder was written
    ("recorded", 1),  # after the state file marked it finished
    ("first_step", 2),  # the next stage, before its first checkpoint
    ("checkpoint", 2),  # right after that checkpoint
]


def stage_files(folder: Path) -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in folder.iterdir() if p.is_file()}


def run_process(command: list[str], kill_at: tuple[str, int] | None = None, *extra: str, env=None):
    """Run `python -m pipeline.run` in a fresh process (`env`: more environment variables);
    with `kill_at` (point, stage) it must SIGKILL itself there, else finish."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    if kill_at:
        env[KILL_POINT_ENV] = f"{kill_at[0]}:{kill_at[1]}"
    done = subprocess.run(
        [*command, *extra], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    expected = -signal.SIGKILL if kill_at else 0
    assert done.returncode == expected, (kill_at, done.stderr[-3000:])
    return done


@pytest.fixture(scope="module")
def killed_4bit_run(tiny_model_dir, tmp_path_factory) -> dict:
    """A 4-bit run (NF4 base, LoRA r 4: the recipes' QLoRA) killed at every boundary of
    KILL_POINTS in turn, each kill resumed by the next process, the last resume finishing
    it with --save_merged. Returns the folder and what each kill left: the printed output,
    the state file, every finished stage's file times, and the trainer checkpoint a
    mid-stage kill left."""
    out = tmp_path_factory.mktemp("killed") / "run"
    command = [
        sys.executable,
        "-m",
        "pipeline.run",
        *run_args(tiny_model_dir, out, "--use_lora", "true", "--lora_r", "4"),
        *[
            "--load_in_4bit",
            "true",
            "--warmup_sft_steps",
            "2",
            "--per_device_train_batch_size",
            "8",
        ],
        *["--min_stage_steps", "2", "--max_stage_steps", "2", "--save_steps", "1"],
    ]
    kills = []
    for i, (point, stage) in enumerate(KILL_POINTS):
        resume = ["--resume", "true"] if i else []
        verbose = ["--log_level", "info"] if point == "evaluated" else []  # safe to change
        killed = run_process(command, (point, stage), *resume, *verbose)
        state = json.loads((out / "curriculum_state.json").read_text())
        checkpoint = out / f"stage_{stage}" / "checkpoints" / "checkpoint-1"
        kills.append(
            {
                "point": point,
                "stage": stage,
                "verbose": bool(verbose),
                "printed": killed.stdout + killed.stderr,
                "state": state,
                "files": {
                    s["stage"]: stage_files(out / s["checkpoint"])
                    for s in state["stages"]
                    if s["status"] != "running"
                },
                "checkpoint": sorted(p.name for p in checkpoint.iterdir())
                if checkpoint.exists()
                else [],
            }
        )
    resumed = run_process(command, None, "--resume", "true", "--save_merged", "true")
    return {"out": out, "kills": kills, "resumed": resumed.stdout + resumed.stderr}


# ~75 s: seven processes, each killed at a boundary and resumed by the next
@pytest.mark.slow
@pytest.mark.xdist_group("killed_4bit_run")  # one worker runs the chain, for both tests
def test_sigkill_at_every_stage_boundary_then_resume(killed_4bit_run):
    """Whenever the state says a stage is finished its folder is complete, a finished stage
    is never retrained or rewritten, a kill mid-stage leaves a trainer checkpoint to resume
    from, and the last resume finishes the run."""
    out = killed_4bit_run["out"]
    finished_files: dict[int, dict[Path, int]] = {}
    for kill in killed_4bit_run["kills"]:
        point = kill["point"]
        assert ("'loss'" in kill["printed"]) == kill["verbose"], point  # the dicts only when asked
        finished = [s["status"] != "running" for s in kill["state"]["stages"]]
        assert finished == {1: [False], 2: [True, False]}[kill["stage"]] or (
            point == "recorded" and finished == [True]
        ), (point, kill["state"])
        for stage, files in kill["files"].items():
            names = {p.name for p in files}
            assert {"adapter_model.safetensors", "adapter_config.json", "erl_memory.json"} <= names
            assert {"tokenizer_config.json", "metrics.jsonl", "reward_curve.png"} <= names
            assert "base_quantization.json" in names  # evaluation rebuilds the 4-bit base
            # Never retrained nor rewritten once finished.
            assert files == finished_files.setdefault(stage, files), point
    mid_stage = killed_4bit_run["kills"][-1]  # right after stage 2's first checkpoint
    assert {"adapter_model.safetensors", "optimizer.pt", "base_quantization.json"} <= set(
        mid_stage["checkpoint"]
    )

    assert "resuming" in killed_4bit_run["resumed"]
    state = json.loads((out / "curriculum_state.json").read_text())
    assert state["finished"] is True
    assert [s["stage"] for s in state["stages"]] == [1, 2]
    assert all(s["status"] in ("promoted", "plateau") and s["steps"] == 2 for s in state["stages"])
    assert stage_files(out / "stage_1") == finished_files[1]
    for stage in (1, 2):
        assert not (out / f"stage_{stage}" / "checkpoints").exists()
        metrics = read_metrics(out / f"stage_{stage}" / "metrics.jsonl")
        assert [m["stage_step"] for m in metrics if "loss" in m] == [1, 2]


@pytest.mark.slow
@pytest.mark.xdist_group("killed_4bit_run")
def test_a_killed_4bit_run_merges_and_evaluates_on_its_base(
    tiny_model_dir, killed_4bit_run, capsys
):
    """The killed and resumed 4-bit run: the warm-up and the stages trained a LoRA adapter
    on the NF4 base; `python -m pipeline.evaluate` scores final/ on the 4-bit base it was
    trained on, and final_merged/ (--save_merged) is that model, dequantized."""
    import bitsandbytes as bnb
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM

    from pipeline.evaluate.cli import main as evaluate
    from pipeline.evaluate.first_attempts import load_for_evaluation
    from pipeline.models.quantization import base_model_kwargs, disable_cpu_weight_packing

    out = killed_4bit_run["out"]
    assert json.loads((out / "run_config.json").read_text())["load_in_4bit"] is True
    for folder in ("warmup", "stage_1", "stage_2", "final"):
        assert json.loads((out / folder / "base_quantization.json").read_text())["load_in_4bit"]
    assert PeftConfig.from_pretrained(out / "final").r == 4

    def count_4bit(model) -> int:
        return sum(isinstance(m, bnb.nn.Linear4bit) for m in model.modules())

    def logits(model) -> torch.Tensor:
        with torch.no_grad():
            return model(input_ids=torch.arange(3, 40).unsqueeze(0)).logits

    # The model as trained: the NF4 base loaded as the run loads it, plus the adapter. With
    # bitsandbytes' CPU weight packing off, as the run has it: on a CPU with AVX512-BF16 a
    # packed layer computes in bf16 (logits ~2e-3 away).
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, **base_model_kwargs(True))
    disable_cpu_weight_packing(base)
    trained = logits(PeftModel.from_pretrained(base, out / "final").eval())
    evaluated, _ = load_for_evaluation(str(out / "final"))
    assert count_4bit(evaluated) == 14
    torch.testing.assert_close(logits(evaluated), trained, rtol=0, atol=0)
    on_float_base, _ = load_for_evaluation(str(out / "final"), load_in_4bit=False)
    float_gap = (logits(on_float_base) - trained).abs().max().item()
    assert count_4bit(on_float_base) == 0 and float_gap > 1e-3

    merged = AutoModelForCausalLM.from_pretrained(out / "final_merged")
    assert count_4bit(merged) == 0 and not any("lora" in n for n, _ in merged.named_parameters())
    assert "quantization_config" not in json.loads((out / "final_merged/config.json").read_text())
    assert {p.dtype for p in merged.parameters()} == {torch.float32}  # a CPU's compute dtype
    merged_gap = (logits(merged) - trained).abs().max().item()
    with capsys.disabled():
        print(f"max |logits - trained|: float base {float_gap:.4f}, final_merged {merged_gap:.2e}")
    torch.testing.assert_close(logits(merged), trained, rtol=1e-4, atol=1e-5)

    capsys.readouterr()
    argv = ["--model_name_or_path", str(out / "final"), "--task", "arithmetic", "--level", "1"]
    assert (
        evaluate([*argv, "--num_prompts", "4", "--max_new_tokens", "8", "--disable_tqdm", "true"])
        == 0
    )
    assert re.search(r"^mean_reward: -?[\d.]+$", capsys.readouterr().out, flags=re.M)


def test_a_float_lora_policy_merges_into_its_weights(tiny_model_dir, tmp_path):
    """--save_merged on a float base (the chain above is 4-bit): PEFT's merge, the same
    logits with no LoRA layer left."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from pipeline.models.quantization import merge_adapter

    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False),
    ).eval()
    ids = torch.arange(3, 40).unsqueeze(0)
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    model.save_pretrained(tmp_path / "adapter")
    merged = merge_adapter(model, tmp_path / "adapter")
    assert not any("lora" in name for name, _ in merged.named_parameters())
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-5)


def test_a_run_interrupted_in_the_warmup_resumes(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Ctrl-C during the SFT warm-up: the folder is resumable and the warm-up reruns."""
    from trl import SFTTrainer

    out = tmp_path / "run"

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(SFTTrainer, "train", interrupted)
    assert main(run_args(tiny_model_dir, out)) == 130  # one line, the command that resumes
    monkeypatch.undo()
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"interrupted: resume with `python -m pipeline.run --output_dir {out} --resume true`"
    )
    assert (out / "curriculum_state.json").exists() and not (out / "warmup").exists()
    assert main(run_args(tiny_model_dir, out)) == 2
    assert "--resume true" in capsys.readouterr().err

    # The configuration the run started with is in the folder; a resume must match it.
    started = json.loads((out / "run_config.json").read_text())
    assert started["learning_rate"] == 5e-4 and started["num_generations"] == 4
    assert main(run_args(tiny_model_dir, out, "--resume", "true", "--learning_rate", "0.1")) == 2
    message = capsys.readouterr().err
    assert "learning_rate: 0.0005 -> 0.1" in message and "max_stage_steps" in message
    changed = run_args(
        tiny_model_dir, out, "--resume", "true", "--memory_size", "7", "--task", "countdown",
        "--reward_signals", '{"correctness": 1.0}'
    )  # fmt: skip
    assert main(changed) == 2
    assert re.search(r"memory_size: 50 -> 7.*task: 'arithmetic'", capsys.readouterr().err)
    assert json.loads((out / "run_config.json").read_text()) == started

    # Options documented as safe to change on resume are accepted.
    safe = ["--max_stage_steps", "3", "--log_level", "warning", "--logging_steps", "2"]
    assert main(run_args(tiny_model_dir, out, "--resume", "true", *safe)) == 0
    assert json.loads((out / "curriculum_state.json").read_text())["finished"] is True
    assert (out / "warmup" / "model.safetensors").exists()


def test_a_resume_needs_no_retyping(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """A run started with overrides of the default recipe, interrupted in its warm-up, resumes
    with `--output_dir` and `--resume true` alone: it trains and evaluates with the options
    it recorded (4 held-out prompts, one step), not configs/tiny.yaml's; an option named on
    the command line is compared with the record."""
    from trl import SFTTrainer

    import pipeline.evaluate.first_attempts as first_attempts

    out = tmp_path / "run"
    started = [
        "--model_name_or_path", tiny_model_dir, "--output_dir", str(out), "--eval_prompts", "4",
        "--warmup_sft_steps", "2", "--max_level", "1", "--min_stage_steps", "1",
        "--max_stage_steps", "1", "--promote_window", "4", "--prompts_per_stage", "8",
        "--per_device_train_batch_size", "8", "--num_generations", "4",
        "--max_completion_length", "4", "--reflection_max_completion_length", "4",
        "--save_strategy", "no", "--disable_tqdm", "true",
    ]  # fmt: skip

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(SFTTrainer, "train", interrupted)
    assert main(started) == 130
    monkeypatch.undo()
    capsys.readouterr()
    resume = ["--output_dir", str(out), "--resume", "true"]
    assert main([*resume, "--eval_prompts", "8"]) == 2
    assert "started with other options (eval_prompts: 4 -> 8): " in capsys.readouterr().err

    evaluated = []
    evaluate = first_attempts.evaluate_first_attempts

    def counted(model, tokenizer, task, level, n, **kwargs):
        evaluated.append(n)
        return evaluate(model, tokenizer, task, level, n, **kwargs)

    monkeypatch.setattr(first_attempts, "evaluate_first_attempts", counted)
    assert main(resume) == 0, capsys.readouterr().err
    assert evaluated == [4]
    state = json.loads((out / "curriculum_state.json").read_text())
    assert state["finished"] and [s["steps"] for s in state["stages"]] == [1]
