"""Running a command under the convention: --help from the stored text; a UsageError as one
line with exit code 2, a fault (`fault_line`) as one line with exit code 1, an interrupt as
one line with exit code 130, each without a traceback (`--log_level debug` adds it)."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType

from pipeline.options.errors import Interrupted, UsageError, fault_line
from pipeline.options.parsing import peek_option


def wants_help(argv: Sequence[str]) -> bool:
    """Whether the command line asks for the help (which then ignores everything else)."""
    return any(arg in ("-h", "--help", "--help_all") for arg in argv)


def run_command(
    body: Callable[[list[str]], int],
    argv: Sequence[str] | None,
    help_text: Callable[[], str],
    help_all: Callable[[], str] | None = None,
) -> int:
    """Run a command's `body(argv)` under the convention (`pipeline.options`); returns its exit code.

    `--help` prints `help_text()` (the project's options, stored) and returns 0; `--help_all`
    prints `help_all()`, every option the parser takes (it imports trl to build it). A
    UsageError is printed as one line and
    returns 2, a fault the user suffers (a damaged file, a full or read-only disk) returns
    1, an interrupt 130 (with the command that resumes, where the body raised
    `Interrupted`); `--log_level debug` (on the command line or in the recipe) prints the
    traceback before the line.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if wants_help(argv):
        everything = "--help_all" in argv and help_all is not None
        sys.stdout.write(help_all() if everything else help_text())
        return 0
    try:
        return body(argv)
    except UsageError as err:
        return _one_line(argv, f"error: {err}", 2)
    except Interrupted as err:
        return _one_line(argv, f"interrupted: resume with `{err}`", 130)
    except KeyboardInterrupt:
        return _one_line(argv, "interrupted", 130)
    except Exception as err:
        line = fault_line(err)
        if line is None:
            raise  # a bug of the project: its traceback
        return _one_line(argv, f"error: {line}", 1)


def _one_line(argv: list[str], line: str, code: int) -> int:
    """Print `line` (after the traceback under `--log_level debug`); return `code`."""
    if peek_option(argv, "log_level") == "debug":
        traceback.print_exc()
    print(line, file=sys.stderr)
    return code


def stored_help(module: ModuleType, prog: str) -> str | None:
    """The --help text of `prog` that `module` stores (`TEXTS`), if it was written with the
    installed versions of the libraries whose options it lists (`LIBRARIES`); else None."""
    from importlib.metadata import PackageNotFoundError, version

    for name, written_with in module.LIBRARIES.items():
        try:
            if version(name) != written_with:
                return None
        except PackageNotFoundError:
            return None
    return module.TEXTS.get(prog)
