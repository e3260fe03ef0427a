"""curriculum.atomic: files and folders that a kill never leaves half-written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from curriculum.atomic import atomic_folder, atomic_write_json, atomic_write_text

REPO = Path(__file__).resolve().parents[1]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# Atomic writes -------------------------------------------------------------------------


def test_atomic_write_round_trips_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "deep" / "state.json"
    atomic_write_json(path, {"a": [1, 2.5, None], "b": "x"})
    atomic_write_json(path, {"a": [3]})
    assert json.loads(path.read_text()) == {"a": [3]}
    assert leftovers(path.parent) == []


class Explodes:
    """Not JSON: serialisation fails when it reaches this, after earlier parts are out."""


@pytest.mark.parametrize("bad", [Explodes(), float("nan")])
def test_failed_serialisation_midway_keeps_the_old_file(tmp_path, bad):
    path = tmp_path / "state.json"
    atomic_write_json(path, {"version": "old"})
    before = path.read_bytes()
    # A long list first: the bad value comes late in the object.
    with pytest.raises((TypeError, ValueError)):
        atomic_write_json(path, {"big": list(range(100_000)), "bad": bad})
    assert path.read_bytes() == before
    assert leftovers(tmp_path) == []


WRITER = textwrap.dedent(
    """
    import sys
    from curriculum.atomic import atomic_write_json
    path, n = sys.argv[1], 0
    while True:
        n += 1
        atomic_write_json(path, {"n": n, "payload": [n] * 200_000})
    """
)


def test_a_killed_writer_leaves_a_complete_file(tmp_path):
    """SIGKILL a process that rewrites a big state file in a loop: the file always parses."""
    path = tmp_path / "state.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for delay in (0.05, 0.13, 0.29):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], env=env)
        deadline = time.monotonic() + 20
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        data = json.loads(path.read_text())
        assert data["payload"] == [data["n"]] * 200_000


def test_atomic_folder_replaces_the_folder_only_when_the_block_succeeds(tmp_path):
    target = tmp_path / "final"
    with atomic_folder(target) as staging:
        (staging / "weights").write_text("v1")
        assert not target.exists()  # nothing at the target until the block ends
    assert (target / "weights").read_text() == "v1"
    with pytest.raises(RuntimeError), atomic_folder(target) as staging:
        (staging / "weights").write_text("half")
        raise RuntimeError("killed mid-save")
    assert (target / "weights").read_text() == "v1"  # the old folder is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # no staging left


def test_atomic_folder_clears_a_killed_writers_leftover(tmp_path):
    leftover = tmp_path / ".final.partial"
    leftover.mkdir()
    (leftover / "stale").write_text("x")
    with atomic_folder(tmp_path / "final") as staging:
        assert staging == leftover and not (staging / "stale").exists()
        (staging / "weights").write_text("v1")
    assert sorted(p.name for p in (tmp_path / "final").iterdir()) == ["weights"]


def test_atomic_write_text_round_trips_unicode(tmp_path):
    path = atomic_write_text(tmp_path / "a" / "ratings.jsonl", "ü → ✓\n")
    assert path.read_text(encoding="utf-8") == "ü → ✓\n"
    assert leftovers(path.parent) == []


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_atomic_writes_keep_the_mode_an_ordinary_write_gives(tmp_path):
    """A new file gets 0666 less the umask (mkstemp's 0600 would hide a run from a teammate),
    and so does what a library wrote owner-only into an atomic folder; a replaced file keeps
    the mode it had."""
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "new.txt", "x")
        with atomic_folder(tmp_path / "folder") as staging:
            (staging / "weights.bin").write_bytes(b"w")
            # As safetensors writes its weights: owner-only, whatever the umask.
            os.close(os.open(staging / "model.safetensors", os.O_CREAT | os.O_WRONLY, 0o600))
        atomic_write_json(tmp_path / "folder" / "state.json", {})
        ordinary = tmp_path / "ordinary.txt"
        ordinary.write_text("x")
        replaced = tmp_path / "replaced.txt"
        replaced.write_text("old")
        replaced.chmod(0o640)
        atomic_write_text(replaced, "new")
    finally:
        os.umask(old)
    assert mode(tmp_path / "new.txt") == mode(ordinary) == 0o644
    assert mode(tmp_path / "folder" / "state.json") == 0o644
    assert mode(tmp_path / "folder" / "model.safetensors") == 0o644
    assert mode(tmp_path / "folder") == 0o755
    assert mode(replaced) == 0o640 and replaced.read_text() == "new"
    assert leftovers(tmp_path) == []
