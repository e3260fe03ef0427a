"""First-attempt evaluation: scoring, generation on the tiny model, loading, and the CLI."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from curriculum.tasks import get_task
from curriculum.tasks.arithmetic import ArithmeticTask
from pipeline.evaluate.cli import main, parse_key_values
from pipeline.evaluate.first_attempts import (
    EVAL_SEED_BASE,
    evaluate_first_attempts,
    generate_completions,
    held_out_seed,
    load_for_evaluation,
    resolve_checkpoint,
    score_completions,
)

LEVEL, N, TOKENS = 1, 4, 10


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One thread: the tiny model gains nothing from more, and on a busy machine several
    threads spinning against each other made these tests 20x slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def task():
    return get_task("arithmetic")


@pytest.fixture(scope="module")
def held_out_rows(task):
    return task.generate(LEVEL, N, seed=held_out_seed(LEVEL))


@pytest.fixture(scope="module")
def trained_dir(tiny_model_dir, task, held_out_rows, tmp_path_factory):
    """The tiny model fitted (cross-entropy on the answer tokens) to the held-out rows'
    reference answers and saved with its tokenizer: a model that answers them correctly."""
    import torch

    model, tokenizer = load_for_evaluation(tiny_model_dir)
    prompts = [
        tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
        for r in held_out_rows
    ]
    answers = [task.reference(r) + tokenizer.eos_token for r in held_out_rows]
    batch = tokenizer(
        [p + a for p, a in zip(prompts, answers)],
        return_tensors="pt",
        padding=True,
        add_special_tokens=False,
    )
    labels = batch["input_ids"].clone()
    answer_len = [len(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers]
    for i, n in enumerate(answer_len):  # left padded: the answer is the last n tokens
        labels[i, : labels.shape[1] - n] = -100
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    for _ in range(200):
        model(**batch, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    folder = tmp_path_factory.mktemp("trained") / "final"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


# Scoring (no model) ----------------------------------------------------------------


def test_reference_completions_score_full_marks(task, held_out_rows):
    result = score_completions(task, held_out_rows, [task.reference(r) for r in held_out_rows])
    assert (result.mean_reward, result.success_rate, result.failure_rate) == (1.0, 1.0, 0.0)
    assert result.rewards == [1.0] * N
    assert result.samples[0]["feedback"] == "The answer is correct."


def test_garbage_scores_zero_with_feedback(task, held_out_rows):
    garbage = ["", "the answer is five", "<answer>", "\x00\ud800<answer>x</answer>"]
    result = score_completions(task, held_out_rows, garbage)
    assert (result.mean_reward, result.success_rate) == (0.0, 0.0)
    assert result.failure_rate == 0.75  # the last one parses, as a non-integer answer
    assert all(sample["feedback"] for sample in result.samples)


def test_weighted_reward_matches_training_weights(task, held_out_rows):
    half = N // 2
    completions = [task.reference(r) for r in held_out_rows[:half]] + ["no tag"] * (N - half)
    weights = {"correctness": 1.0, "format": 0.5}
    result = score_completions(task, held_out_rows, completions, weights=weights)
    # Solved rows score every weighted signal at 1; unparsable ones the -0.5 fallback in each.
    assert result.rewards == [1.5] * half + [-0.75] * (N - half)
    assert result.success_rate == 0.5


def test_a_raising_verifier_scores_zero_instead_of_raising(held_out_rows):
    class BrokenTask(ArithmeticTask):
        def evaluate(self, row, completion):
            raise ZeroDivisionError("verifier bug")

    result = score_completions(BrokenTask(), held_out_rows, ["<answer>1</answer>"] * N)
    assert (result.mean_reward, result.success_rate, result.failure_rate) == (0.0, 0.0, 1.0)
    assert result.samples[0]["feedback"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=60), min_size=1, max_size=6))
def test_any_text_scores_in_range_without_raising(texts):
    task = get_task("arithmetic")
    rows = task.generate(2, len(texts), seed=held_out_seed(2))
    result = score_completions(task, rows, texts)
    assert len(result.rewards) == len(texts)
    assert all(0.0 <= r <= 1.0 for r in result.rewards)
    assert 0.0 <= result.success_rate <= result.mean_reward + 1e-9
    json.dumps(result.to_dict())  # always JSON-ready


def test_held_out_seeds_are_disjoint_from_training_seeds(task):
    assert held_out_seed(1) >= EVAL_SEED_BASE
    seeds = [held_out_seed(level) for level in task.levels]
    assert len(set(seeds)) == len(seeds)


# Generation on the tiny model ------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    return load_for_evaluation(tiny_model_dir)


def test_evaluate_returns_n_rewards_in_range_and_is_deterministic(tiny, task):
    model, tokenizer = tiny
    model.train()
    kwargs = dict(max_new_tokens=TOKENS, progress=False)
    first = evaluate_first_attempts(model, tokenizer, task, LEVEL, 6, batch_size=4, **kwargs)
    assert model.training  # training mode restored
    assert (first.n, first.level, first.task, first.seed) == (
        6,
        LEVEL,
        "arithmetic",
        held_out_seed(LEVEL),
    )
    assert len(first.rewards) == 6 and all(0.0 <= r <= 1.0 for r in first.rewards)
    assert 0.0 <= first.success_rate <= 1.0
    model.eval()
    again = evaluate_first_attempts(model, tokenizer, task, LEVEL, 6, batch_size=3, **kwargs)
    assert not model.training
    assert again.samples == first.samples and again.rewards == first.rewards


def test_left_padding_gives_the_same_completions_as_one_by_one(tiny, task):
    model, tokenizer = tiny
    # Prompts of different token lengths, so the batch is padded.
    prompts = [task.generate(level, 1, seed=7)[0]["prompt"] for level in (1, 6, 3)]
    texts = [
        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
    lengths = {len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts}
    assert len(lengths) > 1
    batched = generate_completions(model, tokenizer, prompts, max_new_tokens=TOKENS, progress=False)
    single = [
        generate_completions(model, tokenizer, [p], max_new_tokens=TOKENS, progress=False)[0]
        for p in prompts
    ]
    assert batched == single
    assert tokenizer.padding_side == "left"


def test_sampling_is_seeded_and_leaves_the_global_rng_alone(tiny, task):
    import torch

    model, tokenizer = tiny
    kwargs = dict(max_new_tokens=TOKENS, do_sample=True, progress=False)
    state = torch.random.get_rng_state()
    a = evaluate_first_attempts(model, tokenizer, task, LEVEL, N, seed=5, **kwargs)
    assert torch.equal(torch.random.get_rng_state(), state)
    b = evaluate_first_attempts(model, tokenizer, task, LEVEL, N, seed=5, **kwargs)
    assert a.samples == b.samples


def test_bad_arguments_raise_value_error_naming_them(tiny, task):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="level 99"):
        evaluate_first_attempts(model, tokenizer, task, 99, N)
    with pytest.raises(ValueError, match="n must be"):
        evaluate_first_attempts(model, tokenizer, task, LEVEL, 0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        evaluate_first_attempts(model, tokenizer, task, LEVEL, N, max_new_tokens=0)


def test_a_model_trained_to_answer_scores_higher(tiny, trained_dir, task):
    untrained = evaluate_first_attempts(
        *tiny, task, LEVEL, N, max_new_tokens=TOKENS, progress=False
    )
    model, tokenizer = load_for_evaluation(trained_dir)  # a full model folder
    trained = evaluate_first_attempts(
        model, tokenizer, task, LEVEL, N, max_new_tokens=TOKENS, progress=False
    )
    assert untrained.success_rate == 0.0
    assert trained.success_rate >= 0.75 and trained.mean_reward > untrained.mean_reward
    assert any(
        s["completion"] == task.reference(r)
        for s, r in zip(trained.samples, task.generate(LEVEL, N, seed=held_out_seed(LEVEL)))
    )


def test_peft_model_evaluates_and_its_adapter_folder_loads(tiny_model_dir, task, tmp_path):
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model

    base, tokenizer = load_for_evaluation(tiny_model_dir)
    torch.manual_seed(0)
    # init_lora_weights=False: a non-zero adapter, so it changes what the model says.
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(base, config)
    peft_model.train()
    kwargs = dict(max_new_tokens=TOKENS, progress=False)
    in_memory = evaluate_first_attempts(peft_model, tokenizer, task, LEVEL, N, **kwargs)
    assert peft_model.training and in_memory.n == N

    peft_model.save_pretrained(tmp_path / "adapter")  # adapter only, no tokenizer
    loaded, loaded_tokenizer = load_for_evaluation(str(tmp_path / "adapter"))
    assert isinstance(loaded, PeftModel)
    reloaded = evaluate_first_attempts(loaded, loaded_tokenizer, task, LEVEL, N, **kwargs)
    assert reloaded.samples == in_memory.samples


@pytest.mark.parametrize("sub", ["", "checkpoints"])
def test_resolve_checkpoint_finds_the_latest_checkpoint(tmp_path, sub):
    stage = tmp_path / "stage_1"
    for step in (3, 12, 7):
        (stage / sub / f"checkpoint-{step}").mkdir(parents=True)
        (stage / sub / f"checkpoint-{step}" / "adapter_config.json").write_text("{}")
        (stage / sub / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    # A checkpoint being written: its weights, not yet the trainer's state (the last file).
    (stage / sub / "checkpoint-99").mkdir()
    (stage / sub / "checkpoint-99" / "adapter_config.json").write_text("{}")
    assert resolve_checkpoint(str(stage)) == str(stage / sub / "checkpoint-12")
    (stage / "config.json").write_text("{}")  # a finished stage holds its model itself
    assert resolve_checkpoint(str(stage)) == str(stage)


def test_resolve_checkpoint_passes_hub_ids_and_rejects_empty_folders(tmp_path):
    assert resolve_checkpoint("Qwen/Qwen2.5-1.5B-Instruct") == "Qwen/Qwen2.5-1.5B-Instruct"
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="empty holds no model"):
        resolve_checkpoint(str(tmp_path / "empty"))


# The CLI ---------------------------------------------------------------------------


def test_cli_prints_and_writes_the_scores(trained_dir, tmp_path, capsys):
    out = tmp_path / "eval.json"
    argv = [
        "--model",
        trained_dir,
        "--task",
        "arithmetic",
        "--level",
        str(LEVEL),
        "--n",
        str(N),
        "--max_new_tokens",
        str(TOKENS),
        "--batch_size",
        "3",
        "--json",
        str(out),
        "--no_progress",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    mean = re.search(r"^mean_reward: (-?\d+\.\d{4})$", printed, re.M)
    success = re.search(r"^success_rate: (\d\.\d{4})$", printed, re.M)
    assert mean and success
    written = json.loads(out.read_text())
    assert written["mean_reward"] == pytest.approx(float(mean.group(1)), abs=1e-4)
    assert written["success_rate"] == pytest.approx(float(success.group(1)), abs=1e-4)
    assert written["success_rate"] >= 0.75  # it evaluated the trained model on held-out rows
    assert (written["task"], written["level"], written["n"]) == ("arithmetic", LEVEL, N)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"--task": "nosuchtask"}, "nosuchtask"),
        ({"--level": "99"}, "--level is not a level of task 'arithmetic' (99)"),
        ({"--task_config": "colour=red"}, "colour"),
        ({"--weights": "speed=1"}, "speed"),
        ({"--n": "0"}, "--n"),
    ],
)
def test_cli_rejects_bad_input_before_loading_the_model(tmp_path, capsys, change, named):
    (tmp_path / "never-loaded").mkdir()  # a folder without a model: loading it would fail
    args = {"--model": str(tmp_path / "never-loaded"), "--task": "arithmetic", "--level": "1"}
    args.update(change)
    assert main([part for pair in args.items() for part in pair]) == 2
    assert named in capsys.readouterr().err


def test_cli_reports_an_unloadable_model_as_a_usage_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["--model", str(tmp_path / "empty"), "--task", "arithmetic", "--level", "1"]) == 2
    assert "holds no model" in capsys.readouterr().err


@given(
    st.dictionaries(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), st.integers() | st.booleans())
)
def test_key_value_pairs_parse_like_json(config):
    pairs = [f"{key}={json.dumps(value)}" for key, value in config.items()]
    if pairs:
        assert parse_key_values(pairs, "--task_config") == config
    assert parse_key_values([json.dumps(config)], "--task_config") == config


def test_key_value_strings_and_bad_pairs():
    assert parse_key_values(["name=abc", "x=1.5"], "--task_config") == {"name": "abc", "x": 1.5}
    with pytest.raises(ValueError, match="--task_config.*'novalue'"):
        parse_key_values(["novalue"], "--task_config")
