"""The ERL algorithm: `ERLConfig` and `ERLTrainer` on TRL's GRPOTrainer.

    config.py           ERLConfig: GRPOConfig plus ERL's options
    trainer.py          ERLTrainer: reflection, retry, memory, internalization
    batch.py            ERL's rows in the base trainer's batch layout
    micro_batches.py    a merged chunk in micro-batches, every loss term counted once
    budget.py           the memory budget of generate calls and loss forwards
    memory.py           the cross-episode reflection memory
    prompts.py          the reflection and retry prompts, and the memory's text

Nothing here imports `pipeline.run`. Import the classes from `pipeline`
(`from pipeline import ERLConfig, ERLTrainer`): that chooses the backend first.
"""
