"""Code a reader can follow: no function in the packages over 80 lines, and ERLTrainer's
adapter to TRL under 500 (its episodes, step interface and guards live beside it)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "curriculum", "rewards")
MAX_FUNCTION_LINES = 80


def long_functions(root: Path, packages=PACKAGES) -> list[str]:
    """'path:line name (N lines)' for every function over MAX_FUNCTION_LINES, nested ones
    and methods included (decorators not counted)."""
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        where = path.relative_to(root)
                        found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_over_80_lines():
    assert long_functions(REPO) == []


def test_a_planted_long_function_is_found(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "long.py").write_text(f"def long():\n{body}\n")
    assert long_functions(tmp_path, ("pipeline",)) == [
        f"pipeline/long.py:1 long ({MAX_FUNCTION_LINES + 1} lines)"
    ]


def test_the_trl_adapter_stays_under_500_lines():
    lines = len((REPO / "pipeline" / "erl" / "trainer.py").read_text().splitlines())
    assert lines < 500, f"pipeline/erl/trainer.py has {lines} lines"
