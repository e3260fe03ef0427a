"""Task families with difficulty levels: `get_task(name, **config)`, `list_tasks()`."""

from __future__ import annotations

import importlib
from typing import Any

from curriculum.tasks.base import SIGNALS, Evaluation, Row, Task, TaskConfig

# name -> "module:Class". Modules are imported on first use so that a family's optional
# dependencies (reasoning-gym, gymnasium, datasets) load only when that family is asked for.
_REGISTRY: dict[str, str] = {
    "arithmetic": "curriculum.tasks.arithmetic:ArithmeticTask",
    "countdown": "curriculum.tasks.countdown:CountdownTask",
    "frozenlake": "curriculum.tasks.frozenlake:FrozenLakeTask",
    "sokoban": "curriculum.tasks.sokoban:SokobanTask",
    "schedule": "curriculum.tasks.schedule:ScheduleTask",
    "reasoning_gym": "curriculum.tasks.reasoning_gym_adapter:ReasoningGymTask",
    "dataset": "curriculum.tasks.dataset_task:DatasetTask",
    "hidden_rule": "curriculum.tasks.hidden_rule:HiddenRuleTask",
}


def list_tasks() -> list[str]:
    """Names of the built-in task families."""
    return sorted(_REGISTRY)


def get_task(name: str, **config: Any) -> Task:
    """The task family `name` configured with `config`; ValueError for a bad name or value."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown task {name!r}; valid tasks: {list_tasks()}")
    module_name, class_name = _REGISTRY[name].split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(**config)


__all__ = ["SIGNALS", "Evaluation", "Row", "Task", "TaskConfig", "get_task", "list_tasks"]
