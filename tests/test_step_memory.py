"""The storage-counting peak meter (pipeline.erl.budget): what ERL's memory budget measures
on a CPU, and what bench/erl_overhead.py compares per step."""

from __future__ import annotations

import torch

from pipeline.erl.budget import StoragePeakMeter

MB = 1000 * 1000 * 4  # bytes of a 1000 x 1000 float32 tensor


def test_counts_each_storage_once_until_freed_and_only_above_the_step_start():
    meter = StoragePeakMeter()
    with meter:
        kept = torch.ones(1000, 1000)  # live before the step: not part of its peak
        meter.begin_step()
        a = kept @ kept
        view = a.view(-1)[:10]  # a view shares a's storage
        b = a + 1
        del a, view, b
        c = kept * 2  # reuses the room a and b freed: the peak stays at two tensors
        meter.end_step()
        assert meter.live == 2 * MB  # kept and c
        del c
        meter.begin_step()
        meter.end_step()
    assert meter.steps == [2 * MB, 0]


def test_counts_activations_and_gradients_of_a_backward():
    layer = torch.nn.Linear(1000, 1000, bias=False)
    meter = StoragePeakMeter()
    with meter:
        meter.begin_step()
        x = torch.ones(500, 1000, requires_grad=True)
        layer(x).square().sum().backward()
        meter.end_step()
    # x, its output and the square's saved input, then the weight's and x's gradients.
    assert meter.steps[0] >= MB + MB // 2
    assert layer.weight.grad is not None
