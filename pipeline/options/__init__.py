"""The project's command lines: dataclasses parsed by TRL's `TrlParser`, one way to fail.

    python -m pipeline.run --config configs/tiny.yaml --learning_rate 5e-4
    python -m pipeline.evaluate --model_name_or_path runs/tiny/final --task arithmetic --level 1
    python -m pipeline.reward_model --config rm.yaml --num_train_epochs 12
    python -m pipeline.reward_model.collect --model_name_or_path runs/tiny/warmup ...

Every command parses its dataclasses with `parse_options` and runs through `run_command`,
so they share one convention:

- `--config recipe.yaml`, then command-line overrides. An unknown or abbreviated option,
  in the recipe or on the command line, is refused by name.
- Booleans are `--flag true|false`. `--no_flag` (which HfArgumentParser adds for a flag
  that defaults to true) and an old spelling such as `--model` or `--base` still work as
  aliases, each with a one-line notice.
- A bad option or input is one line on stderr, `error: <what> (<value>): <what to do>`,
  with exit code 2 and no traceback; a fault the user suffers (a damaged state or weights
  file, a full or read-only disk) one line with exit code 1; Ctrl-C one line with the
  command that resumes, exit code 130. `--log_level debug` prints the traceback too.
- `--help` answers at once: it prints the text stored from the command's parser
  (`help_text.py` in the command's package, written by `scripts/write_cli_help.py`;
  a test fails while it differs), because importing trl and transformers takes seconds.
  It lists the project's own options and the library options a user reaches for first
  (`project_help`); `--help_all` builds the parser and lists every option TRL and
  transformers add.

trl is imported inside the functions (after `activate_backend`).

The package: `errors` (UsageError, Interrupted, `fault_line`), `command` (`run_command`, the
stored help), `parsing` (recipes, TrlParser, aliases) and `values` (a task, its levels and
signals, a model's location).
"""

from pipeline.options.command import run_command, stored_help, wants_help
from pipeline.options.errors import Interrupted, UsageError, fault_line, notice, usage_errors
from pipeline.options.parsing import (
    HELP_EPILOG,
    HELP_WIDTH,
    cuda_bf16,
    named_options,
    options_parser,
    parse_options,
    peek_option,
    project_help,
    read_recipe,
)
from pipeline.options.values import (
    HUB_TIMEOUT_S,
    check_level,
    check_local_model_early,
    check_model_source,
    check_output_path,
    check_signal_weights,
    check_task,
)

__all__ = [
    "HELP_EPILOG",
    "HELP_WIDTH",
    "HUB_TIMEOUT_S",
    "Interrupted",
    "UsageError",
    "check_level",
    "check_local_model_early",
    "check_model_source",
    "check_output_path",
    "check_signal_weights",
    "check_task",
    "cuda_bf16",
    "fault_line",
    "named_options",
    "notice",
    "options_parser",
    "project_help",
    "parse_options",
    "peek_option",
    "read_recipe",
    "run_command",
    "stored_help",
    "usage_errors",
    "wants_help",
]
