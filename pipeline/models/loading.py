"""Loading the policy: Unsloth when it can, plain transformers + PEFT otherwise.

Both paths return a LoRA-wrapped (PEFT) model and its tokenizer, ready for ERLTrainer.
Under Unsloth on a GPU the trainer ignores `peft_config`, so the adapter is attached
here for both backends: one path for the trainer to see.

4-bit (`load_in_4bit`) is NF4 through bitsandbytes on a GPU and on a CPU alike
(`pipeline.models.quantization`), prepared for training, then the adapter.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.models.backend import activate_backend, unsloth_patches_trainers
from pipeline.models.quantization import base_model_kwargs, disable_cpu_weight_packing

# Unsloth names projections explicitly; "all-linear" is PEFT's spelling of the same set.
LLAMA_LIKE_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class ModelConfig:
    """How to load the policy (a hub id or a local folder) and its LoRA adapter."""

    model_name_or_path: str = field(
        default="Qwen/Qwen2.5-1.5B-Instruct",
        metadata={"help": "Hub id or local folder of the policy."},
    )
    backend: str = field(
        default="auto",
        metadata={
            "help": "auto | unsloth | transformers. auto takes Unsloth when a CUDA GPU is present."
        },
    )
    load_in_4bit: bool = field(
        default=False,
        metadata={
            "help": "Load the base model in 4-bit NF4 (bitsandbytes; GPU or CPU) and train a LoRA "
            "adapter on it (QLoRA; needs use_lora)."
        },
    )
    max_seq_length: int = field(
        default=1024, metadata={"help": "Longest prompt + completion in tokens."}
    )
    use_lora: bool = field(
        default=True, metadata={"help": "Train a LoRA adapter (off: full fine-tuning)."}
    )
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha."})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: list(LLAMA_LIKE_TARGETS),
        metadata={"help": "Modules that get LoRA adapters."},
    )
    fast_inference: bool = field(
        default=False,
        metadata={"help": "Unsloth + vLLM fast generation (GPU with vLLM installed)."},
    )
    gpu_memory_utilization: float = field(
        default=0.6,
        metadata={"help": "Share of GPU memory vLLM may take when fast_inference is on."},
    )

    def validate(self) -> None:
        """Raise ValueError naming the first bad field."""
        from pipeline.models.backend import BACKENDS

        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        for name in ("max_seq_length", "lora_r", "lora_alpha"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.load_in_4bit and not self.use_lora:
            raise ValueError(
                "load_in_4bit needs use_lora: the 4-bit weights cannot be trained, only an adapter "
                "on top of them (QLoRA). Set use_lora: true, or load_in_4bit: false for full "
                "fine-tuning"
            )


def check_machine_supports(config: ModelConfig) -> None:
    """Refuse what this machine and the active backend cannot do rather than drop it
    silently (call after `activate_backend`): raises ValueError saying why and what to use."""
    if config.fast_inference and not unsloth_patches_trainers():
        raise ValueError(
            "fast_inference (vLLM generation) needs the unsloth backend on a CUDA GPU with vLLM "
            "installed; here generation would silently fall back to transformers' generate. Set "
            "fast_inference: false (same training, slower generation)"
        )
    if config.load_in_4bit:
        import importlib.util

        if importlib.util.find_spec("bitsandbytes") is None:
            raise ValueError(
                "load_in_4bit needs bitsandbytes (pip install bitsandbytes==0.50.2, as "
                "pyproject.toml pins it), or load_in_4bit: false"
            )


def load_policy(
    config: ModelConfig,
    *,
    seed: int = 42,
    trust_remote_code: bool = False,
    gradient_checkpointing: bool = False,
):
    """Load the model and tokenizer with the configured backend; returns (model, tokenizer).

    `trust_remote_code` runs model code shipped with the checkpoint: off unless you trust it.
    `gradient_checkpointing` is the trainer's setting, which preparing a 4-bit model for
    training must not override.
    """
    config.validate()
    backend = activate_backend(config.backend)
    check_machine_supports(config)
    if backend == "unsloth":
        model, tokenizer = _load_with_unsloth(
            config, seed, trust_remote_code, gradient_checkpointing
        )
    else:
        model, tokenizer = _load_with_transformers(
            config, seed, trust_remote_code, gradient_checkpointing
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    name_tied_weights(model)
    return model, tokenizer


def name_tied_weights(model) -> list[str]:
    """Name the tied copies of a model's weights (an lm_head tied to the embeddings, as
    transformers records them in `all_tied_weights_keys`) as keys it does not save, and
    return them. A checkpoint holds one copy; a trainer that resumes from it (transformers'
    `_issue_warnings_after_load`) then ties them again instead of warning that
    `lm_head.weight` is missing."""
    tied = sorted(getattr(model, "all_tied_weights_keys", None) or {})
    if tied:
        model._keys_to_ignore_on_save = sorted({*(model._keys_to_ignore_on_save or ()), *tied})
    return tied


def _load_with_unsloth(
    config: ModelConfig, seed: int, trust_remote_code: bool, gradient_checkpointing: bool
):
    import torch

    if not torch.cuda.is_available():
        # Unsloth's CPU loader is plain transformers + PEFT, and with UNSLOTH_ALLOW_CPU (its
        # trainer on a CPU) it takes its GPU loader, which needs CUDA: load the same way here
        # (4-bit included: docs/hardware.md, "Unsloth's trainer on a CPU").
        model, tokenizer = _load_with_transformers(
            config, seed, trust_remote_code, gradient_checkpointing
        )
        add_mode_switches(model)  # what Unsloth's trainer calls
        return model, tokenizer
    from unsloth import FastLanguageModel

    dtype = None
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=config.model_name_or_path,
        max_seq_length=config.max_seq_length,
        dtype=dtype,
        load_in_4bit=config.load_in_4bit,
        fast_inference=config.fast_inference,
        max_lora_rank=config.lora_r,
        gpu_memory_utilization=config.gpu_memory_utilization,
        trust_remote_code=trust_remote_code,
    )
    if config.use_lora:
        model = FastLanguageModel.get_peft_model(
            model,
            r=config.lora_r,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=config.lora_target_modules,
            use_gradient_checkpointing="unsloth",
            random_state=seed,
        )
    return model, tokenizer


def _load_with_transformers(
    config: ModelConfig, seed: int, trust_remote_code: bool, gradient_checkpointing: bool
):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"trust_remote_code": trust_remote_code, **base_model_kwargs(config.load_in_4bit)}
    model = AutoModelForCausalLM.from_pretrained(config.model_name_or_path, **kwargs)
    if config.load_in_4bit:
        disable_cpu_weight_packing(model)
    tokenizer = AutoTokenizer.from_pretrained(
        config.model_name_or_path, trust_remote_code=trust_remote_code
    )
    if config.use_lora:
        from peft import LoraConfig, get_peft_model

        if config.load_in_4bit:
            from peft import prepare_model_for_kbit_training

            # It freezes the base, upcasts 16-bit norms and embeddings to float32 and, unless
            # told otherwise, turns gradient checkpointing on whatever the trainer's setting.
            model = prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=gradient_checkpointing
            )
        torch.manual_seed(seed)
        model = get_peft_model(
            model,
            LoraConfig(
                r=config.lora_r,
                lora_alpha=config.lora_alpha,
                lora_dropout=config.lora_dropout,
                target_modules=config.lora_target_modules,
                task_type="CAUSAL_LM",
            ),
        )
    return model, tokenizer


def add_mode_switches(model) -> None:
    """Give a plain transformers/PEFT model the `for_training`/`for_inference` methods that
    Unsloth's trainer calls (Unsloth's GPU loader adds its own; its CPU loader does not)."""
    if not hasattr(model, "for_training"):
        model.for_training = lambda use_gradient_checkpointing=True: model.train()
    if not hasattr(model, "for_inference"):
        model.for_inference = lambda: model.eval()
    import torch

    if not torch.cuda.is_available() and model.dtype == torch.float32:
        # Unsloth's trainer turns a float32 model's training into fp16 mixed precision unless
        # the model says float32 is wanted; on a CPU that autocast is slow and imprecise (its
        # loss's gradients were 1-5% off float32 ones, in the tests that compare them).
        model._unsloth_user_float32 = True
