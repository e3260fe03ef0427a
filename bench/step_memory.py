"""Peak memory of each training step, above what is live when the step starts.

What is live between steps (weights, gradients, optimizer state) is the same for GRPO and
ERL; what a step adds on top (generation caches, activations, logits) is what makes a batch
size fit or not. Two ways to measure it, with one interface:

- `CudaStepMemory`: the CUDA allocator's peak (`max_memory_allocated`) over the step.
- `TensorStepMemory`: on any device, a `TorchDispatchMode` that counts the bytes of every
  tensor storage an operator creates until Python frees it, the CPU stand-in for the
  allocator's count (it misses storages made outside PyTorch's dispatcher, and slows the
  run, so benchmarks measure memory in runs of their own).

  Its blind spot with 4-bit models: a dispatch mode sees the operators a program calls,
  not those that run inside another operator's kernel. bitsandbytes 0.50's CPU forward is
  one custom operator, `bitsandbytes::gemm_4bit`, whose default kernel dequantizes the
  whole weight and multiplies inside it, so that transient dequantized weight (one layer's
  at a time: 32 KB on the tiny model, ~55 MB in float32 for one MLP projection of a 1.5B
  model) is not counted. The Params4bit storages and the backward's dequantized weight
  (`MatMul4Bit.backward` calls `dequantize_4bit` itself) are counted.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary


class TensorStepMemory(TorchDispatchMode):
    """Use as a context around training; call `begin_step` / `end_step` around each step.
    `steps` holds each step's peak bytes above the bytes live at its start."""

    def __init__(self) -> None:
        super().__init__()
        self._seen = WeakIdKeyDictionary()  # storage -> bytes, so views are counted once
        self.live = 0
        self._base = self._peak = 0
        self.steps: list[int] = []

    def begin_step(self) -> None:
        self._base = self._peak = self.live

    def end_step(self) -> None:
        self.steps.append(self._peak - self._base)

    def _freed(self, size: int) -> None:
        self.live -= size

    def _count(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        if storage in self._seen:
            return
        size = storage.nbytes()
        self._seen[storage] = size
        weakref.finalize(storage, self._freed, size)
        self.live += size
        self._peak = max(self._peak, self.live)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in tree_leaves(out):
            if isinstance(value, torch.Tensor) and value.device.type != "meta":
                self._count(value)
        return out


class CudaStepMemory:
    """The same figures from the CUDA allocator."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self._base = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def begin_step(self) -> None:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self._base = torch.cuda.memory_allocated()

    def end_step(self) -> None:
        torch.cuda.synchronize()
        self.steps.append(torch.cuda.max_memory_allocated() - self._base)


def step_memory() -> TensorStepMemory | CudaStepMemory:
    """The allocator's figures on a GPU, the tensor count elsewhere."""
    return CudaStepMemory() if torch.cuda.is_available() else TensorStepMemory()
