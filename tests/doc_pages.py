"""Reading a docs page whose code a test runs as written: its files and its commands."""

from __future__ import annotations

import re
from pathlib import Path

FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def page_blocks(page: Path) -> tuple[dict[str, str], list[str]]:
    """The page's files (a python or yaml block whose first line is `# <name>`) and its
    commands (the lines of its bash blocks), in the page's order. A block of another kind
    fails: every block of such a page is run."""
    files, commands = {}, []
    for language, body in FENCE.findall(page.read_text()):
        first = body.splitlines()[0]
        if language in ("python", "yaml") and re.fullmatch(r"# [\w.]+\.(py|yaml)", first):
            files[first[2:]] = body
        elif language == "bash":
            commands += [line for line in body.splitlines() if line.strip()]
        else:
            raise AssertionError(f"a {language} block the test does not run: {first!r}")
    return files, commands
