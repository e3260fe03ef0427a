"""One writer per run folder: a second `pipeline.run` on a live run's folder is refused in
one line, with or without --resume; a SIGKILLed run leaves no lock behind and resumes; and
under a 022 umask every file the run writes is readable by the group, as ordinary writes
are (issue 34)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from pipeline.run.cli import main

REPO = Path(__file__).resolve().parents[1]
TINY_RECIPE = str(REPO / "configs" / "tiny.yaml")
# One level; no warm-up; a stage that would run for ever (a random policy does not reach
# the threshold) unless the resume below shortens it (max_stage_steps is resume-safe).
LIVE = [
    *("--max_level", "1", "--warmup_sft_steps", "0", "--plateau_policy", "stop"),
    *("--prompts_per_stage", "64", "--eval_prompts", "4", "--per_device_train_batch_size", "8"),
    *("--num_generations", "4", "--max_completion_length", "6"),
    *("--reflection_max_completion_length", "6", "--promote_window", "8"),
    *("--min_stage_steps", "3", "--save_steps", "1", "--disable_tqdm", "true"),
]


def argv(tiny_model_dir: str, out: Path, *extra: str) -> list[str]:
    return [
        *("--config", TINY_RECIPE, "--model_name_or_path", tiny_model_dir),
        *("--build_tiny_model", "false", "--output_dir", str(out), *LIVE, *extra),
    ]


def wait_for(condition, process: subprocess.Popen, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the first run did not get that far"
        time.sleep(0.5)


def owner_only(folder: Path) -> list[str]:
    """Files under `folder` that neither the group nor others may read."""
    return sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and not p.stat().st_mode & (stat.S_IRGRP | stat.S_IROTH)
    )


def test_a_live_run_keeps_its_folder_and_a_killed_one_resumes(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    old_umask = os.umask(0o022)  # the test's run and its subprocess write under 022
    try:
        first = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline.run",
                *argv(tiny_model_dir, out, "--max_stage_steps", "100000"),
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            # Training: the state is written and a checkpoint of stage 1 is complete.
            wait_for(
                lambda: list(
                    out.glob("stage_1/checkpoints/checkpoint-*/curriculum_controller.json")
                ),
                first,
            )
            assert (out / ".run.lock").read_text().strip() == str(first.pid)
            for done in out.glob("stage_1/checkpoints/checkpoint-*/curriculum_controller.json"):
                assert owner_only(done.parent) == []  # the trainer's weights included
            # The files a second process would write first (the first run, training,
            # writes only metrics and checkpoints now).
            files = {p: p.stat().st_mtime_ns for p in out.glob("*.json")}

            # A second process is refused, with --resume and without, in one line that
            # names the folder and the holder; it touches nothing.
            for extra in ([], ["--resume", "true"]):
                capsys.readouterr()
                assert main(argv(tiny_model_dir, out, "--max_stage_steps", "100000", *extra)) == 2
                err = capsys.readouterr().err.strip()
                assert err == (
                    f"error: --output_dir: another process is writing this folder ({out}, process "
                    f"{first.pid}): wait for it to end (or stop it) before you start or resume a "
                    "command that writes there, or choose another folder"
                ), err
                assert first.poll() is None
            assert {p: p.stat().st_mtime_ns for p in out.glob("*.json")} == files
            assert (out / ".run.lock").read_text().strip() == str(first.pid)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
        assert first.returncode == -signal.SIGKILL

        # The kernel dropped the lock with its process: the resume runs, in this process.
        capsys.readouterr()
        assert main(argv(tiny_model_dir, out, "--max_stage_steps", "3", "--resume", "true")) == 0
        state = json.loads((out / "curriculum_state.json").read_text())
        assert state["finished"] and [s["status"] for s in state["stages"]] == ["plateau"]
        # The lock was released when the command ended: another resume may start (and
        # reports the finished run).
        assert main(argv(tiny_model_dir, out, "--max_stage_steps", "3", "--resume", "true")) == 0
    finally:
        os.umask(old_umask)

    # Nothing the run wrote (state, config, plots, weights, checkpoints) is owner-only.
    written = {p.name for p in out.rglob("*") if p.is_file()}
    assert {"model.safetensors", "curriculum_state.json", "run_config.json"} <= written
    assert {"reward_curve.png", "metrics.jsonl", "erl_memory.json"} <= written
    assert owner_only(out) == []


def test_a_refused_start_takes_away_the_lock_and_the_folders_it_made(tmp_path, capsys):
    """A start refused before anything was written leaves no lock file and no folder it
    created, parents included (runs/ for runs/new); once the run has written, the folder
    stays and only the lock file goes."""
    out = tmp_path / "runs" / "new"
    argv = ["--output_dir", str(out), "--task", "arithmetic", "--start_level", "9"]
    assert main(argv) == 2  # refused before the lock: the level
    assert not (tmp_path / "runs").exists()
    from pipeline.layout import RunLayout
    from pipeline.lock import released_at_end
    from pipeline.run.lock import hold_output_dir

    with released_at_end():
        hold_output_dir(RunLayout(out), resume=False)
        assert (out / ".run.lock").read_text().strip() == str(os.getpid())
    assert not (tmp_path / "runs").exists()
    with released_at_end():
        hold_output_dir(RunLayout(out), resume=False)
        (out / "curriculum_state.json").write_text("{}")  # the run wrote: the folder stays
    assert sorted(p.name for p in out.iterdir()) == ["curriculum_state.json"]


def test_every_other_writer_of_a_live_folder_is_refused_with_nothing_written(
    tiny_model_dir, tmp_path, capsys
):
    """A reward model trained into a live folder, and an evaluation whose --output_json
    goes into a live run's folder, are refused in one line; outside a run folder the
    evaluation takes no lock and writes its JSON."""
    from filelock import FileLock

    from pipeline.evaluate.cli import main as evaluate
    from pipeline.reward_model.cli import main as reward_model

    live = tmp_path / "live"
    live.mkdir()
    (live / "run_config.json").write_text("{}")
    pairs = tmp_path / "pairs.jsonl"
    row = {"prompt": "1+1", "chosen": "<answer>2</answer>", "rejected": "no"}
    pairs.write_text((json.dumps(row) + "\n") * 8)
    evaluation = [
        *("--model_name_or_path", tiny_model_dir, "--task", "arithmetic", "--level", "1"),
        *("--num_prompts", "2", "--max_new_tokens", "4", "--disable_tqdm", "true"),
    ]
    with FileLock(str(live / ".run.lock"), timeout=0):  # a run writes the folder
        code = reward_model(
            [
                "--pairs",
                str(pairs),
                "--model_name_or_path",
                tiny_model_dir,
                "--output_dir",
                str(live),
            ]
        )
        assert code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "error: --output_dir: another process is writing" in err[0]
        assert evaluate([*evaluation, "--output_json", str(live / "eval.json")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "error: --output_json: another process is writing" in err[0]
        assert sorted(p.name for p in live.iterdir()) == [".run.lock", "run_config.json"]
        assert evaluate([*evaluation, "--output_json", str(tmp_path / "eval.json")]) == 0
    assert json.loads((tmp_path / "eval.json").read_text())["level"] == 1
