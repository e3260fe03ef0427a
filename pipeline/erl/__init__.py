"""The ERL algorithm: `ERLConfig` and `ERLTrainer` on TRL's GRPOTrainer.

    config.py           ERLConfig: GRPOConfig plus ERL's options
    step.py             the ERL step: gate, feedback, reflect, retry, credit, remember, new
                        rows, against a small interface (no trl, no transformers)
    trainer.py          ERLTrainer: the adapter to TRL (hooks, generation, save/load)
    step_backend.py     the step's interface over the trainer (generate, score, feedback)
    episodes.py         a retry's episode through TRL's tool loop, its own environments
    guards.py           what ERLTrainer cannot train, refused before the base is built
    batch.py            ERL's rows in the base trainer's batch layout
    loss.py             a merged chunk's loss in micro-batches
    upstream.py         every hand copy of TRL / transformers code ERL relies on
    micro_batches.py    how a chunk is cut into micro-batches, every loss term counted once
    budget.py           the memory budget: measured loss forwards, generate calls, meters
    memory.py           the cross-episode reflection memory, which owns its options
    prompts.py          the reflection and retry prompts, and the memory's text

Nothing here imports `pipeline.run`. Import the classes from `pipeline`
(`from pipeline import ERLConfig, ERLTrainer`): that chooses the backend first.
"""
