"""Learned reward models: collect ratings -> train -> score, `python -m pipeline.reward_model`.

collect.py  python -m pipeline.reward_model.collect: sample a policy, rate its replies
formats.py  one record checked: TRL's preference formats (standard/conversational,
            explicit/implicit prompt, margin) and the project's ratings
pairs.py    preference pairs from JSONL, a `datasets` dataset, or a run's samples
config.py   the command line's options: RewardConfig's own plus RewardModelArguments
train.py    train_reward_model: TRL's RewardTrainer, held-out accuracy, calibration
cli.py      the training command line
signals.py  a trained model (or a preference function) as a reward signal and feedback
help_text.py  the stored --help texts of both commands (scripts/write_cli_help.py)
"""
