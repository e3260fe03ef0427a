"""colab/erl_curriculum.ipynb and its recipe configs/colab_t4.yaml.

The slow test runs the notebook on the CPU as a user would run it on Colab, minus the
cells that only make sense there: those tagged `install` (clone + pip) and `colab-only`
(Drive). `ERL_NOTEBOOK_SMOKE=1` makes the notebook's own switch cell run the recipe on the
offline tiny model, 4-bit NF4 base and LoRA adapter as the recipe sets them; every other
cell runs as written. The options the run ends up with are the recipe's except the ones
named below, each with its reason.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import time
from pathlib import Path

import nbformat
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "colab" / "erl_curriculum.ipynb"
RECIPE_PATH = "configs/colab_t4.yaml"
RECIPE = REPO / RECIPE_PATH
SKIPPED_TAGS = {"install", "colab-only"}  # what a CPU run without network cannot do
COLAB_LINK = "https://colab.research.google.com/github/"

# What the smoke run may change in configs/colab_t4.yaml. What a CPU cannot do:
CPU_OVERRIDES = {
    "fast_inference": "vLLM generation is a CUDA engine (on a GPU its start-up alone would "
    "outlast the smoke run, so it is off there too)",
    "fp16": "accelerate ignores fp16 on a CPU (no autocast, no grad scaler), so pipeline.run "
    "refuses it there rather than train float32 under an fp16 label",
}
# ... and what makes it a smoke run: the offline model, sizes, the notebook's own options.
SMOKE_OVERRIDES = {
    "model_name_or_path": "the offline tiny model",
    "build_tiny_model": "built into MODEL on first use",
    "output_dir": "the test's folder",
    "num_stages": "2 stages",
    "max_level": "of 2 levels",
    "min_stage_steps": "of 2 steps",
    "max_stage_steps": "of 2 steps",
    "promote_window": "a window that 2 steps can fill",
    "max_completion_length": "8 tokens",
    "reflection_max_completion_length": "8 tokens",
    "eval_prompts": "8 held-out prompts",
    "disable_tqdm": "no progress bars in the test's log",
    "resume": "the notebook's RESUME parameter, passed once OUTPUT_DIR holds a run",
}


def read_notebook():
    return nbformat.read(NOTEBOOK, as_version=4)


def tags(cell) -> set[str]:
    return set(cell.metadata.get("tags", []))


def tagged(nb, tag: str) -> list:
    return [cell for cell in nb.cells if tag in tags(cell)]


def text_of(cell) -> str:
    """Everything a cell printed (stdout and stderr streams)."""
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


# Structure ------------------------------------------------------------------------------


def test_notebook_is_valid_with_badge_install_and_parameters():
    nb = read_notebook()
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"

    title = nb.cells[0]
    assert title.cell_type == "markdown"
    assert "colab-badge.svg" in title.source
    assert COLAB_LINK in title.source and "/blob/main/colab/erl_curriculum.ipynb" in title.source
    # The first markdown cell documents which tags the CPU test drops.
    assert all(f"`{tag}`" in title.source for tag in SKIPPED_TAGS)

    code = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "code")
    assert len(re.findall(r"^REPO_URL = ", code, flags=re.M)) == 1

    (install,) = tagged(nb, "install")
    assert "REPO_URL" in install.source and "git" in install.source
    assert '"pip", "install"' in install.source and '["-e", "."]' in install.source
    (drive,) = tagged(nb, "colab-only")
    assert "drive.mount(" in drive.source
    # Only these two cells are dropped on the CPU: everything else must run there.
    assert [c for c in nb.cells if tags(c) & SKIPPED_TAGS] == [install, drive]

    (parameters,) = tagged(nb, "parameters")
    for name in ("RECIPE", "OUTPUT_DIR", "MODEL", "TASK", "NUM_STAGES", "MAX_LEVEL",
                 "PROMOTE_THRESHOLD", "EXTRA_ARGS", "RESUME", "SMOKE_TEST", "PUSH_TO_HUB",
                 "HUB_REPO"):  # fmt: skip
        assert re.search(rf"^{name} = ", parameters.source, flags=re.M), name
    # The smoke switch comes right after the parameters, so it overrides all of them, and
    # it keeps the recipe: the smoke run is the recipe's code path.
    switch = nb.cells[nb.cells.index(parameters) + 1]
    assert "ERL_NOTEBOOK_SMOKE" in switch.source and "RECIPE" not in switch.source.split("print")[0]

    heading = "## Resuming after a disconnect"
    resume = [c for c in nb.cells if c.cell_type == "markdown" and c.source.startswith(heading)]
    assert resume and "RESUME" in resume[0].source


def test_the_first_cell_says_what_to_edit_while_the_url_is_a_placeholder():
    nb = read_notebook()
    title = nb.cells[0].source
    (install,) = tagged(nb, "install")
    repo_url = re.search(r'^REPO_URL = "([^"]+)"', install.source, flags=re.M)[1]
    badge = re.search(rf"\(({re.escape(COLAB_LINK)}[^)]+)\)", title)[1]
    # Both stay placeholders until the public URL is known; then both change together.
    assert ("OWNER" in repo_url) == ("/OWNER/" in badge)
    if "OWNER" in repo_url:
        assert repo_url == "https://github.com/OWNER/erl-curriculum"
        assert "placeholder" in title and "`REPO_URL`" in title and "`OWNER`" in title
        assert "OWNER is a placeholder" in install.source
        # Run as shipped, the cell stops with what to set, before it clones or installs.
        with pytest.raises(RuntimeError, match="REPO_URL is still the placeholder .*: set it"):
            exec(compile(install.source, "install", "exec"), {})


# vLLM's own pins, read from its package metadata on PyPI (PEP 658, no wheel download):
#   pip install --dry-run --no-deps --ignore-installed --report r.json vllm==0.33.0
# 0.33.0 is the first release built for torch 2.14 (0.30-0.32 require torch==2.13.0).
VLLM_VERSION = "0.33.0"
VLLM_REQUIRES = {"torch": "==2.14.0", "torchvision": "==0.29.0", "transformers": ">=5.16.1,<5.21.0"}


def test_the_install_cell_pins_the_vllm_built_for_the_pinned_stack():
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")

    (install,) = tagged(read_notebook(), "install")
    assigned = {
        node.targets[0].id: node.value
        for node in ast.parse(install.source).body
        if isinstance(node, ast.Assign)
    }
    assert ast.literal_eval(assigned["VLLM_SPEC"]) == f"vllm=={VLLM_VERSION}"
    project = {
        Requirement(r).name: Requirement(r).specifier
        for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    # vLLM's exact torch is one the project allows, and the project's transformers is one
    # vLLM allows: one resolver can satisfy both in the cell's single pip call.
    torch_version = VLLM_REQUIRES["torch"].removeprefix("==")
    assert torch_version in project["torch"]
    (transformers_pin,) = project["transformers"]
    assert transformers_pin.version in SpecifierSet(VLLM_REQUIRES["transformers"])


def test_the_install_cell_pins_exactly_what_pyproject_pins():
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")

    def pins(requirements):
        parsed = [Requirement(r) for r in requirements]
        return {canonicalize_name(r.name): r.specifier for r in parsed if r.specifier}

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (install,) = tagged(read_notebook(), "install")
    (assignment,) = [
        node
        for node in ast.parse(install.source).body
        if isinstance(node, ast.Assign) and node.targets[0].id == "PINS"
    ]
    notebook_pins = ast.literal_eval(assignment.value)
    assert pins(notebook_pins) == pins(project["dependencies"])
    assert len(notebook_pins) == len(pins(notebook_pins))  # no package pinned twice
    assert {"unsloth", "trl", "transformers"} <= set(pins(notebook_pins))
    # ... and the pip call installs them.
    assert re.search(r'^    packages = \["-e", "."\] \+ PINS \+', install.source, flags=re.M)


def test_parameter_defaults_are_the_recipe_values():
    """The parameters cell passes these on top of the recipe: they must not drift apart."""
    (parameters,) = tagged(read_notebook(), "parameters")
    values = {
        node.targets[0].id: ast.literal_eval(node.value)  # the cell holds literals only
        for node in ast.parse(parameters.source).body
        if isinstance(node, ast.Assign)
    }
    recipe = yaml.safe_load(RECIPE.read_text())
    assert (REPO / values["RECIPE"]).resolve() == RECIPE
    assert values["SMOKE_TEST"] is False and values["RESUME"] is True and values["EXTRA_ARGS"] == []
    assert values["PUSH_TO_HUB"] is False
    for name, key in [("OUTPUT_DIR", "output_dir"), ("MODEL", "model_name_or_path"),
                      ("METHOD", "method"), ("TASK", "task"), ("REWARD_SIGNALS", "reward_signals"),
                      ("NUM_STAGES", "num_stages"), ("MAX_LEVEL", "max_level"),
                      ("PROMOTE_THRESHOLD", "promote_threshold")]:  # fmt: skip
        assert values[name] == recipe[key], name
    assert values["OUTPUT_DIR"].startswith("/content/drive/")


def test_colab_recipe_parses_with_t4_settings(tmp_path):
    from curriculum.tasks import get_task
    from pipeline.models.backend import activate_backend
    from pipeline.run.config import parse_run_config

    activate_backend()  # parse_run_config imports trl; `backend: unsloth` is a string here
    # Parsed as written: fp16 with bf16 off passes GRPOConfig's post-init on a CPU too, so
    # nothing needs overriding (an unknown key would be a SystemExit naming it).
    run, model, curriculum, args = parse_run_config(
        ["--config", str(RECIPE), "--output_dir", str(tmp_path)]
    )
    assert model.model_name_or_path == "Qwen/Qwen2.5-1.5B-Instruct" and model.backend == "unsloth"
    assert model.load_in_4bit and model.use_lora and model.fast_inference
    assert (model.lora_r, model.lora_alpha) == (16, 32)
    assert 0.3 <= model.gpu_memory_utilization <= 0.6
    assert args.fp16 and not args.bf16 and args.gradient_checkpointing
    assert args.max_completion_length == 256 and 4 <= args.num_generations <= 8
    assert args.per_device_train_batch_size % args.num_generations == 0
    assert args.save_strategy == "steps" and args.save_steps <= 10
    assert run.prompts_per_stage == 100 and curriculum.num_stages == 5
    assert curriculum.promote_threshold == 0.6
    task = get_task(run.task, **run.task_config)
    assert curriculum.start_level in task.levels and curriculum.max_level in task.levels
    assert set(run.reward_signals) <= set(task.signals)


# End to end -----------------------------------------------------------------------------


@pytest.mark.slow  # ~26 s: a Jupyter kernel running every cell
def test_notebook_runs_on_cpu_with_the_tiny_model(tiny_model_dir, tmp_path, monkeypatch):
    import torch
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient import NotebookClient
    from peft import PeftConfig

    from pipeline.models.backend import activate_backend
    from pipeline.run.config import parse_run_config, resolved_config

    # jupyter_client replaces a bare "python" in the kernelspec by sys.executable, so the
    # kernel runs in this interpreter's environment (the venv, with torch and trl).
    spec = KernelSpecManager().get_kernel_spec("python3")
    assert spec.argv[0] in {"python", "python3", sys.executable}, spec.argv

    nb = read_notebook()
    nb.cells = [cell for cell in nb.cells if not tags(cell) & SKIPPED_TAGS]
    out = tmp_path / "run"
    monkeypatch.setenv("ERL_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("ERL_NOTEBOOK_TINY_MODEL", tiny_model_dir)
    monkeypatch.setenv("ERL_NOTEBOOK_OUTPUT_DIR", str(out))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    )
    start = time.monotonic()
    client.execute()
    print(f"notebook executed in {time.monotonic() - start:.1f} s")

    # The output folder contract, written by the run cell.
    assert (out / "reward_curve.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    state = json.loads((out / "curriculum_state.json").read_text())
    assert state["finished"] is True
    assert [s["level"] for s in state["stages"]] == [1, 2]  # MAX_LEVEL 2 of the smoke run

    # The recipe's code path: the run was given the recipe, the parameters at their recipe
    # values and the overrides named above, nothing else ...
    (run_cell,) = tagged(nb, "run")
    command = text_of(run_cell).splitlines()[0].split()
    assert command[:4] == ["python", "-m", "pipeline.run", "--config"] and command[4] == RECIPE_PATH
    given = {word[2:] for word in command[5:] if word.startswith("--")}
    parameters = {
        "method",
        "task",
        "reward_signals",
        "promote_threshold",
    }  # = the recipe's (tested above)
    assert given <= set(SMOKE_OVERRIDES) | set(CPU_OVERRIDES) | parameters, given
    # ... and every option the recipe sets kept its value but for those overrides.
    started = json.loads((out / "run_config.json").read_text())
    activate_backend()
    recipe = resolved_config(*parse_run_config(["--config", str(RECIPE)]))  # as written
    checked = set(yaml.safe_load(RECIPE.read_text())) | set(SMOKE_OVERRIDES) | set(CPU_OVERRIDES)
    differing = {k for k in checked if started[k] != recipe[k]}
    gpu_can = {"fp16"} if torch.cuda.is_available() else set()
    # A fresh OUTPUT_DIR: RESUME passes --resume true only to a folder that holds a run.
    assert "resume" not in given
    expected = (set(SMOKE_OVERRIDES) - {"resume"}) | (set(CPU_OVERRIDES) - gpu_can)
    assert differing == expected, {k: (recipe[k], started[k]) for k in differing ^ expected}
    assert started["load_in_4bit"] and started["backend"] == "unsloth"
    # ... its 4-bit base with a LoRA adapter of the recipe's rank, which each folder records.
    for folder in ("stage_1", "stage_2", "final"):
        assert PeftConfig.from_pretrained(out / folder).r == started["lora_r"] == 16
        assert json.loads((out / folder / "base_quantization.json").read_text())["load_in_4bit"]

    assert "smoke test: configs/colab_t4.yaml" in "".join(map(text_of, nb.cells))
    (curves,) = tagged(nb, "curves")
    assert any("image/png" in o.get("data", {}) for o in curves.outputs)
    assert "run finished: True" in text_of(curves)

    (evaluation,) = tagged(nb, "evaluation")
    printed = text_of(evaluation)
    scores = {}
    for name in ("base", "final"):
        match = re.search(rf"^{name} .*mean_reward=(-?[\d.]+) success_rate=([\d.]+)", printed, re.M)
        assert match, printed
        scores[name] = float(match[1]), float(match[2])
        assert 0.0 <= scores[name][1] <= 1.0
    difference = re.search(
        r"difference .*mean_reward=([-+][\d.]+) success_rate=([-+][\d.]+)", printed
    )
    assert difference, printed
    assert float(difference[1]) == pytest.approx(scores["final"][0] - scores["base"][0], abs=2e-4)
    assert float(difference[2]) == pytest.approx(scores["final"][1] - scores["base"][1], abs=2e-4)
