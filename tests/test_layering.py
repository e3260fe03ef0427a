"""The layering, read from the imports: every import points down, and none goes in a circle.

    curriculum  <-  rewards  <-  pipeline
    inside pipeline:  layout, models, options  <-  erl, sdpo, lock  <-  evaluate  <-  reward_model
                      <-  run  <-  compare

A module may import its own unit and the units below it, never one above or beside it;
the algorithm (`pipeline.erl`) never imports the run. Imports inside functions count too:
a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("curriculum", "rewards", "pipeline")

# Units and their layers: a module belongs to the longest unit name it starts with.
LAYERS = {
    "curriculum": 0,
    "rewards": 1,
    "pipeline.layout": 2,
    "pipeline.models": 2,
    "pipeline.options": 2,
    "pipeline.erl": 3,
    "pipeline.sdpo": 3,  # beside erl: neither imports the other
    "pipeline.lock": 3,  # one writer per output folder: for the commands above
    "pipeline.evaluate": 4,
    "pipeline.reward_model": 5,
    "pipeline.run": 6,
    "pipeline.compare": 7,  # runs curricula: above the run
    "pipeline": 8,  # pipeline/__init__.py: the public API, which may name anything
}


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit(module: str) -> str:
    return max((u for u in LAYERS if module == u or module.startswith(u + ".")), key=len)


def project_imports(root: Path) -> dict[str, set[str]]:
    """Project module -> the project modules it imports (anywhere in its body)."""
    files = {module_name(root, p): p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package
                    package = module.split(".") if is_package else module.split(".")[:-1]
                    base = ".".join(package[: len(package) - node.level + 1] + [base]).strip(".")
                # `from a import b` imports module a.b when there is one, else a.
                names = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                    for alias in node.names
                ]
            else:
                continue
            targets |= {name for name in names if name in files and name != module}
        graph[module] = targets
    return graph


def violations(root: Path) -> list[str]:
    """Every upward or sideways import, and every import cycle, under `root`."""
    graph = project_imports(root)
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = unit(module), unit(target)
            if a != b and LAYERS[a] <= LAYERS[b]:
                found.append(f"{module} imports {target}: {a} may not depend on {b}")
    # Cycles: a depth-first search that meets a module still on its path.
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = path[path.index(target) :] + [target]
                found.append("import cycle: " + " -> ".join(cycle))
            elif target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def test_the_layering_holds():
    assert violations(REPO) == []


def test_the_algorithm_never_imports_the_run():
    graph = project_imports(REPO)
    erl = {m: t for m, t in graph.items() if unit(m) == "pipeline.erl"}
    assert erl, "no pipeline.erl modules found"
    assert not {t for targets in erl.values() for t in targets if unit(t) == "pipeline.run"}


def planted(tmp_path: Path, module: str, line: str) -> Path:
    """A copy of the packages with `line` appended to `module`'s file."""
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n{line}\n")
    return tmp_path


def test_a_planted_upward_import_fails(tmp_path):
    root = planted(tmp_path, "pipeline.erl.memory", "from pipeline.run.cli import main")
    found = violations(root)
    upward = (
        "pipeline.erl.memory imports pipeline.run.cli: pipeline.erl may not depend on pipeline.run"
    )
    assert upward in found  # (the run imports the memory, so this also closes a cycle)
    assert violations(REPO) == []  # the planted line is what broke it


def test_a_planted_lazy_import_of_a_higher_package_fails(tmp_path):
    body = "def f():\n    from pipeline.models.tiny import build_tiny_model"
    root = planted(tmp_path, "rewards.feedback", body)
    assert any("rewards.feedback imports pipeline.models.tiny" in v for v in violations(root))


def test_a_planted_cycle_fails(tmp_path):
    root = planted(tmp_path, "pipeline.erl.batch", "import pipeline.erl.trainer")
    assert any(
        v.startswith("import cycle:") and "pipeline.erl.batch" in v and "pipeline.erl.trainer" in v
        for v in violations(root)
    )
