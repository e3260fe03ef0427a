"""ERL on Unsloth's own generated GRPOTrainer, on this CPU.

`import unsloth` must come before trl, and this process already imported trl, so the
both-bases suite (with its 4-bit NF4 + LoRA rerun) runs again in one fresh pytest process with the Unsloth backend and its
CPU opt-in (`ERL_BACKEND=unsloth ERL_UNSLOTH_CPU_TRAINER=1`). Generating Unsloth's trainer
costs ~30 s per process, hence one process for all of it. The child selects what this
session selects (`-m "not slow"` under `make test`, everything under `make test-all`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Tests of the suite for features Unsloth's GRPO loss does not have (they skip there).
UNSLOTH_LACKS = [
    "test_adaptive_entropy_steps_once_per_optimizer_step_with_accumulation",
    "test_moe_router_loss_is_counted_once_per_chunk",
]
SUITE = [
    "tests/test_erl_bases.py",
    "tests/test_erl_entropy_quantile.py",
    "tests/test_erl_internalization.py",
    "tests/test_erl_4bit.py",  # the same claims on a 4-bit NF4 + LoRA model, and its own
    "tests/test_erl_agents.py",  # episodes through TRL's tool loop, as Unsloth generates it
]


@pytest.mark.slow  # ~75 s: Unsloth's trainer generated once, then the whole both-bases suite
def test_both_bases_suite_passes_on_unsloths_trainer(tmp_path, request):
    report = tmp_path / "unsloth.xml"
    markers = request.config.getoption("markexpr")
    selection = ["-m", markers] if markers else []
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "ERL_BACKEND": "unsloth",
        "ERL_UNSLOTH_CPU_TRAINER": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection, *SUITE]
        + [f"--junitxml={report}", f"--basetemp={tmp_path / 'tmp'}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert report.exists(), done.stdout[-4000:] + done.stderr[-4000:]
    suite = ET.parse(report).getroot().find("testsuite")
    counts = {k: int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped")}
    assert done.returncode == 0 and counts["failures"] == counts["errors"] == 0, done.stdout[-6000:]
    # Every test ran on Unsloth's trainer (one module test asserts the base) but those of
    # what Unsloth's loss does not have: adaptive entropy control and MoE router losses.
    skipped = sorted(
        case.get("name").split("[")[0]
        for case in suite.iter("testcase")
        if case.find("skipped") is not None
    )
    assert skipped == UNSLOTH_LACKS and counts["tests"] >= 14, (counts, skipped)


COMPILED_LOSS_SCRIPT = """
import json, sys
from pipeline.models.backend import activate_backend
activate_backend("unsloth")
from datasets import Dataset
from transformers import AutoModelForCausalLM
from curriculum.tasks import get_task
from pipeline import ERLConfig, ERLTrainer
from pipeline.models.backend import unsloth_compiles_loss

def reward(completions, **kw):
    return [(len(c[0]["content"]) % 4) / 3 for c in completions]

args = ERLConfig(output_dir=sys.argv[2], per_device_train_batch_size=8, num_generations=4,
                 max_completion_length=8, max_steps=3, bf16=False, use_cpu=True, report_to=[],
                 logging_steps=1, reward_threshold=2.0, learning_rate=1e-3, loss_type="bnpo",
                 beta=0.04, steps_per_generation=2)
trainer = ERLTrainer(model=AutoModelForCausalLM.from_pretrained(sys.argv[1]), args=args,
                     train_dataset=Dataset.from_list(get_task("arithmetic").generate(1, 16, seed=0)),
                     reward_funcs=reward)
trainer.train()
print("RESULT " + json.dumps({"compiled": unsloth_compiles_loss(), "base": type(trainer).__mro__[1].__name__,
    "steps": trainer.state.global_step, "measured": trainer.budget.cost is not None,
    "gated": [h["erl/gated_fraction"] for h in trainer.state.log_history if "erl/gated_fraction" in h]}))
"""


@pytest.mark.slow
def test_erl_trains_on_unsloths_trainer_with_its_loss_compiled(tiny_model_dir, tmp_path):
    """Unsloth compiles its loss unless UNSLOTH_COMPILE_DISABLE is set; the CPU memory meter
    (a TorchDispatchMode) would break that compile, so the budget plans unmeasured there,
    and an all-gated bnpo + beta + steps_per_generation 2 run trains."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "ERL_UNSLOTH_CPU_TRAINER": "1",
        "UNSLOTH_COMPILE_DISABLE": "0",
        # torch turns its aliasing check of custom ops into an error when CI is set, and
        # its own inductor::_alloc_from_pool fails it on a CPU; elsewhere it is a warning.
        "TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING": "0",
    }
    done = subprocess.run(
        [sys.executable, "-c", COMPILED_LOSS_SCRIPT, tiny_model_dir, str(tmp_path / "out")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT ") :])
    assert result["compiled"] and result["base"] == "UnslothGRPOTrainer"
    assert result["steps"] == 3 and result["gated"] and set(result["gated"]) == {1.0}
    assert not result["measured"]
    assert "memory meter would break" in done.stderr
