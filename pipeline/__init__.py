"""The ERL curriculum pipeline: `from pipeline import ERLConfig, ERLTrainer`.

Attributes load lazily so that importing `pipeline` imports no trl: the backend
(Unsloth or plain transformers) must be chosen before trl is imported, because on a GPU
`import unsloth` rebinds `trl.GRPOTrainer`. `activate_backend("unsloth" | "transformers"
| "auto")` chooses it; otherwise the first access to ERLConfig/ERLTrainer chooses "auto"
(or the `ERL_BACKEND` environment variable).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from pipeline.backend import activate_backend, active_backend

if TYPE_CHECKING:
    from pipeline.erl_config import ERLConfig
    from pipeline.erl_trainer import ERLTrainer
    from pipeline.memory import ReflectionMemory
    from pipeline.smollm2 import build_smollm2
    from pipeline.tiny_model import build_tiny_model

_LAZY = {
    "ERLConfig": "pipeline.erl_config",
    "ERLTrainer": "pipeline.erl_trainer",
    "ReflectionMemory": "pipeline.memory",
    "build_smollm2": "pipeline.smollm2",
    "build_tiny_model": "pipeline.tiny_model",
}

__all__ = [
    "ERLConfig",
    "ERLTrainer",
    "ReflectionMemory",
    "activate_backend",
    "active_backend",
    "build_smollm2",
    "build_tiny_model",
]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
