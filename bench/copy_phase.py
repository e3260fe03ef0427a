"""Can a model learn to copy a lesson from its prompt, and after how many SFT steps?

    python bench/copy_phase.py                          # copy, the tiny model, 3,000 steps at 1e-3
    python bench/copy_phase.py --mode lookup            # the hint is the whole code
    python bench/copy_phase.py --hidden 128 --layers 4 --steps 600

The positive control of the learning bench (`--task hidden_code`) needs a policy that
applies a lesson it reads: a retry whose hint says `Q=3 Z=8` answers `Q=3 Z=8 ...`. This
bench isolates that skill. It trains the tiny model (or `--base PATH`) on hidden_code
retries only, each under a code of its own, and the hint is

- `copy`: the prompt's letters with their digits, in the prompt's order (the reply is the
  hint, verbatim), or
- `lookup`: the whole code in the code's order (the reply looks each letter up);

then answers, greedily, retries under 200 codes no training row used. It prints the SFT
loss every `--log_every` steps, the first step at which the loss fell below half its value
at `--plateau_from` (200; `phase_change_step`), and the share of evaluation replies solved, of
their letters right and of those that repeat the prompt's letters.

A small transformer learns such copying through a phase change (an induction head): the
loss sits on a plateau, then falls within a few hundred steps. A warm-up that stops on the
plateau leaves a model that writes the format but reads none of its prompt, which is what
the learning bench's gates on hidden_code found (docs/log.md).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from curriculum.tasks import get_task  # noqa: E402
from pipeline.erl.prompts import retry_prompt  # noqa: E402

RETRY_TEMPLATE = "{prompt}\nHint: {reflection}"  # the learning bench's (learning_arms.py)
TRAIN_SEED, EVAL_SEED = 1, 2  # streams of codes; a code drawn in both is dropped from training


def retry_rows(mode: str, n: int, seed: int) -> list[dict]:
    """`n` hidden_code retries at level 1, each under a code of its own rule seed."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        task = get_task("hidden_code", rule_seed=rng.randrange(10**9), split="all")
        row = task.generate(1, 1, seed=rng.randrange(10**6))[0]
        code = task.code(1)
        letters = task.meta(row)["symbols"] if mode == "copy" else list(code)
        hint = " ".join(f"{letter}={code[letter]}" for letter in letters)
        rows.append(
            {
                "prompt": retry_prompt(row["prompt"], RETRY_TEMPLATE, hint),
                "completion": [{"role": "assistant", "content": task.reference(row)}],
                "code": task.rule_text(1),
                "task": task,
                "row": row,
            }
        )
    return rows


def phase_change_step(losses: list[tuple[int, float]], plateau_from: int) -> int | None:
    """The first logged step whose loss is below half the plateau's, else None. The plateau's
    loss is the first logged at or after `plateau_from`: by then the initial descent (the
    format's tokens) is over, so a later halving is the copying being learned.

    >>> phase_change_step([(50, 2.1), (200, 0.8), (250, 0.73), (300, 0.3)], plateau_from=200)
    300
    """
    plateau = next((loss for step, loss in losses if step >= plateau_from), None)
    if plateau is None:
        return None
    return next((step for step, loss in losses if step > plateau_from and loss < plateau / 2), None)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("copy", "lookup"), default="copy")
    parser.add_argument("--base", default="tiny", help="'tiny' or a local model folder")
    parser.add_argument("--hidden", type=int, default=64, help="the tiny model's hidden size")
    parser.add_argument("--layers", type=int, default=2, help="the tiny model's layers")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rows", type=int, default=20_000, help="training rows")
    parser.add_argument("--eval_n", type=int, default=200)
    parser.add_argument("--log_every", type=int, default=50)
    parser.add_argument(
        "--plateau_from",
        type=int,
        default=200,
        help="the step from which the loss is on its plateau (phase_change_step)",
    )
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args(argv)
    for name in ("steps", "batch", "rows", "eval_n", "log_every"):
        if getattr(opts, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(opts, name)}")
    if opts.lr <= 0:
        parser.error(f"--lr must be > 0, got {opts.lr}")

    from pipeline.models.backend import activate_backend

    activate_backend()  # before trl: Unsloth first where it is the backend; TRL's CPU log-probs
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from pipeline.evaluate.first_attempts import generate_completions
    from pipeline.models.tiny import build_tiny_model

    torch.manual_seed(opts.seed)
    evaluation = retry_rows(opts.mode, opts.eval_n, EVAL_SEED)
    held = {r["code"] for r in evaluation}
    train = [r for r in retry_rows(opts.mode, opts.rows, TRAIN_SEED) if r["code"] not in held]
    with tempfile.TemporaryDirectory(prefix="copy-phase-") as work:
        folder = opts.base
        if opts.base == "tiny":
            folder = build_tiny_model(
                str(Path(work) / "tiny"), hidden_size=opts.hidden, num_hidden_layers=opts.layers
            )
        model = AutoModelForCausalLM.from_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        losses: list[tuple[int, float]] = []

        class Losses(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "loss" in logs:
                    losses.append((state.global_step, float(logs["loss"])))
                    print(f"loss[{state.global_step}]: {float(logs['loss']):.4f}", flush=True)

        config = SFTConfig(
            output_dir=str(Path(work) / "sft"), max_steps=opts.steps, learning_rate=opts.lr,
            per_device_train_batch_size=opts.batch, lr_scheduler_type="constant",
            logging_steps=opts.log_every, save_strategy="no", report_to=[], seed=opts.seed,
            use_cpu=not torch.cuda.is_available(), bf16=False, disable_tqdm=True,
        )  # fmt: skip
        dataset = Dataset.from_list([{k: r[k] for k in ("prompt", "completion")} for r in train])
        trainer = SFTTrainer(
            model=model, args=config, train_dataset=dataset, processing_class=tokenizer
        )
        trainer.add_callback(Losses())
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        replies = generate_completions(
            model, tokenizer, [r["prompt"] for r in evaluation], max_new_tokens=24,
            batch_size=64, progress=False,
        )  # fmt: skip
    scores = [r["task"].evaluate(r["row"], reply) for r, reply in zip(evaluation, replies)]
    echo = [all(s in reply for s in r["task"].meta(r["row"])["symbols"])
            for r, reply in zip(evaluation, replies)]  # fmt: skip
    figures = {
        "train_seconds": seconds,
        "final_loss": losses[-1][1] if losses else float("nan"),
        "phase_change_step": phase_change_step(losses, opts.plateau_from) or float("nan"),
        "solved": statistics.fmean(s.breakdown["correctness"] for s in scores),
        "letters_right": statistics.fmean(s.breakdown["milestones"] for s in scores),
        "replies_repeating_the_letters": statistics.fmean(echo),
    }
    for r, reply in list(zip(evaluation, replies))[:3]:
        print(f"  {r['prompt'][-1]['content'].splitlines()[-1]!r} -> {reply!r}")
    size = f" (hidden {opts.hidden}, {opts.layers} layers)" if opts.base == "tiny" else ""
    print(f"mode: {opts.mode}; model: {opts.base}{size}; {opts.steps} steps at {opts.lr:g}, "
          f"batch {opts.batch}, {len(train)} rows")  # fmt: skip
    for name, value in figures.items():
        print(f"{name}: {value:.4f}" if isinstance(value, float) else f"{name}: {value}")
    return figures


if __name__ == "__main__":
    main()
