"""The tiny tool-calling model: TRL recognises its template, the warm-up trains only the
model's own tokens, and TRL's GRPOTrainer(environment_factory=...) trains the warm agent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from agent_env import GuessEnv, guess_dataset, guess_solutions
from transformers import AutoTokenizer

from curriculum.tasks.agent import environment_tools
from pipeline.models.backend import activate_backend
from pipeline.models.tiny import TOOL_TOKENS, build_tiny_model
from pipeline.models.tool_warmup import (
    collate,
    grpo_chat_template,
    render_episode,
    warm_up_on_episodes,
)


def call_text(number: int) -> str:
    """A `guess` call as Qwen3's template writes it (and the model is to sample it)."""
    call = {"name": "guess", "arguments": {"number": number}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


CALL = call_text(3)
EMPTY_THINK = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def tool_base_dir(tmp_path_factory) -> str:
    """The tool-calling tiny model before any warm-up (~1 s)."""
    return build_tiny_model(str(tmp_path_factory.mktemp("tool") / "base"), tool_calling=True)


def prompt_ids(tokenizer, env) -> list[int]:
    """The first prompt of an episode as GRPOTrainer tokenizes it (`_tokenize_prompts`)."""
    row = guess_dataset(1)[0]
    prompt = row["prompt"][:-1] + [{"role": "user", "content": env.reset(**row)}]
    return tokenizer.apply_chat_template(
        prompt,
        tools=environment_tools(env),
        chat_template=grpo_chat_template(tokenizer),
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )


def trl_chat_template_utils():
    """TRL's module, imported once the process's backend is set (`import unsloth` first)."""
    activate_backend()
    from trl import chat_template_utils

    return chat_template_utils


def test_trl_recognises_the_template_and_parses_a_call(tool_base_dir):
    trl = trl_chat_template_utils()
    tokenizer = AutoTokenizer.from_pretrained(tool_base_dir)
    assert tokenizer.chat_template == trl.qwen3_chat_template  # TRL's file, byte for byte
    assert trl.supports_tool_calling(tokenizer)
    trl.add_response_schema(tokenizer)  # raises on a template it does not know
    ids = tokenizer(CALL + "<|im_end|>")["input_ids"]
    assert len(ids) <= 6  # <tool_call>, \n, the JSON line, \n, </tool_call>, <|im_end|>
    parsed = trl.parse_response(tokenizer, ids, prefix=prompt_ids(tokenizer, GuessEnv()))
    call = {"type": "function", "function": {"name": "guess", "arguments": {"number": 3}}}
    assert parsed["tool_calls"] == [call] and parsed["content"] == ""
    # Without `prefix`, transformers >= 5.13's parser raises and TRL's parse_response falls
    # back to plain text: the call is lost (GRPOTrainer always passes the prompt).
    assert "tool_calls" not in trl.parse_response(tokenizer, ids)


def test_tool_tokens_are_single_added_tokens_as_in_qwen(tool_base_dir):
    tokenizer = AutoTokenizer.from_pretrained(tool_base_dir)
    added = tokenizer.get_added_vocab()
    for token in TOOL_TOKENS:
        assert tokenizer(token)["input_ids"] == [added[token]]
    # Added but not special (Qwen's flags): skipping special tokens keeps the call's text.
    ids = tokenizer(CALL + "<|im_end|>")["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == CALL
    stamp = json.loads((Path(tool_base_dir) / "tiny_model.json").read_text())
    assert stamp["tool_calling"] is True and stamp["vocab_size"] == 1024
    assert stamp["chat_template"].endswith("qwen3.jinja")


def test_a_property_is_not_a_tool():
    """TRL offers every public method but reset and get_reward; `feedback` is a property."""
    env = GuessEnv()
    assert [tool.__name__ for tool in environment_tools(env)] == ["guess"]
    env.reset(target=3)
    env.guess(5)
    env.guess(3)
    assert env.get_reward() == 1.0
    assert env.feedback == "Guesses [5, 3]; the number was 3 (found)."


def test_warm_up_trains_only_the_models_own_tokens(tool_base_dir):
    """Target 3, rounding down: guesses 4 (lower), 1 (higher), 2 (higher), 3 (correct)."""
    tokenizer = AutoTokenizer.from_pretrained(tool_base_dir)
    env = GuessEnv()
    episode = guess_solutions(targets=[3])[0]
    template = grpo_chat_template(tokenizer)
    ids, mask = render_episode(tokenizer, episode, environment_tools(env), template)

    # The mask's runs are the assistant turns, each exactly what the model samples in
    # GRPO: from after "<|im_start|>assistant\n" through <|im_end|>.
    runs, start = [], None
    for i, bit in enumerate([*mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            runs.append(tokenizer.decode(ids[start:i]))
            start = None
    calls = [call_text(n) for n in (4, 1, 2, 3)]
    assert runs == [EMPTY_THINK + c + "<|im_end|>" for c in calls] + [
        EMPTY_THINK + "The number is 3.<|im_end|>"
    ]
    # Everything else is context: the system turn with the tool schema, the user's turn,
    # the tool replies.
    first = mask.index(1)
    assert ids[:first] == prompt_ids(tokenizer, env)
    context = tokenizer.decode([t for t, bit in zip(ids, mask, strict=True) if not bit])
    for reply in ("lower", "higher", "higher", "correct"):
        assert f"<tool_response>\n{reply}\n</tool_response>" in context
    assert '"name": "guess"' in context and "Guess the number from 0 to 9" in context

    # The same as the template's own assistant mask ({% generation %}, what SFTTrainer's
    # assistant_only_loss uses), but for the newline after each <|im_end|>, which the
    # model never samples (generation stops at <|im_end|>) and TRL masks as tool result.
    theirs = tokenizer.apply_chat_template(
        episode,
        tools=environment_tools(env),
        chat_template=template,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    assert theirs["input_ids"] == ids
    newline_after_eos = [i > 0 and ids[i - 1] == tokenizer.eos_token_id for i in range(len(ids))]
    for i, (ours, template_mask) in enumerate(zip(mask, theirs["assistant_masks"], strict=True)):
        assert ours == (template_mask and not newline_after_eos[i]), i

    # Labels: the ids on the mask, -100 on the context and on the padding.
    short = render_episode(tokenizer, guess_solutions(targets=[4])[0], environment_tools(env))
    input_ids, attention_mask, labels = collate([(ids, mask), short], tokenizer.pad_token_id)
    expected = torch.tensor([t if bit else -100 for t, bit in zip(ids, mask, strict=True)])
    assert torch.equal(labels[0], expected)
    n = len(short[0])
    assert n < len(ids) and (labels[1, n:] == -100).all() and (attention_mask[1, n:] == 0).all()
    assert (input_ids[1, n:] == tokenizer.pad_token_id).all()


def test_warm_up_is_reused_rebuilt_on_new_settings_and_never_replaces_others(
    tool_base_dir, tmp_path
):
    episodes, tools = guess_solutions(targets=[3, 7]), environment_tools(GuessEnv())
    folder = warm_up_on_episodes(tool_base_dir, episodes, tools, str(tmp_path / "w"), steps=2)
    weights = tmp_path / "w" / "model.safetensors"
    built = weights.stat().st_mtime_ns
    assert warm_up_on_episodes(tool_base_dir, episodes, tools, folder, steps=2) == folder
    assert weights.stat().st_mtime_ns == built
    warm_up_on_episodes(tool_base_dir, episodes, tools, folder, steps=3)
    assert json.loads((tmp_path / "w" / "tool_warmup.json").read_text())["settings"]["steps"] == 3
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("precious")
    with pytest.raises(ValueError, match="refusing to replace it"):
        warm_up_on_episodes(tool_base_dir, episodes, tools, str(foreign), steps=2)


def test_grpo_trains_the_warm_agent_with_tool_calls_and_differing_rewards(
    tool_model_dir, tmp_path, monkeypatch
):
    """TRL's own GRPOTrainer, the environment's get_reward as the only reward."""
    activate_backend()
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        use_cpu=True,
        bf16=False,
        max_steps=2,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=64,
        max_tool_calling_iterations=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        seed=0,
    )
    trainer = GRPOTrainer(
        model=tool_model_dir,
        args=args,
        train_dataset=guess_dataset(16, seed=0),
        environment_factory=GuessEnv,
        reward_funcs=None,
    )
    # What the warm-up assumed about TRL: the tools it shows and the template it renders.
    assert [tool.__name__ for tool in trainer.tools] == ["guess"]
    assert trainer.chat_template == grpo_chat_template(trainer.processing_class)
    assert trainer.reward_func_names == ["GuessEnv"]

    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    logs = [h for h in trainer.state.log_history if "tools/call_frequency" in h]
    assert len(logs) == 2
    assert all(h["tools/call_frequency"] > 0 for h in logs)
    # Some episodes find the number and some do not: rewards to compare.
    assert any(h["rewards/GuessEnv/std"] > 0 for h in logs)
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    assert changed
