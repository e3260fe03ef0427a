"""ERLTrainer on agents: TRL's `environment_factory` (and `tools`), multi-turn episodes.

The environment is `tests/agent_env.py`'s GuessEnv, written as a user outside the project
writes one for GRPOTrainer; the model is the tiny tool-calling model after its SFT warm-up
on the environment's own solutions (`tool_model_dir`), so episodes hold real tool calls.
Runs on whichever base trainer this process has; tests/test_unsloth_trainer.py runs it
again on Unsloth's generated trainer. The training tests are `slow` (`make test-all`, CI):
on both bases they add about a minute to the quick suite.
"""

from __future__ import annotations

import pytest
import torch
from agent_env import GuessEnv, guess_dataset
from test_erl_bases import load_model

from pipeline import ERLConfig, ERLTrainer
from rewards import completion_text

GATE = 3.0  # above what a first attempt can score (the environment's 0/1 + under 1)


class RecordingGuessEnv(GuessEnv):
    """GuessEnv that logs every reset: (instance id, target)."""

    resets: list[tuple[int, int]] = []

    def reset(self, **row) -> str:
        RecordingGuessEnv.resets.append((id(self), row["target"]))
        return super().reset(**row)


def spread_reward(completions, attempt=None, **kwargs) -> list[float]:
    """Under 1 by length for first attempts (GRPO has a spread); retries (`attempt` 2)
    score GATE + 2 and more: with reward_threshold GATE every first attempt is gated and
    every retry succeeds, so every kind of row is trained."""
    base = [(len(completion_text(c)) % 4) / 4 for c in completions]
    if attempt is None:
        return base
    return [GATE + 2 + b for b in base]


def agent_args(tmp_path, config_cls=ERLConfig, **overrides):
    from transformers import AutoTokenizer

    pad = AutoTokenizer.from_pretrained(overrides.pop("model_dir")).pad_token_id
    settings = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=48,
        max_tool_calling_iterations=4,
        max_steps=1,
        learning_rate=1e-3,
        bf16=False,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        seed=0,
        optim="adamw_torch",
        gradient_accumulation_steps=1,
        gradient_checkpointing=False,
        loss_type="dapo",
        beta=0.0,
        mask_truncated_completions=False,
        # Unsloth's loss takes a pad id inside a completion for padding: keep the sampler
        # off it, as a trained model is.
        generation_kwargs={"suppress_tokens": [pad]},
    )
    if config_cls is ERLConfig:
        settings.update(reward_threshold=GATE, reflections_per_group=0)
        # One token of lesson: the retries then call tools as first attempts do (7 or 8 of 8 on
        # seeds 0-9), where 16 tokens of the tiny model's text in the system turn left 0-2
        # of 8 retries calling one, and whether any did hung on the sampled trajectory.
        # These tests check what happens to a retry's tool calls, not what a lesson says.
        settings["reflection_max_completion_length"] = 1
    settings.update(overrides)
    return config_cls(**settings)


def agent_trainer(model_dir, tmp_path, environment=RecordingGuessEnv, **overrides):
    return ERLTrainer(
        model=load_model(model_dir),
        args=agent_args(tmp_path, model_dir=model_dir, **overrides),
        train_dataset=guess_dataset(16, seed=1),
        reward_funcs=spread_reward,
        environment_factory=environment,
    )


def rows_of(output, key, mask_key):
    """Each row's tokens of `key`, its padding (by `mask_key`) left out."""
    return [
        [t for t, m in zip(ids.tolist(), mask.tolist()) if m]
        for ids, mask in zip(output[key], output[mask_key])
    ]


@pytest.fixture
def one_batch(tool_model_dir, tmp_path):
    """One gated generation batch on GuessEnv: the trainer, what the feedback function and
    the reflections were given, and the merged batch."""
    from conftest import first_generation_batch

    RecordingGuessEnv.resets.clear()
    seen: dict[str, list] = {"completions": [], "environments": [], "reflections": []}

    def feedback(completions, environments, **kwargs):
        seen["completions"] += completions
        seen["environments"] += environments
        return [environment.feedback for environment in environments]

    trainer = agent_trainer(tool_model_dir, tmp_path)
    trainer.feedback_func = feedback
    generate = trainer._backend.generate

    def recording(prompts, max_new_tokens):
        seen["reflections"] += [p[-1]["content"] for p in prompts]
        return generate(prompts, max_new_tokens)

    trainer._backend.generate = recording
    batch, output = first_generation_batch(trainer)
    return trainer, batch, seen, output


@pytest.mark.slow
def test_a_retry_is_a_fresh_episode_reset_with_its_first_attempts_row(one_batch):
    trainer, batch, seen, output = one_batch
    first_pool = {id(e) for e in trainer._environment_pool[None]}
    retry_pool = {id(e) for e in trainer._backend.episodes.pool[None]}
    assert first_pool.isdisjoint(retry_pool)  # the first attempts' stay as they ended
    first = [target for instance, target in RecordingGuessEnv.resets if instance in first_pool]
    retried = [target for instance, target in RecordingGuessEnv.resets if instance in retry_pool]
    assert first == [row["target"] for row in batch]
    assert retried == first  # every row was gated, each retried once, in its order


@pytest.mark.slow
def test_the_reflection_prompt_shows_the_whole_episode_and_its_environments_feedback(one_batch):
    trainer, batch, seen, output = one_batch
    assert len(seen["reflections"]) == len(seen["completions"]) == len(batch)
    results = 0
    for episode, environment, prompt in zip(
        seen["completions"], seen["environments"], seen["reflections"]
    ):
        assert environment.feedback in prompt  # read from the episode's own environment
        for message in episode:
            if message["role"] == "tool":
                assert f"Result of {message['name']}: {message['content']}" in prompt
                results += 1
    assert results > 0, "no first attempt called a tool"


@pytest.mark.slow
def test_internalization_trains_the_retrys_episode_under_the_tasks_own_prompt(one_batch):
    trainer, batch, seen, output = one_batch
    n = len(batch)
    prompts = rows_of(output, "prompt_ids", "prompt_mask")
    completions = rows_of(output, "completion_ids", "completion_mask")
    tool_mask = output["tool_mask"].tolist()
    # GRPO's rows, then reflections, retries and internalized copies, one each per row.
    assert output["prompt_ids"].size(0) == 4 * n
    retries, copies = range(2 * n, 3 * n), range(3 * n, 4 * n)
    for j, (retry, copy) in enumerate(zip(retries, copies)):
        assert completions[copy] == completions[retry]
        assert tool_mask[copy] == tool_mask[retry]
        assert prompts[copy] == prompts[j]  # the first attempt's prompt: tools, reset text
        assert prompts[retry] != prompts[j]  # the retry's carries the lesson
    assert any(0 in tool_mask[i] for i in retries), "no retry called a tool"


@pytest.mark.slow
def test_tool_results_get_no_gradient_in_any_kind_of_row(one_batch):
    """The loss's gradient reaches tokens the model wrote in GRPO's rows, retries and
    internalized copies, and no tool result's prediction in any of them.

    Read where both bases agree: the last decoder layer's output at each position feeds
    only that position's logits (the final norm works position by position), the next
    token's prediction, so its gradient is zero exactly when that token carries no loss. Which rows a forward holds, and where their
    tokens sit (TRL pads on the left, Unsloth packs rows to the left), is read from the
    token ids the embedding received."""
    trainer, batch, seen, output = one_batch
    pad = trainer._tokenizer.pad_token_id
    trainer.current_gradient_accumulation_steps = 1  # what Trainer's loop sets
    model = trainer.accelerator.unwrap_model(trainer.model)
    forwards: list[dict] = []

    def ids_in(module, args):
        forwards.append({"ids": args[0].detach().clone()})

    def hidden_out(module, args, out):  # returns None: the output stays as it is
        hidden = out if isinstance(out, torch.Tensor) else out[0]
        if hidden.requires_grad:  # not the scoring forwards without gradients
            hidden.retain_grad()
            forwards[-1]["hidden"] = hidden

    hooks = [
        model.get_input_embeddings().register_forward_pre_hook(ids_in),
        model.model.layers[-1].register_forward_hook(hidden_out),
    ]
    try:
        trainer.compute_loss(trainer.model, output).backward()
    finally:
        for hook in hooks:
            hook.remove()
    # Each row's real tokens -> (prompt length, tool mask of its completion, its kind).
    n = len(batch)
    kinds = ["GRPO"] * n + ["reflection"] * n + ["retry"] * n + ["copy"] * n
    prompts = rows_of(output, "prompt_ids", "prompt_mask")
    completions = rows_of(output, "completion_ids", "completion_mask")
    masks = rows_of(output, "tool_mask", "completion_mask")
    rows = {
        tuple(p + c): (len(p), m, kind) for p, c, m, kind in zip(prompts, completions, masks, kinds)
    }
    keys = sorted(rows, key=len, reverse=True)  # the longest match first
    seen_kinds: dict[str, list[int]] = {"GRPO": [0, 0], "retry": [0, 0], "copy": [0, 0]}
    for forward in (f for f in forwards if "hidden" in f):
        for ids, grad in zip(forward["ids"].tolist(), forward["hidden"].grad):
            positions = [i for i, t in enumerate(ids) if t != pad]
            real = [ids[i] for i in positions]
            start = 0
            while start < len(real):  # Unsloth may pack several rows into one sequence
                key = next((k for k in keys if tuple(real[start : start + len(k)]) == k), None)
                if key is None:
                    break
                prompt_length, mask, kind = rows[key]
                if kind in seen_kinds:
                    for j, keep in enumerate(mask):
                        at = positions[start + prompt_length + j - 1]
                        moved = grad[at].abs().max().item()
                        if keep == 0:
                            assert moved == 0, (kind, j)  # a tool result's prediction
                        seen_kinds[kind][keep] += (moved > 0) if keep else 1
                start += len(key)
    for kind, (results, trained) in seen_kinds.items():
        assert results > 0, f"no tool result in a {kind} row"
        assert trained > 0, f"no gradient on the {kind} rows' own tokens"


@pytest.mark.slow
def test_gate_closed_trains_exactly_like_grpo_on_an_environment(tool_model_dir, tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    def run(trainer):
        initial = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        return initial, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    grpo = GRPOTrainer(
        model=load_model(tool_model_dir),
        args=agent_args(tmp_path / "grpo", GRPOConfig, model_dir=tool_model_dir, max_steps=2),
        train_dataset=guess_dataset(16, seed=1),
        reward_funcs=spread_reward,
        environment_factory=GuessEnv,
    )
    initial, base = run(grpo)
    erl_trainer = agent_trainer(
        tool_model_dir, tmp_path / "erl", GuessEnv, reward_threshold=-1.0, max_steps=2
    )
    _, erl = run(erl_trainer)
    assert any(not torch.equal(initial[n], base[n]) for n in initial), "GRPO did not train"
    for name in base:
        assert torch.equal(base[name], erl[name]), name
    calls = [
        h["tools/call_frequency"]
        for h in erl_trainer.state.log_history
        if "tools/call_frequency" in h
    ]
    assert calls and max(calls) > 0


def test_rollout_func_is_refused_with_its_reason(tool_model_dir, tmp_path):
    with pytest.raises(
        ValueError, match="does not support rollout_func=: a retry is a fresh episode"
    ):
        ERLTrainer(
            model=tool_model_dir,
            args=agent_args(tmp_path, model_dir=tool_model_dir),
            train_dataset=guess_dataset(4),
            reward_funcs=spread_reward,
            rollout_func=lambda prompts, trainer: {},
        )


class FeedbackMethodEnv(GuessEnv):
    def feedback(self) -> str:  # a method: TRL would offer it to the model as a tool
        """What went wrong."""
        return "no"


def test_a_feedback_method_is_refused_since_trl_offers_it_as_a_tool(tool_model_dir, tmp_path):
    with pytest.raises(ValueError, match="FeedbackMethodEnv.feedback is a method"):
        agent_trainer(tool_model_dir, tmp_path, FeedbackMethodEnv)


@pytest.mark.slow
def test_a_users_environment_trains_as_the_readme_shows_its_feedback_read_from_it(
    tool_model_dir, tmp_path
):
    """README's agent example: the user's class (written for GRPOTrainer, which trains it
    unchanged above), no reward_funcs (its get_reward scores) and no feedback_func (its
    `feedback` property is read), at ERLConfig's defaults but the sizes."""
    shown = []
    trainer = ERLTrainer(
        model=load_model(tool_model_dir),
        args=agent_args(tmp_path, model_dir=tool_model_dir, max_steps=2, reward_threshold=1.0),
        train_dataset=guess_dataset(16, seed=2),
        environment_factory=GuessEnv,
    )
    generate = trainer._backend.generate
    trainer._backend.generate = lambda prompts, n: shown.extend(prompts) or generate(prompts, n)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "erl/gated_fraction" in h]
    assert len(logged) == 2 and any(h["erl/gated_fraction"] > 0 for h in logged)
    assert shown and all("; the number was " in p[-1]["content"] for p in shown)
    assert trainer.reward_func_names == ["GuessEnv"]


@pytest.mark.slow
def test_standalone_tools_run_in_the_retries_too(tool_model_dir, tmp_path):
    """`tools=` without an environment: first attempts and retries call the same function."""
    from conftest import first_generation_batch
    from datasets import Dataset

    def guess(number: int) -> str:
        """Guess the hidden number; the reply is higher, lower or correct.

        Args:
            number: Your guess, an integer from 0 to 9.
        """
        return "correct" if int(number) == 7 else "higher" if int(number) < 7 else "lower"

    task = [{"role": "user", "content": "Guess the number from 0 to 9 with the guess tool."}]
    trainer = ERLTrainer(
        model=load_model(tool_model_dir),
        # The lesson alone in the retry: the tool model's warm-up never showed a prompt with
        # feedback text, and with the default's (issue 48) its retries stop calling tools
        # (issue 49). What this test checks is the machinery, not the model's reading.
        args=agent_args(
            tmp_path,
            model_dir=tool_model_dir,
            retry_system_prompt="{prompt}\n\nAdvice from a previous attempt: {reflection}",
        ),
        train_dataset=Dataset.from_list([{"prompt": task}] * 16),
        reward_funcs=spread_reward,
        tools=[guess],
    )
    batch, output = first_generation_batch(trainer)
    n = len(batch)
    tool_mask = output["tool_mask"].tolist()
    assert any(0 in tool_mask[i] for i in range(2 * n, 3 * n)), "no retry called the tool"
    assert trainer._metrics["train"]["erl/retry_tool_calls"][-1] > 0
    assert trainer._backend.episodes.pool == {}  # no environment to reset


class OtherGuessEnv(RecordingGuessEnv):
    """A second environment for a dict factory (the same game, its own class)."""


@pytest.mark.slow
def test_a_dict_of_factories_gives_each_retry_its_rows_environment(tool_model_dir, tmp_path):
    from conftest import first_generation_batch
    from datasets import Dataset

    rows = [dict(r, environment="a" if i % 8 < 4 else "b") for i, r in enumerate(guess_dataset(16))]
    RecordingGuessEnv.resets.clear()
    trainer = ERLTrainer(
        model=load_model(tool_model_dir),
        args=agent_args(tmp_path, model_dir=tool_model_dir),
        train_dataset=Dataset.from_list(rows),
        reward_funcs=spread_reward,
        environment_factory={"a": RecordingGuessEnv, "b": OtherGuessEnv},
    )
    batch, _ = first_generation_batch(trainer)
    pools = trainer._backend.episodes.pool
    assert {type(e) for e in pools["a"]} == {RecordingGuessEnv}
    assert {type(e) for e in pools["b"]} == {OtherGuessEnv}
    by_instance = {id(e): name for name, pool in pools.items() for e in pool}
    retried = sorted((by_instance[i], t) for i, t in RecordingGuessEnv.resets if i in by_instance)
    assert retried == sorted((row["environment"], row["target"]) for row in batch)


class ToollessEnv:
    """An environment that only sets the episode up: no tools, no reward of its own."""

    def reset(self, target, **row) -> str:
        self.target = target
        return "Guess the number from 0 to 9 with the guess tool."


@pytest.mark.slow
def test_an_environment_without_tools_sets_the_retries_up_too(tool_model_dir, tmp_path):
    from conftest import first_generation_batch

    trainer = agent_trainer(tool_model_dir, tmp_path, ToollessEnv)
    batch, output = first_generation_batch(trainer)
    assert trainer.tools == [] and "tool_mask" not in output
    (environments,) = trainer._backend.episodes.pool.values()
    assert sorted(e.target for e in environments) == sorted(row["target"] for row in batch)
    assert output["prompt_ids"].size(0) == 4 * len(batch)  # reflections, retries, copies


def test_evaluation_charges_tool_replies_what_training_charges(tool_model_dir, tmp_path):
    """`pipeline.evaluate`'s episodes count a round of tool replies as the trainer does (its
    own suffix: the replies rendered with the next generation prompt, not the replies' text
    alone), so at one budget evaluation keeps the tool results training keeps."""
    from pipeline.evaluate.episodes import _Episode, tool_suffix_length
    from pipeline.models.tool_warmup import grpo_chat_template

    trainer = agent_trainer(tool_model_dir, tmp_path)
    tokenizer = trainer.processing_class
    replies = [{"role": "tool", "name": "guess", "content": "higher"}]
    cost = tool_suffix_length(tokenizer, grpo_chat_template(tokenizer), replies)
    assert cost == len(trainer._get_tool_suffix_ids(replies))
    assert cost > len(tokenizer.encode("higher", add_special_tokens=False))

    class Task:  # a guess episode, as AgentTask.start gives it
        def start(self, row):
            environment = GuessEnv()
            return environment, [{"role": "user", "content": environment.reset(target=7)}]

    turn = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "guess",
                                                             "arguments": {"number": 3}}}]}  # fmt: skip
    # Turns of 20 tokens at a budget that holds one round of replies and not a second turn's.
    budget = 20 + cost + 19
    episode = _Episode(Task(), {}, tokenizer, grpo_chat_template(tokenizer))
    episode.add_turn(dict(turn), 20, budget, True, max_len=10_000)
    assert episode.tokens == 20 + cost and not episode.done
    episode.add_turn(dict(turn), 18, budget, True, max_len=10_000)
    assert episode.done  # TRL rolls the second round of replies back: it would pass the budget
    assert [m["role"] for m in episode.completion] == ["assistant", "tool", "assistant"]
