"""The curriculum run, `python -m pipeline.run`: stage by stage, with checkpoints,
reward curves and resume.

    cli.py          main(): config -> model -> task and rewards -> warm-up -> stages -> save
    config.py       RunConfig and the recipe/command-line parsing; the backend, resolved once
    checks.py       everything a start checks before it writes anything
    rewards.py      the run's reward functions, weights and feedback, assembled once
    stages.py       one stage: train until promoted or out of steps, evaluate, save
    warmup.py       the SFT warm-up on reference solutions
    checkpoints.py  saving and restoring the policy; where a killed run left off
    distributed.py  several processes: who writes, who waits
    console.py      progress bars, stage lines and warnings
    plots.py        reward-curve PNGs
    help_text.py    the stored --help text (scripts/write_cli_help.py writes it)

The output folder's names are in `pipeline.layout`.
"""
