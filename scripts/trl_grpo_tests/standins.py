"""Local stand-ins for the hub ids TRL's GRPO tests load (no machine here reaches the hub).

    python scripts/trl_grpo_tests/standins.py ROOT

Writes folders named like the hub ids under ROOT (ROOT/trl-internal-testing/tiny-Qwen2ForCausalLM-2.5,
...) so that `from_pretrained("trl-internal-testing/...")` resolves to them when the working
directory is ROOT, and ROOT/zen.json for the `trl-internal-testing/zen` dataset. Every model
shares one byte-level BPE tokenizer (the project's `build_tokenizer`, Qwen-style chat
template) trained on the project's corpus and the Zen of Python.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ZEN = [
    "Beautiful is better than ugly.",
    "Explicit is better than implicit.",
    "Simple is better than complex.",
    "Complex is better than complicated.",
    "Flat is better than nested.",
    "Sparse is better than dense.",
    "Readability counts.",
    "Special cases aren't special enough to break the rules.",
    "Although practicality beats purity.",
    "Errors should never pass silently.",
    "Unless explicitly silenced.",
    "In the face of ambiguity, refuse the temptation to guess.",
    "There should be one-- and preferably only one --obvious way to do it.",
    "Although that way may not be obvious at first unless you're Dutch.",
    "Now is better than never.",
    "Although never is often better than *right* now.",
    "If the implementation is hard to explain, it's a bad idea.",
    "If the implementation is easy to explain, it may be a good idea.",
    "Namespaces are one honking great idea -- let's do more of those!",
]


def models(tokenizer):
    """(hub name, config, model class) of every stand-in."""
    import transformers as t

    dense = dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=None, max_position_embeddings=1024,
    )  # fmt: skip
    tied = dict(dense, tie_word_embeddings=True)
    moe = dict(
        dense, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
        router_aux_loss_coef=0.001, output_router_logits=False, head_dim=8,
    )  # fmt: skip
    return [
        ("tiny-Qwen2ForCausalLM-2.5", t.Qwen2Config(**tied), t.Qwen2ForCausalLM),
        ("tiny-Qwen2ForSequenceClassification-2.5", t.Qwen2Config(**dense, num_labels=1), t.Qwen2ForSequenceClassification),
        ("tiny-Qwen3ForCausalLM", t.Qwen3Config(**tied, head_dim=8), t.Qwen3ForCausalLM),
        ("tiny-Qwen3ForSequenceClassification", t.Qwen3Config(**dense, head_dim=8, num_labels=1), t.Qwen3ForSequenceClassification),
        ("tiny-LlamaForCausalLM-3.2", t.LlamaConfig(**tied), t.LlamaForCausalLM),
        ("tiny-LlamaForSequenceClassification-3.2", t.LlamaConfig(**dense, num_labels=1), t.LlamaForSequenceClassification),
        ("tiny-MistralForCausalLM-0.2", t.MistralConfig(**dense), t.MistralForCausalLM),
        ("tiny-Gemma2ForCausalLM", t.Gemma2Config(**dense, head_dim=8), t.Gemma2ForCausalLM),
        ("tiny-Cohere2ForCausalLM", t.Cohere2Config(**dense), t.Cohere2ForCausalLM),
        ("tiny-Qwen3MoeForCausalLM", t.Qwen3MoeConfig(**moe), t.Qwen3MoeForCausalLM),
    ]  # fmt: skip


def build(root: Path) -> None:
    """Write every stand-in and the zen dataset under `root` (existing ones are kept)."""
    from pipeline.models.tiny import build_tokenizer, default_corpus

    tokenizer = build_tokenizer(default_corpus() + ZEN * 20, 512)
    for name, config, cls in models(tokenizer):
        out = root / "trl-internal-testing" / name
        if (out / "config.json").exists():
            continue
        torch.manual_seed(0)
        model = cls(config)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.eos_token_id = tokenizer.eos_token_id
            model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    # trl-internal-testing/zen: 17 training and 2 test rows per configuration.
    rows = [line.rsplit(" ", 1) for line in ZEN]
    data = {
        "standard_prompt_only": [{"prompt": p} for p, _ in rows],
        "conversational_prompt_only": [{"prompt": [{"role": "user", "content": p}]} for p, _ in rows],
        "standard_prompt_completion": [{"prompt": p, "completion": " " + c} for p, c in rows],
    }  # fmt: skip
    (root / "zen.json").write_text(json.dumps(data))


if __name__ == "__main__":
    build(Path(sys.argv[1]))
