"""Where task families are found: the built-in ones by name, a user's own by import path
(`package.module:ClassName`) or by a name given to `register_task`.

    task = get_task("countdown")
    task = get_task("reverse_task:ReverseTask", max_length=8)   # a Task subclass of yours
    register_task("reverse", ReverseTask); task = get_task("reverse")

Importing a module the user named runs the user's own code, as TRL does with reward
functions named in a config; model output is never imported or evaluated. A run records
`task_path(task)` so that a resume and `pipeline.evaluate` find a user's class again.
"""

from __future__ import annotations

import importlib
import inspect
import json
from typing import Any

from curriculum.tasks.base import HELD_OUT_SEED_BASE, Row, Task, is_conversation

# name -> "module:Class". Modules are imported on first use so that a family's optional
# dependencies (reasoning-gym, gymnasium, datasets) load only when that family is asked for.
_BUILT_IN: dict[str, str] = {
    "arithmetic": "curriculum.tasks.arithmetic:ArithmeticTask",
    "countdown": "curriculum.tasks.countdown:CountdownTask",
    "frozenlake": "curriculum.tasks.frozenlake:FrozenLakeTask",
    "frozenlake_agent": "curriculum.tasks.frozenlake_agent:FrozenLakeAgentTask",
    "sokoban": "curriculum.tasks.sokoban:SokobanTask",
    "sokoban_agent": "curriculum.tasks.sokoban_agent:SokobanAgentTask",
    "schedule": "curriculum.tasks.schedule:ScheduleTask",
    "reasoning_gym": "curriculum.tasks.reasoning_gym_adapter:ReasoningGymTask",
    "dataset": "curriculum.tasks.dataset_task:DatasetTask",
    "hidden_rule": "curriculum.tasks.hidden_rule:HiddenRuleTask",
    "hidden_code": "curriculum.tasks.hidden_code:HiddenCodeTask",
    "hidden_code_agent": "curriculum.tasks.hidden_code_agent:HiddenCodeAgentTask",
    "lookup": "curriculum.tasks.lookup:LookupTask",
}
_REGISTERED: dict[str, type[Task]] = {}  # register_task's, in this process


def list_tasks() -> list[str]:
    """Names of the built-in task families and of those registered in this process."""
    return sorted({*_BUILT_IN, *_REGISTERED})


def register_task(name: str, cls: type[Task]) -> None:
    """Make `get_task(name)` (and `--task name`) build `cls`, a subclass of Task; a name of
    a built-in family is refused. ValueError naming what is wrong."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a task name is an identifier such as 'reverse', got {name!r}")
    if name in _BUILT_IN:
        raise ValueError(f"{name!r} is a built-in task family; register yours under another name")
    _REGISTERED[name] = _checked_class(cls, name)


def task_class(name: str) -> type[Task]:
    """The class `name` stands for: a built-in or registered name, or `module:Class`.
    ValueError saying what is wrong: an unknown name, an import that fails, not a Task."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    path = _BUILT_IN.get(name, name)
    if path.count(":") != 1 or not all(path.split(":")):
        raise ValueError(
            f"unknown task {name!r}: choose one of {', '.join(list_tasks())}, or give your own "
            "Task subclass as package.module:ClassName"
        )
    module_name, class_name = path.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        if name in _BUILT_IN:
            raise  # a missing optional dependency of a built-in family: its own message
        raise ValueError(
            f"task {name!r}: cannot import {module_name!r} ({err}); run from the folder that "
            "holds it or put that folder on PYTHONPATH"
        ) from err
    return _checked_class(getattr(module, class_name, None), name)


def _checked_class(cls: Any, name: str) -> type[Task]:
    if not (inspect.isclass(cls) and issubclass(cls, Task)):
        raise ValueError(
            f"task {name!r} is {cls!r}, not a subclass of curriculum.tasks.Task: give the class"
        )
    if inspect.isabstract(cls):
        missing = sorted(cls.__abstractmethods__)
        raise ValueError(f"task {name!r}: {cls.__name__} does not implement {missing}")
    if not isinstance(getattr(cls, "name", None), str) or not cls.name:
        raise ValueError(f"task {name!r}: {cls.__name__} sets no `name` (the rows' task column)")
    return cls


def get_task(name: str, **config: Any) -> Task:
    """The task family `name` configured with `config`; ValueError for a bad name or value."""
    return task_class(name)(**config)


def task_path(task: Task) -> str:
    """`module:Class` of `task`'s class: what a run records to find it again."""
    cls = type(task)
    return f"{cls.__module__}:{cls.__qualname__}"


def check_task_rows(task: Task, levels: list[int] | range | None = None) -> None:
    """That `task` has levels and yields rows in the common schema at each of `levels`
    (default: all), for training and for evaluation, which its verifier scores (the
    reference solves them); ValueError naming the first fault."""
    where = f"task {task.name!r}"
    count = task.num_levels
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"{where}: num_levels must be an integer >= 1, got {count!r}")
    for level in task.levels if levels is None else levels:
        for seed in (0, HELD_OUT_SEED_BASE):  # a training draw and an evaluation draw
            rows = task.generate(level, 1, seed=seed)
            if not isinstance(rows, list) or len(rows) != 1:
                raise ValueError(
                    f"{where}: generate({level}, 1, seed={seed}) gave {rows!r}, not a list of 1 row"
                )
            _check_row(task, level, rows[0], f"{where} level {level}")


def _check_row(task: Task, level: int, row: Row, where: str) -> None:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a row is a dict (see Task.make_row), got {row!r}")
    missing = sorted({"prompt", "task", "level", "answer", "meta"} - set(row))
    if missing:
        raise ValueError(f"{where}: the row lacks {missing}; build it with Task.make_row")
    if not is_conversation(row["prompt"]):
        raise ValueError(f"{where}: prompt must be a list of {{'role', 'content'}} messages")
    if row["level"] != level or not isinstance(row["answer"], str):
        raise ValueError(f"{where}: level must be {level} and answer a string, got {row!r}")
    try:
        meta = json.loads(row["meta"])
        json.dumps(row)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"{where}: meta must be a JSON object string and the row JSON ({err})"
        ) from None
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: meta must hold a JSON object, got {row['meta']!r}")
    evaluation = task.evaluate(row, task.reference(row))
    if not evaluation.solved:
        raise ValueError(
            f"{where}: its reference does not solve its row (reward {evaluation.reward}): "
            "fix reference() or evaluate()"
        )
