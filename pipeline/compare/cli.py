"""Which method learns a task fastest: GRPO, ERL and SDPO, paired by seed, with intervals.

    python -m pipeline.compare --config configs/tiny.yaml --methods grpo,erl,sdpo --seeds 3
    python -m pipeline.compare --config configs/tiny.yaml --methods grpo,erl \
        --learning_rates grpo=5e-5,erl=2e-4 --budget 20000 --budget_unit tokens
    python -m pipeline.compare --config configs/countdown.yaml --task_config '{...}' ...   # any
                                                    # option of python -m pipeline.run
    python -m pipeline.compare --help

compare() reads top to bottom: split the command line -> check every run's options (and
that a finished run read back was trained with them) -> the shared warm-up -> every method
x seed, seed by seed -> the figures, comparison.json and comparison.png. Nothing is
written before every option has been checked; a second call reads finished runs back.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.options import UsageError, run_command

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """`python -m pipeline.compare`; returns the exit code (2: an option refused, in one line)."""
    from pipeline.lock import released_at_end

    with released_at_end():  # the comparison folder's lock, as a run holds its own
        return run_command(compare, argv, _help, _help_all)


def _help() -> str:
    """The comparison's own options (stored, as every command's), then every run's."""
    from pipeline.compare import help_text as stored
    from pipeline.compare.config import PROG, compare_parser
    from pipeline.options import project_help, stored_help
    from pipeline.run.cli import _help as run_help

    own = stored_help(stored, PROG) or project_help(compare_parser())
    return f"{own}\nThe options every run of the comparison takes:\n\n{run_help()}"


def _help_all() -> str:
    """The comparison's options, then every option of a run (builds the parsers)."""
    from pipeline.compare.config import compare_parser
    from pipeline.run.cli import _help_all as run_help_all

    own = compare_parser().format_help()
    return f"{own}\nThe options every run of the comparison takes:\n\n{run_help_all()}"


def compare(argv: list[str]) -> int:
    """The comparison, top to bottom; a refused option raises UsageError before any write."""
    from pipeline.compare.config import parse_compare_options, split_argv
    from pipeline.run.config import check_policy_path_early, choose_backend, parse_run_config

    # ---- Options: the comparison's own, then the run's (the recipe and overrides).
    own, user_argv = split_argv(argv)
    check_policy_path_early(user_argv)  # a typo in a local path is named in a second
    backend = choose_backend(user_argv)
    config = parse_compare_options(own, user_argv)
    methods = tuple(config.method_list())
    run, _, curriculum, args = parse_run_config(user_argv, options_for=methods)
    task, level, root = _check_comparison(run, curriculum, args, methods, user_argv)
    specs, argvs, settings, finished = _plan(config, args, root, user_argv, backend, methods)

    # ---- The shared warm-up, then the runs, seed by seed: one comparison writes the folder.
    from pipeline.layout import RunLayout
    from pipeline.models.threads import use_cpu_threads
    from pipeline.run.lock import hold_output_dir

    hold_output_dir(RunLayout(root), resume=False)
    # One thread unless asked otherwise, as the learning bench and the tests use: the runs'
    # seconds stay comparable whatever else the machine does (pipeline.models.threads).
    if threads := use_cpu_threads(run.threads, default=1):
        print(threads)
    records = _train_runs(specs, argvs, settings, finished, config, run, args, task, level,
                          root, user_argv, methods)  # fmt: skip
    return _report(records, specs, config, curriculum, run, task, level, root, methods)


def _check_comparison(run, curriculum, args, methods, user_argv):
    """What a comparison cannot run, refused: (task, the held-out prompts' level, folder)."""
    from pipeline.options import check_output_path, check_task, named_options
    from pipeline.run.checks import check_agent_task, check_levels
    from pipeline.run.distributed import launched_processes

    if launched_processes() > 1:
        raise UsageError(
            "pipeline.compare runs in one process", launched_processes(),
            "run it with python, not accelerate launch or torchrun",
        )  # fmt: skip
    if run.eval_prompts < 1:
        raise UsageError(
            "--eval_prompts must be >= 1 for a comparison", run.eval_prompts, "e.g. 64"
        )
    task = check_task(run.task, run.task_config)
    check_agent_task(task, methods, run, args)  # sdpo cannot play an agent task's episodes
    level = check_levels(curriculum, task).level  # the first stage's: the held-out prompts'
    # Where --output_dir says; a recipe's output_dir names a run's folder, not this one's.
    given = "output_dir" in named_options(user_argv)[0]
    root = Path(args.output_dir if given else f"{str(args.output_dir).rstrip('/')}-compare")
    check_output_path(root, "--output_dir")
    _check_not_a_run(root)
    return task, level, root


def _plan(config, args, root: Path, user_argv, backend, methods):
    """Every run's options, checked before anything is written; a finished run is read
    back only if it was trained with exactly these: (specs, argv per spec, budget settings
    per spec, finished records per spec)."""
    from pipeline.compare.runs import budget_settings, plan_runs, read_record, run_argv

    specs = plan_runs(config, args.seed, args.learning_rate, root)
    finished, settings, argvs = {}, {}, {}
    for spec in specs:
        argvs[spec] = run_argv(user_argv, spec, config)
        max_stage_steps, options = _run_options(argvs[spec], backend, methods)
        settings[spec] = budget_settings(config, max_stage_steps)
        record = read_record(spec.folder)
        if record is not None:
            _check_read_back(spec, record, settings[spec], options)
            finished[spec] = record
    return specs, argvs, settings, finished


def _train_runs(specs, argvs, settings, finished, config, run, args, task, level, root,
                user_argv, methods) -> dict:  # fmt: skip
    """Each run not yet finished, after the shared warm-up (made once, when first needed),
    under one progress bar: spec -> record."""
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    from pipeline.compare.runs import (
        Recorder,
        ensure_warmup,
        held_out_evaluator,
        train_run,
        warmup_folder,
    )
    from pipeline.evaluate.run_folder import stage_eval_weights

    records = {}
    start = None
    # The runs' own lines (stage lines, warnings) print above the bar, not through it.
    with (
        logging_redirect_tqdm(),
        tqdm(
            total=len(specs), desc="compare", unit="run", dynamic_ncols=True, mininterval=2
        ) as bar,
    ):
        for spec in specs:
            bar.set_postfix_str(spec.label)
            if spec in finished:
                records[spec] = finished[spec]
                bar.update(1)
                continue
            start = start or ensure_warmup(user_argv, warmup_folder(root), methods)
            recorder = Recorder(
                budget=config.budget if config.budget_unit != "steps" or config.budget else None,
                unit=config.budget_unit,
                scope=config.budget_scope,
                eval_every=config.eval_every,
                evaluate=held_out_evaluator(
                    task,
                    level,
                    run.eval_prompts,
                    args.max_completion_length,
                    stage_eval_weights(run.reward_signals),
                ),
                progress=lambda text, label=spec.label: bar.set_postfix_str(
                    f"{label}: {text}", refresh=False
                ),
            )
            records[spec] = train_run(spec, argvs[spec], start, recorder, settings[spec], methods)
            bar.update(1)
    return records


def _report(records, specs, config, curriculum, run, task, level, root: Path, methods) -> int:
    """The figures, comparison.json and comparison.png; 1 when a run failed or fewer than
    two methods finished one."""
    from pipeline.compare import report

    ok = {m: [r for s, r in records.items() if s.method == m and not r["error"]] for m in methods}
    failed = [r for r in records.values() if r["error"]]
    ran = {m: rs for m, rs in ok.items() if rs}
    if len(ran) < 2:
        for run_record in failed:
            print(
                f"failed: {run_record['method']} seed {run_record['seed']}: {run_record['error']}"
            )
        print("no comparison: fewer than two methods have a finished run")
        return 1
    result = report.figures(ran)
    described = {
        "methods": list(methods),
        "seeds": config.seeds,
        "learning_rates": {s.method: s.learning_rate for s in specs},
        "budget": config.budget or None,
        "budget_unit": config.budget_unit,
        "budget_scope": config.budget_scope,
        "budget_text": _budget_text(config, curriculum.max_stage_steps),
        "eval_every": config.eval_every,
        "held_out": {"task": task.name, "level": level, "prompts": run.eval_prompts},
        "start_success": next(iter(ran.values()))[0]["evals"][0]["success"],
        "output_dir": str(root),
    }
    report.print_report(result, described, failed)
    report.write_json(root / "comparison.json", result, described, list(records.values()))
    report.plot(root / "comparison.png", ran, f"{task.name} level {level}")
    print(f"wrote {root / 'comparison.json'} and {root / 'comparison.png'}")
    return 0 if not failed else 1


def _check_not_a_run(root: Path) -> None:
    """Refuse a folder that holds a run of `pipeline.run` (finished or live): the comparison
    would write its warm-up and runs into it."""
    from pipeline.layout import STATE_FILE

    if (root / STATE_FILE).exists():
        raise UsageError(
            "--output_dir holds a run of python -m pipeline.run",
            root,
            "give the comparison a folder of its own",
        )


def _run_options(argv: list[str], backend: str, methods: tuple[str, ...]) -> tuple[int, dict]:
    """(max_stage_steps, the resolved options) one run would start with."""
    from pipeline.run.config import parse_run_config, resolved_config

    run, model, curriculum, args = parse_run_config(argv, options_for=methods)
    model.backend = backend
    return curriculum.max_stage_steps, resolved_config(run, model, curriculum, args)


def _check_read_back(spec, record: dict, settings: dict, options: dict) -> None:
    """A finished run is read back only if it was trained with these options and budget."""
    from pipeline.layout import RunLayout
    from pipeline.run.config import config_changes

    changes = config_changes(RunLayout(spec.folder).run_config, options)
    changes = "; ".join(
        filter(None, [changes] + [
            f"{k}: {record['settings'].get(k)!r} -> {v!r}"
            for k, v in settings.items()
            if record["settings"].get(k) != v
        ])
    )  # fmt: skip
    if changes:
        raise UsageError(
            f"--output_dir: the finished run {spec.folder} was trained with other options",
            changes,
            "give another --output_dir, or delete that run's folder to train it again",
        )


def _budget_text(config, max_stage_steps: int) -> str:
    scope = "on the first stage" if config.budget_scope == "first_stage" else "on the curriculum"
    if config.budget:
        return f"{config.budget:g} {config.budget_unit} {scope}"
    if config.budget_scope == "first_stage":
        return f"{max_stage_steps} steps (max_stage_steps) {scope}"
    return "the whole curriculum"
