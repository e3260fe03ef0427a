"""ERL's memory budget: how wide a loss micro-batch or a reflection/retry generate call may
be, planned from what this backend's own loss forward is measured to hold.

GRPO's step peaks in its loss forward: `per_device_train_batch_size` rows of its batch,
whose activations are kept for the backward. ERL adds a reflection and a retry generation
and about 4x the rows to the loss. `ERLConfig.peak_memory_factor` (default 1.5) caps every
one of those calls at that multiple of GRPO's loss forward, so that an all-gated step peaks
at most that much above a GRPO step (checked by bench/erl_overhead.py):

- a loss micro-batch holds at most the tokens whose measured cost (`LossCost`), on top of
  what the chunk already holds when it starts (the gradients of the micro-batches before
  it), is the factor times that of GRPO's forward (or of the gradients, when those are
  more). Tokens are what the backend's forward holds: rows x
  padded width on TRL's trainer; on Unsloth's, which packs a forward's rows into one
  sequence, the rows' own tokens. The cost need not be proportional to them: Unsloth's
  packed forward on a CPU holds a mask and attention over the whole packed sequence;
- a generate call holds at most the factor times the measured bytes of GRPO's forward. A
  call's bytes are estimated by `MemoryModel` (KV cache, one layer's activations while the
  prompt is read, each row's next-token distribution), scaled by the largest ratio of
  measured to estimated bytes of the calls measured.

Measuring (`StepBudget`): during the first `CALIBRATION_CHUNKS` merged chunks, every loss
forward and every reflection/retry generate call is measured (`peak_meter`: the CUDA
allocator's peak, elsewhere a count of the tensor storages PyTorch creates), then never
again, as counting slows every operator. Every process's samples are pooled, so that all
plan alike. Until the first measurement, a micro-batch holds at most the tokens of GRPO's
own forward and generate calls are weighed against `MemoryModel`'s estimate of it. Under
vLLM, which manages its own cache, reflections and retries are one call each.

What the fit may find depends on the layout. TRL's trainer pads each row: no tensor of its
forward spans more than one row, so the bytes are proportional to the tokens at a given
width, and the fit has no growth term (one it found there at the default step was an
artefact: two- and three-row forwards of one width differing by ~2.6% a token). Unsloth's
trainer packs the rows into one sequence whose mask and attention grow with it: there the
growth is real and fitted, and while calibrating a plan goes no further above the largest
forward measured than a cost growing with the square of the tokens allows (every cost
T x (per_token + growth x T) is at most that), since a first chunk of alike forwards can
hide the growth.

On a CPU with torch.compile on (Unsloth's compiled loss), nothing is measured: the storage
count is a TorchDispatchMode, which compiled code refuses to run under, and measuring
around the compiled regions would miss the loss forward, the step's peak. The plan then
stays the one made before any measurement, within GRPO's own forward (`measure=False`).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from pipeline.erl.micro_batches import pack

# Merged chunks whose loss forwards and generate calls are measured; the plan is refitted
# after each. Two: the first is planned within GRPO's own forward, the second at the fitted
# size, which the second measurement then checks.
CALIBRATION_CHUNKS = 2


# Measuring ---------------------------------------------------------------------------


class StoragePeakMeter(TorchDispatchMode):
    """Peak bytes of tensor storages between `begin_step` and `end_step`, above those live at
    `begin_step`, on any device: a TorchDispatchMode counting each storage an operator
    creates until Python frees it (the CPU stand-in for the CUDA allocator's count). Use it
    as a context around the steps; `steps` holds each step's peak.

    It misses storages made outside PyTorch's dispatcher, and work done inside one
    operator's kernel (bitsandbytes' CPU `gemm_4bit` dequantizes a whole weight inside it),
    and it slows every operator."""

    def __init__(self) -> None:
        super().__init__()
        self._seen = WeakIdKeyDictionary()  # storage -> bytes, so views are counted once
        self.live = 0  # bytes of the storages created since the meter was entered, still alive
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


class CudaPeakMeter:
    """The same figures from the CUDA allocator (it resets the allocator's peak counter)."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self._base = self._start = 0

    def __enter__(self):
        self._start = torch.cuda.memory_allocated()
        return self

    def __exit__(self, *exc) -> None:
        return None

    @property
    def live(self) -> int:
        """Bytes allocated above those allocated when the meter was entered."""
        return torch.cuda.memory_allocated() - self._start

    def begin_step(self) -> None:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self._base = torch.cuda.memory_allocated()

    def end_step(self) -> None:
        torch.cuda.synchronize()
        self.steps.append(torch.cuda.max_memory_allocated() - self._base)


def peak_meter(device: torch.device | str | None = None) -> StoragePeakMeter | CudaPeakMeter:
    """The allocator's figures on a CUDA device, the storage count elsewhere (default device:
    CUDA when there is one)."""
    if device is None:
        cuda = torch.cuda.is_available()
    else:
        cuda = torch.device(device).type == "cuda"
    return CudaPeakMeter() if cuda else StoragePeakMeter()


@contextmanager
def measured(device, samples: list[tuple[float, float]], key: float) -> Iterator[None]:
    """Append (key, peak bytes of the block above its start) to `samples`."""
    meter = peak_meter(device)
    with meter:
        meter.begin_step()
        yield
        meter.end_step()
    samples.append((float(key), float(meter.steps[-1])))


# Costs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LossCost:
    """Bytes a loss forward (with its backward) holds over T tokens: T x (per_token +
    growth x T). `growth` is what grows with the forward's size, such as attention over a
    packed sequence; 0 where the cost is proportional to the tokens."""

    per_token: float
    growth: float = 0.0

    @classmethod
    def fit(cls, samples: Sequence[tuple[float, float, float]], grows: bool = True) -> LossCost:
        """The line of bytes per token against tokens through (tokens, bytes, completion
        share) samples; flat (no growth) unless the cost `grows`, as the packed layout's.

        Its slope, the growth, is the median of the slopes between samples of alike
        composition (completion shares within 0.05: a forward of short rows holds more
        logits per token than one of long rows) whose tokens differ by 10% or more
        (Theil-Sen: a first call's one-off allocation moves it little); 0 when that is
        negative or there are no such pairs. per_token is the token-weighted mean of what
        remains."""
        values = torch.tensor([list(sample) for sample in samples], dtype=torch.float64)
        tokens, share = values[:, 0].clamp(min=1.0), values[:, 2]
        per = values[:, 1] / tokens
        smaller = torch.minimum(tokens[:, None], tokens[None, :])
        pairs = (tokens[:, None] - tokens[None, :] >= 0.1 * smaller) & (
            (share[:, None] - share[None, :]).abs() <= 0.05
        )
        slopes = ((per[:, None] - per[None, :]) / (tokens[:, None] - tokens[None, :]))[pairs]
        fitted = grows and slopes.numel() > 0
        growth = max(slopes.median().item(), 0.0) if fitted else 0.0
        weight = tokens / tokens.sum()
        per_token = (weight * (per - growth * tokens)).sum().item()
        if per_token < 0:  # all growth: the weighted least-squares T^2 through the origin
            growth = ((weight * per * tokens).sum() / (weight * tokens.square()).sum()).item()
            return cls(0.0, growth)
        return cls(per_token, growth)

    @classmethod
    def square_through(cls, tokens: float, measured: float) -> LossCost:
        """The cost growing with the square of the tokens through one measured forward: for
        more tokens, an upper bound on every cost T x (per_token + growth x T) through it."""
        return cls(0.0, measured / max(tokens, 1.0) ** 2)

    def bytes(self, tokens: float) -> float:
        """The bytes of a forward over `tokens` tokens."""
        return tokens * (self.per_token + self.growth * tokens)

    def tokens_within(self, limit: float) -> float:
        """The most tokens whose forward holds at most `limit` bytes."""
        a, b = self.per_token, self.growth
        if b == 0:
            return limit / a if a > 0 else math.inf
        return (-a + math.sqrt(a * a + 4 * b * limit)) / (2 * b)


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

    def scaled(self, factor: float) -> MemoryModel:
        """Every estimate times `factor`."""
        return replace(
            self,
            activation=self.activation * factor,
            cache=self.cache * factor,
            layer=self.layer * factor,
            logits=self.logits * factor,
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


# The budget -------------------------------------------------------------------------


class StepBudget:
    """One trainer's budget: `loss_tokens()` per loss forward and `plan_generation` for
    generate calls, from `factor` x GRPO's loss forward of `reference_tokens` tokens (set
    for every generation batch), measured on the first merged chunks (`packed`: the rows of
    a forward are one sequence, Unsloth's layout; `measure` False: never measured)."""

    def __init__(
        self,
        factor: float,
        estimate: MemoryModel,
        device,
        packed: bool = False,
        measure: bool = True,
    ) -> None:
        self.factor = factor
        self.estimate = estimate
        self.device = device
        self.packed = packed
        self.reference_tokens = 0
        self.cost: LossCost | None = None
        # What a chunk already holds when a later micro-batch's forward starts (the
        # gradients of those before it), at most: GRPO's one forward holds none of it.
        self.held = 0.0
        # Measured / estimated bytes of generate calls: the largest ratio measured (1 before).
        self.generate_scale = 1.0
        self._generate_ratio = 0.0
        self._chunks_left = CALIBRATION_CHUNKS if measure else 0
        self._meter: StoragePeakMeter | CudaPeakMeter | None = None  # during a chunk
        self._loss: list[tuple[float, ...]] = []  # (tokens, bytes, share, held), this chunk
        self._generate: list[tuple[float, float]] = []  # (estimated, measured bytes)
        self._pooled: list[tuple[float, ...]] = []  # every process's (tokens, bytes, share)

    def state_dict(self) -> dict:
        """What the budget has measured, for a checkpoint: a resumed run plans its generate
        calls and loss micro-batches as the uninterrupted run does (its calls, split
        otherwise, would sample other reflections and retries)."""
        return {
            "chunks_left": self._chunks_left,
            "held": self.held,
            "generate_ratio": self._generate_ratio,
            "generate_scale": self.generate_scale,
            "pooled": [list(sample) for sample in self._pooled],
        }

    def load_state_dict(self, state: dict) -> None:
        self._chunks_left = int(state["chunks_left"])
        self.held = float(state["held"])
        self._generate_ratio = float(state["generate_ratio"])
        self.generate_scale = float(state["generate_scale"])
        self._pooled = [tuple(sample) for sample in state["pooled"]]
        self.cost = LossCost.fit(self._pooled, grows=self.packed) if self._pooled else None

    @property
    def calibrating(self) -> bool:
        """Whether loss forwards and generate calls are still being measured."""
        return self._chunks_left > 0

    def loss_tokens(self) -> int:
        """The most tokens a loss forward of a merged chunk may hold."""
        if self.cost is None:  # nothing measured yet: no more than GRPO's own forward
            return max(1, int(min(1.0, self.factor) * self.reference_tokens))
        # GRPO's step holds at least its forward, and at least the gradients its backward
        # leaves; a later micro-batch's forward starts on those gradients.
        reference = max(self.cost.bytes(self.reference_tokens), self.held)
        limit = max(self.factor * reference - self.held, 0.0)
        tokens = self.cost.tokens_within(limit)
        if self.calibrating and self.packed:  # a growth the first chunk may have hidden
            largest_tokens, largest_bytes, _ = max(self._pooled)
            bound = LossCost.square_through(largest_tokens, largest_bytes)
            tokens = min(tokens, bound.tokens_within(limit))
        return max(1, int(min(tokens, 2**62)))

    def generation_bytes(self) -> float:
        """The most bytes a reflection or retry generate call may hold."""
        if self.cost is None:
            return self.factor * self.estimate.loss_forward(self.reference_tokens)
        return self.factor * self.cost.bytes(self.reference_tokens)

    def plan_generation(self, prompt_lengths: Sequence[int], new_tokens: int) -> list[list[int]]:
        """Prompts (indices) per generate call, each call within `generation_bytes()`."""
        memory = self.estimate.scaled(self.generate_scale)
        return plan_generation(prompt_lengths, new_tokens, memory, self.generation_bytes())

    @contextmanager
    def generate_call(self, rows: int, longest_prompt: int, new_tokens: int) -> Iterator[None]:
        """Around one generate call: measured while calibrating."""
        if not self.calibrating:
            yield
            return
        estimate = self.estimate.generate_call(rows, longest_prompt, new_tokens)
        with measured(self.device, self._generate, estimate):
            yield

    @contextmanager
    def chunk(self, gather: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
        """Around a merged chunk's loss. While calibrating, its loss forwards are measured
        (`loss_forward`), and at its end every process's samples are pooled (`gather`: the
        accelerator's; every process has measured as many forwards) and the cost refitted."""
        if not self.calibrating:
            yield
            return
        self._meter = peak_meter(self.device)
        try:
            with self._meter:
                yield
        finally:
            self._meter = None
        self._chunks_left -= 1
        loss = torch.tensor(self._loss, dtype=torch.float32, device=self.device).reshape(-1, 4)
        ratio = max((measured / estimate for estimate, measured in self._generate), default=0.0)
        ratio = torch.tensor([ratio], dtype=torch.float32, device=self.device)
        self._loss, self._generate = [], []
        pooled = gather(loss).tolist()
        self._pooled += [tuple(sample[:3]) for sample in pooled]
        self.held = max([self.held] + [sample[3] for sample in pooled])
        self._generate_ratio = max(self._generate_ratio, gather(ratio).max().item())
        if self._generate_ratio > 0:  # some call was measured
            self.generate_scale = self._generate_ratio
        if self._pooled:
            self.cost = LossCost.fit(self._pooled, grows=self.packed)

    @contextmanager
    def loss_forward(self, tokens: int, share: float = 0.0) -> Iterator[None]:
        """Around one loss forward of `tokens` tokens (`share` of them completion tokens)
        inside `chunk`: measured while calibrating, with what the chunk already held when
        it started."""
        meter = self._meter
        if meter is None:
            yield
            return
        held = meter.live
        meter.begin_step()
        yield
        meter.end_step()
        self._loss.append((float(tokens), float(meter.steps[-1]), float(share), float(held)))
