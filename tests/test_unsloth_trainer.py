"""ERL on Unsloth's own generated GRPOTrainer, on this CPU.

`import unsloth` must come before trl, and this process already imported trl, so the
both-bases suite (with its 4-bit NF4 + LoRA rerun) runs again in one fresh pytest process with the Unsloth backend and its
CPU opt-in (`ERL_BACKEND=unsloth ERL_UNSLOTH_CPU_TRAINER=1`). Generating Unsloth's trainer
costs ~30 s per process, hence one process for all of it. The child selects what this
session selects (`-m "not slow"` under `make test`, everything under `make test-all`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

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
]


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
