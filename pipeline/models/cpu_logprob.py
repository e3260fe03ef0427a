"""A pure-torch stand-in for TRL 1.15's Triton log-prob kernel, used only on CPU tensors.

TRL 1.15 gives GRPOTrainer and SFTTrainer a fused LM head whose kernel is Triton whenever
Triton is importable, whatever the device; on a CPU-only machine with a CUDA build of
torch (which ships Triton) that raises "0 active drivers". TRL 1.16 checks the device.
This module wraps the kernel so CPU tensors take a plain-torch path and CUDA tensors
still take TRL's kernel unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _DeviceDispatchingLogProb:
    """Same call signature as TRL's `ChunkedLogProbFunction.apply`; CPU -> torch, CUDA -> TRL."""

    def __init__(self, cuda_kernel) -> None:
        self.cuda_kernel = cuda_kernel

    def apply(
        self,
        hidden,
        weight,
        bias,
        targets,
        temperature,
        chunk_size,
        final_logit_softcapping=None,
        logit_scale=1.0,
        outputs=("entropy",),
    ):
        if hidden.is_cuda and self.cuda_kernel is not None:
            return self.cuda_kernel.apply(
                hidden,
                weight,
                bias,
                targets,
                temperature,
                chunk_size,
                final_logit_softcapping,
                logit_scale,
                outputs,
            )
        return torch_logprobs(
            hidden,
            weight,
            bias,
            targets,
            temperature,
            final_logit_softcapping,
            logit_scale,
            outputs,
        )


def torch_logprobs(
    hidden, weight, bias, targets, temperature, softcap=None, logit_scale=1.0, outputs=("entropy",)
):
    """Per-token log-probs (and the optional outputs TRL's kernel offers) with full logits."""
    logits = F.linear(hidden, weight, bias).float() * logit_scale
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    logits = logits / temperature
    log_probs_all = logits.log_softmax(dim=-1)
    log_probs = log_probs_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs_all.exp() * log_probs_all).sum(-1) if "entropy" in outputs else None
    with torch.no_grad():
        log_sum_sq = (
            torch.logsumexp(2 * log_probs_all, dim=-1) if "log_sum_sq_probs" in outputs else None
        )
        mean_logits = logits.mean(-1) if "mean_logits" in outputs else None
        is_top1 = logits.argmax(-1) == targets if "is_top1" in outputs else None
    return log_probs, entropy, log_sum_sq, mean_logits, is_top1


def install_cpu_logprob_fallback() -> None:
    """Route TRL's fused-LM-head kernel through the device dispatcher (idempotent)."""
    from trl.trainer import utils as trl_utils

    current = trl_utils._ChunkedLogProbFunction
    if not isinstance(current, _DeviceDispatchingLogProb):
        trl_utils._ChunkedLogProbFunction = _DeviceDispatchingLogProb(current)
