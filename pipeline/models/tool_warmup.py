"""An SFT warm-up that teaches a model an environment's tool-call format from its solutions.

A model fresh from `build_tiny_model(..., tool_calling=True)` samples noise, so GRPO with
`environment_factory` would see no tool call and no reward to compare. A few hundred steps
of supervised training on the environment's own solved episodes teach it to emit
`<tool_call>` lines that TRL parses, to read the tool's replies and to close with a plain
answer; GRPO then has calls to run and rewards that differ.

    >>> episodes = [[user, assistant_with_tool_calls, tool_reply, ..., final_answer], ...]
    >>> folder = warm_up_on_episodes(model_dir, episodes, environment_tools(MyEnv()),
    ...                              "/tmp/warm", steps=300, lr=3e-3, seed=0)
    >>> GRPOTrainer(model=folder, environment_factory=MyEnv, ...)

An episode is rendered exactly as `GRPOTrainer` renders an agent's prompt: with the
tokenizer's chat template, or with the training template TRL 1.15 swaps in when there are
tools and that template is not prefix-preserving (`get_training_chat_template`; Qwen3's is
not), and with `tools=` the environment's methods as TRL collects them. The loss covers the model's own tokens,
what GRPO would sample and train (each assistant turn after its header, through
`<|im_end|>`), and nothing else: not the prompt, the tools' schemas or the tool results,
which TRL masks out of GRPO's loss too (`tool_mask`).
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from curriculum.atomic import atomic_folder

STAMP = "tool_warmup.json"


def grpo_chat_template(tokenizer) -> str | None:
    """The chat template GRPOTrainer renders agent prompts with, given tools: None (the
    tokenizer's own) when it is prefix-preserving, else TRL's training variant of it."""
    _activate_backend()
    from trl.chat_template_utils import (
        get_training_chat_template,
        is_chat_template_prefix_preserving,
    )

    if is_chat_template_prefix_preserving(tokenizer):
        return None
    return get_training_chat_template(tokenizer)


def render_episode(
    tokenizer, messages: list[dict], tools: list, chat_template: str | None = None
) -> tuple[list[int], list[int]]:
    """Token ids of a whole episode and its loss mask (1 on the model's own tokens).

    `chat_template` None renders with the template GRPOTrainer uses (`grpo_chat_template`).
    Each assistant turn's tokens are found by rendering prefixes, the way TRL builds a
    rollout: the conversation before it with the generation prompt (what the model is
    given), then with the turn (what it would have sampled, up to and including the
    end-of-turn token, as generation stops there; the newline after it comes with the next
    message, which TRL masks as part of the tool result)."""

    def render(conversation, add_generation_prompt=False):
        return tokenizer.apply_chat_template(
            conversation,
            tools=tools or None,  # as TRL: `or None`, some templates render boilerplate for []
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=True,
            return_dict=False,
        )

    if chat_template is None:
        chat_template = grpo_chat_template(tokenizer)
    ids = render(messages)
    mask = [0] * len(ids)
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt, with_turn = render(messages[:k], True), render(messages[: k + 1])
        if with_turn[: len(prompt)] != prompt or ids[: len(with_turn)] != with_turn:
            raise ValueError(
                f"the chat template does not preserve prefixes at message {k}, so the turns "
                "cannot be told apart as GRPOTrainer builds them"
            )
        turn = with_turn[len(prompt) :]
        if tokenizer.eos_token_id not in turn:
            raise ValueError(f"assistant message {k} renders without the eos token")
        end = len(prompt) + len(turn) - turn[::-1].index(tokenizer.eos_token_id)
        mask[len(prompt) : end] = [1] * (end - len(prompt))
    return ids, mask


def warm_up_on_episodes(
    model_dir: str,
    episodes: list[list[dict]],
    tools: list,
    output_dir: str,
    *,
    steps: int = 300,
    lr: float = 3e-3,
    seed: int = 0,
    batch_size: int = 8,
    overwrite: bool = False,
    untooled: list[list[dict]] = (),
) -> str:
    """Train the model in `model_dir` on `episodes` (lists of chat messages) for `steps`
    AdamW steps and save it with its tokenizer to `output_dir`; returns that folder.

    `tools` are what the prompt shows, as GRPOTrainer gets them (`curriculum.tasks.agent.environment_tools(env)`,
    functions or JSON schemas). `untooled`: more conversations, rendered with no tools
    shown, as ERLTrainer renders a reflection prompt (e.g. a reflection and its lesson). Each step takes `batch_size` episodes at random; the
    learning rate warms up over 10 steps and decays linearly to 0. A plain torch loop in
    float32: on the tiny model it is what runs fastest and most predictably on a CPU.

    A folder that holds a warm-up of the same settings (the model folder's bytes, the
    episodes, the tools' schemas, steps, lr, seed, batch size) is reused; the folder is
    written atomically, and a non-empty folder this did not write is refused.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    settings = {
        "model": _folder_digest(Path(model_dir)),
        "episodes": _digest(episodes),
        "tools": _digest(_tool_schemas(tools)),
        "steps": steps,
        "lr": lr,
        "seed": seed,
        "batch_size": batch_size,
    }
    if untooled:  # (a warm-up without any keeps the settings it was cached under)
        settings["untooled"] = _digest(list(untooled))
    out = Path(output_dir)
    stamp = out / STAMP
    if not overwrite and stamp.exists() and json.loads(stamp.read_text())["settings"] == settings:
        return str(out)
    if out.exists() and any(out.iterdir()) and not stamp.exists():
        raise ValueError(
            f"{out} is not empty and holds no warm-up written by this project; refusing to "
            "replace it (choose an empty folder for warm_up_on_episodes)"
        )

    template = grpo_chat_template(tokenizer)  # once, not once per episode
    rows = [render_episode(tokenizer, e, tools, template) for e in episodes]
    rows += [render_episode(tokenizer, c, [], template) for c in untooled]

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    losses = _train(model, rows, tokenizer.pad_token_id, steps, lr, seed, batch_size)

    with atomic_folder(out) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        record = {"settings": settings, "first_loss": losses[0], "last_loss": losses[-1]}
        (staging / STAMP).write_text(json.dumps(record))
    return str(out)


def _train(model, rows, pad_id: int, steps: int, lr: float, seed: int, batch_size: int):
    """`steps` AdamW steps on `batch_size` rows drawn at random, the rate warmed up over 10
    steps and decayed linearly to 0; the loss of every step."""
    import torch

    rng = random.Random(seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = min(10, steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * (1.0 - s / steps)
    )
    losses = []
    for _ in range(steps):
        batch = rng.sample(rows, min(batch_size, len(rows)))
        input_ids, attention_mask, labels = collate(batch, pad_id)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def collate(rows: list[tuple[list[int], list[int]]], pad_id: int):
    """`render_episode` rows as right-padded tensors: input ids, attention mask and labels
    (the ids on the loss mask, -100 elsewhere; the model shifts labels itself)."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100)
    for i, (ids, mask) in enumerate(rows):
        n = len(ids)
        input_ids[i, :n] = torch.tensor(ids)
        attention_mask[i, :n] = 1
        labels[i, :n] = torch.where(torch.tensor(mask).bool(), torch.tensor(ids), -100)
    return input_ids, attention_mask, labels


def _tool_schemas(tools: list) -> list[dict]:
    from transformers.utils import get_json_schema

    return [t if isinstance(t, dict) else get_json_schema(t) for t in tools]


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _folder_digest(folder: Path) -> str:
    """A hash of every file's name and bytes: the warm-up's starting point, whatever built it."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _activate_backend() -> None:
    """The process's backend before trl is imported (`import unsloth` must come first)."""
    from pipeline.models.backend import activate_backend

    activate_backend()
