"""What the curriculum run prints, and where its full logs go.

By default the console shows one progress bar per stage (stage, level, step/max, r1, r2,
gated %, s/step), the one-line stage summaries, each stage's line on its reflections
(written, stored, confirmed, refused and why), and warnings that matter: a fallback
rate above a few percent, a collapsing r1, a plateau. TRL's per-step metric dictionary
(about 40 keys) still goes to `stage_<k>/metrics.jsonl` and to every `report_to` sink;
`--log_level info` (transformers' option) prints it again, and `--disable_tqdm true`
drops the bars. TensorBoard writes to `<output_dir>/tensorboard/<stage_k|warmup>/`.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm
from transformers import TrainerCallback

from pipeline.erl.memory import CONFIRMED, REJECTIONS, STORED
from pipeline.layout import RunLayout, stage_name
from pipeline.run.config import verbose
from pipeline.run.plots import first_attempt_reward

logger = logging.getLogger(__name__)

R1, R2, GATED, FALLBACK = (
    "erl/r1_mean",  # ERL's key; GRPO and SDPO log r1 under theirs (first_attempt_reward)
    "erl/r2_mean",
    "erl/gated_fraction",
    "rewards/fallback_rate",
)


def quiet_libraries() -> None:
    """Turn off the library progress bars and chatter that the stage bars replace."""
    import datasets
    import transformers

    transformers.utils.logging.disable_progress_bar()  # loading / writing model shards
    datasets.utils.logging.disable_progress_bar()  # SFT's tokenizing passes
    # torch's DataLoader warns on every stage when no accelerator can use pinned memory.
    warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true.*")


# ---- Warnings that matter ------------------------------------------------------------


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


@dataclass
class RewardWatch:
    """Reads each logged step of one stage and says, once per stage and kind, when the
    fallback rate is high, r1 collapses, or r1 stops improving below promotion."""

    stage: int
    promote_threshold: float
    plateau_steps: int = 30
    """Logged steps without a better rolling r1 that make a plateau."""
    window: int = 10
    """Logged steps in a rolling mean."""
    fallback_limit: float = 0.05
    collapse_drop: float = 0.25
    """How far the rolling r1 may fall below its best before it is a collapse."""
    r1: list[float] = field(default_factory=list)
    fallback: list[float] = field(default_factory=list)
    warned: set[str] = field(default_factory=set)
    _best: float = -math.inf
    _best_at: int = 0

    def update(self, logs: dict[str, Any]) -> list[str]:
        """The warnings this logged step raises (most steps: none)."""
        messages = []
        fallback = _finite(logs.get(FALLBACK))
        if fallback is not None:
            self.fallback.append(fallback)
            recent = self.fallback[-self.window :]
            if len(recent) >= 3 and _mean(recent) > self.fallback_limit:
                messages += self._once(
                    "fallback",
                    f"{_mean(recent):.0%} of first attempts scored the fallback reward over the "
                    f"last {len(recent)} steps (unparseable or unscorable): see generations.jsonl",
                )
        r1 = first_attempt_reward(logs)
        if r1 is None:
            return messages
        self.r1.append(r1)
        if len(self.r1) < self.window:
            return messages
        rolling = _mean(self.r1[-self.window :])
        if rolling > self._best + 0.01:
            self._best, self._best_at = rolling, len(self.r1)
        if self._best - rolling >= self.collapse_drop:
            messages += self._once(
                "collapse",
                f"r1 collapsed from {self._best:.2f} to {rolling:.2f} (mean of {self.window} "
                "steps): the learning rate may be too high, or the policy forgets easier levels",
            )
        stalled = len(self.r1) - self._best_at
        if stalled >= self.plateau_steps and rolling < self.promote_threshold:
            messages += self._once(
                "plateau",
                f"r1 has not improved for {stalled} steps ({rolling:.2f}, best {self._best:.2f}, "
                f"promotion at {self.promote_threshold:.2f})",
            )
        return messages

    def _once(self, kind: str, message: str) -> list[str]:
        if kind in self.warned:
            return []
        self.warned.add(kind)
        return [f"[stage {self.stage}] warning: {message}"]


# ---- The progress bar ----------------------------------------------------------------


def stage_postfix(logs: dict[str, Any]) -> dict[str, str]:
    """r1, r2 and the gated share of a logged step, for the stage bar."""
    postfix = {}
    r1 = first_attempt_reward(logs)
    r2, gated = (_finite(logs.get(key)) for key in (R2, GATED))
    if r1 is not None:
        postfix["r1"] = f"{r1:.3f}"
    if gated is not None:
        # r2 exists only for rows that were gated; "-" when none were.
        postfix["r2"] = f"{r2:.3f}" if gated > 0 and r2 is not None else "-"
        postfix["gated"] = f"{gated:.0%}"
    return postfix


def warmup_postfix(logs: dict[str, Any]) -> dict[str, str]:
    """The loss of a logged warm-up step."""
    loss = _finite(logs.get("loss"))
    return {"loss": f"{loss:.3f}"} if loss is not None else {}


def memory_summary(stage: int, tally: Mapping[str, int]) -> str | None:
    """The stage's line on reflections: how many were written, and what the memory did with
    those whose retry succeeded: stored, confirmed (a restated lesson), refused and why
    (ERLStep.tally). None when no reflection was written."""
    written = tally.get("reflections", 0)
    if not written:
        return None
    kept = [f"{tally.get(o, 0)} {o}" for o in (STORED, CONFIRMED)]
    refused = [f"{tally[r]} {r.replace('_', ' ')}" for r in REJECTIONS if tally.get(r)]
    return (
        f"[stage {stage}] reflections: {written} written"
        + f"; memory: {', '.join(kept)}"
        + (f"; refused: {', '.join(refused)}" if refused else "; none refused")
    )


class RunProgress(TrainerCallback):
    """One progress bar for one trainer (a stage or the warm-up) in place of transformers'
    per-step dictionaries; passes each logged step to a `RewardWatch` when given one."""

    def __init__(
        self,
        description: str,
        postfix: Callable[[dict[str, Any]], dict[str, str]],
        *,
        bar: bool,
        print_logs: bool,
        watch: RewardWatch | None = None,
        summary: Callable[[], str | None] | None = None,
    ) -> None:
        self.description = description
        self.postfix = postfix
        self.show_bar = bar
        self.print_logs = print_logs
        self.watch = watch
        self.summary = summary  # a closing line, printed when the trainer ends
        self.bar = None
        self.values: dict[str, str] = {}

    def on_train_begin(self, args, state, control, **kwargs):
        if self.show_bar and state.is_world_process_zero:
            # `initial`: a resumed stage starts its bar at the checkpoint's step.
            self.bar = tqdm(
                total=state.max_steps,
                initial=state.global_step,
                desc=self.description,
                unit="step",
                dynamic_ncols=True,
                bar_format="{desc} {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_inv_fmt}]{postfix}",
            )

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or not state.is_world_process_zero:
            return
        if self.print_logs:
            shown = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in logs.items()}
            self._write(str(shown))
        if "train_runtime" in logs:
            return
        self.values |= self.postfix(logs)
        if self.bar is not None:
            self.bar.set_postfix(self.values, refresh=True)
        for message in self.watch.update(logs) if self.watch else []:
            self._write(message, warning=True)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        line = self.summary() if self.summary and state.is_world_process_zero else None
        if line:
            self._write(line)

    def _write(self, message: str, warning: bool = False) -> None:
        if self.bar is not None:
            self.bar.write(message)  # above the bar, which then redraws
        elif warning:
            logger.warning(message)
        else:
            print(message, flush=True)  # a killed run's last steps still show


def show_progress(trainer, progress: RunProgress, tensorboard_dir: Path) -> None:
    """Put `progress` in place of the trainer's own progress/printer callback, and send its
    TensorBoard events (when `report_to` has tensorboard) to `tensorboard_dir`."""
    from transformers.integrations import TensorBoardCallback
    from transformers.trainer import DEFAULT_PROGRESS_CALLBACK  # the notebook one in Jupyter
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for default in {ProgressCallback, DEFAULT_PROGRESS_CALLBACK, PrinterCallback}:
        trainer.remove_callback(default)
    trainer.add_callback(progress)
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, TensorBoardCallback):
            # Its default is under the trainer's output_dir: the stage's checkpoint folder,
            # which is deleted once the stage is finished.
            callback.logging_dir = str(tensorboard_dir)


def show_stage_progress(trainer, args, controller, layout: RunLayout, method: str) -> None:
    """The running stage's bar and warnings in place of the per-step dictionaries; ERL's
    stage ends with its line on reflections."""
    stage, config = controller.stage, controller.config
    watch = RewardWatch(
        stage, config.promote_threshold, plateau_steps=max(20, config.max_stage_steps // 4)
    )
    progress = RunProgress(
        f"stage {stage} · level {controller.level} · {method}",
        stage_postfix,
        bar=not args.disable_tqdm,
        print_logs=verbose(args.log_level),
        watch=watch,
        summary=(lambda: memory_summary(stage, trainer.erl_step.tally))
        if method == "erl"
        else None,
    )
    show_progress(trainer, progress, layout.tensorboard(stage_name(stage)))
