"""Task families with difficulty levels: `get_task(name, **config)`, `list_tasks()`, and a
user's own family by import path (`get_task("reverse_task:ReverseTask")`) or by name
after `register_task("reverse", ReverseTask)`.

The Task API a family implements is in `curriculum.tasks.base` and docs/own_task.md; an
agent task, played turn by turn with tools, in `curriculum.tasks.agent` and docs/agents.md;
`check_task_rows` checks an instance keeps it before a run writes anything.
"""

from __future__ import annotations

from curriculum.tasks.agent import AgentTask, Played
from curriculum.tasks.base import SIGNALS, Evaluation, Row, Task, TaskConfig
from curriculum.tasks.registry import (
    check_task_rows,
    get_task,
    list_tasks,
    register_task,
    task_class,
    task_path,
)

__all__ = [
    "SIGNALS",
    "AgentTask",
    "Evaluation",
    "Played",
    "Row",
    "Task",
    "TaskConfig",
    "check_task_rows",
    "get_task",
    "list_tasks",
    "register_task",
    "task_class",
    "task_path",
]
