"""Learned reward models: collect ratings -> train -> score, `python -m pipeline.reward_model`.

collect.py  python -m pipeline.reward_model.collect: sample a policy, rate its replies
pairs.py    preference pairs from JSONL ratings and pairs, or from a run's samples
train.py    train_reward_model: TRL's RewardTrainer, held-out accuracy, calibration
cli.py      the training command line
signals.py  a trained model (or a preference function) as a reward signal and feedback
"""
