"""What a run checks before it writes anything, so that a refused start leaves output_dir
as it was and the corrected command runs without --resume.

    task, controller = check_run(run, model_config, curriculum_config, args, layout, config)

Each refusal is a UsageError, printed in one line: `error: <what> (<value>): <what to do>`.
The options' own values are checked when they are parsed (`pipeline.run.config`); here
come what needs the task, the machine, the model's location or the output folder. What
only loading can tell (a folder without weights) fails at loading, which `cli.main` also
does before the first write.
"""

from __future__ import annotations

from typing import Any

from curriculum.controller import CurriculumController
from curriculum.tasks import Task, task_path
from curriculum.tasks.agent import (
    ENVIRONMENT_REWARD_WEIGHT,
    environment_reward_weights,
    environment_tools,
    is_agent_task,
)
from pipeline.evaluate.run_folder import recorded_task
from pipeline.layout import RunLayout
from pipeline.options import (
    UsageError,
    check_level,
    check_model_source,
    check_output_path,
    check_signal_weights,
    check_task,
    notice,
    usage_errors,
)
from pipeline.run.checkpoints import check_output_dir
from pipeline.run.config import check_resume_config
from pipeline.run.distributed import check_parallelism
from pipeline.run.lock import hold_output_dir


def check_run(
    run, model, curriculum, args, layout: RunLayout, config: dict[str, Any]
) -> tuple[Task, CurriculumController]:
    """Every check of a start, in the order a user would fix them (what to train, with which
    model, on this machine, where); returns the task and a fresh controller (the run loads
    its saved state into it)."""
    task = check_task(_task_to_load(run, layout), run.task_config)
    config["task_class"] = task_path(task)  # recorded: a resume and evaluate find it again
    config["environment_reward"] = environment_reward_weights(task)  # evaluate scores it too
    controller = check_levels(curriculum, task)
    check_signal_weights(task, run.reward_signals, "--reward_signals")
    check_agent_task(task, (run.method,), run, args)
    check_model_sources(run, model)
    check_exports(run, model)
    check_machine(model, args)
    check_parallelism(args)
    check_output_path(layout.root, "--output_dir")  # before the lock makes the folder
    hold_output_dir(layout, run.resume)  # before the folder is read: one writer at a time
    check_output_dir(layout, run.resume)
    if run.resume:
        check_resume_config(layout.root, config)
    return task, controller


def _task_to_load(run, layout: RunLayout) -> str:
    """--task as given; on a resume of a run whose task was registered by name in the
    process that started it (`register_task`), the class that run recorded."""
    if run.resume and layout.run_config.exists():
        recorded = layout.recorded_config()
        if recorded.get("task") == run.task:
            return recorded_task(recorded)
    return run.task


def check_agent_task(task: Task, methods: tuple[str, ...], run, args) -> None:
    """An agent task (`curriculum.tasks.agent`): methods (the run's, or a comparison's)
    and signals that can play episodes, tools TRL can describe to the model, and TRL's
    turn cap; unset, it becomes the task's largest turn limit."""
    if not is_agent_task(task):
        return
    if "sdpo" in methods:
        option = "--method" if len(methods) == 1 else "--methods"
        raise UsageError(
            f"{option} sdpo cannot train the agent task {task.name}: TRL 1.15's SDPOTrainer "
            "takes no tools= or environment_factory=, so it cannot play multi-turn episodes",
            ",".join(methods),
            "choose erl or grpo",
        )
    learned = [*run.reward_models, *run.preference_functions]
    if learned:
        raise UsageError(
            f"--reward_models / --preference_functions score one reply, not the episodes of "
            f"the agent task {task.name}",
            ", ".join(learned),
            "leave them out (the task's own signals score episodes)",
        )
    from transformers.utils import get_json_schema

    environment = task.make_environment()
    _check_environment_feedback(task, environment)  # a feedback method is no tool to describe
    tools = environment_tools(environment)
    if not tools:
        raise UsageError(
            f"--task {task.name}: its environment {type(environment).__name__} has no tool",
            task_path(task),
            "give it a public method with a docstring (docs/agents.md)",
        )
    for tool in tools:
        try:
            get_json_schema(tool)
        except Exception as err:  # TRL needs the schema to show the tool to the model
            raise UsageError(
                f"--task {task.name}: tool {tool.__name__} of {type(environment).__name__} "
                "cannot be described to the model",
                str(err).splitlines()[0],
                "give it type hints and a Google-style docstring with an Args: section, or "
                "make it private (a leading _) if it is not a tool (docs/agents.md)",
            ) from err
    if callable(getattr(type(environment), "get_reward", None)):
        signals = ", ".join(f"{k} {v:g}" for k, v in run.reward_signals.items())
        notice(
            f"--task {task.name}: {type(environment).__name__}.get_reward is a reward of its own: "
            f"TRL trains on it at weight {ENVIRONMENT_REWARD_WEIGHT:g} beside the task's "
            f"signals ({signals}), and each stage's evaluation scores it the same way"
        )
    if args.max_tool_calling_iterations is None:
        args.max_tool_calling_iterations = task.max_turns()
    elif args.max_tool_calling_iterations < 1:
        raise UsageError(
            "--max_tool_calling_iterations must be >= 1",
            args.max_tool_calling_iterations,
            f"leave it unset for the task's largest turn limit ({task.max_turns()})",
        )


def _check_environment_feedback(task: Task, environment) -> None:
    """A `feedback` on the environment as ERLTrainer takes one through the Python API: not a
    method (TRL would offer it to the model as a tool), and, read on one reset environment,
    a string or None. The run itself scores feedback with the task's judge."""
    from pipeline.erl.step import environment_feedback, refuse_feedback_method

    try:
        refuse_feedback_method(type(environment))
        # On the class (a property, not evaluated here) or the instance; __slots__ has no dict.
        if hasattr(type(environment), "feedback") or "feedback" in getattr(
            environment, "__dict__", {}
        ):
            environment.reset(**task.generate(task.levels[0], 1, seed=0)[0])
            environment_feedback(environment)
    except ValueError as err:
        raise UsageError(f"--task {task_path(task)}: {err}") from err


def check_agent_budget(task: Task, tokenizer, max_completion_length: int, level: int) -> None:
    """--max_completion_length must hold one tool call: TRL counts an episode's turns and
    tool results against it, so a budget shorter than the task's own first call cuts every
    episode before a tool runs, and the run trains on nothing but cut calls. The call is
    the first of the reference solution of one row at `level`, rendered as GRPOTrainer
    renders it (needs the tokenizer: checked after loading, still before the first write)."""
    if not is_agent_task(task):
        return
    from pipeline.models.tool_warmup import render_episode

    row = task.generate(level, 1, seed=0)[0]
    environment, prompt = task.start(row)
    try:
        _, mask = render_episode(
            tokenizer, prompt + task.reference(row), environment_tools(environment)
        )
    except ValueError:  # a template TRL cannot split into turns: TRL itself says so at step 1
        return
    start = mask.index(1) if 1 in mask else len(mask)
    call = next((k for k in range(start, len(mask)) if not mask[k]), len(mask)) - start
    if 0 < max_completion_length < call:
        raise UsageError(
            f"--max_completion_length is shorter than one tool call of the agent task "
            f"{task.name} (its solution's first call takes {call} tokens), so no episode "
            "would get a tool's reply",
            max_completion_length,
            f"give at least {call}, and room for the replies and the closing turn",
        )


def check_exports(run, model) -> None:
    """--save_gguf needs Unsloth's GPU stack; --save_merged an adapter to merge."""
    from pipeline.models.backend import unsloth_patches_trainers

    if run.save_gguf and not unsloth_patches_trainers():
        raise UsageError(
            "--save_gguf needs the unsloth backend on a CUDA GPU", run.save_gguf, "leave it out"
        )
    if run.save_merged and not model.use_lora:
        raise UsageError(
            "--save_merged needs --use_lora true: a fully fine-tuned final/ is already merged",
            run.save_merged,
            "leave it out",
        )


def check_machine(model, args) -> None:
    """Refuse settings this machine would silently drop: vLLM without the unsloth backend
    on a GPU, 4-bit without bitsandbytes, fp16 on a CPU."""
    from pipeline.models.loading import check_machine_supports

    with usage_errors():
        check_machine_supports(model)
    if args.fp16 and args.device.type == "cpu":
        # accelerate enables fp16 autocast and its grad scaler only off the CPU.
        raise UsageError(
            "--fp16 needs a GPU: on a CPU accelerate ignores it (no autocast, no grad scaler) "
            "and the run would train in float32 while its config says fp16",
            args.fp16,
            "pass --fp16 false on a CPU (--bf16 true --use_cpu true autocasts on a CPU, slowly)",
        )


def check_levels(curriculum, task: Task) -> CurriculumController:
    """--start_level and --max_level within the task's levels."""
    for name in ("start_level", "max_level"):
        if getattr(curriculum, name) is not None:
            check_level(task, getattr(curriculum, name), f"--{name}")
    with usage_errors():
        return CurriculumController(curriculum, task.num_levels)


def check_model_sources(run, model) -> None:
    """The policy and every learned reward model exist: a local folder, or a hub id the Hub
    (or its cache) has. A missing local path is named at once, without download retries."""
    if not run.build_tiny_model:  # else the run builds the folder before loading it
        check_model_source(model.model_name_or_path, "--model_name_or_path")
    for name, spec in run.reward_models.items():
        check_model_source(spec["path"], f"--reward_models {name}.path")
