"""Command lines made of dataclasses: a `--config` YAML recipe, then command-line overrides.

    python -m pipeline.run --config configs/tiny.yaml --learning_rate 5e-4
    python -m pipeline.reward_model --config rm.yaml --num_train_epochs 12

Both commands parse their dataclasses here, with TRL's `TrlParser`, so they read a recipe
the same way and refuse an unknown option, in the recipe or on the command line, by name.
trl is imported inside the function: call it after `activate_backend`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def parse_options(
    dataclass_types: Sequence[type],
    argv: Sequence[str],
    prog: str,
    defaults: Mapping[str, Any] | None = None,
    required: Sequence[str] = (),
) -> list[Any]:
    """One instance per dataclass, from `--config recipe.yaml` and the options after it.

    `defaults` replace the dataclasses' own defaults (a recipe and the command line still
    override them); `required` names fields that must be given, in the recipe or on the
    command line. An option no dataclass has (an abbreviation of one too) is a SystemExit
    naming it.
    """
    from trl import TrlParser

    parser = TrlParser(dataclass_types, prog=prog, allow_abbrev=False)  # one spelling each
    parser.set_defaults(**(defaults or {}))
    for action in parser._actions:  # TrlParser un-requires a field its recipe gives
        if action.dest in required:
            action.required = True
    *configs, from_recipe, from_command_line = parser.parse_args_and_config(
        list(argv), return_remaining_strings=True, separate_remaining_strings=True
    )
    unknown = [s[2:] for s in from_recipe[::2]] + [
        s for s in from_command_line if s.startswith("-")
    ]
    if unknown or from_command_line:
        raise SystemExit(
            f"error: unknown option(s): {', '.join(unknown or from_command_line)} "
            f"(see {prog} --help)"
        )
    return configs
