"""One writer per output folder: a command that writes a folder holds an OS-level lock on
`<folder>/.run.lock` while it runs.

Two processes writing one folder (two terminals, two Colab runtimes on one Drive folder,
a `--resume` started while the run still trains, an evaluation writing its JSON into a run
that trains) would overwrite each other's files. So each writing command takes the lock
before it reads the folder, and a second one is refused in one line that names the folder
and the holder's process id. The lock is `filelock`'s (flock on Unix): the operating
system drops it when its process dies, SIGKILL included, so a killed command resumes as
before and there is no stale lock to clear by hand.

    with released_at_end():                   # the command's main(): let go however it ends
        hold_folder(Path("runs/rm"), "--output_dir")

`released_at_end` releases what the command took and removes the file, so that a refused
start leaves the folder as it was (a killed command leaves the file, which holds no lock:
the next process takes it over). A run under several processes takes it in its main
process for all of them (`pipeline.run.lock`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.layout import LOCK_FILE
from pipeline.options import UsageError

_held: list[FolderLock] = []  # what this command holds; `released_at_end` lets go of it


class FolderLock:
    """The lock of one output folder, held by this process."""

    def __init__(self, root: Path) -> None:
        from filelock import FileLock

        self.root = Path(root)
        self.path = self.root / LOCK_FILE
        # The folders this start makes (runs/ too, for runs/x), deepest first.
        self.created = [p for p in (self.root, *self.root.parents) if not p.exists()]
        self.file = FileLock(str(self.path), timeout=0)

    def acquire(self, option: str) -> str | None:
        """Take the lock; returns None, or the refusal's text (naming `option`) while another
        process holds it."""
        from filelock import Timeout

        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self.file.acquire()
        except Timeout:
            holder = _read_pid(self.path)
            return str(
                UsageError(
                    f"{option}: another process is writing this folder",
                    f"{self.root}, process {holder}",
                    "wait for it to end (or stop it) before you start or resume a command "
                    "that writes there, or choose another folder",
                )
            )
        # Who holds it, for the refusal above (the lock itself is the kernel's, not this).
        with open(self.path, "w") as f:
            f.write(f"{os.getpid()}\n")
        _held.append(self)
        return None

    def release(self) -> None:
        """Let go of the lock and take its file away (a folder this start made and left
        empty too), so that a refused start leaves the folder as it was."""
        # Removed while still held: a process that opens the file after this finds no lock
        # to wait on, and filelock skips an inode that was unlinked under it.
        self.path.unlink(missing_ok=True)
        for folder in self.created:
            if folder.exists():
                if any(folder.iterdir()):
                    break
                folder.rmdir()
        self.file.release()


def _read_pid(path: Path) -> str:
    try:
        return path.read_text().strip() or "unknown"
    except OSError:
        return "unknown"


def hold_folder(root: Path, option: str) -> None:
    """Take `root`'s lock for this command (one process); UsageError naming `option`, the
    folder and the holder's PID while another process holds it."""
    refusal = FolderLock(root).acquire(option)
    if refusal:
        raise UsageError(refusal)


@contextmanager
def released_at_end() -> Iterator[None]:
    """Release the locks this command took, however it ends (each command's main())."""
    try:
        yield
    finally:
        while _held:
            _held.pop().release()
