"""First-attempt evaluation, `python -m pipeline.evaluate`: the deployment view of a policy.

cli.py             the command line
first_attempts.py  evaluate_first_attempts, score_completions, load_for_evaluation
help_text.py       the stored --help text (scripts/write_cli_help.py writes it)
"""
