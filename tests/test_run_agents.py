"""Agent tasks through `python -m pipeline.run`, `pipeline.evaluate` and `pipeline.compare`:
what is refused up front, and (slow) the agent recipe end to end on a CPU: warm-up on the
simulator's episodes, stages, a SIGKILL mid-stage and its resume, whole episodes in the
log and in the evaluation, GRPO on a 4-bit LoRA base, Unsloth's trainer, two processes,
a comparison."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_multiprocess import run_two
from test_run import run_process

from curriculum.tasks import get_task
from pipeline.erl.experience import read_experience
from pipeline.evaluate.first_attempts import evaluate_first_attempts, load_for_evaluation
from pipeline.run.cli import main

REPO = Path(__file__).resolve().parents[1]
RECIPE = str(REPO / "configs" / "frozenlake_agent.yaml")


def agent_args(output_dir: Path, *extra: str) -> list[str]:
    """The agent recipe, cut to a few steps: a short warm-up, two 2-step stages."""
    model = output_dir.parent / "tiny-tool-model"
    return [
        "--config", RECIPE, "--model_name_or_path", str(model), "--output_dir", str(output_dir),
        "--warmup_sft_steps", "40", "--warmup_sft_examples", "64",
        "--prompts_per_stage", "32", "--eval_prompts", "4",
        "--per_device_train_batch_size", "8", "--num_generations", "4",
        "--min_stage_steps", "2", "--max_stage_steps", "2", "--save_steps", "1",
        "--max_completion_length", "96", "--disable_tqdm", "true",
        *extra,
    ]  # fmt: skip


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--method", "sdpo"], "--method sdpo cannot train the agent task frozenlake_agent"),
        (["--max_tool_calling_iterations", "0"], "--max_tool_calling_iterations must be >= 1"),
        (
            ["--preference_functions", '{"judge": {"function": "judge:prefer", "weight": 1}}'],
            "score one reply, not the episodes",
        ),
    ],
)
def test_what_cannot_play_episodes_is_refused_before_anything_is_written(
    tmp_path, capsys, monkeypatch, extra, message
):
    (tmp_path / "judge.py").write_text("def prefer(prompt, a, b):\n    return 0.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    assert main(agent_args(out, *extra)) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and not (tmp_path / "tiny-tool-model").exists()


def test_a_tool_the_model_cannot_be_shown_is_named(tmp_path, capsys, monkeypatch):
    """A public helper without a docstring would be offered to the model as a tool that
    TRL cannot describe: the run names it and says what to do."""
    (tmp_path / "helper_task.py").write_text(
        "from curriculum.tasks.frozenlake_agent import FrozenLakeAgentTask, FrozenLakeEnv\n"
        "class Env(FrozenLakeEnv):\n"
        "    def score_now(self):\n"
        "        return 1\n"
        "class HelperTask(FrozenLakeAgentTask):\n"
        "    environment_class = Env\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(agent_args(tmp_path / "run", "--task", "helper_task:HelperTask")) == 2
    err = capsys.readouterr().err
    assert "tool score_now of Env cannot be described to the model" in err
    assert "make it private" in err


def test_a_budget_shorter_than_one_tool_call_is_refused_before_anything_is_written(
    tmp_path, capsys
):
    out = tmp_path / "run"
    assert main(agent_args(out, "--max_completion_length", "4")) == 2
    err = capsys.readouterr().err
    assert "--max_completion_length is shorter than one tool call" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_the_budget_check_measures_the_solutions_first_call(tool_model_dir):
    """The refusal's threshold is the first call's tokens as GRPOTrainer renders the turn:
    exactly that many pass, one fewer is refused."""
    from transformers import AutoTokenizer

    from pipeline.options import UsageError
    from pipeline.run.checks import check_agent_budget

    task = get_task("frozenlake_agent")
    tokenizer = AutoTokenizer.from_pretrained(tool_model_dir)
    with pytest.raises(UsageError) as refused:
        check_agent_budget(task, tokenizer, 1, 1)
    call = int(str(refused.value).split("first call takes ")[1].split()[0])
    assert call > 5  # the JSON of a call: name, argument, the tags and the end of turn
    check_agent_budget(task, tokenizer, call, 1)  # exactly one call fits
    with pytest.raises(UsageError):
        check_agent_budget(task, tokenizer, call - 1, 1)


@pytest.mark.parametrize(
    "feedback, message",
    [
        ("    def feedback(self):\n        return 'x'\n", "Env.feedback is a method"),
        ("    @property\n    def feedback(self):\n        return 3\n",
         "Env.feedback must be a string (a property or an attribute), got int"),
    ],
)  # fmt: skip
def test_an_environment_feedback_erl_cannot_read_is_refused_as_the_python_api_refuses_it(
    tmp_path, capsys, monkeypatch, feedback, message
):
    module = f"feedback_task_{len(feedback)}"  # one module per case: Python caches imports
    (tmp_path / f"{module}.py").write_text(
        "from curriculum.tasks.frozenlake_agent import FrozenLakeAgentTask, FrozenLakeEnv\n"
        "class Env(FrozenLakeEnv):\n"
        f"{feedback}"
        "class FeedbackTask(FrozenLakeAgentTask):\n"
        "    environment_class = Env\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    assert main(agent_args(out, "--task", f"{module}:FeedbackTask")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --task {module}:FeedbackTask: ")
    assert message in err[0] and not out.exists()


def test_the_recipe_caps_tool_rounds_at_the_tasks_largest_turn_limit():
    from pipeline.run.checks import check_agent_task
    from pipeline.run.config import choose_backend, parse_run_config

    argv = ["--config", RECIPE]
    choose_backend(argv)
    run, _, _, args = parse_run_config(argv)
    task = get_task(run.task)
    assert args.max_tool_calling_iterations is None
    check_agent_task(task, (run.method,), run, args)
    assert args.max_tool_calling_iterations == task.max_turns() == 16


# ---- End to end (slow) ---------------------------------------------------------------


@pytest.mark.slow
def test_the_agent_recipe_runs_is_killed_mid_stage_resumes_and_evaluates_episodes(tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "pipeline.run", *agent_args(out)]
    run_process(command, ("checkpoint", 1))  # SIGKILL after stage 1's first checkpoint
    state = json.loads((out / "curriculum_state.json").read_text())
    assert [s["status"] for s in state["stages"]] == ["running"]
    assert (out / "warmup" / "model.safetensors").exists()  # the warm-up is not redone

    resumed = run_process(command, None, "--resume", "true")
    assert "SFT warm-up" not in resumed.stdout + resumed.stderr
    assert "resuming" in resumed.stdout + resumed.stderr
    state = json.loads((out / "curriculum_state.json").read_text())
    assert state["finished"] and [s["level"] for s in state["stages"]] == [1, 2]
    assert all(s["eval_reward"] is not None for s in state["stages"])
    steps = [
        json.loads(line)["stage_step"]
        for line in (out / "stage_1" / "metrics.jsonl").read_text().splitlines()
        if "loss" in json.loads(line)
    ]
    assert steps == [1, 2]  # the killed step logged once, after the resume

    records = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    episodes = [r["episode"] for r in records if "episode" in r]
    assert episodes and all(isinstance(m, dict) for e in episodes for m in e)
    metrics = [
        json.loads(line) for line in (out / "stage_1" / "metrics.jsonl").read_text().splitlines()
    ]
    # TRL's tool loop was on (after 40 warm-up steps the model seldom calls a tool yet;
    # the recipe's 300 call ~2 per episode: docs/results.md).
    assert all("tools/call_frequency" in m for m in metrics if "loss" in m)

    # What ERL did is on disk, once per step after the resume: each reflection, and each
    # retry episode with the lesson in its system turn.
    experience = read_experience(out)
    for stage in (1, 2):
        lines = (out / f"stage_{stage}" / "metrics.jsonl").read_text().splitlines()
        counted = sum(json.loads(line)["erl/reflections"] for line in lines if "loss" in line)
        written = [r for r in experience if r["kind"] == "reflection" and r["stage"] == stage]
        assert counted and len(written) == counted
    retries = [r for r in experience if r["kind"] == "retry"]
    assert retries and all(isinstance(r["completion"], list) for r in retries)
    for retry in retries:
        system = retry["retry_prompt"][0]
        assert system["role"] == "system" and retry["lesson"] in system["content"]

    # pipeline.evaluate plays the stage's held-out episodes again, as the stage line did.
    report = tmp_path / "eval.json"
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.evaluate", "--model_name_or_path", str(out / "stage_2"),
         "--output_json", str(report), "--disable_tqdm", "true"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["task"] == "frozenlake_agent" and result["level"] == 2
    assert result["mean_reward"] == pytest.approx(state["stages"][1]["eval_reward"])
    assert all(isinstance(s["completion"], list) for s in result["samples"])


# An environment that owns a reward: 0.25, and 0.25 more a row it stands down the lake, so
# the reward depends on the episode played.
OWNED_REWARD = (
    "from curriculum.tasks.frozenlake_agent import FrozenLakeAgentTask, FrozenLakeEnv\n"
    "class Env(FrozenLakeEnv):\n"
    "    def get_reward(self) -> float:\n"
    "        return 0.25 + 0.25 * self.position[0]\n"
    "class OwnedRewardTask(FrozenLakeAgentTask):\n"
    "    environment_class = Env\n"
)


def test_evaluation_adds_the_environments_own_reward_as_training_does(tmp_path, monkeypatch):
    """With the training weights, an episode's reward is the weighted signals plus the
    environment's get_reward after the replayed episode, at the weight TRL trains it at."""
    from curriculum.tasks.agent import environment_reward_weights
    from pipeline.evaluate.first_attempts import score_completions

    (tmp_path / "owned_reward.py").write_text(OWNED_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    from owned_reward import OwnedRewardTask

    task = OwnedRewardTask()
    assert environment_reward_weights(task) == {"Env": 1.0}
    assert environment_reward_weights(get_task("frozenlake_agent")) == {}
    row = task.generate(2, seed=3, n=1)[0]
    start = json.loads(row["meta"])["start"][0]
    goal = json.loads(row["meta"])["goal"][0]
    assert start != goal  # the reward tells the two episodes apart
    episodes = [task.reference(row), [{"role": "assistant", "content": "I stay."}]]
    weights = {"correctness": 0.7, "milestones": 0.2, "format": 0.1}
    signals = score_completions(task, [row, row], episodes, weights=weights).rewards
    summed = score_completions(
        task, [row, row], episodes, weights=weights, environment_weight=1.0
    ).rewards
    own = [0.25 + 0.25 * goal, 0.25 + 0.25 * start]
    assert summed == pytest.approx([signals[0] + own[0], signals[1] + own[1]])


@pytest.mark.slow
def test_an_environment_that_owns_a_reward_trains_through_every_stage(
    tmp_path, monkeypatch, capsys
):
    """TRL adds an environment's get_reward to the reward list it is given, in place: each
    stage's trainer gets its own list, so stage 2 does not start with one function more
    than its weights, and both stages log the environment's reward beside the task's. The
    run records it, and pipeline.evaluate scores the stage as the stage line did."""
    (tmp_path / "owned_reward.py").write_text(OWNED_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    assert main(agent_args(out, "--task", "owned_reward:OwnedRewardTask")) == 0
    said = capsys.readouterr().err
    assert "Env.get_reward is a reward of its own: TRL trains on it at weight 1" in said
    state = json.loads((out / "curriculum_state.json").read_text())
    assert state["finished"] and [s["level"] for s in state["stages"]] == [1, 2]
    recorded = json.loads((out / "run_config.json").read_text())
    for stage in (1, 2):  # every weighted reward is named in the metrics
        lines = (out / f"stage_{stage}" / "metrics.jsonl").read_text().splitlines()
        logged = [json.loads(line) for line in lines if "loss" in json.loads(line)]
        named = ["Env", *(f"{name}_reward" for name in recorded["reward_signals"])]
        assert logged and all(f"rewards/{name}/mean" in m for m in logged for name in named)
    assert recorded["environment_reward"] == {"Env": 1.0}

    from pipeline.evaluate.cli import main as evaluate

    report = tmp_path / "eval.json"
    argv = ["--model_name_or_path", str(out / "stage_2"), "--output_json", str(report),
            "--disable_tqdm", "true"]  # fmt: skip
    assert evaluate(argv) == 0
    result = json.loads(report.read_text())
    assert result["environment_reward"] == {"Env": 1.0}
    assert result["mean_reward"] == pytest.approx(state["stages"][1]["eval_reward"])
    # ... and that figure holds the environment's reward (at least 0.25 an episode).
    from owned_reward import OwnedRewardTask

    from pipeline.evaluate.run_folder import find_run

    model, tokenizer = load_for_evaluation(str(out / "stage_2"))
    task = OwnedRewardTask()
    alone = evaluate_first_attempts(
        model, tokenizer, task, 2, 4, max_new_tokens=96, weights=recorded["reward_signals"],
        progress=False,
        trained=find_run(str(out / "stage_2")).trained(task, 2),
    )  # fmt: skip
    assert alone.mean_reward <= result["mean_reward"] - 0.25 + 1e-6


@pytest.mark.slow
def test_grpo_trains_an_agent_task_on_a_4bit_lora_base(tmp_path):
    out = tmp_path / "run"
    extra = ["--method", "grpo", "--max_level", "1", "--load_in_4bit", "true",
             "--use_lora", "true", "--lora_r", "4", "--lora_alpha", "8"]  # fmt: skip
    assert main(agent_args(out, *extra)) == 0
    state = json.loads((out / "curriculum_state.json").read_text())
    assert state["finished"] and state["stages"][0]["steps"] == 2
    assert (out / "final" / "adapter_config.json").exists()
    model, tokenizer = load_for_evaluation(str(out / "final"))  # the 4-bit base it recorded
    task = get_task("frozenlake_agent")
    result = evaluate_first_attempts(model, tokenizer, task, 1, 4, max_new_tokens=96)
    assert result.mean_reward == pytest.approx(state["stages"][0]["eval_reward"])


@pytest.mark.slow
def test_an_agent_run_on_unsloths_trainer(tmp_path):
    """The unsloth backend (Unsloth's CPU loader and its generated GRPO trainer under
    ERLTrainer) trains an agent stage: TRL's tool loop runs inside Unsloth's trainer."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "pipeline.run", *agent_args(out, "--max_level", "1")]
    done = run_process(command, None, "--backend", "unsloth")
    assert "Unsloth" in done.stdout + done.stderr
    assert json.loads((out / "run_config.json").read_text())["backend"] == "unsloth"
    state = json.loads((out / "curriculum_state.json").read_text())
    assert state["finished"] and state["stages"][0]["steps"] == 2
    metrics = [
        json.loads(line) for line in (out / "stage_1" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["stage_step"] for m in metrics if "loss" in m] == [1, 2]
    assert all("tools/call_frequency" in m for m in metrics if "loss" in m)


@pytest.mark.slow
def test_an_agent_run_in_two_processes(tmp_path):
    out = tmp_path / "run"
    log = tmp_path / "run.log"
    args = agent_args(out, "--max_level", "1", "--use_cpu", "true")
    # The main process builds the model and warms it up; the other waits and loads it.
    run_two("-m", "pipeline.run", *args, log=log)
    text = log.read_text()
    assert "2 processes (MULTI_CPU" in text and text.count("[stage 1] level 1 | erl") == 1
    state = json.loads((out / "curriculum_state.json").read_text())
    assert state["finished"] and state["stages"][0]["steps"] == 2


@pytest.mark.slow
def test_a_comparison_of_erl_and_grpo_on_an_agent_task(tmp_path, monkeypatch):
    """On a user's environment that owns a reward (`--task module:Class`): every run trains
    on it and the held-out evaluation scores it, as a stage of pipeline.run does."""
    (tmp_path / "owned_reward.py").write_text(OWNED_REWARD)
    root = tmp_path / "compare"
    run_args = agent_args(tmp_path / "unused")[2:]  # the recipe's overrides
    run_args[run_args.index("--output_dir") + 1] = str(root)
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.compare", "--config", RECIPE, "--methods", "erl,grpo",
         "--seeds", "2", "--eval_every", "1", "--task", "owned_reward:OwnedRewardTask",
         *run_args],
        cwd=REPO, env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"},
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    comparison = json.loads((root / "comparison.json").read_text())
    assert comparison["settings"]["methods"] == ["erl", "grpo"]
    assert sorted(run["method"] for run in comparison["runs"]) == ["erl", "erl", "grpo", "grpo"]
    for run in comparison["runs"]:
        folder = root / "runs" / f"{run['method']}-seed{run['seed']}"
        lines = (folder / "stage_1" / "metrics.jsonl").read_text().splitlines()
        assert all("rewards/Env/mean" in json.loads(line) for line in lines if "loss" in line)
    # The evaluation of the shared start (step 0) holds the environment's reward.
    monkeypatch.syspath_prepend(str(tmp_path))
    from owned_reward import OwnedRewardTask

    model, tokenizer = load_for_evaluation(str(root / "runs" / "warmup" / "final"))
    signals = json.loads((root / "runs" / "warmup" / "run_config.json").read_text())
    scored = {
        weight: evaluate_first_attempts(
            model, tokenizer, OwnedRewardTask(), 1, 4, max_new_tokens=96, progress=False,
            weights=signals["reward_signals"], environment_weight=weight,
        ).mean_reward
        for weight in (0.0, 1.0)
    }  # fmt: skip
    assert scored[1.0] >= scored[0.0] + 0.25 - 1e-6
    for run in comparison["runs"]:
        assert run["evals"][0]["mean_reward"] == pytest.approx(scored[1.0])
