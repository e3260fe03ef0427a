"""Running a command under the convention: --help from the stored text, a UsageError as
one line with exit code 2 and no traceback (`--log_level debug` adds it)."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType

from pipeline.options.errors import UsageError
from pipeline.options.parsing import peek_option


def wants_help(argv: Sequence[str]) -> bool:
    """Whether the command line asks for the help (which then ignores everything else)."""
    return any(arg in ("-h", "--help") for arg in argv)


def run_command(
    body: Callable[[list[str]], int], argv: Sequence[str] | None, help_text: Callable[[], str]
) -> int:
    """Run a command's `body(argv)` under the convention (`pipeline.options`); returns its exit code.

    `--help` prints `help_text()` and returns 0. A UsageError is printed as one line and
    returns 2; `--log_level debug` (on the command line or in the recipe) prints the
    traceback before it.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if wants_help(argv):
        sys.stdout.write(help_text())
        return 0
    try:
        return body(argv)
    except UsageError as err:
        if peek_option(argv, "log_level") == "debug":
            traceback.print_exc()
        print(f"error: {err}", file=sys.stderr)
        return 2


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
