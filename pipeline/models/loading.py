"""Loading the policy: Unsloth when it can, plain transformers + PEFT otherwise.

Both paths return a LoRA-wrapped (PEFT) model and its tokenizer, ready for ERLTrainer.
Under Unsloth on a GPU the trainer ignores `peft_config`, so the adapter is attached
here for both backends: one path for the trainer to see.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.models.backend import activate_backend

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
        default=False, metadata={"help": "Load the base model in 4-bit (GPU only)."}
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


def load_policy(config: ModelConfig, *, seed: int = 42, trust_remote_code: bool = False):
    """Load the model and tokenizer with the configured backend; returns (model, tokenizer).

    `trust_remote_code` runs model code shipped with the checkpoint: off unless you trust it.
    """
    config.validate()
    backend = activate_backend(config.backend)
    if backend == "unsloth":
        model, tokenizer = _load_with_unsloth(config, seed, trust_remote_code)
    else:
        model, tokenizer = _load_with_transformers(config, seed, trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return model, tokenizer


def _load_with_unsloth(config: ModelConfig, seed: int, trust_remote_code: bool):
    import torch

    if not torch.cuda.is_available():
        # Unsloth's CPU loader is plain transformers + PEFT, and with UNSLOTH_ALLOW_CPU (its
        # trainer on a CPU) it takes its GPU loader, which needs CUDA: load the same way here.
        model, tokenizer = _load_with_transformers(config, seed, trust_remote_code)
        add_mode_switches(model)  # what Unsloth's trainer calls
        return model, tokenizer
    from unsloth import FastLanguageModel

    dtype = None
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=config.model_name_or_path,
        max_seq_length=config.max_seq_length,
        dtype=dtype,
        load_in_4bit=config.load_in_4bit and torch.cuda.is_available(),
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


def _load_with_transformers(config: ModelConfig, seed: int, trust_remote_code: bool):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"trust_remote_code": trust_remote_code}
    if torch.cuda.is_available():
        kwargs["dtype"] = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if config.load_in_4bit:
            from transformers import BitsAndBytesConfig

            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=kwargs["dtype"]
            )
    model = AutoModelForCausalLM.from_pretrained(config.model_name_or_path, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(
        config.model_name_or_path, trust_remote_code=trust_remote_code
    )
    if config.use_lora:
        from peft import LoraConfig, get_peft_model

        if config.load_in_4bit and torch.cuda.is_available():
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model)
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
