"""The offline tiny model: built here, loaded through the normal from_pretrained path."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipeline import build_tiny_model


def test_loads_with_from_pretrained_and_chats(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.padding_side == "left"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "3+4"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\n3+4<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer("<answer>7</answer>")["input_ids"]
    assert tokenizer.decode(ids) == "<answer>7</answer>" and len(ids) < 9  # BPE merged the tag text
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id


def test_reuses_a_matching_folder_and_rebuilds_on_new_size(tmp_path):
    folder = build_tiny_model(str(tmp_path / "m"), hidden_size=32, vocab_size=300)
    weights = tmp_path / "m" / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert build_tiny_model(folder, hidden_size=32, vocab_size=300) == folder
    assert weights.stat().st_mtime_ns == stamp
    build_tiny_model(folder, hidden_size=48, vocab_size=300)
    assert AutoModelForCausalLM.from_pretrained(folder).config.hidden_size == 48


def test_unknown_size_key_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"unknown size key\(s\) \['layers'\]"):
        build_tiny_model(str(tmp_path / "m"), layers=3)


def test_never_replaces_a_folder_it_did_not_build(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "my_weights.safetensors").write_bytes(b"precious")
    with pytest.raises(ValueError, match="refusing to replace it"):
        build_tiny_model(str(folder))
    assert (folder / "my_weights.safetensors").read_bytes() == b"precious"
