"""Write the stored --help texts of the project's commands (`help_text.py` in each package).

    python scripts/write_cli_help.py     # after changing an option, its help, or a pin

Each command prints its stored text for --help instead of importing trl and transformers
to build its parser (`pipeline/options/`); tests/test_cli_conventions.py fails while a
stored text differs from the parser's own. The texts are built with the transformers
backend, the one every machine has.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["ERL_BACKEND"] = "transformers"
LIBRARIES = ("transformers", "trl")


def parsers() -> dict[str, dict[str, object]]:
    """Package folder -> {prog: its parser}."""
    from pipeline.compare.config import PROG as COMPARE
    from pipeline.compare.config import compare_parser
    from pipeline.evaluate.cli import PROG as EVALUATE
    from pipeline.evaluate.cli import evaluator_parser
    from pipeline.models.backend import activate_backend
    from pipeline.reward_model.collect import PROG as COLLECT
    from pipeline.reward_model.collect import collector_parser
    from pipeline.reward_model.config import PROG as REWARD_MODEL
    from pipeline.reward_model.config import reward_model_parser
    from pipeline.run.config import PROG as RUN
    from pipeline.run.config import run_parser

    activate_backend("transformers")
    return {
        "pipeline/run": {RUN: run_parser()},
        "pipeline/evaluate": {EVALUATE: evaluator_parser()},
        "pipeline/compare": {COMPARE: compare_parser()},
        "pipeline/reward_model": {
            REWARD_MODEL: reward_model_parser(),
            COLLECT: collector_parser(),
        },
    }


def module_source(texts: dict[str, str]) -> str:
    """A help_text.py holding `texts` and the library versions they were written with."""
    versions = {name: version(name) for name in LIBRARIES}
    lines = [
        '"""The --help texts of this package\'s commands, stored so that --help imports no',
        "trl or transformers. Written by scripts/write_cli_help.py from the parsers: do not edit.",
        '"""',
        "",
        f"LIBRARIES = {versions!r}",
        "TEXTS = {",
    ]
    for prog, text in texts.items():
        lines.append(f"    {prog!r}: (")
        lines += [f"        {line!r}" for line in text.splitlines(keepends=True)]
        lines.append("    ),")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> None:
    from pipeline.options import project_help

    for folder, commands in parsers().items():
        path = REPO / folder / "help_text.py"
        path.write_text(module_source({p: project_help(parser) for p, parser in commands.items()}))
        subprocess.run([sys.executable, "-m", "ruff", "format", "-q", str(path)], check=True)
        print(f"wrote {path.relative_to(REPO)}: {', '.join(commands)}")


if __name__ == "__main__":
    main()
