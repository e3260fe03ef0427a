"""The three commands speak one convention (issue 28, `pipeline/options/`): TrlParser
dataclasses, `--config` in every --help, `--model_name_or_path` everywhere with the old
spellings as aliases that print a notice, booleans as true|false, a --help that imports
neither torch nor trl, and no third-party noise at start."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.compare.cli import main as compare
from pipeline.evaluate.cli import main as evaluate
from pipeline.models.backend import activate_backend
from pipeline.reward_model.cli import main as reward_model
from pipeline.reward_model.collect import main as collect
from pipeline.run.cli import main as run

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {
    "python -m pipeline.run": run,
    "python -m pipeline.evaluate": evaluate,
    "python -m pipeline.reward_model": reward_model,
    "python -m pipeline.reward_model.collect": collect,
    "python -m pipeline.compare": compare,
}


@pytest.mark.parametrize("prog", COMMANDS)
def test_every_help_lists_config_and_model_name_or_path(prog, capsys):
    assert COMMANDS[prog](["--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: {prog} ")
    assert "--config RECIPE.yaml" in text and "--model_name_or_path" in text
    assert "Booleans take true or false" in text
    assert "--no_use_lora" not in text and "--no-use-lora" not in text  # aliases only


@pytest.mark.parametrize(
    "prog",
    ["python -m pipeline.run", "python -m pipeline.reward_model", "python -m pipeline.compare"],
)
def test_help_shows_the_projects_options_and_help_all_every_option(prog, capsys):
    """--help: the project's options and the library options a user reaches for first, a
    last line naming --help_all; --help_all: every option TRL and transformers add."""
    assert COMMANDS[prog](["--help"]) == 0
    short = capsys.readouterr().out
    assert COMMANDS[prog](["--help_all"]) == 0
    full = capsys.readouterr().out
    assert "--help_all lists every option" in short
    for kept in ("--learning_rate", "--output_dir", "--report_to"):
        assert kept in short and kept in full
    assert "--adam_beta1" not in short and "--adam_beta1" in full  # a TrainingArguments option
    assert len(full.splitlines()) > len(short.splitlines())


def test_the_stored_help_texts_are_under_600_lines():
    total = sum(len(p.read_text().splitlines()) for p in (REPO / "pipeline").glob("*/help_text.py"))
    assert total < 600, f"the stored --help texts have {total} lines"


def test_the_stored_help_is_each_parsers_own():
    """--help prints a stored text (building the parser imports trl and transformers): it
    must be what the parser prints. After changing an option: python scripts/write_cli_help.py"""
    if activate_backend() != "transformers":
        pytest.skip("the stored texts are the transformers backend's")
    from pipeline.compare import help_text as compare_help
    from pipeline.compare.config import compare_parser
    from pipeline.evaluate import help_text as evaluate_help
    from pipeline.evaluate.cli import evaluator_parser
    from pipeline.options import project_help, stored_help
    from pipeline.reward_model import help_text as reward_model_help
    from pipeline.reward_model.collect import collector_parser
    from pipeline.reward_model.config import reward_model_parser
    from pipeline.run import help_text as run_help
    from pipeline.run.config import run_parser

    for module, prog, parser in [
        (run_help, "python -m pipeline.run", run_parser),
        (evaluate_help, "python -m pipeline.evaluate", evaluator_parser),
        (reward_model_help, "python -m pipeline.reward_model", reward_model_parser),
        (reward_model_help, "python -m pipeline.reward_model.collect", collector_parser),
        (compare_help, "python -m pipeline.compare", compare_parser),
    ]:
        assert stored_help(module, prog) == project_help(parser()), (
            f"{prog} --help is stale: run python scripts/write_cli_help.py"
        )


def run_python(code: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def test_help_and_a_missing_local_model_import_neither_torch_nor_trl(tmp_path):
    """What makes --help and a mistyped local path answer at once: neither needs the
    trainer stack, so neither imports it."""
    missing = str(tmp_path / "no-model")
    done = run_python(
        "import contextlib, io, sys\n"
        "from pipeline.run.cli import main as run\n"
        "from pipeline.evaluate.cli import main as evaluate\n"
        "from pipeline.reward_model.cli import main as reward_model\n"
        "from pipeline.reward_model.collect import main as collect\n"
        "from pipeline.compare.cli import main as compare\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    codes = [main(['--help']) for main in (run, evaluate, reward_model, collect, compare)]\n"
        f"codes.append(run(['--model_name_or_path', {missing!r}, '--build_tiny_model', 'false']))\n"
        f"codes.append(evaluate(['--model', {missing!r}, '--task', 'arithmetic', '--level', '1']))\n"
        f"codes.append(collect(['--model', {missing!r}, '--task', 'x', '--level', '1', '--output', 'o']))\n"
        f"codes.append(compare(['--model_name_or_path', {missing!r}, '--build_tiny_model', 'false']))\n"
        "import runpy\n"
        "sys.argv = ['examples/quickstart.py', '--help']\n"
        "with contextlib.redirect_stdout(io.StringIO()) as quickstart:\n"
        "    try:\n"
        "        runpy.run_path('examples/quickstart.py', run_name='__main__')\n"
        "    except SystemExit as done:\n"
        "        codes.append(done.code)\n"
        "assert '--warmup_steps' in quickstart.getvalue(), quickstart.getvalue()\n"
        "print(codes, sorted(m for m in ('torch', 'transformers', 'trl') if m in sys.modules))\n"
    )
    # The quickstart too answers --help before it imports anything, let alone trains.
    assert done.stdout.strip() == "[0, 0, 0, 0, 0, 2, 2, 2, 2, 0] []", done.stdout + done.stderr
    errors = done.stderr.splitlines()
    assert errors == [f"error: --model_name_or_path ({missing}): no such folder: check the path "
                      "(a hub id is namespace/name)"] * 4  # fmt: skip


def test_old_spellings_are_aliases_with_a_notice(tiny_model_dir, tmp_path, capsys):
    from pipeline.evaluate.cli import ALIASES as EVALUATE_ALIASES
    from pipeline.evaluate.cli import EvaluateArguments
    from pipeline.options import parse_options
    from pipeline.reward_model.config import parse_reward_model_config
    from pipeline.run.config import parse_run_config

    def same(parse, old: list[str], new: list[str], notices: list[str]):
        capsys.readouterr()
        before = parse(old)
        assert capsys.readouterr().err.splitlines() == [f"note: {n}" for n in notices]
        assert before == parse(new)

    base = ["--pairs", "p.jsonl", "--output_dir", str(tmp_path / "rm")]
    same(
        lambda argv: parse_reward_model_config([*base, *argv]),
        ["--base", tiny_model_dir],
        ["--model_name_or_path", tiny_model_dir],
        ["--base is an old spelling: use --model_name_or_path"],
    )
    recipe = ["--output_dir", str(tmp_path / "run")]
    same(
        lambda argv: parse_run_config([*recipe, *argv]),
        ["--no_use_lora", "--no-logging_first_step"],
        ["--use_lora", "false", "--logging_first_step", "false"],
        [
            "--no_use_lora is an old spelling: use --use_lora false",
            "--no-logging_first_step is an old spelling: use --logging_first_step false",
        ],
    )
    task = ["--task", "arithmetic", "--level", "1"]
    same(
        lambda argv: parse_options(
            (EvaluateArguments,), [*task, *argv], "evaluate", aliases=EVALUATE_ALIASES
        ),
        ["--model", "m", "--n", "3", "--json", "e.json", "--no_progress", "--no-load_in_4bit"],
        ["--model_name_or_path", "m", "--num_prompts", "3", "--output_json", "e.json"]
        + ["--disable_tqdm", "true", "--load_in_4bit", "false"],
        [
            "--model is an old spelling: use --model_name_or_path",
            "--n is an old spelling: use --num_prompts",
            "--json is an old spelling: use --output_json",
            "--no_progress is an old spelling: use --disable_tqdm true",
            "--no-load_in_4bit is an old spelling: use --load_in_4bit false",
        ],
    )


def test_booleans_take_true_or_false_in_every_command(tmp_path):
    from pipeline.evaluate.cli import EvaluateArguments
    from pipeline.options import parse_options
    from pipeline.reward_model.collect import CollectArguments
    from pipeline.reward_model.config import parse_reward_model_config
    from pipeline.run.config import parse_run_config

    for value, expected in [("true", True), ("false", False), ("True", True), ("0", False)]:
        _, model, _, args = parse_run_config(
            ["--output_dir", str(tmp_path), "--use_lora", value, "--disable_tqdm", value]
        )
        assert model.use_lora is expected and args.disable_tqdm is expected
        options, _ = parse_reward_model_config(
            ["--model_name_or_path", "m", "--pairs", "p", "--output_dir", "o", "--use_lora", value]
        )
        assert options.use_lora is expected
        task = ["--model_name_or_path", "m", "--task", "t", "--level", "1"]
        (evaluation,) = parse_options(
            (EvaluateArguments,), [*task, "--do_sample", value, "--load_in_4bit", value], "e"
        )
        assert evaluation.do_sample is expected and evaluation.load_in_4bit is expected
        (collection,) = parse_options(
            (CollectArguments,), [*task, "--output", "o", "--disable_tqdm", value], "c"
        )
        assert collection.disable_tqdm is expected
    # A flag alone is true, as in TRL's scripts.
    (evaluation,) = parse_options((EvaluateArguments,), [*task, "--do_sample"], "e")
    assert evaluation.do_sample is True and evaluation.load_in_4bit is None


def test_evaluate_reads_a_recipe(tmp_path):
    from pipeline.evaluate.cli import EvaluateArguments, parse_key_values
    from pipeline.options import parse_options

    recipe = tmp_path / "eval.yaml"
    recipe.write_text(
        "model_name_or_path: runs/x/final\ntask: countdown\nlevel: 2\nnum_prompts: 100\n"
        "task_config: {reveal_answer: false}\n"
    )
    (args,) = parse_options((EvaluateArguments,), ["--config", str(recipe), "--level", "3"], "e")
    assert (args.model_name_or_path, args.task, args.level, args.num_prompts) == (
        "runs/x/final",
        "countdown",
        3,
        100,
    )
    assert parse_key_values(args.task_config, "--task_config") == {"reveal_answer": False}


def test_only_the_two_import_warnings_are_dropped(caplog):
    """The stack's two import-time notices go; anything else those loggers say, and the
    project's own warnings, still reach the console."""
    from pipeline.models.backend import silence_import_noise

    silence_import_noise()
    caplog.set_level(logging.WARNING)
    pytree = logging.getLogger("torch.utils._pytree")
    pytree.warning(
        "%s is an Enum subclass and is now natively supported by torch.compile as an opaque "
        "value type. Calling register_constant() on Enum subclasses is deprecated and will be "
        "an error in a future release.",
        "<enum 'KernelPreference'>",
    )
    bnb = logging.getLogger("bitsandbytes.backends.cpu.ops")
    bnb.warning(
        "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you "
        "already `pip install kernels` and the kernels >= 0.11.1",
        "No module named 'kernels'",
    )
    pytree.warning("a pytree warning of another kind")
    bnb.warning("a bitsandbytes warning of another kind")
    logging.getLogger("pipeline.run.console").warning("[stage 1] warning: r1 collapsed")
    assert [r.getMessage() for r in caplog.records] == [
        "a pytree warning of another kind",
        "a bitsandbytes warning of another kind",
        "[stage 1] warning: r1 collapsed",
    ]


def test_no_command_prints_third_party_noise_at_start(tiny_model_dir, tmp_path):
    """Each command, in a fresh process, gets past its imports (trl, transformers, torchao,
    bitsandbytes) and refuses a bad value: its one error line is all it prints."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"}) + "\n")
    model = ["--model_name_or_path", tiny_model_dir]
    commands = {
        "run": [*model, "--build_tiny_model", "false", "--task", "arithmetik"],
        "evaluate": [*model, "--task", "arithmetik", "--level", "1"],
        "reward_model": [
            *model,
            "--pairs",
            str(pairs),
            "--output_dir",
            "o",
            "--learning_rate",
            "0",
        ],
        "collect": [*model, "--task", "arithmetic", "--level", "9", "--output", "o"],
    }
    calls = ", ".join(f"{name}({argv!r})" for name, argv in commands.items())
    code = (
        "from pipeline.run.cli import main as run\n"
        "from pipeline.evaluate.cli import main as evaluate\n"
        "from pipeline.reward_model.cli import main as reward_model\n"
        "from pipeline.reward_model.collect import main as collect\n"
        f"print([{calls}])\n"
    )
    done = run_python(code, timeout=600)
    assert done.stdout.strip() == "[2, 2, 2, 2]", done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 4 and all(line.startswith("error: ") for line in lines), done.stderr
