"""Gate b's question asked step by step: SFT from a warm checkpoint on a code's (or rule's)
right answers, at a constant rate, with held-out and training success every `--every`
steps. Gate b (`bench/learning_gates.capacity`) answers it once, after its steps under the
warm-up's cosine schedule; this shows whether a failure there is a wall or a plateau the
rate's decay stopped short of (docs/log.md, 2026-12-06).

    python bench/capacity_curve.py --warm .cache/bench-learning/warm-<key> --rule 1:0 \
        --steps 600 --batch 24 --lr 1e-3
"""

from __future__ import annotations

import argparse
import dataclasses

import learning
import learning_arms as arms
import learning_gates as gates
import torch
from transformers import AutoTokenizer, TrainerCallback
from trl import SFTTrainer

from pipeline.run.warmup import reference_dataset


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm", required=True, help="a warm checkpoint folder")
    parser.add_argument("--task", default="hidden_code", choices=sorted(learning.PRESETS))
    parser.add_argument("--rule", default="1:0", help="level:rule_seed")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--every", type=int, default=100)
    opts = parser.parse_args(argv)
    torch.set_num_threads(1)
    _, s = learning.parse_options(["--task", opts.task, "--rules", opts.rule])
    task = arms.make_task(s)
    tokenizer = AutoTokenizer.from_pretrained(opts.warm)
    model = arms.load_model(opts.warm)
    evaluate = arms.held_out(task, tokenizer, s)
    data = reference_dataset(task, s.level, 4000, seed=700_000)  # training seeds, as gate b
    _, config = gates._warm_config(s, "/tmp/capacity-curve", opts.steps)
    config = dataclasses.replace(
        config, lr_scheduler_type="constant", warmup_steps=0, learning_rate=opts.lr,
        per_device_train_batch_size=opts.batch, disable_tqdm=True, save_strategy="no",
    )  # fmt: skip

    class Every(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % opts.every == 0:
                model.eval()
                result = evaluate(model)
                model.train()
                print(f"step {state.global_step}: held-out {result['success']:.2f}, "
                      f"train {result.get('train_success', float('nan')):.2f}", flush=True)  # fmt: skip

    SFTTrainer(
        model=model, args=config, train_dataset=data, processing_class=tokenizer,
        callbacks=[Every()],
    ).train()  # fmt: skip


if __name__ == "__main__":
    main()
