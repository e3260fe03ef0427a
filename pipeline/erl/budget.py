"""ERL's memory budget: how large a reflection/retry generate call or a loss micro-batch
may be, as a multiple of GRPO's own loss forward.

GRPO's step peaks in its loss forward: `per_device_train_batch_size` rows of the batch's
width, whose activations are kept for the backward. ERL adds a reflection and a retry
generation and about 4x the rows to the loss. `ERLConfig.memory_budget` (default 1.5)
caps every one of those calls at that multiple of GRPO's forward, so that an all-gated
step peaks at most that much above a GRPO step:

- a loss micro-batch holds at most `memory_budget` x GRPO's padded tokens per forward
  (both keep the same activations per token);
- a generate call holds far less per token: no activations are kept for a backward, only
  the KV cache, one layer's activations at a time while the prompt is read, and each
  row's next-token distribution. `MemoryModel` estimates those bytes from the model's
  config, and `plan_generation` packs prompts into calls within the budget.

The estimates leave out what both kinds of work share (the weights, the optimizer) and
are checked on a CPU by `bench/erl_overhead.py`, which measures every step's peak.
Under vLLM, which manages its own cache, reflections and retries are one call each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.erl.micro_batches import pack


@dataclass(frozen=True)
class MemoryModel:
    """Estimated bytes per token of a policy's loss forward and of its generation."""

    activation: float
    """A loss forward: activations kept for the backward, per token of a trained row."""
    cache: float
    """A generate call: KV cache, per token of a row (prompt and new tokens)."""
    layer: float
    """A generate call: one layer's activations, per prompt token, while the prompt is read."""
    logits: float
    """A generate call: one row's next-token distribution (logits, probabilities, sample)."""

    @classmethod
    def of(cls, config, dtype_bytes: int, gradient_checkpointing: bool) -> MemoryModel:
        """The estimate for a model with this (text) `config`, activations of `dtype_bytes`.

        One decoder layer keeps about 6 x hidden + 2 x kv + 4 x intermediate values per
        token for its backward (norms, q/k/v, attention output, the MLP's gate, up,
        activation and down input); with gradient checkpointing only each layer's input is
        kept, and one layer's activations are rebuilt at a time."""
        hidden = config.hidden_size
        heads = config.num_attention_heads
        kv = (getattr(config, "num_key_value_heads", None) or heads) * (
            getattr(config, "head_dim", None) or hidden // heads
        )
        intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
        layers = config.num_hidden_layers
        layer = (6 * hidden + 2 * kv + 4 * intermediate) * dtype_bytes
        activation = (
            (layers * hidden * dtype_bytes + layer) if gradient_checkpointing else (layers * layer)
        )
        return cls(
            activation=float(activation),
            cache=float(2 * layers * kv * dtype_bytes),
            layer=float(layer),
            logits=float(3 * 4 * config.vocab_size),  # float32 logits, softmax, sampling
        )

    def loss_forward(self, tokens: int) -> float:
        """Bytes of a loss forward over `tokens` padded tokens (rows x width)."""
        return tokens * self.activation

    def generate_call(self, rows: int, longest_prompt: int, new_tokens: int) -> float:
        """Bytes of one generate call of `rows` prompts padded to `longest_prompt`."""
        return (
            rows * (longest_prompt + new_tokens) * self.cache
            + rows * longest_prompt * self.layer
            + rows * self.logits
        )


def plan_generation(
    prompt_lengths: Sequence[int], new_tokens: int, memory: MemoryModel, budget: float
) -> list[list[int]]:
    """Consecutive prompts per generate call, each call within `budget` bytes (a prompt
    that alone is over goes alone)."""
    return pack(
        list(range(len(prompt_lengths))),
        lambda rows: (
            memory.generate_call(len(rows), max(prompt_lengths[r] for r in rows), new_tokens)
            <= budget
        ),
    )
