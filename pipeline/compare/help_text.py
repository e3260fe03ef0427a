"""The --help texts of this package's commands, stored so that --help imports no
trl or transformers. Written by scripts/write_cli_help.py from the parsers: do not edit.
"""

LIBRARIES = {"transformers": "5.17.0", "trl": "1.15.0"}
TEXTS = {
    "python -m pipeline.compare": (
        "usage: python -m pipeline.compare --config RECIPE.yaml --methods grpo,erl[,sdpo] [--seeds N] [--output_dir DIR] [--option VALUE ...]\n"
        "\n"
        "Which method learns a task fastest: every method x seed from one shared warm-up, held-out first\n"
        "attempts at equal steps and equal generated tokens, 95% intervals. Every option of `python -m\n"
        "pipeline.run` goes to every run, but for those the comparison sets itself (method, resume, and with\n"
        "--budget_scope first_stage num_stages and a step budget's max_stage_steps). It writes\n"
        "comparison.json, comparison.png and the runs (runs/) into --output_dir when the command line gives\n"
        "it, else into <the recipe's output_dir>-compare; a second call reads its finished runs back.\n"
        "\n"
        "options:\n"
        "  -h, --help            show this help message and exit\n"
        "  --methods METHODS     Comma list of methods to compare: grpo, erl, sdpo (at least two). (default:\n"
        "                        grpo,erl)\n"
        "  --seeds SEEDS         Runs per method, paired across methods: the recipe's seed, seed+1, ... (the\n"
        "                        same rows in the same order for every method). (default: 3)\n"
        "  --budget BUDGET       Each run's budget in budget_unit (0: the recipe's own: max_stage_steps on\n"
        "                        the first stage, the whole curriculum otherwise). A token or seconds budget\n"
        "                        never runs a stage past max_stage_steps. (default: 0)\n"
        "  --budget_unit BUDGET_UNIT, --budget-unit BUDGET_UNIT\n"
        "                        steps, tokens (generated in training) or seconds (of training). (default:\n"
        "                        steps)\n"
        "  --budget_scope BUDGET_SCOPE, --budget-scope BUDGET_SCOPE\n"
        "                        first_stage: train the recipe's first stage for the whole budget (a\n"
        "                        promotion is recorded, not obeyed); curriculum: the run's stages as they\n"
        "                        come. (default: first_stage)\n"
        "  --learning_rates LEARNING_RATES, --learning-rates LEARNING_RATES\n"
        "                        Each method's peak learning rate, e.g. grpo=5e-5,erl=2e-4 (a method not\n"
        "                        named takes --learning_rate). (default: )\n"
        "  --eval_every EVAL_EVERY, --eval-every EVAL_EVERY\n"
        "                        Steps between held-out evaluations (and one at the start and end). (default:\n"
        "                        10)\n"
        "  --config RECIPE.yaml  YAML recipe of option: value lines; options given after it override it.\n"
        "\n"
        "Every option can also be set in the --config recipe. Booleans take true or false. A bad option is\n"
        "refused in one line with exit code 2; --log_level debug adds the traceback.\n"
    ),
}
