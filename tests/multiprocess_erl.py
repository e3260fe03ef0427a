"""ERL training on the tiny model, run once per gate setting; used by tests/test_multiprocess.py.

    accelerate launch --config_file configs/accelerate/ddp.yaml tests/multiprocess_erl.py MODEL OUT 6
    python tests/multiprocess_erl.py MODEL OUT 12

Every process writes OUT/<gate>/rank<i>.pt: its world size, final parameters, the erl/
metrics it logged and its reflection memory. Generation is made independent of how rows
are laid out over processes (see `KeyedSamplingERLTrainer`), so two processes with batch
B and one with batch 2B must end with the same parameters, metrics and memory.
"""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import torch
from datasets import Dataset
from rank_results import save_rank_result

from curriculum.tasks import get_task
from pipeline import ERLConfig, ERLTrainer
from rewards import completion_text

# reward_threshold and which attempts the reward scores, per gate setting.
GATES = {
    "closed": -1.0,  # no row reflects: ERL trains as GRPO
    "all": 0.5,  # first attempts score 0: every row reflects and retries, some retries succeed
    "some": 0.5,  # first attempts score by length: only some rows reflect
}
STEPS = 2


def length_reward(completions, attempt=None, **kwargs) -> list[float]:
    """(length mod 4) / 3: varies between completions, so GRPO has a gradient."""
    return [(len(completion_text(c)) % 4) / 3 for c in completions]


def retry_only_reward(completions, attempt=None, **kwargs) -> list[float]:
    """0 for first attempts, `length_reward` for retries (`attempt` 2): every row is gated."""
    if attempt is None:
        return [0.0] * len(completions)
    return length_reward(completions)


def feedback(completions, **kwargs) -> list[str]:
    return [f"You wrote {completion_text(c)[:12]!r}." for c in completions]


class KeyedSamplingERLTrainer(ERLTrainer):
    """ERLTrainer whose sampling of a row does not depend on how rows are laid out.

    Each process has its own random stream, so one process with 2B rows and two with B
    would otherwise sample different completions. Here every row is sampled by the real
    model (TRL's own generation, temperature 1), alone, with the torch seed set from the
    step, its prompt tokens and, for first attempts, its index in the global generation
    batch (copies of one prompt must differ). Reflections and retries are keyed by their
    prompt alone: their global position shifts with the per-process padding rows.
    """

    def _generate_single_turn(
        self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False
    ):
        first_attempts = num_generations == self.num_generations  # ERL's calls pass 1
        offset = self.accelerator.process_index * len(prompt_ids)
        completions = []
        for i, ids in enumerate(prompt_ids):
            key = [self.state.global_step, offset + i if first_attempts else -1, *ids]
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(zlib.crc32(str(key).encode()))
                ids_out, _ = super()._generate_single_turn([ids], None, {}, 1)
            completions += ids_out
        return completions, None


def train(
    model_dir: str, out: Path, batch_size: int, gate: str, loss_type: str | None = None
) -> None:
    """Two steps of `gate`'s setting at `loss_type` (None: ERLConfig's default), saved under
    `out / gate` (`out / loss_type / gate` when a loss type is given). With a loss type the
    optimizer is plain SGD without gradient clipping, under which a loss scaled by a
    constant moves the parameters by that much more (Adam and clipping would hide it)."""
    rows = get_task("arithmetic").generate(1, 16, seed=0)
    out = out / loss_type if loss_type else out
    sgd = {"loss_type": loss_type, "optim": "sgd", "max_grad_norm": 0.0, "learning_rate": 0.5}
    args = ERLConfig(
        # Large rates, so that every step moves the parameters visibly.
        **(sgd if loss_type else {"learning_rate": 1e-2}),
        output_dir=str(out / gate / "trainer"),
        per_device_train_batch_size=batch_size,
        num_generations=4,
        max_completion_length=8,
        reflection_max_completion_length=8,
        max_steps=STEPS,
        reward_threshold=GATES[gate],
        bf16=False,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = KeyedSamplingERLTrainer(
        model=model_dir,
        args=args,
        train_dataset=Dataset.from_list(rows),
        reward_funcs=retry_only_reward if gate == "all" else length_reward,
        feedback_func=feedback,
    )
    trainer.train()
    save_rank_result(trainer, out / gate)


if __name__ == "__main__":
    # MODEL OUT BATCH [LOSS_TYPE,... GATE,...]: every gate at the default loss type, or the
    # gates given at each loss type given.
    model_dir, out, batch = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    if len(sys.argv) > 4:
        for loss_type in sys.argv[4].split(","):
            for gate in sys.argv[5].split(","):
                train(model_dir, out, batch, gate, loss_type)
    else:
        for gate in GATES:
            train(model_dir, out, batch, gate)
