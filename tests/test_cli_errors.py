"""A user's first hour (issue 28): every bad start of the three commands is refused in one
line, `error: <what> (<value>): <what to do>`, with exit code 2 and no traceback, before
anything is written, so that the corrected command then runs in the same folder without
--resume. Each case below is one the issue lists; most fail before any model loads."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from pipeline.evaluate.cli import main as evaluate
from pipeline.options import UsageError
from pipeline.reward_model.cli import main as reward_model
from pipeline.reward_model.collect import main as collect
from pipeline.run.cli import main as run

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "tiny.yaml")
COLAB = str(REPO / "configs" / "colab_t4.yaml")
CUDA = torch.cuda.is_available()
ANY = "…"  # in an expected line: any text (a path, an OS's wording of a network error)


def folder_state(path: Path):
    """What a refused start must leave as it was: None (no folder) or every file's size and
    modification time."""
    if not path.exists():
        return None
    return {p.relative_to(path): (p.stat().st_size, p.stat().st_mtime_ns) for p in path.rglob("*")}


def refusal(capsys, code: int) -> str:
    """The one line a refused command printed (notices about old spellings aside)."""
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if not line.startswith("note: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def matches(line: str, expected: str, **paths: str) -> bool:
    """`line` is `expected` with its NAME placeholders filled in and ANY matching anything."""
    for name, value in paths.items():
        expected = expected.replace(name, value)
    return re.fullmatch(".*".join(map(re.escape, expected.split(ANY))), line) is not None


@pytest.fixture
def unreachable_hub(monkeypatch):
    """The Hub at a local port nobody listens on: every machine fails to reach it alike."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


def case(name: str, extra: list[str], expected: str, marks=()):
    """One row of a table: the options, the line they must print, and the row's name."""
    return pytest.param(extra, expected, id=name, marks=marks)


HUB_DOWN = "no such folder here, and the Hugging Face Hub cannot be reached to fetch it (…): check the path, or the network (HF_ENDPOINT names the Hub)"
NO_FOLDER = "no such folder: check the path (a hub id is namespace/name)"

# ---- python -m pipeline.run ----------------------------------------------------------

# (id, options after the tiny recipe, the line). MODEL: the tiny model, OUT: the output
# folder, TMP: the test's folder, EMPTY: a folder that holds no model (had the run loaded
# the model first, it would say so instead).
RUN_CASES = [
    case("task typo", ["--task", "arithmetik"],
     "error: --task: unknown task (arithmetik): choose one of arithmetic, countdown, dataset, "
     "frozenlake, frozenlake_agent, hidden_code, hidden_code_agent, hidden_rule, lookup, reasoning_gym, "
     "schedule, sokoban, "
     "sokoban_agent, or give your own Task "
     "subclass as package.module:ClassName"),
    case("task_config key", ["--task_config", '{"colour": "red"}'],
     "error: --task_config: task 'arithmetic' refuses it ({'colour': 'red'}): unknown config "
     "key(s) ['colour'] for task 'arithmetic'; valid keys: ['reveal_answer']"),
    case("reward signal typo", ["--reward_signals", '{"corectness": 1.0}'],
     "error: --reward_signals: task 'arithmetic' reports no signal 'corectness' (corectness): "
     "weigh its signals, format, correctness, milestones, length (e.g. --reward_signals "
     "'{\"correctness\": 1.0}')"),
    case("levels beyond the task", ["--start_level", "40", "--max_level", "40"],
     "error: --start_level is not a level of task 'arithmetic' (40): choose one in 1..6"),
    case("missing local model", ["--model_name_or_path", "TMP/no-model"],
     f"error: --model_name_or_path (TMP/no-model): {NO_FOLDER}"),
    case("folder without a model", ["--model_name_or_path", "EMPTY"],
     "error: --model_name_or_path: cannot load it (EMPTY): …"),
    case("missing local reward model", ["--reward_models", '{"rm": {"path": "TMP/no-rm"}}'],
     f"error: --reward_models rm.path (TMP/no-rm): {NO_FOLDER}"),
    case("reward model hub id, hub down", ["--reward_models", '{"rm": {"path": "runs/rm-typo"}}'],
     f"error: --reward_models rm.path (runs/rm-typo): {HUB_DOWN}"),
    case("model hub id, hub down", ["--model_name_or_path", "nobody/no-model"],
     f"error: --model_name_or_path (nobody/no-model): {HUB_DOWN}"),
    case("colab recipe, another task",
     ["--config", COLAB, "--task", "hidden_rule", "--backend", "transformers"],
     "error: --reward_signals: task 'hidden_rule' reports no signal 'plausibility' "
     "(plausibility): weigh its signals, format, correctness, milestones, length (e.g. "
     "--reward_signals '{\"correctness\": 1.0}')"),
    case("missing --config file", ["--config", "TMP/none.yaml"],
     "error: --config: no such file (TMP/none.yaml): check the path"),
    case("broken YAML", ["--config", "TMP/broken.yaml"],
     "error: --config: not valid YAML (TMP/broken.yaml, line 3, column 1): expected ',' or "
     "']', but got '<stream end>'; fix the file"),
    case("max_steps", ["--max_steps", "10"],
     "error: --max_steps is set per stage by the curriculum (10): give --max_stage_steps instead"),
    case("save_total_limit 1", ["--save_total_limit", "1"],
     "error: --save_total_limit must be >= 2 (or unset) so that a stage can always resume (1): "
     "pass --save_total_limit 2"),
    case("memory_scope", ["--memory_scope", "everywhere"],
     "error: memory_scope must be one of ['similar', 'same_prompt', 'global'], got 'everywhere'"),
    case("backend cuda", ["--backend", "cuda"],
     "error: --backend: unknown backend (cuda): choose auto, unsloth, transformers"),
    case("learning rate -1, before the model loads",
     ["--learning_rate", "-1", "--model_name_or_path", "EMPTY"],
     "error: --learning_rate must be a finite number > 0 (-1.0): e.g. 5e-4"),
    case("learning rate nan", ["--learning_rate", "nan"],
     "error: --learning_rate must be a finite number > 0 (nan): e.g. 5e-4"),
    case("warm-up learning rate 0", ["--warmup_sft_learning_rate", "0"],
     "error: --warmup_sft_learning_rate must be a finite number > 0 (0.0): e.g. 5e-4"),
    case("generation count", ["--num_generations", "3"],
     "error: generation_batch_size (64) must be divisible by num_generations (3)."),
    case("completion length 0", ["--max_completion_length", "0"],
     "error: --max_completion_length must be >= 1 (0): give a positive count"),
    case("bf16 on a CPU", ["--bf16", "true"],
     "error: --bf16 needs a CUDA GPU with bf16, and this machine has none (True): pass --bf16 "
     "false (or add --use_cpu true to autocast bf16 on the CPU, slowly)",
     marks=pytest.mark.skipif(CUDA, reason="a CUDA GPU may have bf16")),
    case("abbreviated option", ["--promote_thresh", "0.5"],
     "error: unknown option(s) (--promote_thresh): did you mean --promote_threshold? "
     "python -m pipeline.run --help lists every option"),
    case("bad boolean", ["--use_lora", "maybe"],
     "error: argument --use_lora/--use-lora: Truthy value expected: got maybe but expected one "
     "of yes/no, true/false, t/f, y/n, 1/0 (case insensitive): see python -m pipeline.run --help"),
    case("preference function of other arguments",
     ["--preference_functions", '{"j": {"function": "os:system", "weight": 1}}'],
     "error: preference function 'os:system' takes other arguments than (prompt, a, b) "
     "((command)): give a function (prompt, a, b) -> a preference in [0, 1]"),
    case("an option only erl reads, with grpo", ["--method", "grpo", "--reflections_per_group", "2"],
     "error: --reflections_per_group is an option of erl only, which --method grpo would ignore "
     "(2): leave it out, or choose erl"),
    case("an option only erl reads, with sdpo", ["--method", "sdpo", "--no_enable_memory"],
     "error: --enable_memory is an option of erl only, which --method sdpo would ignore (False): "
     "leave it out, or choose erl"),
    case("resume with no run there", ["--resume", "true"],
     "error: --resume true: there is no run to resume in --output_dir (OUT: STATE): check the "
     "folder's name, or leave out --resume to start a new run there"),
]  # fmt: skip


@pytest.fixture
def run_argv(tiny_model_dir, tmp_path):
    """The tiny recipe on the test's tiny model, into tmp_path/out, plus `extra`."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken.yaml").write_text("task: arithmetic\nlearning_rate: [1, 2\n")
    paths = {
        "MODEL": tiny_model_dir,
        "OUT": str(tmp_path / "out"),
        "EMPTY": str(tmp_path / "empty"),
    }
    paths["TMP"] = str(tmp_path)

    def argv(*extra: str) -> list[str]:
        filled = [paths.get(a, a).replace("TMP", str(tmp_path)) for a in extra]
        return [
            "--config", TINY, "--model_name_or_path", tiny_model_dir, "--build_tiny_model",
            "false", "--output_dir", paths["OUT"], *filled,
        ]  # fmt: skip

    argv.paths = paths
    return argv


@pytest.mark.parametrize("folder", ["absent", "empty"])
@pytest.mark.parametrize("extra, expected", RUN_CASES)
def test_a_bad_run_start_is_one_line_and_leaves_the_folder_as_it_was(
    run_argv, unreachable_hub, tmp_path, capsys, folder, extra, expected
):
    out = tmp_path / "out"
    if folder == "empty":
        out.mkdir()
    before = folder_state(out)
    line = refusal(capsys, run(run_argv(*extra)))
    state = {"absent": "no such folder", "empty": "empty"}[folder]
    assert matches(line, expected, STATE=state, **run_argv.paths), line
    assert folder_state(out) == before


def test_the_corrected_command_then_runs_in_the_same_folder_without_resume(
    run_argv, unreachable_hub, tmp_path, capsys
):
    """Each mistake of the table, one after the other in one folder, then the command as
    it should have been: it trains without --resume (nothing was locked)."""
    out = tmp_path / "out"
    for row in RUN_CASES:
        extra = row.values[0]
        assert run(run_argv(*extra)) == 2, extra
        assert not out.exists(), extra
    capsys.readouterr()
    short = [
        "--warmup_sft_steps", "0", "--max_level", "1", "--min_stage_steps", "1",
        "--max_stage_steps", "1", "--promote_window", "4", "--eval_prompts", "1",
        "--prompts_per_stage", "8", "--per_device_train_batch_size", "8", "--num_generations",
        "4", "--max_completion_length", "4", "--reflection_max_completion_length", "4",
        "--save_strategy", "no", "--disable_tqdm", "true",
    ]  # fmt: skip
    assert run(run_argv(*short)) == 0, capsys.readouterr().err
    state = json.loads((out / "curriculum_state.json").read_text())
    assert state["finished"] and [s["steps"] for s in state["stages"]] == [1]
    # A finished run is not overwritten, and --resume true continues it (to its end).
    assert "--output_dir holds files already" in refusal(capsys, run(run_argv(*short)))
    assert run(run_argv(*short, "--resume", "true")) == 0


def test_a_resume_with_other_options_is_one_line(run_argv, tmp_path, capsys):
    from pipeline.models.backend import active_backend
    from pipeline.run.config import parse_run_config, resolved_config

    out = tmp_path / "out"
    out.mkdir()
    (out / "curriculum_state.json").write_text('{"stages": [], "current_stage": 0}')
    options, model, curriculum, args = parse_run_config(run_argv())
    model.backend = active_backend()  # as the run records it
    started = resolved_config(options, model, curriculum, args)
    (out / "run_config.json").write_text(json.dumps({**started, "learning_rate": 0.1}))
    before = folder_state(out)
    line = refusal(capsys, run(run_argv("--resume", "true")))
    assert line.startswith(
        f"error: --resume true: the run in {out} started with other options (learning_rate: "
        f"0.1 -> 0.0005): leave them out to continue with those in {out / 'run_config.json'}, or "
        "start a new run in another --output_dir (a resume may change baseline_run, disable_tqdm, "
    ), line
    assert folder_state(out) == before
    (out / "run_config.json").unlink()
    (out / "curriculum_state.json").unlink()
    (out / "notes.txt").write_text("not a run")
    line = refusal(capsys, run(run_argv("--resume", "true")))
    assert line == (
        f"error: --resume true: --output_dir holds no curriculum_state.json, so it is not a "
        f"run's folder ({out}): give the folder of the run to resume"
    )


def test_a_removed_erl_option_is_one_line_on_the_command_line_in_a_recipe_and_on_resume(
    run_argv, tmp_path, capsys
):
    """ERLConfig options removed by issue 31 name what became of them; an old run that
    kept such an option at its default resumes, one that changed it is refused."""
    from pipeline.models.backend import active_backend
    from pipeline.run.config import check_resume_config, parse_run_config, resolved_config

    out = tmp_path / "out"
    line = refusal(capsys, run(run_argv("--reflect_per_group", "1")))
    assert line == (
        "error: --reflect_per_group no longer exists (1): removed: reflections_per_group "
        "chooses who reflects (one reflection per group since issue 32; its bench arm "
        "erl_per_group measured one retry per reflection, docs/log.md)"
    )
    old = tmp_path / "old.yaml"
    old.write_text(Path(TINY).read_text() + "\nmemory_min_gain: 0.5\n")
    argv = run_argv()
    argv[argv.index(TINY)] = str(old)
    line = refusal(capsys, run(argv))
    assert line.startswith("error: --config: option memory_min_gain no longer exists (0.5): ")
    assert line.endswith(
        "removed: it measured nothing on the learning bench (docs/log.md, 2026-12-02)"
    )
    assert not out.exists()

    options, model, curriculum, args = parse_run_config(run_argv())
    model.backend = active_backend()
    started = resolved_config(options, model, curriculum, args)
    out.mkdir()
    (out / "curriculum_state.json").write_text('{"stages": [], "current_stage": 0}')
    (out / "run_config.json").write_text(json.dumps({**started, "train_retries": True}))
    check_resume_config(out, started)  # the old default: it trained as today's code does
    (out / "run_config.json").write_text(json.dumps({**started, "train_retries": False}))
    before = folder_state(out)
    line = refusal(capsys, run(run_argv("--resume", "true")))
    assert line == (
        f"error: the run in {out} started with option train_retries, which no longer exists "
        "(False): ERLConfig option train_retries was removed: it measured "
        "nothing on the learning bench (docs/log.md, 2026-12-02); start a new run in another "
        "--output_dir"
    )
    assert folder_state(out) == before


@pytest.mark.parametrize("recipe", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.stem)
def test_a_resume_continues_with_the_options_its_run_recorded(recipe, tmp_path):
    """`--output_dir D --resume true` alone parses to exactly the options the run started
    with, overrides included, whatever its recipe; an option it names is compared."""
    from pipeline.models.backend import active_backend
    from pipeline.run.config import check_resume_config, parse_run_config, resolved_config

    out = tmp_path / "out"
    here = ["--backend", "transformers", "--bf16", "false", "--fast_inference", "false"]
    overrides = ["--eval_prompts", "4", "--gradient_accumulation_steps", "2", "--seed", "3"]
    run, model, curriculum, args = parse_run_config(
        ["--config", str(recipe), "--output_dir", str(out), *here, *overrides]
    )
    model.backend = active_backend()  # as the run records it
    started = resolved_config(run, model, curriculum, args)
    out.mkdir()
    (out / "run_config.json").write_text(json.dumps(started))
    resumed = resolved_config(*parse_run_config(["--output_dir", str(out), "--resume"]))
    assert resumed == {**started, "resume": True}
    named = resolved_config(
        *parse_run_config(["--output_dir", str(out), "--resume", "true", "--seed", "4"])
    )
    with pytest.raises(UsageError, match=r"started with other options \(seed: 3 -> 4\)"):
        check_resume_config(out, named)
    # A record from before method and reflections_per_group: what those runs trained with.
    older = {k: v for k, v in started.items() if k not in ("method", "reflections_per_group")}
    (out / "run_config.json").write_text(json.dumps(older))
    resumed = resolved_config(*parse_run_config(["--output_dir", str(out), "--resume", "true"]))
    assert (resumed["method"], resumed["reflections_per_group"]) == ("erl", 0)
    check_resume_config(out, resumed)


def test_an_option_only_erl_reads_counts_where_the_user_gives_it_with_the_method():
    """Refused on the command line, or in a recipe that chooses the method itself; a recipe
    made for erl (configs/tiny.yaml) trains grpo as it stands, and sdpo reads reward_threshold."""
    from pipeline.run.config import parse_run_config

    *_, args = parse_run_config(["--method", "sdpo", "--reward_threshold", "0.5"])
    assert args.reward_threshold == 0.5
    assert parse_run_config(["--config", TINY, "--method", "grpo"])[0].method == "grpo"


def test_a_recipe_that_chooses_grpo_and_an_option_only_erl_reads_is_one_line(
    run_argv, tmp_path, capsys
):
    recipe = tmp_path / "grpo.yaml"
    recipe.write_text(Path(TINY).read_text().replace("method: erl", "method: grpo"))
    argv = run_argv()
    argv[argv.index(TINY)] = str(recipe)
    line = refusal(capsys, run(argv))
    assert line.startswith("error: --memory_scope is an option of erl only, which --method grpo")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "command, extra, option",
    [
        ("run", ["--output_dir", "FILE"], "--output_dir"),
        ("run", ["--output_dir", "FILE/sub", "--resume", "true"], "--output_dir"),
        ("compare", ["--output_dir", "FILE"], "--output_dir"),
        ("reward_model", ["--output_dir", "FILE"], "--output_dir"),
        ("evaluate", ["--output_json", "FOLDER"], "--output_json"),
        ("collect", ["--output", "FOLDER"], "--output"),
    ],
)
def test_an_output_that_cannot_be_written_there_is_one_line(
    tiny_model_dir, tmp_path, capsys, command, extra, option
):
    """An output folder that is a file (or inside one), an output file that is a folder:
    refused before the lock or anything else touches the disk."""
    from pipeline.compare.cli import main as compare

    (tmp_path / "FILE").write_text("not a folder\n")
    pairs = tmp_path / "FOLDER" / "pairs.jsonl"
    pairs.parent.mkdir()
    pairs.write_text('{"prompt": "q", "chosen": "a", "rejected": "b"}\n' * 4)
    before = folder_state(tmp_path)
    extra = [str(tmp_path / a) if a.startswith(("FILE", "FOLDER")) else a for a in extra]
    model = ["--model_name_or_path", tiny_model_dir]
    task = ["--task", "arithmetic", "--level", "1"]
    main, argv = {
        "run": (run, ["--config", TINY, *model]),
        "compare": (compare, ["--config", TINY, *model]),
        "reward_model": (reward_model, ["--pairs", str(pairs), *model]),
        "evaluate": (evaluate, [*model, *task]),
        "collect": (collect, [*model, *task]),
    }[command]
    line = refusal(capsys, main([*argv, *extra]))
    assert line.startswith(f"error: {option} is "), line
    assert folder_state(tmp_path) == before


def test_a_run_from_before_reflections_per_group_resumes_at_0_only(tmp_path):
    """A run_config.json written before the option existed trained one reflection per gated
    attempt: it matches reflections_per_group 0, and a resume with another value is refused."""
    from pipeline.run.config import config_changes

    path = tmp_path / "run_config.json"
    path.write_text(json.dumps({"method": "erl", "reward_threshold": 1.0}))
    today = {"method": "erl", "reward_threshold": 1.0}
    assert config_changes(path, {**today, "reflections_per_group": 0}) == ""
    assert config_changes(path, {**today, "reflections_per_group": 1}) == (
        "reflections_per_group: 0 -> 1"
    )


def test_a_recipe_without_logging_steps_logs_every_step(tmp_path):
    """TRL's default (10) left a short stage with no metrics.jsonl and no r2: the run logs
    every step unless the recipe or the command line says otherwise."""
    from pipeline.run.config import parse_run_config

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(Path(TINY).read_text().replace("logging_steps: 1\n", ""))
    assert "logging_steps" not in recipe.read_text()
    argv = ["--config", str(recipe), "--output_dir", str(tmp_path / "o")]
    assert parse_run_config(argv)[-1].logging_steps == 1
    assert parse_run_config([*argv, "--logging_steps", "5"])[-1].logging_steps == 5


def test_a_recipe_without_bf16_trains_on_a_cpu(tmp_path):
    """TRL turns bf16 on by default, which transformers refuses without a GPU: the run's
    default is off where there is no CUDA GPU with bf16."""
    from pipeline.run.config import parse_run_config

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(Path(TINY).read_text().replace("bf16: false\n", ""))
    *_, args = parse_run_config(["--config", str(recipe), "--output_dir", str(tmp_path / "o")])
    assert args.bf16 is (True if CUDA and torch.cuda.is_bf16_supported() else False)


# ---- python -m pipeline.evaluate -----------------------------------------------------

EVALUATE_CASES = [
    case("missing local model", ["--model_name_or_path", "TMP/no-model"],
     f"error: --model_name_or_path (TMP/no-model): {NO_FOLDER}"),
    case("missing local model, old --model", ["--model", "TMP/no-model"],
     f"error: --model_name_or_path (TMP/no-model): {NO_FOLDER}"),
    case("hub id, hub down", ["--model_name_or_path", "nobody/no-model"],
     f"error: --model_name_or_path (nobody/no-model): {HUB_DOWN}"),
    case("folder without a model", ["--model_name_or_path", "EMPTY"],
     "error: EMPTY holds no model: expected config.json (full model), adapter_config.json "
     "(PEFT adapter) or checkpoint-N subfolders (also under checkpoints/) holding one"),
    case("task typo", ["--task", "arithmetik"],
     "error: --task: unknown task (arithmetik): choose one of arithmetic, countdown, dataset, "
     "frozenlake, frozenlake_agent, hidden_code, hidden_code_agent, hidden_rule, lookup, reasoning_gym, "
     "schedule, sokoban, "
     "sokoban_agent, or give your own Task "
     "subclass as package.module:ClassName"),
    case("task module that does not import", ["--task", "no_such_module_here:ReverseTask"],
     "error: --task (no_such_module_here:ReverseTask): task 'no_such_module_here:ReverseTask': "
     "cannot import 'no_such_module_here' (No module named 'no_such_module_here'); run from the "
     "folder that holds it or put that folder on PYTHONPATH"),
    case("task path to another class", ["--task", "json:JSONDecoder"],
     "error: --task (json:JSONDecoder): task 'json:JSONDecoder' is <class "
     "'json.decoder.JSONDecoder'>, not a subclass of curriculum.tasks.Task: give the class"),
    case("no task for a model of no run", ["--task", "", "--model_name_or_path", "MODEL"],
     "error: --task is needed for a model that no run of this project wrote (MODEL): give "
     "--task NAME (and --level N)"),
    case("level", ["--level", "99"],
     "error: --level is not a level of task 'arithmetic' (99): choose one in 1..6"),
    case("weights", ["--weights", "speed=1"],
     "error: --weights: task 'arithmetic' reports no signal 'speed' (speed): weigh its signals, "
     "format, correctness, milestones, length (e.g. --weights '{\"correctness\": 1.0}')"),
    case("prompts", ["--num_prompts", "0"],
     "error: --num_prompts must be >= 1 (0): give a positive count"),
    case("temperature", ["--do_sample", "true", "--temperature", "0"],
     "error: --temperature must be a finite number > 0 with --do_sample true (0.0): e.g. 1.0"),
    case("missing --config file", ["--config", "TMP/none.yaml"],
     "error: --config: no such file (TMP/none.yaml): check the path"),
]  # fmt: skip


@pytest.mark.parametrize("extra, expected", EVALUATE_CASES)
def test_a_bad_evaluation_is_one_line_and_writes_nothing(
    tiny_model_dir, unreachable_hub, tmp_path, capsys, extra, expected
):
    (tmp_path / "empty").mkdir()
    paths = {"TMP": str(tmp_path), "EMPTY": str(tmp_path / "empty"), "MODEL": tiny_model_dir}
    extra = [paths.get(a, a).replace("TMP", str(tmp_path)) for a in extra]
    argv = ["--model_name_or_path", tiny_model_dir, "--task", "arithmetic", "--level", "1"]
    out = tmp_path / "eval.json"
    line = refusal(capsys, evaluate([*argv, "--output_json", str(out), *extra]))
    assert matches(line, expected, **paths), line
    assert not out.exists()


def test_evaluate_names_the_checkpoint_of_an_unfinished_stage(tiny_model_dir, tmp_path, capsys):
    """A stage folder without a model of its own is scored at its latest complete trainer
    checkpoint, and the command says which one (also in the JSON)."""
    stage = tmp_path / "run" / "stage_2"
    for step in (2, 4, 6):
        shutil.copytree(tiny_model_dir, stage / "checkpoints" / f"checkpoint-{step}")
    for step in (2, 4):  # complete: the trainer wrote its state (after the weights)
        (stage / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    # checkpoint-6 is being written: its weights, not yet the trainer's state
    out = tmp_path / "eval.json"
    argv = [
        "--model_name_or_path", str(stage), "--task", "arithmetic", "--level", "1",
        "--num_prompts", "2", "--max_new_tokens", "4", "--disable_tqdm", "true",
        "--output_json", str(out),
    ]  # fmt: skip
    assert evaluate(argv) == 0
    checkpoint = stage / "checkpoints" / "checkpoint-4"
    captured = capsys.readouterr()
    printed = captured.out.splitlines()
    assert printed[0] == f"model: {checkpoint} (the latest checkpoint in {stage})"
    cut = stage / "checkpoints" / "checkpoint-6"
    assert f"note: passing over {cut}: its save did not finish" in captured.err
    written = json.loads(out.read_text())
    assert (written["model"], written["checkpoint"]) == (str(stage), str(checkpoint))


# ---- python -m pipeline.reward_model and its collect command -----------------------------

REWARD_MODEL_CASES = [
    case("missing --base folder", ["--base", "TMP/no-model"],
     f"error: --model_name_or_path (TMP/no-model): {NO_FOLDER}"),
    case("missing base folder", ["--model_name_or_path", "TMP/no-model"],
     f"error: --model_name_or_path (TMP/no-model): {NO_FOLDER}"),
    case("learning rate -1", ["--learning_rate", "-1"],
     "error: --learning_rate must be a finite number > 0 (-1.0): give a positive one"),
    case("missing --config file", ["--config", "TMP/none.yaml"],
     "error: --config: no such file (TMP/none.yaml): check the path"),
    case("unknown option", ["--epochs", "3"],
     "error: unknown option(s) (--epochs): python -m pipeline.reward_model --help lists every "
     "option"),
    case("missing --pairs file", ["--pairs", "TMP/nofile.jsonl"],
     "error: --pairs: no such file (TMP/nofile.jsonl): give a JSONL of preference pairs"),
]  # fmt: skip


@pytest.mark.parametrize("extra, expected", REWARD_MODEL_CASES)
def test_a_bad_reward_model_start_is_one_line_and_writes_nothing(
    tiny_model_dir, tmp_path, capsys, extra, expected
):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "q", "chosen": "a", "rejected": "b"}\n' * 4)
    extra = [a.replace("TMP", str(tmp_path)) for a in extra]
    out = tmp_path / "rm"
    argv = ["--pairs", str(pairs), "--model_name_or_path", tiny_model_dir, "--output_dir", str(out)]
    line = refusal(capsys, reward_model([*argv, *extra]))
    assert matches(line, expected, TMP=str(tmp_path)), line
    assert not out.exists()


COLLECT_CASES = [
    case("missing model, old --model", ["--model", "TMP/no-model"],
     f"error: --model_name_or_path (TMP/no-model): {NO_FOLDER}"),
    case("level", ["--level", "9"],
     "error: --level is not a level of task 'arithmetic' (9): choose one in 1..6"),
    case("seed", ["--seed", "500000"], "error: --seed must be in [0, 500000) (500000): e.g. 0"),
]  # fmt: skip


@pytest.mark.parametrize("extra, expected", COLLECT_CASES)
def test_a_bad_collection_is_one_line_and_writes_nothing(
    tiny_model_dir, tmp_path, capsys, extra, expected
):
    extra = [a.replace("TMP", str(tmp_path)) for a in extra]
    out = tmp_path / "ratings.jsonl"
    argv = ["--model_name_or_path", tiny_model_dir, "--task", "arithmetic", "--level", "1"]
    line = refusal(capsys, collect([*argv, "--output", str(out), *extra]))
    assert matches(line, expected, TMP=str(tmp_path)), line
    assert not out.exists()


def test_log_level_debug_adds_the_traceback(run_argv, capsys):
    assert run(run_argv("--task", "arithmetik", "--log_level", "debug")) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.splitlines()[-1].startswith("error: --task")


def test_a_resume_keeps_the_memory_policy_its_run_started_with(tmp_path):
    """The memory's options are not ERLConfig's, so run_config.json records them: a new run
    takes ReflectionMemory's defaults, a resume what its run recorded, and a run from before
    the record the memory it trained with (issue 32 changed the defaults)."""
    from pipeline.erl.memory import PAPER_POLICY
    from pipeline.run.config import memory_policy

    path = tmp_path / "run_config.json"
    assert memory_policy(path) == {"lessons_only": True, "confirmations": True}
    path.write_text(json.dumps({"method": "erl"}))
    assert memory_policy(path) == PAPER_POLICY == {"lessons_only": False, "confirmations": False}
    recorded = {"lessons_only": True, "confirmations": False}
    path.write_text(json.dumps({"method": "erl", "memory_policy": recorded}))
    assert memory_policy(path) == recorded
