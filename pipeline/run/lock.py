"""One writer per run folder (`pipeline.lock`), under one process or several.

A run takes the lock before it checks the folder, and a second process, with or without
`--resume`, is refused in one line that names the folder and the holder's process id.
Under several processes (torchrun, accelerate) the main process holds the lock for all of
them and tells the others whether it got it; `main()` releases it when the command ends
(`pipeline.lock.released_at_end`).
"""

from __future__ import annotations

from pipeline.layout import RunLayout
from pipeline.lock import FolderLock
from pipeline.options import UsageError
from pipeline.run.distributed import all_processes, is_main_process


def hold_output_dir(layout: RunLayout, resume: bool) -> None:
    """Take the run folder's lock for this command (the main process, for all processes);
    UsageError naming the folder and the holder's PID while another process holds it.

    A resume of a folder that does not exist takes none: there is no run to protect, and
    `check_output_dir` refuses it next as it stands."""
    if resume and not layout.root.exists():
        return
    refusal = FolderLock(layout.root).acquire("--output_dir") if is_main_process() else None
    # Every process learns the main process's answer, so all of them refuse together.
    refusals = [r for r in all_processes([refusal]) if r]
    if refusals:
        raise UsageError(refusals[0])
