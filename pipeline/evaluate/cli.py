"""Evaluate a model's first attempts on one task level: no reflection, as deployed.

Usage:

    python -m pipeline.evaluate --model_name_or_path runs/demo/stage_2   # a run's: as its stage line
    python -m pipeline.evaluate --model_name_or_path runs/demo/final --task arithmetic --level 1
    python -m pipeline.evaluate --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --task countdown \\
        --level 2 --num_prompts 100 --task_config '{"reveal_answer": false}' --output_json eval.json
    python -m pipeline.evaluate --config eval.yaml --level 3     # a recipe, one value changed

`--model_name_or_path` takes a full model folder, a PEFT adapter folder, a run's stage
folder or a hub id. A stage folder that holds no model yet (an unfinished stage) is scored
at its latest trainer checkpoint, and the command names it. An adapter trained on a 4-bit
base is evaluated on that 4-bit base (its folder records it; `--load_in_4bit true`
quantizes a plain model or hub id too). Prints `mean_reward: ...` and `success_rate: ...`,
one line each; `--output_json` also writes the result (summary and a few samples).
Prompts are held out from training: see `pipeline.evaluate.first_attempts.held_out_seed`.

A folder a run wrote (the run's, a stage's, final/, warmup/, a checkpoint) brings the
run's task, task options, reward weights, prompt count and completion length with it
(`pipeline.evaluate.run_folder`); options on the command line override them. So
`--model_name_or_path runs/x/stage_2` reports the same weighted evaluation as the stage
line, on the same prompts, none of which the run trained on.

The options follow the project's convention (`pipeline.options`): a TrlParser dataclass,
`--config`, booleans as true|false, one-line errors with exit code 2. The old spellings
`--model`, `--n`, `--json`, `--no_progress` and `--no-load_in_4bit` still work, with a notice.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipeline.options import UsageError, check_output_path, run_command, usage_errors

PROG = "python -m pipeline.evaluate"
USAGE = f"{PROG} --model_name_or_path PATH [--task NAME] [--level N] [--option VALUE ...]"
ALIASES = {
    "--model": ["--model_name_or_path"],
    "--n": ["--num_prompts"],
    "--json": ["--output_json"],
    "--no_progress": ["--disable_tqdm", "true"],
}


@dataclass
class EvaluateArguments:
    """What `python -m pipeline.evaluate` scores, on which prompts, and how it generates."""

    model_name_or_path: str = field(
        metadata={
            "help": "Model folder, PEFT adapter folder, a run's stage folder (an unfinished "
            "stage: its latest checkpoint) or hub id. Was --model."
        }
    )
    task: str | None = field(
        default=None,
        metadata={
            "help": "Task family name, e.g. arithmetic, or your own Task subclass as "
            "package.module:ClassName (None: the run's, for a folder a run wrote)."
        },
    )
    level: int | None = field(
        default=None,
        metadata={"help": "Difficulty level (1..N; None: the stage's, or the run's last)."},
    )
    num_prompts: int | None = field(
        default=None,
        metadata={"help": "Held-out prompts (None: the run's eval_prompts, else 64). Was --n."},
    )
    task_config: list[str] | None = field(
        default=None,
        metadata={
            "help": "Task config: one JSON object or key=value pairs (None: the run's).",
            "metavar": "KEY=VALUE",
        },
    )
    weights: list[str] | None = field(
        default=None,
        metadata={
            "help": "Score the weighted reward of these signals (as in training) instead of the "
            "task reward: one JSON object or signal=weight pairs (None: the run's "
            "reward_signals, as its stage line; the task reward for a model of no run). An "
            "agent environment's get_reward is added at the weight training gave it.",
            "metavar": "SIGNAL=WEIGHT",
        },
    )
    seed: int | None = field(
        default=None, metadata={"help": "Seed of the prompts (None: the level's held-out seed)."}
    )
    max_new_tokens: int | None = field(
        default=None,
        metadata={
            "help": "Longest completion in tokens (None: the run's max_completion_length, "
            "else 256)."
        },
    )
    batch_size: int = field(default=16, metadata={"help": "Prompts per generate call."})
    do_sample: bool = field(default=False, metadata={"help": "Sample instead of greedy decoding."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (do_sample)."})
    backend: Literal["auto", "unsloth", "transformers"] | None = field(
        default=None,
        metadata={"help": "auto | unsloth | transformers (None: $ERL_BACKEND, else auto)."},
    )
    load_in_4bit: bool | None = field(
        default=None,
        metadata={
            "help": "Load the base in 4-bit NF4 (None: when the adapter folder records a 4-bit "
            "base; true also quantizes a plain model or hub id, as a 4-bit run's base).",
            "nargs": "?",
            "const": True,
        },
    )
    output_json: str | None = field(
        default=None, metadata={"help": "Also write the result as JSON to this file. Was --json."}
    )
    disable_tqdm: bool = field(default=False, metadata={"help": "Hide the progress bar."})
    threads: int | None = field(
        default=None,
        metadata={
            "help": "torch threads on a CPU (unset: OMP_NUM_THREADS when set, else the cores no "
            "other process keeps busy). Ignored on a GPU."
        },
    )
    log_level: Literal["passive", "debug", "info", "warning", "error", "critical"] = field(
        default="passive", metadata={"help": "debug: a refused option also prints its traceback."}
    )

    def validate(self) -> None:
        """Reject a bad count or temperature, naming it."""
        for name in ("num_prompts", "max_new_tokens", "batch_size", "threads"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UsageError(
                    f"--{name} must be >= 1", getattr(self, name), "give a positive count"
                )
        if self.do_sample and not (math.isfinite(self.temperature) and self.temperature > 0):
            raise UsageError(
                "--temperature must be a finite number > 0 with --do_sample true",
                self.temperature,
                "e.g. 1.0",
            )
        if self.output_json:
            check_output_path(self.output_json, "--output_json", folder=False)


def parse_key_values(items: list[str] | dict, option: str) -> dict[str, Any]:
    """A dict from one JSON object or from `key=value` pairs (values parsed as JSON if
    they can be: `n=3` is 3, `reveal_answer=true` is True, `name=abc` is "abc"); a mapping
    (from a recipe) as it is."""
    if isinstance(items, dict):
        return dict(items)
    if len(items) == 1 and items[0].lstrip().startswith("{"):
        value = json.loads(items[0])
        if not isinstance(value, dict):
            raise ValueError(f"{option} must be a JSON object, got {items[0]!r}")
        return value
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{option} expects key=value pairs or one JSON object, got {item!r}")
        try:
            out[key] = json.loads(text)
        except json.JSONDecodeError:
            out[key] = text
    return out


def evaluator_parser():
    """The command's TrlParser (imports trl)."""
    from pipeline.options import options_parser

    return options_parser((EvaluateArguments,), PROG, usage=USAGE)


def main(argv: list[str] | None = None) -> int:
    """`python -m pipeline.evaluate`; returns the exit code (2: refused, in one line)."""
    from pipeline.lock import released_at_end

    with released_at_end():  # a run folder's lock, while --output_json writes into it
        return run_command(evaluate_from_command_line, argv, _help, _help_all)


def _help() -> str:
    from pipeline.evaluate import help_text as stored
    from pipeline.options import project_help, stored_help

    return stored_help(stored, PROG) or project_help(evaluator_parser())


def _help_all() -> str:
    return evaluator_parser().format_help()


def evaluate_from_command_line(argv: list[str]) -> int:
    """Check every option, then load, generate, score and print."""
    from pipeline.models.backend import activate_backend
    from pipeline.options import check_local_model_early, parse_options, peek_option

    # -- a missing local model is named at once, before the slow imports below
    check_local_model_early(argv, "model_name_or_path", "model")
    # -- the backend first: Unsloth must be imported before transformers/peft/trl
    activate_backend(peek_option(argv, "backend"))
    (args,) = parse_options((EvaluateArguments,), argv, PROG, aliases=ALIASES)
    args.validate()
    if args.disable_tqdm:  # transformers' own bars too (loading the weights)
        from transformers.utils.logging import disable_progress_bar

        disable_progress_bar()
    from pipeline.evaluate.first_attempts import evaluate_first_attempts

    plan = _plan(args)
    folder, model, tokenizer = _load(args, plan.model_path)
    result = evaluate_first_attempts(
        model,
        tokenizer,
        plan.task,
        plan.level,
        plan.num_prompts,
        seed=args.seed,
        max_new_tokens=plan.max_new_tokens,
        batch_size=args.batch_size,
        do_sample=args.do_sample,
        temperature=args.temperature,
        weights=plan.weights,
        environment_weight=sum(plan.environment.values()),
        trained=plan.run.trained(plan.task, plan.level) if plan.run else (),  # held out
        progress=not args.disable_tqdm,
        # An agent task's rounds of tool calls, as its run capped them (None: the task's).
        max_turns=plan.recorded.get("max_tool_calling_iterations"),
    )
    _print_and_write(args, plan, folder, result)
    return 0


@dataclass
class _Plan:
    """What an evaluation scores, resolved from the options and the run that wrote the model."""

    task: Any
    level: int
    weights: dict | None
    environment: dict  # an agent environment's get_reward weight, by environment
    num_prompts: int
    max_new_tokens: int
    model_path: str
    run: Any  # the run whose choices apply (pipeline.evaluate.run_folder), or None
    recorded: dict  # that run's run_config.json


def _plan(args) -> _Plan:
    """The task, level, weights and model before loading anything; a folder the run wrote
    gives what the command line leaves out."""
    from curriculum.tasks.agent import environment_reward_weights
    from pipeline.evaluate.run_folder import find_run, recorded_task, stage_eval_weights
    from pipeline.options import check_level, check_model_source, check_signal_weights, check_task

    with usage_errors():  # a state file that cannot be read says so in one line
        found = find_run(args.model_name_or_path)
    run = found  # the run whose choices apply: none for another task than the run's
    if (
        found
        and args.task
        and args.task not in (found.config["task"], found.config.get("task_class"))
    ):
        run = None
    recorded = run.config if run else {}
    if not args.task and run is None:
        raise UsageError(
            "--task is needed for a model that no run of this project wrote",
            args.model_name_or_path,
            "give --task NAME (and --level N)",
        )
    with usage_errors():  # json.JSONDecodeError is a ValueError too
        task_config = (
            recorded.get("task_config", {})
            if args.task_config is None
            else parse_key_values(args.task_config, "--task_config")
        )
        weights = (
            stage_eval_weights(recorded.get("reward_signals", {}))
            if args.weights is None
            else parse_key_values(args.weights, "--weights")
        )
    task = check_task(args.task or recorded_task(recorded), task_config)
    level = args.level if args.level is not None else run and run.stage_level()
    if level is None:
        raise UsageError(
            "--level is needed: the run has no stage yet", args.model_name_or_path, "give --level N"
        )
    check_level(task, level)
    if weights is not None:
        weights = check_signal_weights(task, weights, "--weights")
    check_model_source(args.model_name_or_path, "--model_name_or_path")
    if args.output_json and (into := _run_folder_of(Path(args.output_json))):
        from pipeline.lock import hold_folder

        hold_folder(into, "--output_json")  # a run writing there: one writer at a time
    return _Plan(
        task=task,
        level=level,
        weights=weights,
        # An agent environment's get_reward, at the weight its run recorded (TRL's otherwise).
        environment=recorded.get("environment_reward", environment_reward_weights(task)),
        num_prompts=args.num_prompts or recorded.get("eval_prompts") or 64,
        max_new_tokens=args.max_new_tokens or recorded.get("max_completion_length") or 256,
        model_path=str(found.model) if found else args.model_name_or_path,
        run=run,
        recorded=recorded,
    )


def _load(args, model_path: str):
    """(the checkpoint folder, model, tokenizer): a run's latest checkpoint when given its
    folder, on the CPU threads asked for."""
    from pipeline.evaluate.first_attempts import load_for_evaluation, resolve_checkpoint
    from pipeline.models.threads import use_cpu_threads

    with usage_errors():
        folder = resolve_checkpoint(model_path)
    if Path(folder) != Path(model_path):
        print(f"model: {folder} (the latest checkpoint in {model_path})")
    elif Path(folder) != Path(args.model_name_or_path):
        print(f"model: {folder} (the run's)")
    if threads := use_cpu_threads(args.threads):
        print(threads)
    try:
        model, tokenizer = load_for_evaluation(folder, load_in_4bit=args.load_in_4bit)
    except (ValueError, OSError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UsageError("--model_name_or_path: cannot load it", folder, reason) from err
    return folder, model, tokenizer


def _print_and_write(args, plan: _Plan, folder, result) -> None:
    """The figures on the console, and in --output_json when asked."""
    weights, environment = plan.weights, plan.environment
    print(f"task: {result.task}  level: {result.level}  n: {result.n}  seed: {result.seed}")
    if weights is not None:  # with the environment's get_reward, where it adds one
        shown = {**weights, **{f"{name}.get_reward": v for name, v in environment.items()}}
        print(f"weights: {', '.join(f'{k}={v:g}' for k, v in shown.items())}")
    print(f"mean_reward: {result.mean_reward:.4f}")
    print(f"success_rate: {result.success_rate:.4f}")
    if result.trained:
        print(f"trained_on: {result.trained} of {result.n} prompts (the level has too few others)")
    if args.output_json:
        from curriculum.atomic import atomic_write_json

        record = {"model": args.model_name_or_path, "checkpoint": folder, "weights": weights}
        if weights is not None and environment:
            record["environment_reward"] = environment
        atomic_write_json(args.output_json, {**record, **result.to_dict()})


def _run_folder_of(path: Path) -> Path | None:
    """The run folder `path` would be written into (its own or an ancestor's), or None."""
    from pipeline.layout import RunLayout

    for folder in path.absolute().parents:
        layout = RunLayout(folder)
        if layout.run_config.exists() or layout.lock.exists():
            return folder
    return None
