"""`python -m pipeline.run`: config handling, the output contract, and kill-and-resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.run import main

REPO = Path(__file__).resolve().parents[1]
TINY_RECIPE = str(REPO / "configs" / "tiny.yaml")
# configs/tiny.yaml, shortened: a few steps per stage, two levels.
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
    "--reflection_max_completion_length",
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
        (["--prompts_per_stage", "0"], "prompts_per_stage must be >= 1, got 0"),
        (["--reward_signals", "{not json"], "reward_signals must be a JSON object"),
        (["--max_steps", "10"], "use max_stage_steps"),
        (["--save_total_limit", "1"], "save_total_limit must be >= 2"),
        (["--plateau_policy", "retry"], "plateau_policy"),
        (["--task", "chess"], "unknown task 'chess'"),
        (["--reward_signals", '{"style": 1.0}'], "style"),
    ],
)
def test_bad_options_are_rejected_with_their_name(tiny_model_dir, tmp_path, extra, message, capsys):
    with pytest.raises((SystemExit, ValueError)) as err:
        main(run_args(tiny_model_dir, tmp_path / "out", *extra))
    assert message in str(err.value) + capsys.readouterr().err


def test_unknown_key_in_a_recipe_is_rejected(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(Path(TINY_RECIPE).read_text() + "\nmemory_sise: 10\n")
    with pytest.raises(SystemExit, match="memory_sise"):
        main(["--config", str(recipe), "--output_dir", str(tmp_path / "out")])


def test_help_lists_every_option_with_its_help(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    for option, help_words in [
        ("--promote_threshold", "rolling mean"),
        ("--reward_signals", "weight"),
        ("--reward_threshold", "Gating threshold"),
        ("--lora_r", "LoRA rank"),
        ("--warmup_sft_steps", "SFT steps"),
    ]:
        assert option in text and help_words in text


@pytest.mark.slow
def test_tiny_run_writes_the_output_contract(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    assert main(run_args(tiny_model_dir, out)) == 0

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
        metrics = [
            json.loads(line) for line in (stage_dir / "metrics.jsonl").read_text().splitlines()
        ]
        assert [m["stage_step"] for m in metrics if "loss" in m] == list(
            range(1, entry["steps"] + 1)
        )
        assert (stage_dir / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert not (stage_dir / "checkpoints").exists()
    AutoModelForCausalLM.from_pretrained(out / "final")
    assert (out / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    generations = [
        json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()
    ]
    assert generations and {"step", "level", "completion", "reward", "feedback", "attempt"} <= set(
        generations[0]
    )
    assert {g["attempt"] for g in generations} <= {1, 2}

    # A finished run's folder is not overwritten by accident.
    with pytest.raises(SystemExit, match="--resume"):
        main(run_args(tiny_model_dir, out))


def _wait_for(predicate, process, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_sigkill_in_stage_two_then_resume(tiny_model_dir, tmp_path):
    """Kill a run in the middle of stage 2, resume it: it finishes, stage 1 is not
    rewritten, and the history has one entry per stage."""
    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "pipeline.run",
        *run_args(
            tiny_model_dir,
            out,
            "--use_lora",
            "true",
            "--lora_r",
            "4",
            "--min_stage_steps",
            "6",
            "--max_stage_steps",
            "6",
        ),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = open(tmp_path / "first.log", "w")
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        in_stage_two = _wait_for(
            lambda: any(
                (out / "stage_2" / "checkpoints").glob("checkpoint-*/curriculum_controller.json")
            ),
            process,
            timeout=600,
        )
        assert in_stage_two, (tmp_path / "first.log").read_text()[-3000:]
        process.send_signal(signal.SIGKILL)
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
    state = json.loads((out / "curriculum_state.json").read_text())
    assert [s["status"] for s in state["stages"]] == ["plateau", "running"] or [
        s["status"] for s in state["stages"]
    ] == ["promoted", "running"]
    stage_one = {p: p.stat().st_mtime_ns for p in (out / "stage_1").iterdir() if p.is_file()}

    resumed = subprocess.run(
        [*command, "--resume", "true", "--save_merged", "true"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming" in resumed.stderr + resumed.stdout
    state = json.loads((out / "curriculum_state.json").read_text())
    assert state["finished"] is True
    assert [s["stage"] for s in state["stages"]] == [1, 2]
    assert all(s["status"] in ("promoted", "plateau") and s["steps"] == 6 for s in state["stages"])
    assert {
        p: p.stat().st_mtime_ns for p in (out / "stage_1").iterdir() if p.is_file()
    } == stage_one
    metrics = [
        json.loads(line) for line in (out / "stage_2" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["stage_step"] for m in metrics if "loss" in m] == [1, 2, 3, 4, 5, 6]
    from peft import PeftConfig
    from transformers import AutoModelForCausalLM

    assert PeftConfig.from_pretrained(out / "final").r == 4
    merged = AutoModelForCausalLM.from_pretrained(
        out / "final_merged"
    )  # LoRA folded into the weights
    assert not any("lora" in name for name, _ in merged.named_parameters())


@pytest.mark.slow
def test_a_run_interrupted_in_the_warmup_resumes(tiny_model_dir, tmp_path, monkeypatch):
    """Ctrl-C during the SFT warm-up: the folder is resumable and the warm-up reruns."""
    from trl import SFTTrainer

    out = tmp_path / "run"

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(SFTTrainer, "train", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main(run_args(tiny_model_dir, out))
    monkeypatch.undo()
    assert (out / "curriculum_state.json").exists() and not (out / "warmup").exists()
    with pytest.raises(SystemExit, match="--resume"):
        main(run_args(tiny_model_dir, out))
    assert main(run_args(tiny_model_dir, out, "--resume", "true")) == 0
    assert json.loads((out / "curriculum_state.json").read_text())["finished"] is True
    assert (out / "warmup" / "model.safetensors").exists()
