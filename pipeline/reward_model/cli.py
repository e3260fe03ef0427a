"""Train a reward model from preference pairs or ratings: `python -m pipeline.reward_model`.

    python -m pipeline.reward_model --pairs pairs.jsonl --model_name_or_path <model> --output_dir runs/rm
    python -m pipeline.reward_model --dataset_name data.parquet --model_name_or_path <model> --output_dir runs/rm
    python -m pipeline.reward_model --from_run runs/x --model_name_or_path <model> --output_dir runs/rm --use_lora true
    python -m pipeline.reward_model --config rm.yaml --num_train_epochs 12   # recipe + overrides
    python -m pipeline.reward_model --help                                   # every option

The options are TRL's `RewardConfig` fields plus the project's few
(`pipeline.reward_model.config`); pairs: `pipeline.reward_model.pairs`; training:
`pipeline.reward_model.train`. The last line printed is `heldout_pair_accuracy: X`. A bad
option, a bad pair or a base model that is not there is one line, `error: ...`, with exit
code 2, before anything is written (`pipeline.options`); so is an `--output_dir` another
command is writing (`pipeline.lock`).
"""

from __future__ import annotations

from pathlib import Path

from pipeline.options import UsageError, run_command, usage_errors


def main(argv: list[str] | None = None) -> int:
    """`python -m pipeline.reward_model`; returns the exit code (2: refused, in one line)."""
    from pipeline.lock import released_at_end

    with released_at_end():  # the output folder's lock (pipeline.lock)
        return run_command(train_from_command_line, argv, _help, _help_all)


def _help() -> str:
    """The --help text: the stored one when it is current, else the parser's (slow)."""
    from pipeline.models.backend import activate_backend
    from pipeline.options import project_help, stored_help
    from pipeline.reward_model import help_text as stored
    from pipeline.reward_model.config import PROG, reward_model_parser

    text = stored_help(stored, PROG)
    if text is None:
        activate_backend()  # before trl
        text = project_help(reward_model_parser())
    return text


def _help_all() -> str:
    """Every option, RewardConfig's included (builds the parser)."""
    from pipeline.models.backend import activate_backend
    from pipeline.reward_model.config import reward_model_parser

    activate_backend()  # before trl
    return reward_model_parser().format_help()


def train_from_command_line(argv: list[str]) -> int:
    """Read the options and the pairs, check the base model, train, print the summary."""
    from pipeline.models.backend import activate_backend
    from pipeline.options import check_local_model_early, check_model_source

    check_local_model_early(argv, "model_name_or_path", "base")  # before the slow imports
    activate_backend()  # unsloth (on a GPU) must be imported before trl and transformers
    from pipeline.reward_model.config import parse_reward_model_config
    from pipeline.reward_model.pairs import pairs_from_run, read_dataset, read_pairs
    from pipeline.reward_model.train import train_reward_model

    options, args = parse_reward_model_config(argv)
    with usage_errors(OSError, ValueError):  # a pair file's own messages name file and line
        if options.from_run:
            pairs = pairs_from_run(options.from_run)
        elif options.pairs:
            if not Path(options.pairs).is_file():
                raise UsageError(
                    "--pairs: no such file", options.pairs, "give a JSONL of preference pairs"
                )
            pairs = read_pairs(options.pairs)
        else:
            pairs = read_dataset(
                options.dataset_name, options.dataset_config, options.dataset_train_split
            )
    check_model_source(options.model_name_or_path, "--model_name_or_path")
    from pipeline.lock import hold_folder

    hold_folder(Path(args.output_dir), "--output_dir")  # one writer at a time
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
