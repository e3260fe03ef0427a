"""A tiny causal LM built offline, for tests, CI and the CPU demo.

No machine here reaches a model hub, so the project builds its own small model: a
byte-level BPE tokenizer trained on task text, wrapped as a fast tokenizer with a
Qwen-style chat template, and a Llama-architecture model from a small config. It is
saved to a folder and loaded through the same `from_pretrained` path a hub id takes.

    >>> folder = build_tiny_model("/tmp/tiny")
    >>> AutoModelForCausalLM.from_pretrained(folder)   # or ERLTrainer(model=folder, ...)
"""

from __future__ import annotations

import json
from collections.abc import Iterable
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


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 512):
    """A byte-level BPE fast tokenizer with the chat template and special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side="left",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(
    output_dir: str,
    *,
    corpus: Iterable[str] | None = None,
    seed: int = 0,
    overwrite: bool = False,
    **size: int,
) -> str:
    """Build (or reuse) a tiny Llama model + tokenizer in `output_dir`; returns the folder.

    `size` overrides entries of `DEFAULT_SIZE` (hidden_size, num_hidden_layers, ...). A
    folder that already holds a model built with the same settings is reused, so the
    demo builds it once. The folder is written atomically: a crash leaves no half model.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    unknown = sorted(set(size) - set(DEFAULT_SIZE))
    if unknown:
        raise ValueError(f"unknown size key(s) {unknown}; valid: {sorted(DEFAULT_SIZE)}")
    settings = {**DEFAULT_SIZE, **size, "seed": seed, "custom_corpus": corpus is not None}
    out = Path(output_dir)
    stamp = out / "tiny_model.json"
    if not overwrite and stamp.exists() and json.loads(stamp.read_text()) == settings:
        return str(out)
    if out.exists() and any(out.iterdir()) and not stamp.exists():
        raise ValueError(
            f"{out} is not empty and holds no tiny model built by this project; refusing to "
            "replace it (choose an empty folder for build_tiny_model)"
        )

    tokenizer = build_tokenizer(
        corpus if corpus is not None else default_corpus(),
        size.get("vocab_size", DEFAULT_SIZE["vocab_size"]),
    )
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
