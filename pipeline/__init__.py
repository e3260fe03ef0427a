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

from pipeline.models.backend import activate_backend, active_backend

if TYPE_CHECKING:
    from pipeline.erl.config import ERLConfig
    from pipeline.erl.memory import ReflectionMemory
    from pipeline.erl.trainer import ERLTrainer
    from pipeline.models.smollm2 import build_smollm2
    from pipeline.models.tiny import build_tiny_model

_LAZY = {
    "ERLConfig": "pipeline.erl.config",
    "ERLTrainer": "pipeline.erl.trainer",
    "ReflectionMemory": "pipeline.erl.memory",
    "build_smollm2": "pipeline.models.smollm2",
    "build_tiny_model": "pipeline.models.tiny",
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
