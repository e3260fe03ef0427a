"""One reader of a run's record (run_config.json): `pipeline.layout.read_run_config`, which
every command goes through, and which names a file that holds no options."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline.layout import RunLayout, read_run_config

REPO = Path(__file__).resolve().parents[1]


def test_the_record_is_read_back_and_a_bad_one_is_named(tmp_path):
    layout = RunLayout(tmp_path)
    assert layout.recorded_config() is None  # no run here
    layout.run_config.write_text('{"task": "arithmetic", "method": "grpo"}')
    assert layout.recorded_config() == {"task": "arithmetic", "method": "grpo"}
    layout.run_config.write_text("[1, 2]")
    with pytest.raises(ValueError, match=re.escape(str(layout.run_config))):
        read_run_config(layout.run_config)


def test_no_module_but_the_layout_parses_the_record_itself():
    readers = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "pipeline").rglob("*.py"))
        if path.name != "layout.py"
        and re.search(r"run_config\)?\.read_text|json\.load\(open\(.*run_config", path.read_text())
    ]
    assert readers == []
