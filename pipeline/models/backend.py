"""Choosing the backend: Unsloth when it can, plain transformers + PEFT otherwise.

`import unsloth` must come before trl/transformers/peft: on a GPU it rewrites TRL's
trainers and rebinds `trl.GRPOTrainer` to its own class. So the backend is chosen once
per process, before anything imports trl, by `activate_backend()`; the modules that
subclass TRL classes (`pipeline.erl.config`, `pipeline.erl.trainer`) call it at import.

Choose with `activate_backend("unsloth" | "transformers" | "auto")` before importing
`ERLConfig`/`ERLTrainer`, or with the environment variable `ERL_BACKEND`. `auto` takes
Unsloth when a CUDA GPU is present and Unsloth is installed.

Unsloth's trainer on a CPU: Unsloth rewrites TRL's trainers by itself only on a GPU. With
`ERL_UNSLOTH_CPU_TRAINER=1` (the explicit opt-in tests and CI use), the "unsloth" backend
asks it to do so on a CPU too, so `ERLTrainer` is built on Unsloth's generated
`UnslothGRPOTrainer`: the GPU code path of the trainer (its config, batch layout and loss),
without its kernels, 4-bit loading or vLLM.
"""

from __future__ import annotations

import importlib.util
import logging
import os

BACKENDS = ("auto", "unsloth", "transformers")
BACKEND_ENV = "ERL_BACKEND"
UNSLOTH_CPU_TRAINER_ENV = "ERL_UNSLOTH_CPU_TRAINER"

_active: str | None = None


def resolve_backend(name: str = "auto") -> str:
    """The concrete backend ("unsloth" or "transformers") that `name` stands for."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; valid backends: {list(BACKENDS)}")
    if name != "auto":
        return name
    return "unsloth" if cuda_available() and importlib.util.find_spec("unsloth") else "transformers"


def activate_backend(name: str | None = None) -> str:
    """Set up the backend for this process (once) and return its concrete name.

    `name` None keeps the active backend, or reads `ERL_BACKEND` (default "auto") when
    none is active yet. Asking for a different backend
    after one is active is an error: the import order that decides it is already fixed.
    """
    global _active
    if name is None and _active is not None:
        return _active  # the modules that subclass TRL classes call this without a name
    silence_import_noise()  # before anything below imports torchao or bitsandbytes
    resolved = resolve_backend(name or os.environ.get(BACKEND_ENV, "auto"))
    if _active is not None:
        if resolved != _active:
            raise RuntimeError(
                f"backend {_active!r} is already active in this process and cannot be switched to "
                f"{resolved!r}; choose it before importing ERLConfig/ERLTrainer (or set {BACKEND_ENV})"
            )
        return _active
    if resolved == "unsloth":
        if unsloth_cpu_trainer_requested() and not cuda_available():
            _patch_unsloth_trainer_on_cpu()
        else:
            import unsloth  # noqa: F401  (must precede trl: on a GPU it rebinds trl.GRPOTrainer)
    from pipeline.models.cpu_logprob import install_cpu_logprob_fallback

    install_cpu_logprob_fallback()
    _active = resolved
    return resolved


# Two warnings that the pinned stack prints on import and that say nothing to a user: torch
# about an Enum torchao registers (twice), and bitsandbytes about an optional CPU kernel
# package. Logger -> the start of the one message it drops; everything else still prints.
IMPORT_NOISE = {
    "torch.utils._pytree": "%s is an Enum subclass and is now natively supported",
    "bitsandbytes.backends.cpu.ops": "Failed to load CPU gemm_4bit_forward from kernels-community",
}


class _DropMessage(logging.Filter):
    """Drops the records whose message (its format string) starts with `start`."""

    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.start)


def silence_import_noise() -> None:
    """Drop exactly the IMPORT_NOISE messages, before the libraries that print them load."""
    for name, start in IMPORT_NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) for f in logger.filters):
            logger.addFilter(_DropMessage(start))


def active_backend() -> str | None:
    """The backend activated in this process, or None before `activate_backend`."""
    return _active


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def unsloth_cpu_trainer_requested() -> bool:
    """Whether the environment opts in to Unsloth's generated trainer on a CPU."""
    return os.environ.get(UNSLOTH_CPU_TRAINER_ENV, "0").strip().lower() in ("1", "true", "yes")


def _patch_unsloth_trainer_on_cpu() -> None:
    """Import Unsloth in its CPU mode, then have it generate and bind its GRPO trainer
    (`unsloth_compiled_cache/UnslothGRPOTrainer.py`, ~30 s), as it does by itself on a GPU."""
    os.environ["UNSLOTH_ALLOW_CPU"] = "1"
    # Unsloth's shared-prompt shortcut scores the current policy differently from the scorer
    # that produced the old/reference log-probs (docs/hardware.md, "Unsloth's trainer on a CPU"): off unless set.
    os.environ.setdefault("UNSLOTH_GRPO_PREFIX_GROUPER", "0")
    # torch.compile of Unsloth's loss regions costs minutes per shape and loss type on a CPU
    # and computes the same; kernels are a GPU matter. Eager unless set.
    os.environ.setdefault("UNSLOTH_COMPILE_DISABLE", "1")
    import unsloth  # noqa: F401
    from unsloth.models.rl import _patch_trl_rl_trainers_impl

    _patch_trl_rl_trainers_impl("grpo_trainer")


def unsloth_compiles_loss() -> bool:
    """Whether Unsloth's generated trainer is active and torch-compiles its loss (as it does
    unless `UNSLOTH_COMPILE_DISABLE` is set; read where Unsloth read it, at its import)."""
    if not unsloth_trainer_active():
        return False
    from unsloth_zoo.temporary_patches.common import UNSLOTH_COMPILE_DISABLE

    return not UNSLOTH_COMPILE_DISABLE


def unsloth_patches_trainers() -> bool:
    """Whether Unsloth's whole GPU stack is in use: its rewritten trainers and its model
    methods (merging, GGUF export). Unsloth's trainer alone on a CPU does not count."""
    return _active == "unsloth" and cuda_available()


def unsloth_trainer_active() -> bool:
    """Whether trl.GRPOTrainer is Unsloth's generated trainer (a GPU, or the CPU opt-in)."""
    return _active == "unsloth" and (cuda_available() or unsloth_cpu_trainer_requested())


def check_trainer_base(base: type) -> None:
    """Fail loudly when Unsloth's trainer is expected but `base` is not Unsloth's trainer."""
    import trl

    if unsloth_trainer_active() and not base.__name__.startswith("Unsloth"):
        raise RuntimeError(
            f"the Unsloth backend is active but ERLTrainer is built on {base.__module__}.{base.__name__}, "
            f"not Unsloth's patched GRPOTrainer (trl.GRPOTrainer is now {trl.GRPOTrainer.__name__}). "
            "Import unsloth (or call pipeline.activate_backend('unsloth')) before importing ERLTrainer."
        )
    if base is not trl.GRPOTrainer:
        raise RuntimeError(
            f"ERLTrainer is built on {base.__name__} but trl.GRPOTrainer is now {trl.GRPOTrainer.__name__}: "
            "something rebound TRL's trainer after ERLTrainer was imported (e.g. `import unsloth` after "
            "`from pipeline import ERLTrainer`). Import unsloth first, or set ERL_BACKEND."
        )
