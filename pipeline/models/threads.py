"""How many torch threads a command uses on a CPU, chosen once per process.

    line = use_cpu_threads(args.threads)     # None on a GPU; else the line to print once

`--threads N` wins, then `OMP_NUM_THREADS`; otherwise the count is measured: torch's own
default (the physical cores this process may use) less the cores other processes keep
busy right now, and at least one. Measured by `bench/threads.py` (docs/results.md): alone
on a 2-core machine every recipe ran fastest on both cores, but beside one other CPU-bound
job two threads wait on each other's core and the recipes ran 1.8-2.5 times slower than on
one thread. torch's default cannot tell the two apart; a look at the machine can.

The look is Linux's `/proc/stat`, over a quarter of a second, on the CPUs this process
may run on; where there is no such file (macOS, Windows) the count is torch's default.
On a GPU nothing changes: the model's work is on the device.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PROC_STAT = Path("/proc/stat")
SAMPLE_SECONDS = 0.25

_chosen: int | None = None  # the count this process runs with, once chosen


def use_cpu_threads(requested: int | None, *, default: int | None = None) -> str | None:
    """Set torch's thread count for this CPU process and return the line that says so (None
    on a GPU, where it is left alone). `requested`: --threads; `default`: a fixed count
    instead of the measured one when neither --threads nor OMP_NUM_THREADS is given (a
    comparison keeps one thread, so that its runs' seconds compare). Only the first call
    in a process chooses (a comparison's runs keep its choice); later ones return None."""
    global _chosen
    import torch

    if torch.cuda.is_available() or _chosen is not None:
        return None
    cores = torch.get_num_threads()  # torch's default, or OMP_NUM_THREADS when set
    if requested is not None:
        threads, why = requested, "--threads"
    elif os.environ.get("OMP_NUM_THREADS"):
        threads, why = cores, "OMP_NUM_THREADS"
    elif default is not None:
        threads, why = default, "the command's default; --threads N to change"
    else:
        busy, allowed = busy_cpus(), len(_allowed_cpus())
        if busy is None:
            threads, why = cores, "torch's default; --threads N to change"
        else:
            threads = max(1, min(cores, round(allowed - busy)))
            why = f"{busy:.1f} of {allowed} CPUs busy with other work; --threads N to change"
    torch.set_num_threads(threads)
    _chosen = threads
    return f"CPU: {threads} torch thread{'s' if threads > 1 else ''} ({why})"


def busy_cpus(seconds: float = SAMPLE_SECONDS) -> float | None:
    """How many of this process's CPUs other processes kept busy over `seconds` (this one
    sleeps meanwhile), from `/proc/stat`; None where the file cannot be read."""
    first = _cpu_times()
    time.sleep(seconds if first else 0)
    second = _cpu_times()
    return None if first is None or second is None else busy_between(first, second)


def busy_between(first: dict[int, tuple[int, int]], second: dict[int, tuple[int, int]]) -> float:
    """The CPUs busy between two `/proc/stat` readings (CPU -> (idle, total) jiffies): the
    sum over CPUs of the share of their time not idle."""
    busy = 0.0
    for cpu, (idle, total) in second.items():
        before = first.get(cpu)
        if before is not None and total > before[1]:
            busy += 1.0 - (idle - before[0]) / (total - before[1])
    return busy


def _allowed_cpus() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def _cpu_times() -> dict[int, tuple[int, int]] | None:
    """CPU number -> (idle jiffies incl. I/O wait, total jiffies), for the allowed CPUs."""
    try:
        lines = PROC_STAT.read_text().splitlines()
    except OSError:
        return None
    allowed = _allowed_cpus()
    times = {}
    for line in lines:
        name, *fields = line.split()
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in allowed):
            continue
        values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
        times[int(name[3:])] = (values[3] + values[4], sum(values))
    return times or None
