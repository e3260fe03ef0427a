"""Atomic writes: a reader sees the old file (or folder) or the new one, never a part.

Every file a resume or another tool trusts goes through here: the curriculum state, the
run's options, the reflection memory, metrics after a resume trims them, ratings, plots,
and model folders. A file is written to a temporary sibling, flushed, fsynced and renamed
into place; a folder is built in a temporary sibling and renamed into place. A new file
gets the mode an ordinary `open(path, "w")` would give it (0666 less the umask), and a
replaced file keeps its own, so that a teammate (or another account) reads a run as usual.
A folder gets the same for what libraries write into it (`umask_modes`): safetensors
writes its weights owner-only (0600) whatever the umask.

    atomic_write_json("runs/x/curriculum_state.json", {"stages": []})
    with atomic_folder("runs/x/final") as staging:   # write into `staging`
        model.save_pretrained(staging)

The project's lowest package holds this (curriculum imports nothing of the project), so
every package can use the one implementation.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` atomically (temp file in the same folder, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = _create_temporary_sibling(path)
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


def _create_temporary_sibling(path: Path) -> tuple[int, str]:
    """A new temporary file beside `path` (os.replace is only atomic within one filesystem)
    with the mode an ordinary write would leave on `path`: `tempfile.mkstemp` would make
    it owner-only (0600), and the rename would carry that onto the run's files."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)  # a replaced file keeps its mode
    except FileNotFoundError:
        mode = None
    while True:
        tmp_name = str(path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp"))
        try:
            # 0o666 less the umask, applied by the kernel, as open(path, "w") does.
            fd = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        if mode is not None:
            os.chmod(tmp_name, mode)
        return fd, tmp_name


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
        umask_modes(staging)
        if path.exists():
            shutil.rmtree(path)
        os.replace(staging, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _fsync_folder(path.parent)


def umask_modes(folder: str | os.PathLike[str]) -> None:
    """Give every file under `folder` at least the read and write bits an ordinary write
    grants under the process's umask (0644 under 022); never take bits away. For folders
    that libraries wrote: safetensors' `save_file` leaves 0600 files whatever the umask."""
    granted = 0o666 & ~_umask()
    for path in Path(folder).rglob("*"):
        if path.is_file() and not path.is_symlink():
            mode = stat.S_IMODE(path.stat().st_mode)
            if mode | granted != mode:
                os.chmod(path, mode | granted)


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (os.umask can
    only read it by setting it, which would race with other threads creating files)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
