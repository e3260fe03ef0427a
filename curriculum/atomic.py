"""Atomic writes: a reader sees the old file (or folder) or the new one, never a part.

Every file a resume or another tool trusts goes through here: the curriculum state, the
run's options, the reflection memory, metrics after a resume trims them, ratings, plots,
and model folders. A file is written to a temporary sibling, flushed, fsynced and renamed
into place; a folder is built in a temporary sibling and renamed into place.

    atomic_write_json("runs/x/curriculum_state.json", {"stages": []})
    with atomic_folder("runs/x/final") as staging:   # write into `staging`
        model.save_pretrained(staging)

The project's lowest package holds this (curriculum imports nothing of the project), so
every package can use the one implementation.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` atomically (temp file in the same folder, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Same folder: os.replace is only atomic within one filesystem.
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        # Also on KeyboardInterrupt: never leave temp files behind.
        Path(tmp_name).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write `obj` as indented, strict JSON to `path` atomically."""
    # allow_nan=False: NaN is not JSON, and other tools parse these files strictly. Encoded
    # before anything is written, so an unencodable object leaves the old file in place.
    return atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False) + "\n")


@contextmanager
def atomic_folder(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Build a folder in the sibling `.<name>.partial` and rename it to `path` when the
    block ends without an error (replacing what was there); on an error, remove it.

    The sibling's name is fixed, so a kill's leftover is cleared by the next write."""
    path = Path(path)
    staging = path.with_name(f".{path.name}.partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        yield staging
        if path.exists():
            shutil.rmtree(path)
        os.replace(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    """Persist a rename itself; without this a power cut may bring back the old entry.
    (Windows cannot open a folder; its MoveFileEx is durable enough for us.)"""
    if os.name == "nt":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
