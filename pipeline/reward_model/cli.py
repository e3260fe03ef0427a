"""Train a reward model from preference pairs or ratings: `python -m pipeline.reward_model`.

    python -m pipeline.reward_model --pairs pairs.jsonl --base <model> --output_dir runs/rm
    python -m pipeline.reward_model --dataset_name data.parquet --base <model> --output_dir runs/rm
    python -m pipeline.reward_model --from_run runs/x --base <model> --output_dir runs/rm --use_lora true
    python -m pipeline.reward_model --config rm.yaml --num_train_epochs 12   # recipe + overrides
    python -m pipeline.reward_model --help                                   # every option

The options are TRL's `RewardConfig` fields plus the project's few
(`pipeline.reward_model.config`); pairs: `pipeline.reward_model.pairs`; training:
`pipeline.reward_model.train`. The last line printed is `heldout_pair_accuracy: X`.
"""

from __future__ import annotations

import sys

from pipeline.reward_model.pairs import pairs_from_run, read_dataset, read_pairs
from pipeline.reward_model.train import train_reward_model


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from pipeline.models.backend import activate_backend

    activate_backend()  # unsloth (on a GPU) must be imported before trl and transformers
    from pipeline.reward_model.config import parse_reward_model_config

    try:
        options, args = parse_reward_model_config(argv)
        if options.from_run:
            pairs = pairs_from_run(options.from_run)
        elif options.pairs:
            pairs = read_pairs(options.pairs)
        else:
            pairs = read_dataset(
                options.dataset_name, options.dataset_config, options.dataset_train_split
            )
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary = train_reward_model(pairs, options, args)
    print(f"pairs: {summary['train_pairs']} train, {summary['heldout_pairs']} held out")
    print(f"train_loss: {summary['train_loss']:.4f}")
    print(f"saved: {args.output_dir}")
    accuracy = summary["heldout_pair_accuracy"]
    if accuracy is None:
        print(f"train_pair_accuracy: {summary['train_pair_accuracy']:.4f} (nothing held out)")
        print("heldout_pair_accuracy: n/a")
    else:
        print(f"heldout_pair_accuracy: {accuracy:.4f}")
    return 0
