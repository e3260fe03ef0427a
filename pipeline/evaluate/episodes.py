"""First attempts of an agent task: whole episodes played with `generate`, as GRPO plays them.

    episodes = play_episodes(model, tokenizer, get_task("frozenlake_agent"), rows,
                             max_completion_length=256)
    score_completions(task, rows, episodes)   # the task replays and judges each episode

Each row gets a fresh environment (`AgentTask.start`: reset, its text appended to the
prompt). Then, turn by turn, for every episode still running: the conversation is
rendered with the tools shown, as `GRPOTrainer` renders it (the chat template, or TRL's
training variant when that one is not prefix-preserving); the model generates one turn;
TRL's `parse_response` reads it, tool calls included; each call runs in the environment
the way TRL's tool loop runs it (`run_tool_call`, the replay's own: an unknown tool,
arguments that are not a mapping, or a tool that raises answer `{'error': ...}`), and its
reply is appended. An episode ends at a turn with no tool
call, after `max_turns` rounds of calls (TRL's `max_tool_calling_iterations`; the
task's largest turn limit by default), or when its tokens after the prompt, tool replies
included, reach `max_completion_length`, as in training: a round of replies costs what
TRL charges for it (`tool_suffix_length`, TRL's own rendering of the replies and the next
generation prompt), and replies that would pass the budget or the model's positions are
dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from curriculum.tasks.agent import AgentTask, Message, environment_tools, run_tool_call
from curriculum.tasks.base import Row


def play_episodes(
    model: Any,
    tokenizer: Any,
    task: AgentTask,
    rows: Sequence[Row],
    *,
    max_completion_length: int = 256,
    max_turns: int | None = None,
    batch_size: int = 16,
    do_sample: bool = False,
    temperature: float = 1.0,
    seed: int = 0,
    progress: bool = True,
) -> list[list[Message]]:
    """One episode per row: the messages after the prompt (assistant turns with their
    `tool_calls`, the tools' replies, the closing reply). Greedy unless `do_sample`;
    sampling is seeded without touching the caller's RNG."""
    import torch
    from tqdm.auto import tqdm

    from pipeline.models.tool_warmup import grpo_chat_template

    if max_completion_length < 1 or batch_size < 1:
        raise ValueError(
            f"max_completion_length and batch_size must be >= 1, got {max_completion_length} "
            f"and {batch_size}"
        )
    max_turns = task.max_turns() if max_turns is None else max_turns
    parser = _response_parser(tokenizer)
    template = grpo_chat_template(tokenizer)
    episodes = [_Episode(task, row, tokenizer, template) for row in rows]
    max_len = getattr(model.config, "max_position_embeddings", None) or float("inf")

    device = next(model.parameters()).device
    was_training, padding_side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"  # generation appends on the right
    bar = tqdm(total=len(episodes), desc="playing episodes", disable=not progress, leave=False)
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            # The first turn, then one turn after each round of calls; as in TRL, the calls
            # of the turn after the last round never run.
            for round_ in range(max_turns + 1):
                running = [e for e in episodes if not e.done]
                for start in range(0, len(running), batch_size):
                    batch = running[start : start + batch_size]
                    prompts, turns = _generate_turns(
                        model,
                        tokenizer,
                        template,
                        batch,
                        max_completion_length,
                        do_sample,
                        temperature,
                        device,
                    )
                    for episode, prompt, ids in zip(batch, prompts, turns, strict=True):
                        run_calls = round_ < max_turns
                        if round_ == 0:
                            episode.prompt_tokens = len(prompt)
                        episode.add_turn(
                            parser(ids, prompt), len(ids), max_completion_length, run_calls,
                            max_len,
                        )  # fmt: skip
                        bar.update(int(episode.done))
    finally:
        bar.close()
        model.train(was_training)
        tokenizer.padding_side = padding_side
    return [episode.completion for episode in episodes]


class _Episode:
    """One row's episode in progress: its environment, prompt, messages and token count."""

    def __init__(self, task: AgentTask, row: Row, tokenizer: Any, template: str | None = None):
        self.tokenizer, self.template = tokenizer, template
        self.environment, self.prompt = task.start(row)
        self.tools = {tool.__name__: tool for tool in environment_tools(self.environment)}
        self.completion: list[Message] = []
        self.tokens = 0
        """Tokens after the prompt so far: the model's turns and the tools' replies."""
        self.prompt_tokens = 0
        """The rendered prompt's tokens (set at the first turn)."""
        self.done = False

    def add_turn(
        self, message: Message, generated: int, budget: int, run_calls: bool, max_len: int
    ) -> None:
        """Append the model's turn and run its calls, unless it has none, the budget is spent
        or the rounds are (`run_calls` false): then the episode is over."""
        self.completion.append(message)
        self.tokens += generated
        calls = message.get("tool_calls")
        if not calls or self.tokens >= budget or not run_calls:
            self.done = True
            return
        replies = [self._run(call) for call in calls]
        messages = [{"role": "tool", "name": n, "content": r} for n, r in replies]
        # The replies cost what TRL charges: the whole rendered suffix (the tool turns and
        # the next generation prompt). Replies that would pass the budget, or the model's
        # positions, are dropped and the episode ends, as TRL rolls them back (the calls ran).
        cost = tool_suffix_length(self.tokenizer, self.template, messages)
        if self.tokens + cost > budget or self.prompt_tokens + self.tokens + cost >= max_len:
            self.done = True
            return
        self.tokens += cost
        self.completion += messages

    def _run(self, call: dict) -> tuple[str, str]:
        """A call run as TRL 1.15's tool loop runs it (the replay's own function)."""
        record = run_tool_call(self.tools, call)
        return record.name, record.reply


def tool_suffix_length(tokenizer: Any, template: str | None, tool_messages: list[Message]) -> int:
    """The tokens TRL 1.15 adds after an assistant turn for its tool replies: TRL's own
    `GRPOTrainer._get_tool_suffix_ids` (the replies rendered with the generation prompt
    that follows, cut at the end of the assistant turn), called on this tokenizer and
    template."""
    from types import SimpleNamespace

    from pipeline.models.backend import activate_backend

    activate_backend()  # before trl
    from trl.trainer.grpo_trainer import GRPOTrainer

    owner = SimpleNamespace(  # what the method reads of its trainer
        processing_class=tokenizer,
        _tokenizer=tokenizer,
        chat_template=template,
        chat_template_kwargs={},
        _is_vlm=False,
    )
    return len(GRPOTrainer._get_tool_suffix_ids(owner, tool_messages))


def _generate_turns(
    model, tokenizer, template, batch, budget, do_sample, temperature, device
) -> tuple[list[list[int]], list[list[int]]]:
    """The rendered conversation of each episode of `batch` and the turn generated after
    it: token ids up to and including eos, at most what is left of the episode's budget."""
    import torch
    from transformers import GenerationConfig

    conversations = [e.prompt + e.completion for e in batch]
    tools = [list(e.tools.values()) or None for e in batch]
    encoded = [
        tokenizer.apply_chat_template(
            conversation,
            tools=tool_list,
            chat_template=template,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for conversation, tool_list in zip(conversations, tools, strict=True)
    ]
    limits = [max(1, budget - e.tokens) for e in batch]
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    width = max(len(ids) for ids in encoded)
    input_ids = torch.tensor(
        [[pad_id] * (width - len(ids)) + ids for ids in encoded], device=device
    )
    attention = torch.tensor(
        [[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded], device=device
    )
    eos = sorted({tokenizer.eos_token_id, *_as_list(model.generation_config.eos_token_id)})
    config = GenerationConfig(
        max_new_tokens=max(limits),
        do_sample=do_sample,
        temperature=temperature if do_sample else None,
        top_p=None,
        top_k=None,
        eos_token_id=eos,
        pad_token_id=pad_id,
    )
    with torch.no_grad():
        output = model.generate(
            input_ids=input_ids, attention_mask=attention, generation_config=config
        )
    turns = []
    for row, limit in zip(output[:, width:].tolist(), limits, strict=True):
        ids = row[:limit]
        ends = [k for k, token in enumerate(ids) if token in eos]
        turns.append(ids[: ends[0] + 1] if ends else ids)
    return encoded, turns


def _response_parser(tokenizer):
    """Token ids -> an assistant message, tool calls included, as TRL parses a turn (its
    `parse_response`, once `add_response_schema` gave the tokenizer its template's
    parser); a tokenizer TRL cannot parse tool calls for gives plain text."""
    from pipeline.models.backend import activate_backend

    activate_backend()  # trl must come after unsloth
    from trl.chat_template_utils import add_response_schema, parse_response

    try:
        add_response_schema(tokenizer)
    except ValueError:
        pass  # an unrecognised template: TRL refuses tools for it in training too
    if getattr(tokenizer, "response_template", None) is None and (
        getattr(tokenizer, "response_schema", None) is None
    ):
        return lambda ids, prefix: {
            "role": "assistant",
            "content": tokenizer.decode(ids, skip_special_tokens=True),
        }
    return lambda ids, prefix: parse_response(tokenizer, ids, prefix=prefix)


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
