"""The curriculum run's options: YAML recipes with command-line overrides (TrlParser).

    python -m pipeline.run --config configs/tiny.yaml --learning_rate 5e-4

Four dataclasses share one command line: `RunConfig` (task, rewards, warm-up, output),
`ModelConfig` (model and LoRA), `CurriculumConfig` (stages) and `ERLConfig` (every
GRPOConfig option plus ERL's), parsed by `pipeline.options`. A bad option, in the YAML
file or on the command line, is a UsageError that names it; what needs the task or the
machine is checked in `pipeline.run.checks`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from curriculum.atomic import atomic_write_json
from curriculum.controller import CurriculumConfig
from curriculum.tasks.dataset_task import DatasetConfig
from pipeline.layout import RunLayout, read_run_config
from pipeline.models.backend import BACKEND_ENV, BACKENDS, activate_backend, resolve_backend
from pipeline.models.loading import ModelConfig
from pipeline.options import (
    UsageError,
    check_model_source,
    cuda_bf16,
    named_options,
    options_parser,
    parse_options,
    peek_option,
    usage_errors,
)
from pipeline.run.distributed import backend_for_processes, launched_processes

PROG = "python -m pipeline.run"
# The `dataset` family's options, named in --task_config's help (they live in its config).
DATASET_OPTIONS = [f.name for f in fields(DatasetConfig)]
METHODS = ("erl", "grpo", "sdpo")
"""The trainers a run can train with (`pipeline.run.methods`); erl is the default."""
DEFAULT_RECIPE = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"


@dataclass
class RunConfig:
    """How to train, on what, how it is rewarded, the warm-up, and what the run writes."""

    method: str = field(
        default="erl",
        metadata={
            "help": "Training method: erl (ERLTrainer), grpo (the backend's GRPOTrainer) or sdpo "
            "(TRL's SDPOTrainer, the task's feedback as the teacher's context)."
        },
    )
    task: str = field(
        default="arithmetic",
        metadata={
            "help": "Task family (see curriculum.tasks.list_tasks()), or your own Task subclass "
            "as package.module:ClassName (docs/own_task.md)."
        },
    )
    task_config: str = field(  # a mapping from YAML, a JSON string from the command line
        default_factory=dict,
        metadata={
            "help": "Task options: a YAML mapping, or JSON on the command line, e.g. "
            '\'{"dataset": "chain_sum"}\'. The dataset family\'s: '
            f"{', '.join(DATASET_OPTIONS)} (docs/tasks.md)."
        },
    )
    reward_signals: str = field(  # a mapping from YAML, a JSON string from the command line
        default_factory=lambda: {"correctness": 1.0},
        metadata={
            "help": "Reward signal -> weight (they become reward_funcs and reward_weights); "
            'a YAML mapping or JSON, e.g. \'{"correctness": 0.7, "milestones": 0.3}\'.'
        },
    )
    reward_models: str = field(  # a mapping from YAML, a JSON string from the command line
        default_factory=dict,
        metadata={
            "help": "Learned reward models beside reward_signals: name -> {path, weight, objectives, "
            "pairwise}; see pipeline/reward_model/signals.py and `python -m pipeline.reward_model`."
        },
    )
    preference_functions: str = field(  # a mapping from YAML, a JSON string from the command line
        default_factory=dict,
        metadata={
            "help": "Human-feedback judges scoring a group by win rate: name -> "
            '{function: "module:function", weight}; the function is (prompt, a, b) -> [0, 1].'
        },
    )
    fallback_reward: float = field(
        default=-0.5, metadata={"help": "Reward of a completion that cannot be parsed or scored."}
    )
    length_budget: int = field(
        default=2000,
        metadata={"help": "Characters a completion may use before the length signal penalises it."},
    )
    prompts_per_stage: int = field(
        default=100, metadata={"help": "Training prompts generated per stage."}
    )
    eval_prompts: int = field(
        default=32,
        metadata={"help": "Held-out prompts per stage for the first-attempt evaluation (0: skip)."},
    )
    warmup_sft_steps: int = field(
        default=0,
        metadata={"help": "SFT steps on reference solutions before the first stage (0: none)."},
    )
    warmup_sft_examples: int = field(
        default=2000, metadata={"help": "Reference solutions for the warm-up."}
    )
    warmup_sft_batch_size: int = field(default=32, metadata={"help": "Warm-up batch size."})
    warmup_sft_learning_rate: float = field(
        default=3e-3, metadata={"help": "Warm-up learning rate."}
    )
    build_tiny_model: bool = field(
        default=False,
        metadata={"help": "Build the offline tiny model into model_name_or_path on first use."},
    )
    resume: bool = field(
        default=False,
        metadata={"help": "Continue the run in output_dir from its curriculum_state.json."},
    )
    save_merged: bool = field(
        default=False,
        metadata={
            "help": "Also save final/ merged into a full unquantized model (final_merged/; a 4-bit "
            "base is dequantized first: 16-bit on a GPU, float32 on a CPU)."
        },
    )
    save_gguf: str | None = field(
        default=None,
        metadata={
            "help": "Also export final/ as GGUF with this quantization, e.g. q4_k_m (Unsloth, GPU)."
        },
    )
    baseline_run: str = field(
        default="",
        metadata={
            "help": "Another run's output_dir (e.g. the same recipe with the gate closed: GRPO) "
            "whose r1 curve reward_curve.png draws beside this run's."
        },
    )
    log_generations_every: int = field(
        default=20,
        metadata={"help": "Append sampled generations to generations.jsonl every N reward calls."},
    )
    threads: int | None = field(
        default=None,
        metadata={
            "help": "torch threads on a CPU (unset: OMP_NUM_THREADS when set, else the cores no "
            "other process keeps busy; docs/run.md). Ignored on a GPU."
        },
    )

    def validate(self) -> None:
        """Parse mapping options given as JSON and reject bad values, naming them."""
        if self.method not in METHODS:
            raise UsageError(
                "--method: unknown method", self.method, f"choose {', '.join(METHODS)}"
            )
        self.task_config = _mapping("task_config", self.task_config)
        self.reward_signals = _mapping("reward_signals", self.reward_signals)
        from pipeline.reward_model.signals import (
            check_preference_function_specs,
            check_reward_model_specs,
        )

        self.reward_models = check_reward_model_specs(_mapping("reward_models", self.reward_models))
        self.preference_functions = check_preference_function_specs(
            _mapping("preference_functions", self.preference_functions)
        )
        for name in (
            "prompts_per_stage",
            "length_budget",
            "warmup_sft_batch_size",
            "log_generations_every",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        for name in ("eval_prompts", "warmup_sft_steps", "warmup_sft_examples"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.warmup_sft_steps:
            check_learning_rate("warmup_sft_learning_rate", self.warmup_sft_learning_rate)


def check_learning_rate(name: str, value: float) -> None:
    """Refuse a learning rate that is not a finite number > 0 (a negative one would train
    away from the data, silently)."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise UsageError(f"--{name} must be a finite number > 0", value, "e.g. 5e-4")


def _mapping(name: str, value: Any) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as err:
            raise ValueError(f"{name} must be a JSON object, got {value!r} ({err})") from err
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a mapping, got {value!r}")
    return value


def check_policy_path_early(argv: list[str]) -> None:
    """A policy path that looks local and does not exist, refused before the slow imports
    (trl, transformers), unless the run builds the tiny model there. The full check, hub
    ids included, comes with the others (`pipeline.run.checks`)."""
    source = peek_run_option(argv, "model_name_or_path")
    if source and not _true(peek_run_option(argv, "build_tiny_model")):
        check_model_source(source, "--model_name_or_path", hub=False)


def choose_backend(argv: list[str]) -> str:
    """Resolve the run's backend once and activate it; returns "unsloth" or "transformers".

    Read from the command line, else the recipe, else `ERL_BACKEND` (default auto), before
    trl is imported (the backend decides how trl is imported). Several processes turn
    `auto` into transformers and refuse `unsloth` (Unsloth's GRPO trainer is single-GPU).
    The run writes the result into `ModelConfig.backend`, which every later reader (the
    policy loader, run_config.json) takes.
    """
    given = peek_run_option(argv, "backend")
    requested = given or os.environ.get(BACKEND_ENV, "auto")
    if requested not in BACKENDS:
        where = "--backend" if given else BACKEND_ENV
        raise UsageError(f"{where}: unknown backend", requested, f"choose {', '.join(BACKENDS)}")
    return activate_backend(resolve_backend(backend_for_processes(requested, launched_processes())))


# transformers' `log_level` values that bring back the per-step metric dictionaries.
VERBOSE_LOG_LEVELS = ("info", "debug")


def verbose(log_level: str) -> bool:
    """Whether the run prints every logged metric dictionary: transformers' `log_level`
    set to info or debug (its default, passive, keeps the console quiet)."""
    return log_level in VERBOSE_LOG_LEVELS


def peek_log_level(argv: list[str]) -> str:
    """The `log_level` option, read before the libraries that print on import load."""
    return peek_run_option(argv, "log_level") or "passive"


# ---- The configuration a run started with ---------------------------------------------

# Options a resume may change: where and how much the run logs, checkpoint frequency,
# exports, and the stage step budget. Anything else would make the resumed stages train
# differently from the ones before, so a resume with another value is refused.
RESUME_SAFE_OPTIONS = frozenset(
    {
        "resume",
        "output_dir",
        "max_stage_steps",
        "log_level",
        "log_level_replica",
        "disable_tqdm",
        "logging_strategy",
        "logging_steps",
        "logging_first_step",
        "report_to",
        "run_name",
        "project",
        "trackio_space_id",
        "log_completions",
        "num_completions_to_print",
        "log_generations_every",
        "save_steps",
        "save_total_limit",
        "save_merged",
        "save_gguf",
        "baseline_run",
        "threads",
    }
)


def resolved_config(run, model, curriculum, args) -> dict[str, Any]:
    """Every option of the run after the recipe and overrides, as JSON values (option
    names are unique across the four dataclasses)."""
    from dataclasses import asdict

    options = {**asdict(run), **asdict(model), **asdict(curriculum), **args.to_dict()}
    return _json_values(json.loads(json.dumps(options, default=str)))


def _json_values(value: Any) -> Any:
    """`value` with NaN and infinities as text: strict JSON has no place for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {k: _json_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_values(v) for v in value]
    return value


# What an older run_config.json, written before an option existed, trained with: always ERL,
# one reflection per gated attempt (the value of each that trains as those runs did).
BEFORE_THE_OPTION = {"method": "erl", "reflections_per_group": 0}

# Recorded beside the options, derived from them: `task_class` is where the class of
# `task` lives (module:Class), so that a resume and pipeline.evaluate find a user's task.
# `memory_policy` is what the reflection memory admits and how it ranks (ReflectionMemory's
# own options, not ERLConfig's): a resume keeps the policy its run started with.
# `environment_reward` is the agent environment's `get_reward` that TRL trains on beside the
# signals ({class name: weight}, {} for none), so that pipeline.evaluate scores it too.
RECORDED_ONLY = frozenset({"task_class", "memory_policy", "environment_reward"})


def memory_policy(path: Path) -> dict[str, bool]:
    """The memory options a run keeps: those its run_config.json at `path` recorded (a run
    from before the record trained with the paper's, `PAPER_POLICY`, the defaults then), or,
    for a new run, ReflectionMemory's defaults. So a resume never changes what its memory
    admits."""
    from pipeline.erl.memory import PAPER_POLICY, ReflectionMemory

    if path.exists():
        return read_run_config(path).get("memory_policy", PAPER_POLICY)
    return ReflectionMemory(0).policy


def check_resume_config(output_dir: Path, config: dict[str, Any]) -> None:
    """On a resume, refuse `config` if an option outside RESUME_SAFE_OPTIONS differs from
    the one the run started with (its run_config.json; a run without one is not checked).
    The resume starts from those (`recorded_options`): only an option the command line or
    its --config recipe names can differ."""
    path = RunLayout(output_dir).run_config
    changes = config_changes(path, config, output_dir)
    if changes:
        raise UsageError(
            f"--resume true: the run in {output_dir} started with other options",
            changes,
            f"leave them out to continue with those in {path}, or start a new run in another "
            f"--output_dir (a resume may change {', '.join(sorted(RESUME_SAFE_OPTIONS))})",
        )


def config_changes(path: Path, config: dict[str, Any], output_dir: Path | None = None) -> str:
    """The options outside RESUME_SAFE_OPTIONS in which `config` differs from the run_config.json
    at `path`, as "name: old -> new; ..." ("" when none differs or there is no such file).

    A run that started with an ERLConfig option since removed (`REMOVED_OPTIONS`) is refused
    in one line naming it, unless it kept the option's default: then it trained as today's
    code does."""
    from pipeline.erl.config import REMOVED_OPTIONS

    if not path.exists():
        return ""
    started = BEFORE_THE_OPTION | read_run_config(path)
    for name, (default, why) in REMOVED_OPTIONS.items():
        value = started.pop(name, default)
        if value != default:
            raise UsageError(
                f"the run in {output_dir or path.parent} started with option {name}, which no "
                "longer exists",
                value,
                f"ERLConfig option {name} was {why}; start a new run in another --output_dir",
            )
    differing = sorted(
        key
        for key in set(started) | set(config)
        if key not in RESUME_SAFE_OPTIONS | RECORDED_ONLY and started.get(key) != config.get(key)
    )
    return "; ".join(f"{k}: {started.get(k)!r} -> {config.get(k)!r}" for k in differing)


def record_config(output_dir: Path, config: dict[str, Any]) -> None:
    """Save `config` as the run's run_config.json (the main process, once it starts)."""
    atomic_write_json(RunLayout(output_dir).run_config, config)


def with_default_recipe(argv: list[str]) -> list[str]:
    """`argv` with `--config configs/tiny.yaml` in front when it names no recipe (a plain
    `python -m pipeline.run` is the offline demo), unless it resumes a run that recorded
    its options: those are then what it does not name (`recorded_options`)."""
    argv = list(argv)
    named = "--config" in argv or any(a in ("-h", "--help") for a in argv)
    if not named and not recorded_options(argv):
        argv = ["--config", str(DEFAULT_RECIPE), *argv]
    return argv


def recorded_options(argv: list[str]) -> dict[str, Any]:
    """On `--resume true`, the options the run in --output_dir started with (its
    run_config.json): a resume continues with them, under those its command line and its
    --config recipe name. {} for a new run, or a run from before the record."""
    given = peek_option(argv, "resume") or ("true" if "--resume" in argv else None)  # or bare
    if not _true(given):
        return {}
    recipe = argv if "--config" in argv else ["--config", str(DEFAULT_RECIPE), *argv]
    output_dir = peek_option(recipe, "output_dir")
    path = RunLayout(output_dir).run_config if output_dir else None
    if path is None or not path.is_file():
        return {}
    recorded = BEFORE_THE_OPTION | read_run_config(path)
    return recorded | {"output_dir": output_dir}  # the folder, as given now


def peek_run_option(argv: list[str], name: str) -> str | None:
    """Option `name` as the run will read it, before parsing: the command line, its
    recipe (`with_default_recipe`), then the options a resumed run recorded."""
    value = peek_option(with_default_recipe(argv), name)
    if value is None:
        value = recorded_options(argv).get(name)
    return None if value is None else str(value)


def _true(value: str | None) -> bool:
    """A boolean option's text (peeked, before parsing) as HfArgumentParser reads it."""
    return (value or "").lower() in ("true", "yes", "t", "y", "1")


def run_parser():
    """The run's TrlParser, as `--help` shows it (no machine-dependent defaults); importing
    ERLConfig activates the backend (from ERL_BACKEND) if none is active yet."""
    from pipeline.erl.config import ERLConfig

    parser = options_parser(_dataclasses(ERLConfig), PROG)
    parser.set_defaults(**RUN_DEFAULTS)  # so that --help shows the run's own defaults
    return parser


def _dataclasses(erl_config: type) -> tuple[type, ...]:
    return (RunConfig, ModelConfig, CurriculumConfig, erl_config)


def _check_precision(namespace) -> None:
    """bf16 asked for where transformers would refuse it with a message about `use_cpu`."""
    if namespace.bf16 and not namespace.use_cpu and not cuda_bf16():
        raise UsageError(
            "--bf16 needs a CUDA GPU with bf16, and this machine has none",
            namespace.bf16,
            "pass --bf16 false (or add --use_cpu true to autocast bf16 on the CPU, slowly)",
        )


# Defaults of the run that differ from TRL's: metrics every step (TRL's 10 left a short
# stage with no metrics.jsonl, no r2 in its stage line and no r1/r2 on its progress bar).
RUN_DEFAULTS = {"logging_steps": 1}


def parse_run_config(argv: list[str], options_for: tuple[str, ...] = ()):
    """(RunConfig, ModelConfig, CurriculumConfig, ERLConfig) from a recipe and overrides;
    on a resume, from the options its run recorded and those the command line names.

    Without a CUDA GPU that has bf16, bf16 defaults to off (TRL's default turns it on and
    transformers then refuses the machine); `logging_steps` defaults to 1 (RUN_DEFAULTS). A bad option is a UsageError naming it, and so
    is an option the user gives that no method of `options_for` reads (default: the run's
    own method; `check_options_read`). Call after `activate_backend` (or
    `choose_backend`): this imports trl.
    """
    from pipeline.erl.config import REMOVED_OPTIONS, ERLConfig

    # The record's options (not RECORDED_ONLY's, nor one since removed); without
    # generation_batch_size, recorded as derived from steps_per_generation (or the reverse):
    # GRPOConfig refuses both given.
    names = {f.name for cls in _dataclasses(ERLConfig) for f in fields(cls) if f.init}
    names.discard("generation_batch_size")
    recorded = {k: v for k, v in recorded_options(argv).items() if k in names}
    run, model, curriculum, args = parse_options(
        _dataclasses(ERLConfig),
        with_default_recipe(argv),
        PROG,
        defaults=RUN_DEFAULTS | ({} if cuda_bf16() else {"bf16": False}) | recorded,
        check=_check_precision,
        removed={name: why for name, (_, why) in REMOVED_OPTIONS.items()},
    )
    with usage_errors():
        run.validate()
        model.validate()
        curriculum.validate()
    if args.max_steps not in (-1, None):
        raise UsageError(
            "--max_steps is set per stage by the curriculum",
            args.max_steps,
            "give --max_stage_steps instead",
        )
    if args.reward_weights is not None:
        raise UsageError(
            "--reward_weights is set by the run from reward_signals, reward_models and "
            "preference_functions",
            args.reward_weights,
            "give the weights there",
        )
    if args.save_total_limit == 1:
        # The newest checkpoint is marked complete only after the trainer deleted the one
        # before it: with one kept, a kill in between would leave nothing to resume from.
        raise UsageError(
            "--save_total_limit must be >= 2 (or unset) so that a stage can always resume",
            args.save_total_limit,
            "pass --save_total_limit 2",
        )
    check_learning_rate("learning_rate", args.learning_rate)
    for name in ("per_device_train_batch_size", "max_completion_length"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1", getattr(args, name), "give a positive count")
    named, recipe = named_options(argv)
    if not options_for and recipe.get("method") == run.method:  # the recipe chose the method
        named |= set(recipe)
    check_options_read(args, named, options_for or (run.method,))
    return run, model, curriculum, args


# ERLConfig's own options that another method reads too: SDPO's success threshold.
ALSO_READ_BY = {"reward_threshold": ("sdpo",)}


def check_options_read(args, named: set[str], methods: tuple[str, ...]) -> None:
    """Refuse an option of ERLConfig's own (not its GRPOConfig's) in `named` that no method
    of `methods` reads, which it would ignore: `--method grpo --memory_size 7`."""
    from pipeline.erl.config import ERLConfig

    base = ERLConfig.__bases__[0]  # the backend's GRPOConfig
    own = {f.name for f in fields(ERLConfig)} - {f.name for f in fields(base)}
    for name in sorted(named & own):
        readers = ("erl", *ALSO_READ_BY.get(name, ()))
        if not set(readers) & set(methods):
            chosen = (
                f"--method {methods[0]}" if len(methods) == 1 else f"--methods {','.join(methods)}"
            )
            raise UsageError(
                f"--{name} is an option of {' and '.join(readers)} only, which {chosen} "
                "would ignore",
                getattr(args, name),
                f"leave it out, or choose {' or '.join(readers)}",
            )
