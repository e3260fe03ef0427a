"""How many torch threads a CPU run should use: the recipes timed at 1 and 2 threads and at
the project's default, alone on the machine and beside one other CPU-bound job.

    python bench/threads.py                          # every recipe, both conditions
    python bench/threads.py --recipes demo --conditions alone

Each measurement is one whole `python -m pipeline.run` command in a fresh output folder (so
the warm-up, the stages and the evaluation all count), its wall seconds taken around the
process. "threads 1" and "threads 2" set OMP_NUM_THREADS; "default" sets nothing, as a user
who types the command does, so the project chooses (`pipeline.models.threads`). "shared"
starts a neighbour first: one process multiplying matrices on one thread, busy before the
command starts and for as long as it runs (a test worker, a second run).

It prints one line per measurement, then per recipe and condition the fastest setting and
`default_vs_fastest` (the default's seconds over the fastest's). Results are cached under
`.cache/bench-threads/` by recipe, overrides, setting, condition and the commit's tree of
`pipeline/` and `configs/`, so an interrupted bench resumes; `--fresh` measures again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "bench-threads"

# name -> (recipe, overrides). The demo and the agent recipe run as users run them; SmolLM2's
# recipe is cut to a few steps (a full run is ~an hour on this CPU), so its figure is per
# those steps.
RECIPES = {
    "demo": ("configs/tiny.yaml", []),
    "agent": ("configs/frozenlake_agent.yaml", []),
    "smollm2": (
        "configs/smollm2.yaml",
        [
            "--warmup_sft_steps", "4", "--max_level", "1", "--min_stage_steps", "2",
            "--max_stage_steps", "2", "--eval_prompts", "4", "--save_steps", "2",
        ],
    ),
}  # fmt: skip
SETTINGS = ("1", "2", "default")
CONDITIONS = ("alone", "shared")
NEIGHBOUR = (
    "import torch\n"
    "torch.set_num_threads(1)\n"
    "a = torch.randn(384, 384)\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    a = torch.tanh(a @ a)\n"
)


def code_version() -> str:
    """The git tree of what decides a run's speed (the code and the recipes)."""
    trees = subprocess.run(
        ["git", "rev-parse", "HEAD:pipeline", "HEAD:configs", "HEAD:curriculum", "HEAD:rewards"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return hashlib.sha1(" ".join(trees).encode()).hexdigest()[:12]


def measure(recipe: str, overrides: list[str], setting: str, shared: bool) -> tuple[float, str]:
    """Wall seconds of one whole run of `recipe` at `setting` threads, and the line in which
    the run said how many threads it took."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if setting != "default":
        env["OMP_NUM_THREADS"] = setting
    neighbour = None
    if shared:
        neighbour = subprocess.Popen(
            [sys.executable, "-c", NEIGHBOUR],
            env={**env, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE,
            text=True,
        )
        neighbour.stdout.readline()  # busy from here on, as a job already running is
    try:
        with tempfile.TemporaryDirectory() as out:
            command = [sys.executable, "-m", "pipeline.run", "--config", recipe]
            command += [*overrides, "--output_dir", str(Path(out) / "run")]
            start = time.perf_counter()
            done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
            seconds = time.perf_counter() - start
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    if done.returncode != 0:
        raise SystemExit(f"{recipe} at {setting} threads failed:\n{done.stderr[-3000:]}")
    said = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("CPU: ")]
    return seconds, said[0] if said else "(no thread line)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipes", default=",".join(RECIPES))
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--conditions", default=",".join(CONDITIONS))
    parser.add_argument("--fresh", action="store_true", help="measure again, ignoring the cache")
    a = parser.parse_args()
    recipes, settings = a.recipes.split(","), a.settings.split(",")
    conditions = a.conditions.split(",")
    for name, values, known in [
        ("--recipes", recipes, RECIPES),
        ("--settings", settings, SETTINGS),
        ("--conditions", conditions, CONDITIONS),
    ]:
        if unknown := [v for v in values if v not in known]:
            parser.error(f"{name}: unknown {unknown}; known: {', '.join(known)}")

    version = code_version()
    CACHE.mkdir(parents=True, exist_ok=True)
    seconds: dict[tuple[str, str, str], float] = {}
    for name in recipes:
        recipe, overrides = RECIPES[name]
        for condition in conditions:
            for setting in settings:
                key = json.dumps([name, recipe, overrides, setting, condition, version])
                path = CACHE / f"{hashlib.sha1(key.encode()).hexdigest()[:16]}.json"
                if path.exists() and not a.fresh:
                    stored = json.loads(path.read_text())
                    value, said = stored["seconds"], stored.get("said", "")
                else:
                    value, said = measure(recipe, overrides, setting, condition == "shared")
                    tmp = path.with_suffix(".tmp")
                    tmp.write_text(json.dumps({"key": key, "seconds": value, "said": said}))
                    tmp.replace(path)
                seconds[name, condition, setting] = value
                print(f"{name} {condition} threads={setting}: {value:.1f} s  {said}", flush=True)
    print(f"code_version: {version}  cpus: {os.cpu_count()}")
    for name in recipes:
        for condition in conditions:
            row = {s: seconds[name, condition, s] for s in settings}
            fastest = min(row, key=row.get)
            line = f"{name} {condition}: fastest threads={fastest}"
            if "default" in row:
                line += f"  default_vs_fastest {row['default'] / row[fastest]:.3f}"
            print(line)


if __name__ == "__main__":
    main()
