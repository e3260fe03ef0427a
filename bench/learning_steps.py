"""ERL steps that change one thing of the product's step, for the learning bench's
ablations (issue 48: what makes `erl_defaults` miss where a lesson can be copied).

Each is an `ERLStep` subclass that a bench arm names (`Arm.step`); `train_one` puts it in
the trainer in place of its own step. None of them is an ERLConfig option: an ablation lives
beside the bench that runs it until a measurement makes it a default.

- `no_reflection_rows`: the reflections are written, read and remembered as usual, but
  their rows are left out of the batch (no policy-gradient term for a reflection).
- `loss_weighted_internalization`: seed 000's definition of `internalization_coef`, the
  weight of the internalization loss *relative to the RL loss*: the loss becomes the merged
  batch's RL loss + coef x the internalization rows' own mean token cross-entropy. The
  product weighs those rows by their share of the batch's loss tokens instead (with TRL's
  token-level DAPO normalisation, an advantage a on a row is a x its tokens / all tokens);
  here each internalization row's advantage is coef x all tokens / internalization tokens,
  which gives exactly that gradient (ratio 1, beta 0; single process, as the bench runs).
- `internalization_only`: `loss_weighted_internalization` with the retries' and the
  reflections' rows at advantage 0: GRPO's first attempts plus the internalized rows' own
  cross-entropy, nothing else.
- `raft_internalization`: the ERL paper's code: every scored retry, successful or not, is
  copied under the original prompt and trained with advantage coef x max(r2, 0).
"""

from __future__ import annotations

from pipeline.erl.step import ERLStep


class NoReflectionRows(ERLStep):
    """The product's step without the reflections' rows in the batch."""

    def _new_rows(self, backend, plan, chosen, reflections, retries, advantages, kept):
        return super()._new_rows(backend, plan, chosen, None, retries, advantages, kept)


class LossWeightedInternalization(ERLStep):
    """Internalization weighted against the RL loss as seed 000 defines it (module doc)."""

    _first_tokens = 0  # the loss tokens of this batch's first attempts

    def __call__(self, backend, first, step):
        self._first_tokens = sum(len(ids) for ids in first.completion_ids)
        return super().__call__(backend, first, step)

    def _new_rows(self, backend, plan, chosen, reflections, retries, advantages, kept):
        rows = super()._new_rows(backend, plan, chosen, reflections, retries, advantages, kept)
        if not kept:
            return rows
        lengths = [len(ids) if ok else 0 for ids, ok in zip(rows.completion_ids, rows.valid)]
        internalization = sum(lengths[-len(kept) :])
        total = self._first_tokens + sum(lengths)
        if internalization:
            scale = total / internalization
            for j in range(len(rows.advantages) - len(kept), len(rows.advantages)):
                rows.advantages[j] *= scale
        return rows


class InternalizationOnly(LossWeightedInternalization):
    """Loss-weighted internalization, and no policy-gradient term for the retries or the
    reflections (their rows stay in the batch with advantage 0): what the merged batch
    adds to GRPO is the internalized rows' cross-entropy alone."""

    def _new_rows(self, backend, plan, chosen, reflections, retries, advantages, kept):
        rows = super()._new_rows(backend, plan, chosen, reflections, retries, advantages, kept)
        for j in range(len(rows.advantages) - len(kept)):
            rows.advantages[j] = 0.0
        return rows


class RaftInternalization(ERLStep):
    """Every scored retry internalized, advantage coef x max(r2, 0) (the ERL paper's code)."""

    def _internalized(self, r2, scored, success):
        s = self.settings
        if not (s.enable_internalization and s.internalization_coef > 0):
            return []
        values = r2.tolist()
        return [
            (i, s.internalization_coef * max(values[i], 0.0))
            for i, ok in enumerate(scored)
            if ok and values[i] > 0
        ]


STEPS = {
    "no_reflection_rows": NoReflectionRows,
    "loss_weighted_internalization": LossWeightedInternalization,
    "raft_internalization": RaftInternalization,
    "internalization_only": InternalizationOnly,
}
"""`Arm.step` -> the ERLStep subclass the arm trains with ("" is the product's step)."""
