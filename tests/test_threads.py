"""The CPU thread count a command runs with (pipeline.models.threads): --threads, then
OMP_NUM_THREADS, then the cores other processes leave free, read from /proc/stat; chosen
once per process; printed once by pipeline.run."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from pipeline.models import threads


@pytest.fixture
def unchosen(monkeypatch):
    """A process that has not chosen yet; torch's count put back after the test."""
    monkeypatch.setattr(threads, "_chosen", None)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_threads_given_win_and_only_the_first_choice_counts(unchosen, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads.use_cpu_threads(2) == "CPU: 2 torch threads (--threads)"
    assert torch.get_num_threads() == 2
    assert threads.use_cpu_threads(1) is None and torch.get_num_threads() == 2


def test_omp_num_threads_then_a_commands_default(unchosen, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)  # what torch reads from OMP_NUM_THREADS at start
    assert threads.use_cpu_threads(None, default=2) == "CPU: 1 torch thread (OMP_NUM_THREADS)"
    monkeypatch.setattr(threads, "_chosen", None)
    monkeypatch.delenv("OMP_NUM_THREADS")
    line = threads.use_cpu_threads(None, default=1)
    assert line.startswith("CPU: 1 torch thread (the command's default")


def test_unset_the_count_is_the_free_cores(unchosen, monkeypatch):
    """Neither given: torch's default less the CPUs other processes keep busy, at least 1."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    monkeypatch.setattr(threads, "_allowed_cpus", lambda: {0, 1})
    for busy, expected in [(0.1, 2), (0.8, 1), (1.9, 1)]:
        monkeypatch.setattr(threads, "_chosen", None)
        monkeypatch.setattr(threads, "busy_cpus", lambda busy=busy: busy)
        line = threads.use_cpu_threads(None)
        assert torch.get_num_threads() == expected, line
        assert f"{busy:.1f} of 2 CPUs busy with other work" in line


def test_busy_cpus_are_read_from_two_proc_stat_readings():
    first = {0: (100, 200), 1: (100, 200)}
    # CPU 0 idle throughout, CPU 1 busy for 3 of 4 jiffies, CPU 2 not in the first reading.
    second = {0: (110, 210), 1: (101, 204), 2: (0, 50)}
    assert threads.busy_between(first, second) == pytest.approx(0.75)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_a_process_spinning_on_a_cpu_is_seen_busy():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # started
        busy = threads.busy_cpus(0.5)
    finally:
        spinner.kill()
        spinner.wait()
    assert 0.7 <= busy <= len(threads._allowed_cpus()) + 0.01
