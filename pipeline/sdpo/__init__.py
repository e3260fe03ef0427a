"""SDPO for the curriculum run: TRL's `SDPOTrainer` (trl.experimental.sdpo) with the task's
feedback on each rollout as the teacher's privileged context (`pipeline.sdpo.trainer`).

trl is imported inside `pipeline.sdpo.trainer`, after the backend is chosen.
"""
