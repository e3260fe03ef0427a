"""What ERL costs on top of GRPO, measured side by side in one process.

    python bench/erl_overhead.py [--steps 12] [--warmup 3] [--backend transformers|unsloth]

Trains GRPOTrainer, ERLTrainer with the gate closed (threshold below every reward) and
ERLTrainer with every row gated, on the offline tiny model with the same data and seed, in
interleaved rounds, and prints one `name: value` line per figure (medians over all rounds):

    gate_closed_step_ratio   median step time, ERL (gate closed) / GRPO   (target <= 1.05)
    all_gated_step_ratio     median step time, ERL (every row gated) / GRPO
    erl_overhead_share       share of an all-gated ERL step spent outside generation and
                             forward/backward (scoring, feedback, templating, merging)
                             (target <= 0.05)
    peak_memory_ratio        peak memory while training, ERL (all gated) / GRPO (CUDA:
                             max allocated; CPU: peak resident-set growth over the start)
                             (target <= 1.5)

`--backend unsloth` measures on Unsloth's generated GRPOTrainer (on a CPU through the
`ERL_UNSLOTH_CPU_TRAINER=1` opt-in, which this flag sets); GRPO is then that trainer too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

from pipeline.backend import UNSLOTH_CPU_TRAINER_ENV, activate_backend

# The backend decides how trl is imported, so it is read before anything imports trl.
_pre = argparse.ArgumentParser(add_help=False)
_pre.add_argument("--backend", choices=("transformers", "unsloth"), default="transformers")
BACKEND = _pre.parse_known_args(sys.argv[1:])[0].backend
if BACKEND == "unsloth":
    os.environ.setdefault(UNSLOTH_CPU_TRAINER_ENV, "1")
activate_backend(BACKEND)

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from curriculum.tasks import get_task  # noqa: E402
from pipeline import ERLConfig, ERLTrainer, build_tiny_model  # noqa: E402
from pipeline.model_loading import add_mode_switches  # noqa: E402


def length_reward(completions, **kwargs):
    """Varies between completions, so every step has a gradient."""
    return [(len(c[0]["content"]) % 4) / 3 for c in completions]


def feedback(completions, **kwargs):
    return ["The answer must be exactly <answer>N</answer>."] * len(completions)


class Timed:
    """Mixin: accumulates wall time spent in the phases the figures are made of."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.phase_seconds = defaultdict(float)
        self.step_seconds: list[float] = []

    def _timed(self, phase, fn, *args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.phase_seconds[phase] += time.perf_counter() - start

    def training_step(self, *args, **kwargs):
        start = time.perf_counter()
        out = self._timed("step", super().training_step, *args, **kwargs)
        self.step_seconds.append(time.perf_counter() - start)
        return out

    def _prepare_inputs(self, *args, **kwargs):
        return self._timed("prepare", super()._prepare_inputs, *args, **kwargs)

    def _generate_single_turn(self, *args, **kwargs):
        return self._timed("generate", super()._generate_single_turn, *args, **kwargs)

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        # Only the no-grad forwards inside _prepare_inputs are counted here; the training
        # forward/backward is the step time outside _prepare_inputs.
        if torch.is_grad_enabled():
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)
        return self._timed("forward", super()._get_per_token_logps_and_entropies, *args, **kwargs)


class TimedGRPO(Timed, GRPOTrainer):
    pass


class TimedERL(Timed, ERLTrainer):
    pass


class PeakMemory:
    """Peak memory during a block: CUDA max allocated, or sampled resident-set growth on CPU."""

    def __enter__(self):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            self.start = self.peak = _rss()
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            self.bytes = torch.cuda.max_memory_allocated() - self.start
        else:
            self._stop.set()
            self._thread.join()
            self.bytes = self.peak - self.start


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def run(trainer_cls, args, model_dir, dataset, warmup, **extra):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)  # Unsloth's trainer takes objects
    add_mode_switches(model)
    trainer = trainer_cls(
        model=model, args=args, train_dataset=dataset, reward_funcs=length_reward, **extra
    )
    with PeakMemory() as memory:
        trainer.train()
    steps = trainer.step_seconds[warmup:]
    phases = {
        k: v * len(steps) / len(trainer.step_seconds) for k, v in trainer.phase_seconds.items()
    }
    return steps, phases, sum(steps), memory.bytes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=12, help="measured steps per trainer")
    parser.add_argument("--warmup", type=int, default=3, help="steps excluded from the figures")
    parser.add_argument(
        "--rounds", type=int, default=2, help="interleaved rounds of the three variants"
    )
    parser.add_argument("--batch", type=int, default=16, help="completions per step")
    parser.add_argument("--max_completion_length", type=int, default=24)
    parser.add_argument(
        "--backend",
        choices=("transformers", "unsloth"),
        default="transformers",
        help="base trainer: TRL's GRPOTrainer, or Unsloth's generated one",
    )
    opts = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="erl-bench-"))
    model_dir = build_tiny_model(str(work / "tiny"))
    dataset = Dataset.from_list(get_task("arithmetic").generate(1, 512, seed=0))
    common = dict(
        per_device_train_batch_size=opts.batch,
        num_generations=4,
        max_completion_length=opts.max_completion_length,
        max_steps=opts.warmup + opts.steps,
        learning_rate=1e-4,
        bf16=False,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        # Pinned where Unsloth's config defaults differ from TRL's, so both backends train
        # the same way.
        optim="adamw_torch",
        gradient_accumulation_steps=1,
        gradient_checkpointing=False,
        loss_type="dapo",
        beta=0.0,
        mask_truncated_completions=False,
        epsilon_high=0.2,
        warmup_steps=0,
        weight_decay=0.0,
    )

    configs = {
        "grpo": (TimedGRPO, lambda i: GRPOConfig(output_dir=str(work / f"grpo{i}"), **common), {}),
        "erl_gate_closed": (
            TimedERL,
            lambda i: ERLConfig(
                output_dir=str(work / f"closed{i}"), reward_threshold=-1.0, **common
            ),
            {"feedback_func": feedback},
        ),
        "erl_all_gated": (
            TimedERL,
            lambda i: ERLConfig(output_dir=str(work / f"gated{i}"), reward_threshold=2.0, **common),
            {"feedback_func": feedback},
        ),
    }
    # Interleaved rounds, so that drift in the machine's load affects every variant alike.
    steps, memory, phases, totals = (
        defaultdict(list),
        defaultdict(list),
        defaultdict(float),
        defaultdict(float),
    )
    for round_index in range(opts.rounds):
        for name, (cls, make_args, extra) in configs.items():
            step_times, round_phases, total, peak = run(
                cls, make_args(round_index), model_dir, dataset, opts.warmup, **extra
            )
            steps[name] += step_times
            memory[name].append(peak)
            totals[name] += total
            for key, value in round_phases.items():
                phases[name, key] += value
    median = {name: statistics.median(times) for name, times in steps.items()}
    grpo_time, closed_time, gated_time = (
        median["grpo"],
        median["erl_gate_closed"],
        median["erl_all_gated"],
    )
    grpo_mem, gated_mem = max(memory["grpo"]), max(memory["erl_all_gated"])
    phases = {key: phases["erl_all_gated", key] for key in ("prepare", "generate", "forward")}
    total = totals["erl_all_gated"]

    outside = phases["prepare"] - phases["generate"] - phases.get("forward", 0.0)
    print(
        f"backend: {BACKEND} ({GRPOTrainer.__name__}), "
        f"device: {'cuda' if torch.cuda.is_available() else 'cpu'}, steps: {opts.rounds} x {opts.steps} "
        f"(after {opts.warmup} warm-up each), completions/step: {opts.batch}"
    )
    print(f"median_step_s[grpo]: {grpo_time:.4f}")
    print(f"median_step_s[erl_gate_closed]: {closed_time:.4f}")
    print(f"median_step_s[erl_all_gated]: {gated_time:.4f}")
    print(f"gate_closed_step_ratio: {closed_time / grpo_time:.3f}")
    print(f"all_gated_step_ratio: {gated_time / grpo_time:.3f}")
    print(f"erl_overhead_share: {outside / total:.3f}")
    print(f"peak_memory_ratio: {gated_mem / max(grpo_mem, 1):.3f}")


if __name__ == "__main__":
    main()
