"""How a command reports what went wrong, in one line on stderr (`run_command` prints it):

- a bad option or input: a UsageError, `error: <what> (<value>): <what to do>`, exit code 2,
  before anything is written;
- a fault the user suffers (a damaged file the command reads, a full or read-only disk):
  `error: <what>: <what to do>`, exit code 1 (`fault_line` knows which errors these are);
- an interrupt (Ctrl-C): `interrupted: <how to resume>`, exit code 130.

Anything else is a bug of the project and keeps its traceback."""

from __future__ import annotations

import errno
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


class Interrupted(Exception):
    """Ctrl-C during a command that can be resumed; its message is the command that
    resumes it (`run_command` prints it and exits with 130)."""


NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def fault_line(err: BaseException) -> str | None:
    """The one line for a fault the user can suffer (None: not one, a bug keeps its traceback):
    a damaged curriculum state file, a full or read-only disk, damaged weights."""
    from curriculum.state import CorruptStateError

    if isinstance(err, CorruptStateError):
        return str(err)
    if isinstance(err, OSError) and err.errno in NO_SPACE + READ_ONLY:
        where = err.filename or "the output folder"
        if err.errno in NO_SPACE:
            return (
                f"no space left to write {where} ({err.strerror}): free some space, then "
                "resume with the same command and --resume true; the last complete "
                "checkpoint and the state file are kept"
            )
        return (
            f"cannot write {where} ({err.strerror}): choose a folder you can write (--output_dir)"
        )
    if type(err).__name__ == "SafetensorError":  # safetensors' own, raised for a cut file
        return f"a weights file is damaged ({err}): delete that checkpoint or save it again"
    return None
