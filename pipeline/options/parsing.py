"""Reading a command's options: `--config` recipes, TrlParser dataclasses, aliases."""

from __future__ import annotations

import argparse
import difflib
import os
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.options.errors import UsageError, notice, usage_errors

HELP_WIDTH = 100
"""The help's line width, fixed so that the stored text does not depend on the terminal."""
HELP_EPILOG = (
    "Every option can also be set in the --config recipe. Booleans take true or false. A bad "
    "option is refused in one line with exit code 2; --log_level debug adds the traceback."
)


def cuda_bf16() -> bool:
    """Whether this machine has a CUDA GPU with bf16: elsewhere TrainingArguments' bf16,
    which TRL turns on by default, is refused (or, with use_cpu, autocasts on the CPU)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


# ---- Reading the command line and the recipe ------------------------------------------


def peek_option(argv: Sequence[str], name: str) -> str | None:
    """Option `name` from the command line, else from the `--config` recipe, before parsing
    (None when neither gives it, or the recipe cannot be read: parsing reports that)."""
    parser = _Peeker(add_help=False, allow_abbrev=False)
    parser.add_argument("--config")
    parser.add_argument(f"--{name}")
    try:
        known, _ = parser.parse_known_args(list(argv))
    except UsageError:  # e.g. --config without a file: parsing says so, in its own words
        return None
    if getattr(known, name):
        return getattr(known, name)
    try:
        recipe = read_recipe(known.config) if known.config else {}
    except UsageError:
        return None
    value = recipe.get(name)
    return None if value is None else str(value)


class _Peeker(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(message)


def read_recipe(path: str) -> dict[str, Any]:
    """The `--config` YAML recipe as a mapping (safe_load); UsageError naming what is wrong."""
    import yaml

    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise UsageError("--config: no such file", path, "check the path") from None
    except OSError as err:
        raise UsageError("--config: cannot read it", path, err.strerror or str(err)) from None
    try:
        recipe = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else path
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UsageError("--config: not valid YAML", where, f"{problem}; fix the file") from None
    if recipe is None:
        return {}
    if not isinstance(recipe, dict):
        raise UsageError(
            "--config: not a mapping of option: value",
            path,
            "write one option a line, e.g. `learning_rate: 1.0e-4`",
        )
    return recipe


def _take_recipe(argv: list[str]) -> tuple[list[str], dict[str, Any]]:
    """`argv` without `--config PATH` (or `--config=PATH`), and the recipe it names."""
    rest, recipe = [], {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config" or arg.startswith("--config="):
            path = arg.partition("=")[2] if "=" in arg else None
            if path is None:
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    raise UsageError("--config needs a file", "none given", "--config recipe.yaml")
                path, i = argv[i + 1], i + 1
            recipe = read_recipe(path)
        else:
            rest.append(arg)
        i += 1
    return rest, recipe


def named_options(argv: Sequence[str]) -> tuple[set[str], dict[str, Any]]:
    """What a command line names itself, not its defaults: the options on it, spelt as
    fields (`--a-b` and `--a_b=1` name a_b, and so does `--no_a_b`), and the mapping of the
    `--config` recipe it names ({} without one)."""
    rest, recipe = _take_recipe(list(argv))
    names = set()
    for arg in rest:
        if arg.startswith("--"):
            name = arg[2:].split("=", 1)[0].replace("-", "_")
            names |= {name, name.removeprefix("no_")}
    return names, recipe


def _rewrite_aliases(
    argv: list[str], aliases: Mapping[str, Sequence[str]], booleans: set[str]
) -> list[str]:
    """`argv` with old spellings replaced by the current ones, a notice for each: the
    `aliases` given (`--base` -> `--model_name_or_path`) and `--no_flag` / `--no-flag` ->
    `--flag false` for a boolean option."""
    out = []
    for arg in argv:
        option, sep, value = arg.partition("=")
        if option in aliases:
            new = list(aliases[option])
            notice(f"{option} is an old spelling: use {' '.join(new)}")
            out += [*new, value] if sep else new
            continue
        negated = option[5:].replace("-", "_") if option[:5] in ("--no_", "--no-") else None
        if negated in booleans and not sep:
            notice(f"{option} is an old spelling: use --{negated} false")
            out += [f"--{negated}", "false"]
            continue
        out.append(arg)
    return out


def _rename_recipe_aliases(
    recipe: dict[str, Any], aliases: Mapping[str, Sequence[str]]
) -> dict[str, Any]:
    """`recipe` with keys spelt the old way (`base:`) renamed, a notice for each; only
    aliases of one option to another apply (not those that also set a value)."""
    renamed = {}
    for key, value in recipe.items():
        new = aliases.get(f"--{key}", ())
        if len(new) == 1:
            notice(f"{key}: in the recipe is an old spelling: use {new[0][2:]}:")
            key = new[0][2:]
        renamed[key] = value
    return renamed


# The library options --help shows beside the project's own: the ones a recipe of this
# project sets, or a user of TRL reaches for first. Every other option of TRL's and
# transformers' configs is accepted all the same, and listed by --help_all.
KEY_LIBRARY_OPTIONS = (
    "output_dir", "seed", "learning_rate", "lr_scheduler_type", "max_steps",
    "num_train_epochs", "per_device_train_batch_size", "gradient_accumulation_steps",
    "num_generations", "max_completion_length", "max_length", "temperature", "beta",
    "loss_type", "use_vllm", "bf16", "use_cpu", "gradient_checkpointing", "logging_steps",
    "save_steps", "report_to", "log_level", "disable_tqdm",
)  # fmt: skip


def _library_bases(dataclass_types: Sequence[type]) -> list[type]:
    """The dataclasses of trl or transformers these dataclasses are or derive from."""
    import dataclasses

    return [
        base
        for kind in dataclass_types
        for base in kind.__mro__
        if base.__module__.split(".")[0] in ("trl", "transformers")
        and dataclasses.is_dataclass(base)
    ]


def library_fields(dataclass_types: Sequence[type]) -> set[str]:
    """The fields of these dataclasses that a class of trl or transformers declares (an
    ERLConfig's GRPOConfig and TrainingArguments fields; every field of TRL's RewardConfig)."""
    import dataclasses

    return {f.name for base in _library_bases(dataclass_types) for f in dataclasses.fields(base)}


def project_help(parser) -> str:
    """`parser`'s --help with only the project's own options and `KEY_LIBRARY_OPTIONS`;
    a last line counts the library options left out and names --help_all, which lists
    them (`parser.format_help()`)."""
    hidden = library_fields(parser.dataclass_types) - set(KEY_LIBRARY_OPTIONS)
    saved = {}
    for action in parser._actions:
        if action.dest in hidden and action.help != argparse.SUPPRESS:
            saved[action] = action.help
            action.help = argparse.SUPPRESS
    try:
        text = parser.format_help()
    finally:
        for action, help in saved.items():
            action.help = help
    bases = _library_bases(parser.dataclass_types)
    libraries = sorted({base.__name__ for base in bases if not base.__name__.startswith("_")})
    note = (
        f"{len(saved)} more options of {', '.join(libraries)} are accepted too: --help_all "
        "lists every option."
    )
    return text + "\n" + textwrap.fill(note, HELP_WIDTH) + "\n"


def options_parser(
    dataclass_types: Sequence[type],
    prog: str,
    *,
    usage: str | None = None,
    description: str | None = None,
    defaults: Mapping[str, Any] | None = None,
    required: Sequence[str] = (),
):
    """The TrlParser of a command: its dataclasses' options plus `--config`, one spelling
    each (no abbreviations), a bad value raising UsageError instead of printing the usage.

    `defaults` replace the dataclasses' own (a recipe and the command line still override
    them); `required` names fields that must be given, in the recipe or on the command line.
    """
    from trl import TrlParser

    class Parser(TrlParser):
        def error(self, message: str):  # argparse's: the usage, then exit 1 or 2
            raise UsageError(message.rstrip("."), todo=f"see {prog} --help")

    def formatter(prog: str, **kwargs) -> argparse.HelpFormatter:
        return argparse.ArgumentDefaultsHelpFormatter(prog, width=HELP_WIDTH, **kwargs)

    parser = Parser(
        dataclass_types,
        prog=prog,
        usage=usage or f"{prog} [--config RECIPE.yaml] [--option VALUE ...]",
        description=description,
        epilog=HELP_EPILOG,
        formatter_class=formatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--config",
        metavar="RECIPE.yaml",
        default=argparse.SUPPRESS,  # TrlParser's own: parse_options reads it before argparse
        help="YAML recipe of option: value lines; options given after it override it.",
    )
    parser.set_defaults(**(defaults or {}))
    for action in parser._actions:
        if action.dest in required:  # TrlParser un-requires a field its recipe gives
            action.required = True
        if action.option_strings and all(
            o[:5] in ("--no_", "--no-") for o in action.option_strings
        ):
            action.help = argparse.SUPPRESS  # HfArgumentParser's --no_flag: an alias now
    return parser


def parse_options(
    dataclass_types: Sequence[type],
    argv: Sequence[str],
    prog: str,
    *,
    defaults: Mapping[str, Any] | None = None,
    required: Sequence[str] = (),
    aliases: Mapping[str, Sequence[str]] | None = None,
    check: Callable[[argparse.Namespace], None] | None = None,
    removed: Mapping[str, str] | None = None,
) -> list[Any]:
    """One instance per dataclass, from `--config recipe.yaml` and the options after it.

    `aliases` maps an old spelling to the current one (`{"--base":
    ["--model_name_or_path"]}`). `removed` maps an option that is gone to what became of it,
    the refusal's last part. `check(namespace)` sees the parsed values before the
    dataclasses are built, for what their own checks would report less clearly. A bad
    option, a bad value or a dataclass's own refusal is a UsageError naming it.
    """
    parser = options_parser(dataclass_types, prog, defaults=defaults, required=required)
    argv, recipe = _take_recipe(list(argv))
    argv = _rewrite_aliases(argv, aliases or {}, _boolean_options(parser))
    recipe = _rename_recipe_aliases(recipe, aliases or {})
    env = recipe.pop("env", {})  # TrlParser's: environment variables the recipe sets
    if not isinstance(env, dict):
        raise UsageError("--config: env must be a mapping", env, "write `env: {NAME: value}`")
    os.environ.update({str(k): str(v) for k, v in env.items()})
    _refuse_removed(recipe, argv, removed or {})
    unknown = [key for key in recipe if key not in _option_names(parser) - {"config"}]
    if unknown:
        raise UsageError(
            "unknown option(s) in the recipe", ", ".join(unknown), _did_you_mean(unknown, parser)
        )
    parser.set_defaults_with_config(**recipe)
    namespace, rest = parser.parse_known_args(argv)
    if rest:
        flags = [s for s in rest if s.startswith("-")] or rest
        raise UsageError("unknown option(s)", ", ".join(flags), _did_you_mean(flags, parser))
    if check is not None:
        check(namespace)
    # The dataclasses' own __post_init__ checks; TypeError: a recipe value of the wrong type.
    with usage_errors(ValueError, TypeError):
        return list(parser.parse_args_into_dataclasses(argv))


def _refuse_removed(recipe: Mapping[str, Any], argv: Sequence[str], removed: Mapping[str, str]):
    """A UsageError for the first option of the recipe or the command line that is gone."""
    for key, value in recipe.items():
        if key in removed:
            raise UsageError(f"--config: option {key} no longer exists", value, removed[key])
    for i, arg in enumerate(argv):
        name = arg.removeprefix("--").split("=", 1)[0].replace("-", "_")
        if arg.startswith("--") and name in removed:
            value = arg.split("=", 1)[1] if "=" in arg else (argv[i + 1 : i + 2] or [""])[0]
            raise UsageError(f"--{name} no longer exists", value, removed[name])


def _option_names(parser) -> set[str]:
    return {a.dest for a in parser._actions if a.option_strings} - {"help"}


def _boolean_options(parser) -> set[str]:
    # HfArgumentParser reads a boolean field's value with its `string_to_bool`.
    return {a.dest for a in parser._actions if getattr(a.type, "__name__", "") == "string_to_bool"}


def _did_you_mean(unknown: Sequence[str], parser) -> str:
    names = sorted(_option_names(parser))
    close = [
        match
        for option in unknown
        for match in difflib.get_close_matches(option.lstrip("-"), names, n=1, cutoff=0.75)
    ]
    hint = f"did you mean {', '.join('--' + c for c in close)}? " if close else ""
    return f"{hint}{parser.prog} --help lists every option"
