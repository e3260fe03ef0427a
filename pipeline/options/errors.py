"""How a command reports a bad option or input: a UsageError, printed by `run_command` as
one line, `error: <what> (<value>): <what to do>`, with exit code 2."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_UNSET = object()


class UsageError(Exception):
    """A bad option or input, reported as `error: <what> (<value>): <what to do>`, exit code 2.

    `UsageError("--task: unknown task", "arithmetik", "choose one of arithmetic, countdown")`;
    a message that already has that form is given alone.
    """

    def __init__(self, what: str, value: Any = _UNSET, todo: str = "") -> None:
        text = what if value is _UNSET else f"{what} ({value})"
        super().__init__(f"{text}: {todo}" if todo else text)


@contextmanager
def usage_errors(*kinds: type[Exception]) -> Iterator[None]:
    """Turn `kinds` (default ValueError) raised inside into a UsageError with their message:
    for the checks of the libraries and dataclasses a command calls while it reads options."""
    caught = kinds or (ValueError,)
    try:
        yield
    except caught as err:
        raise UsageError(str(err)) from err


def notice(message: str) -> None:
    """One line on stderr that is not an error (an alias used, a default applied)."""
    print(f"note: {message}", file=sys.stderr)
