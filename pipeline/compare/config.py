"""`python -m pipeline.compare`'s own options, and how it splits its command line.

    python -m pipeline.compare --config configs/tiny.yaml --methods grpo,erl,sdpo --seeds 3

`CompareConfig` holds what the comparison adds; every other option is the run's
(`python -m pipeline.run --help`) and goes, with the recipe, to every run of the
comparison. What each run gets on top (its method, seed, learning rate, folder, budget)
is `run_argv`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from pipeline.options import UsageError, parse_options
from pipeline.run.config import METHODS, check_learning_rate

PROG = "python -m pipeline.compare"
BUDGET_UNITS = ("steps", "tokens", "seconds")
BUDGET_SCOPES = ("first_stage", "curriculum")
# Its options that are gone, and what to give instead (the refusal's last part).
REMOVED_OPTIONS = {
    "compare_dir": "give --output_dir instead: the comparison is written where it says "
    "(without it, in <the recipe's output_dir>-compare)",
}


@dataclass
class CompareConfig:
    """What to compare, on what budget, and how often to evaluate."""

    methods: str = field(
        default="grpo,erl",
        metadata={"help": "Comma list of methods to compare: grpo, erl, sdpo (at least two)."},
    )
    seeds: int = field(
        default=3,
        metadata={
            "help": "Runs per method, paired across methods: the recipe's seed, seed+1, ... "
            "(the same rows in the same order for every method)."
        },
    )
    budget: float = field(
        default=0,
        metadata={
            "help": "Each run's budget in budget_unit (0: the recipe's own: max_stage_steps on the "
            "first stage, the whole curriculum otherwise). A token or seconds budget never runs "
            "a stage past max_stage_steps."
        },
    )
    budget_unit: str = field(
        default="steps",
        metadata={"help": "steps, tokens (generated in training) or seconds (of training)."},
    )
    budget_scope: str = field(
        default="first_stage",
        metadata={
            "help": "first_stage: train the recipe's first stage for the whole budget (a "
            "promotion is recorded, not obeyed); curriculum: the run's stages as they come."
        },
    )
    learning_rates: str = field(
        default="",
        metadata={
            "help": "Each method's peak learning rate, e.g. grpo=5e-5,erl=2e-4 (a method not "
            "named takes --learning_rate)."
        },
    )
    eval_every: int = field(
        default=10,
        metadata={"help": "Steps between held-out evaluations (and one at the start and end)."},
    )

    def validate(self) -> None:
        """Reject bad values, naming them."""
        methods = self.method_list()
        unknown = [m for m in methods if m not in METHODS]
        if unknown:
            raise UsageError(
                "--methods: unknown method", ",".join(unknown), f"choose among {', '.join(METHODS)}"
            )
        if len(set(methods)) != len(methods) or len(methods) < 2:
            raise UsageError(
                "--methods: give at least two different methods", self.methods,
                f"choose among {', '.join(METHODS)}, e.g. grpo,erl,sdpo",
            )  # fmt: skip
        if self.seeds < 2:
            raise UsageError("--seeds must be >= 2 for an interval", self.seeds, "e.g. 3")
        if not (math.isfinite(self.budget) and self.budget >= 0):
            raise UsageError("--budget must be a number >= 0", self.budget, "e.g. 100")
        if self.budget_unit not in BUDGET_UNITS:
            raise UsageError(
                "--budget_unit: unknown unit", self.budget_unit, f"choose {', '.join(BUDGET_UNITS)}"
            )
        if self.budget_scope not in BUDGET_SCOPES:
            raise UsageError(
                "--budget_scope: unknown scope", self.budget_scope,
                f"choose {', '.join(BUDGET_SCOPES)}",
            )  # fmt: skip
        if self.budget_unit != "steps" and not self.budget:
            raise UsageError(
                f"--budget_unit {self.budget_unit} needs a --budget", self.budget, "e.g. 20000"
            )
        if self.eval_every < 1:
            raise UsageError("--eval_every must be >= 1", self.eval_every, "e.g. 10")
        self.rates()

    def method_list(self) -> list[str]:
        """The methods, in the order given."""
        return [m.strip() for m in self.methods.split(",") if m.strip()]

    def rates(self) -> dict[str, float]:
        """--learning_rates as {method: rate}."""
        rates = {}
        for item in filter(None, (i.strip() for i in self.learning_rates.split(","))):
            method, sep, value = item.partition("=")
            try:
                rate = float(value)
            except ValueError:
                rate = None
            if not sep or method not in self.method_list() or rate is None:
                raise UsageError(
                    "--learning_rates: each item is METHOD=RATE for a compared method",
                    item, "e.g. grpo=5e-5,erl=2e-4",
                )  # fmt: skip
            check_learning_rate("learning_rates", rate)
            rates[method] = rate
        return rates


def compare_parser():
    """The parser of the comparison's own options (for --help and parsing)."""
    from pipeline.options import options_parser

    return options_parser(
        (CompareConfig,),
        PROG,
        usage=f"{PROG} --config RECIPE.yaml --methods grpo,erl[,sdpo] [--seeds N] "
        "[--output_dir DIR] [--option VALUE ...]",
        description="Which method learns a task fastest: every method x seed from one shared "
        "warm-up, held-out first attempts at equal steps and equal generated tokens, 95% "
        "intervals. Every option of `python -m pipeline.run` goes to every run, but for those "
        "the comparison sets itself (method, resume, and with --budget_scope first_stage "
        "num_stages and a step budget's max_stage_steps). It writes comparison.json, "
        "comparison.png and the runs (runs/) into --output_dir when the command line gives "
        "it, else into <the recipe's output_dir>-compare; a second call reads its finished "
        "runs back.",
    )


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the comparison's own options, the command line every run gets), taken apart as
    text (nothing imported yet)."""
    names = {f"--{f.name}" for f in fields(CompareConfig)} | {f"--{n}" for n in REMOVED_OPTIONS}
    names |= {name.replace("_", "-") for name in names}  # HfArgumentParser's other spelling
    own, rest, i = [], [], 0
    while i < len(argv):
        name = argv[i].split("=", 1)[0]
        takes_value = "=" not in argv[i] and i + 1 < len(argv)
        target = own if name in names else rest
        target.append(argv[i])
        if takes_value and not argv[i + 1].startswith("--"):
            target.append(argv[i + 1])
            i += 1
        i += 1
    return own, rest


def parse_compare_options(own: list[str], user_argv: list[str]) -> CompareConfig:
    """CompareConfig from the comparison's own options (`split_argv`), checked, and a run
    option of `user_argv` that the comparison sets itself refused, with why."""
    (config,) = parse_options((CompareConfig,), own, PROG, removed=REMOVED_OPTIONS)
    config.validate()
    for option, why in _run_options_it_sets(config).items():
        given = [i for i, a in enumerate(user_argv) if a.split("=", 1)[0] == f"--{option}"]
        if given:  # on the command line (a recipe's value is replaced)
            i, arg = given[0], user_argv[given[0]]
            value = arg.split("=", 1)[1] if "=" in arg else " ".join(user_argv[i + 1 : i + 2])
            raise UsageError(
                f"--{option} is set by {PROG} for each run", value, f"leave it out ({why})"
            )
    return config


def _run_options_it_sets(config: CompareConfig) -> dict[str, str]:
    """The run options the comparison sets for each run (`runs.run_argv`), with why."""
    sets = {
        "method": "--methods gives each run its method",
        "resume": "a second call reads the finished runs back and trains the others again",
    }
    if config.budget_scope == "first_stage":
        sets["num_stages"] = (
            "--budget_scope first_stage trains each run's first stage only; --budget_scope "
            "curriculum trains the recipe's stages"
        )
        if config.budget_unit == "steps" and config.budget:
            sets["max_stage_steps"] = "--budget is each run's max_stage_steps in its one stage"
    return sets
