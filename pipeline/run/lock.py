"""One writer per run folder: the run holds an OS-level lock on `<output_dir>/.run.lock`.

Two processes writing one folder (two terminals, two Colab runtimes on one Drive folder,
a `--resume` started while the run still trains) would train side by side and overwrite
each other's checkpoints and state. So a run takes the lock before it checks the folder,
and a second process, with or without `--resume`, is refused in one line that names the
folder and the holder's process id. The lock is `filelock`'s (flock on Unix): the
operating system drops it when its process dies, SIGKILL included, so a killed run
resumes as before and there is no stale lock to clear by hand.

Under several processes (torchrun, accelerate) the main process holds the lock for all of
them and tells the others whether it got it. `main()` releases it when the command ends
and removes the file, so that a refused start leaves the folder as it was (a killed run
leaves the file, which holds no lock: the next process takes it over).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.layout import RunLayout
from pipeline.options import UsageError
from pipeline.run.distributed import all_processes, is_main_process

_held: list[_RunLock] = []  # what this command holds; `released_at_end` lets go of it


class _RunLock:
    """The lock of one run folder, held by this process."""

    def __init__(self, layout: RunLayout) -> None:
        from filelock import FileLock

        self.root = layout.root
        self.path = layout.lock
        # The folders this start makes (runs/ too, for runs/x), deepest first.
        self.created = [p for p in (self.root, *self.root.parents) if not p.exists()]
        self.file = FileLock(str(self.path), timeout=0)

    def acquire(self) -> str | None:
        """Take the lock; returns None, or the refusal's text while another process holds it."""
        from filelock import Timeout

        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self.file.acquire()
        except Timeout:
            holder = _read_pid(self.path)
            return str(
                UsageError(
                    "--output_dir: another process is writing this run",
                    f"{self.root}, process {holder}",
                    "wait for it to end (or stop it) before you start or resume a run there, "
                    "or choose another --output_dir",
                )
            )
        # Who holds it, for the refusal above (the lock itself is the kernel's, not this).
        with open(self.path, "w") as f:
            f.write(f"{os.getpid()}\n")
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


def hold_output_dir(layout: RunLayout, resume: bool) -> None:
    """Take the run folder's lock for this command (the main process, for all processes);
    UsageError naming the folder and the holder's PID while another process holds it.

    A resume of a folder that does not exist takes none: there is no run to protect, and
    `check_output_dir` refuses it next as it stands."""
    if resume and not layout.root.exists():
        return
    refusal = None
    if is_main_process():
        lock = _RunLock(layout)
        refusal = lock.acquire()
        if refusal is None:
            _held.append(lock)
    # Every process learns the main process's answer, so all of them refuse together.
    refusals = [r for r in all_processes([refusal]) if r]
    if refusals:
        raise UsageError(refusals[0])


@contextmanager
def released_at_end() -> Iterator[None]:
    """Release the locks this command took, however it ends (`main()` wraps the run)."""
    try:
        yield
    finally:
        while _held:
            _held.pop().release()
