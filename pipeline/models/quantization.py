"""4-bit bases: loading them on this machine, training their adapter, rebuilding them.

`load_in_4bit` is NF4 through bitsandbytes on a GPU and on a CPU alike, with the compute
dtype the device has: bf16 (fp16 without bf16 support) on a GPU, float32 on a CPU, where
bf16 and fp16 compute measured 2-3x slower. What else a 4-bit base needs:

- bitsandbytes' CPU weight packing off (`disable_cpu_weight_packing`): training through a
  packed weight is wrong;
- its adapter in float32 after a TRL trainer's `__init__` cast it to bf16
  (`undo_qlora_bf16_cast`);
- a note in every adapter folder trained on it (`BASE_QUANTIZATION_FILE`), so that
  evaluation loads the same 4-bit base and `--save_merged` dequantizes it first
  (`merge_adapter`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BASE_QUANTIZATION_FILE = "base_quantization.json"
"""Written beside an adapter trained on a 4-bit base: {"load_in_4bit": true, ...}."""


def base_model_kwargs(load_in_4bit: bool) -> dict[str, Any]:
    """`from_pretrained` keywords for a base on this machine: bf16 (fp16 without bf16
    support) on a GPU, the checkpoint's own dtype on a CPU; with `load_in_4bit`, NF4 with
    that compute dtype (float32 on a CPU, on `device_map="cpu"`)."""
    import torch

    kwargs: dict[str, Any] = {}
    compute_dtype = torch.float32
    if torch.cuda.is_available():
        compute_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        kwargs["dtype"] = compute_dtype
    if load_in_4bit:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype
        )
        if not torch.cuda.is_available():
            kwargs["device_map"] = "cpu"
    return kwargs


def is_4bit(model) -> bool:
    """Whether `model` (or the base under its adapter) is loaded in 4-bit."""
    return bool(getattr(model, "is_loaded_in_4bit", False))


def disable_cpu_weight_packing(model) -> None:
    """Keep every bitsandbytes 4-bit layer's weight in its trainable layout.

    On a CPU with AVX512-BF16, bitsandbytes 0.50 repacks a `Linear4bit` weight in place on
    its first eval-mode no-grad forward (an evaluation, a `generate`) and keeps it packed,
    and backward through the packed layout is wrong: training after one evaluation would
    silently stall. Unsloth's CPU loader turns it off the same way.
    """
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False


def undo_qlora_bf16_cast(model) -> None:
    """Put a quantized model's trainable weights back in float32 after a TRL trainer's
    `__init__` cast them to bfloat16.

    TRL 1.15's GRPOTrainer and SFTTrainer cast every trainable weight of a quantized model
    to bf16, whatever the run's precision (Unsloth's generated trainer removes that cast).
    Measured on the tiny 4-bit model: at the recipes' learning rate 5e-6 only 0.6% of
    `lora_A`'s entries ever changed (Adam's steps round away in bf16), exact-gradient checks
    were off by up to 3.4e-3, and a resumed run came back in float32 (PEFT upcasts a loaded
    adapter), 4.7e-4 away from the uninterrupted one. Float32 adapters are what mixed
    precision expects (bf16/fp16 autocast still computes in 16 bits).
    """
    import torch

    if not (is_4bit(model) or getattr(model, "is_loaded_in_8bit", False)):
        return
    for param in model.parameters():
        if param.requires_grad and param.dtype == torch.bfloat16:
            param.data = param.data.float()


def record_base_quantization(model, folder: str | Path) -> None:
    """Note in an adapter folder that its base was loaded in 4-bit (nothing otherwise)."""
    if is_4bit(model):
        Path(folder, BASE_QUANTIZATION_FILE).write_text(
            json.dumps({"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}) + "\n"
        )


def recorded_4bit(folder: str | Path) -> bool:
    """Whether the adapter in `folder` was trained on a 4-bit base."""
    path = Path(folder, BASE_QUANTIZATION_FILE)
    return path.exists() and bool(json.loads(path.read_text()).get("load_in_4bit"))


def merge_adapter(model, adapter_folder: str | Path):
    """`model` (a PEFT model) with its adapter merged into unquantized base weights.

    On a 4-bit base PEFT's `merge_and_unload` re-quantizes the merged weights (still 4-bit,
    0.09 off the trained model on the tiny one), so the base is loaded again, dequantized
    (to its compute dtype: 16-bit on a GPU, float32 on a CPU) and the saved adapter merged
    into that.
    """
    if not is_4bit(model):
        return model.merge_and_unload()
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM

    base_name = PeftConfig.from_pretrained(str(adapter_folder)).base_model_name_or_path
    base = AutoModelForCausalLM.from_pretrained(base_name, **base_model_kwargs(True))
    disable_cpu_weight_packing(base)
    base = base.dequantize()
    return PeftModel.from_pretrained(base, str(adapter_folder)).merge_and_unload()
