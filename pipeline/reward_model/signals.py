"""Learned reward models and preference functions as reward signals beside the programs.

A recipe names them next to `reward_signals`:

    reward_models:
      helpful: {path: runs/rm-helpful, weight: 0.3}              # a sequence-classification model
      style: {path: runs/rm-style, weight: 0.2, objectives: {tone: 0.7, brevity: 0.3}}
      judge: {path: runs/rm-helpful, weight: 0.5, pairwise: true}  # win rate within the group
    preference_functions:
      human: {function: "mypkg.feedback:prefer", weight: 0.5}    # (prompt, a, b) -> [0, 1]

Each entry becomes one TRL reward function (`<name>_reward_model`, `<name>_preference`)
with its weight in `reward_weights`, and adds a sentence to the ERL feedback.

**Normalisation.** A Bradley–Terry model is trained on score *differences*, so its raw
logit has an arbitrary offset and scale: a weight on it would mean something different
for every model. `python -m pipeline.reward_model` therefore saves calibration statistics
with the model (`reward_model.json`: mean μ and standard deviation σ of the raw scores of
the held-out completions, per head), and a completion's signal is σ(2·(raw − μ)/σ) in
(0, 1): 0.5 is an average calibration completion, 0.88 one standard deviation above. On
a well-separated preference set a preferred completion sits about one σ above the mean,
so preferred ≈ 0.9 and rejected ≈ 0.1 — the span of a pass/fail program signal, so a
weight means the same for both. A model without calibration (e.g. a hub reward model) is
squashed as σ(raw). A group z-score was not chosen: GRPO already normalises within the
group, and per-group scaling would give a signal that cannot tell replies apart the same
pull as one that can.

**Multi-objective.** A model with several heads (`num_labels > 1`, names from
`config.id2label`) is one entry: its signal is the weighted mean of its normalised heads
(`objectives`: head name or index -> weight; equal weights when left out).

Scoring is batched, without gradients, on the device given (the policy's). torch is
imported inside the functions that need it, so reading a recipe stays light.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from curriculum.tasks.base import prompt_key
from rewards.pairwise import (
    group_indices,
    load_preference_function,
    win_rate_sentence,
    win_rates,
)
from rewards.scoring import completion_text

logger = logging.getLogger(__name__)

INFO_FILE = "reward_model.json"
"""Saved beside a trained reward model: objectives, calibration, held-out accuracy."""
SLOPE = 2.0
"""σ(SLOPE · z): one calibration standard deviation above the mean scores 0.88."""

_MODEL_KEYS = {"path", "weight", "objectives", "pairwise", "batch_size", "max_length"}
_FUNCTION_KEYS = {"function", "weight"}


# Recipe entries --------------------------------------------------------------------


def check_reward_model_specs(specs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The `reward_models` recipe mapping, checked and completed; ValueError naming a bad entry."""
    checked = {}
    for name, spec in specs.items():
        where = f"reward_models.{name}"
        spec = _entry(where, spec, _MODEL_KEYS, required="path")
        objectives = spec.get("objectives")
        if objectives is not None:
            if not isinstance(objectives, Mapping) or not objectives:
                raise ValueError(f"{where}.objectives must be a mapping of head -> weight")
            for head, w in objectives.items():
                _number(f"{where}.objectives.{head}", w, minimum=0)
            if sum(objectives.values()) <= 0:
                raise ValueError(f"{where}.objectives: the weights must not all be 0")
        for key in ("batch_size", "max_length"):
            if key in spec and (not isinstance(spec[key], int) or spec[key] < 1):
                raise ValueError(f"{where}.{key} must be an integer >= 1, got {spec[key]!r}")
        if not isinstance(spec.get("pairwise", False), bool):
            raise ValueError(f"{where}.pairwise must be true or false")
        checked[name] = {
            "path": str(spec["path"]),
            "weight": _number(f"{where}.weight", spec.get("weight", 1.0)),
            "objectives": dict(objectives) if objectives else None,
            "pairwise": spec.get("pairwise", False),
            "batch_size": spec.get("batch_size", 32),
            "max_length": spec.get("max_length", 1024),
        }
    return checked


def check_preference_function_specs(specs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The `preference_functions` recipe mapping, checked: each function imports, is callable
    and takes (prompt, a, b), before the run writes anything."""
    checked = {}
    for name, spec in specs.items():
        where = f"preference_functions.{name}"
        spec = _entry(where, spec, _FUNCTION_KEYS, required="function")
        function = spec["function"]
        if not isinstance(function, str) or function.count(":") != 1:
            raise ValueError(f"{where}.function must be 'module:function', got {function!r}")
        load_preference_function(function)
        checked[name] = {
            "function": function,
            "weight": _number(f"{where}.weight", spec.get("weight", 1.0)),
        }
    return checked


def _entry(where: str, spec: Any, keys: set[str], required: str) -> dict[str, Any]:
    if isinstance(spec, str) and required == "path":
        spec = {"path": spec}
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where} must be a mapping with {required!r}, got {spec!r}")
    unknown = sorted(set(spec) - keys)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; valid: {sorted(keys)}")
    if required not in spec:
        raise ValueError(f"{where} needs {required!r}")
    return dict(spec)


def _number(where: str, value: Any, minimum: float | None = None) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise ValueError(f"{where} must be a finite number{bound}, got {value!r}")
    return float(value)


# Loading and scoring ---------------------------------------------------------------


class RewardModel:
    """A sequence-classification reward model with its tokenizer and calibration."""

    def __init__(self, path: str, device: Any = None, max_length: int = 1024, batch_size: int = 32):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        folder = Path(path)
        info_path = folder / INFO_FILE
        self.info = json.loads(info_path.read_text()) if info_path.exists() else {}
        kwargs: dict[str, Any] = {"trust_remote_code": False}
        if torch.device(device or "cpu").type == "cuda":
            kwargs["dtype"] = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        if (folder / "adapter_config.json").exists():
            from peft import PeftConfig, PeftModel

            # The adapter holds the head; the base must be built with the same head count.
            objectives = self.info.get("objectives", ["reward"])
            base = AutoModelForSequenceClassification.from_pretrained(
                PeftConfig.from_pretrained(path).base_model_name_or_path,
                num_labels=len(objectives),
                id2label=dict(enumerate(objectives)),
                **kwargs,
            )
            model = PeftModel.from_pretrained(base, path)
        else:
            model = AutoModelForSequenceClassification.from_pretrained(path, **kwargs)
        self.model = model.to(device or "cpu").eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        labels = self.model.config.id2label or {}
        self.heads = [str(labels.get(i, i)) for i in range(self.model.config.num_labels)]
        self.max_length = max_length
        self.batch_size = batch_size

    def encode(self, prompt: Any, completion: Any) -> list[int]:
        """Token ids of prompt + completion, formatted as at training time."""
        return encode_pair(self.tokenizer, prompt, completion, self.max_length)

    def raw_scores(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[list[float]]:
        """Raw head logits per completion, in batches, without gradients."""
        return score_ids(
            self.model,
            [self.encode(p, c) for p, c in zip(prompts, completions, strict=True)],
            self.tokenizer.pad_token_id,
            self.batch_size,
        )

    def normalise(self, raw: list[float]) -> list[float]:
        """Each head's raw score mapped into (0, 1) with the saved calibration."""
        calibration = self.info.get("calibration")
        if not calibration:
            return [_sigmoid(x) for x in raw]
        return [
            _sigmoid(SLOPE * (x - mean) / std)
            for x, mean, std in zip(raw, calibration["mean"], calibration["std"], strict=True)
        ]


def encode_pair(
    tokenizer, prompt: Any, completion: Any, max_length: int | None = None
) -> list[int]:
    """Token ids of a prompt and its completion, as TRL's RewardTrainer would build them.

    Training (`pipeline.reward_model`) and scoring share this, so the model scores the
    same text it learned from. Conversational (the prompt or the completion is messages):
    through the chat template, a text completion being one assistant message, so `"5"` and
    `[{"role": "assistant", "content": "5"}]` (a TRL conversational reply, or a run's
    completion) are the same ids. Text prompt and text completion (TRL's standard format,
    and how GRPO feeds a text prompt to the policy): prompt + completion + eos, so where
    an implicit prompt ends does not change the ids. Too long: the start is cut, the
    completion's end is kept.
    """
    eos = tokenizer.eos_token or ""
    if tokenizer.chat_template and not (isinstance(prompt, str) and isinstance(completion, str)):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        reply = (
            [{"role": "assistant", "content": completion}]
            if isinstance(completion, str)
            else completion
        )
        full = tokenizer.apply_chat_template([*messages, *reply], tokenize=False)
    else:
        full = completion_text(prompt) + completion_text(completion)
        full += "" if full.endswith(eos) else eos  # TRL adds eos unless the text ends with it
    ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    return ids[-max_length:] if max_length else ids


def score_ids(model, ids: list[list[int]], pad_id: int, batch_size: int) -> list[list[float]]:
    """Head logits for each token-id list (right-padded batches on the model's device)."""
    import torch

    device = next(model.parameters()).device
    out: list[list[float]] = []
    with torch.no_grad():
        for start in range(0, len(ids), batch_size):
            chunk = ids[start : start + batch_size]
            width = max(len(x) for x in chunk)
            input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, x in enumerate(chunk):
                input_ids[row, : len(x)] = torch.tensor(x)
                mask[row, : len(x)] = 1
            logits = model(input_ids=input_ids.to(device), attention_mask=mask.to(device)).logits
            out += logits.float().cpu().tolist()
    return out


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


# Reward functions ------------------------------------------------------------------


class _LearnedSignal:
    """One recipe entry: scores a batch, remembers it for the feedback, explains it."""

    def __init__(self, name: str, spec: dict[str, Any], model: RewardModel) -> None:
        self.name = name
        self.pairwise = spec["pairwise"]
        self.model = model
        self.head_weights = _head_weights(name, spec["objectives"], model.heads)
        self.cache: OrderedDict[tuple[str, str], tuple[float, list[float]]] = OrderedDict()
        self.group_best: dict[str, float] = {}
        self.group_size: dict[str, int] = {}

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        raw = self.model.raw_scores(prompts, completions)
        heads = [self.model.normalise(r) for r in raw]
        values = [sum(w * h for w, h in zip(self.head_weights, hs)) for hs in heads]
        if self.pairwise:  # Bradley–Terry: P(a ≻ b) = σ(r_a − r_b) on the weighted raw score
            combined = [sum(w * x for w, x in zip(self.head_weights, r)) for r in raw]
            # Keyed by prompt too: the same text may answer two prompts and score differently.
            score = {
                (prompt_key(p), completion_text(c)): x
                for p, c, x in zip(prompts, completions, combined)
            }
            values = win_rates(
                prompts,
                completions,
                lambda p, a, b: _sigmoid(score[prompt_key(p), a] - score[prompt_key(p), b]),
                judge=self.name,
            )
        first_attempts = all(a == 1 for a in kwargs.get("attempt", [1] * len(prompts)))
        for rows in group_indices(prompts).values():
            key = prompt_key(prompts[rows[0]])
            if first_attempts:  # the group the feedback compares with is the first attempts'
                self.group_best[key] = max(values[i] for i in rows)
                self.group_size[key] = len(rows)
        for prompt, completion, value, hs in zip(prompts, completions, values, heads):
            self._remember((prompt_key(prompt), completion_text(completion)), (value, hs))
        if log_metric := kwargs.get("log_metric"):
            for h, head in enumerate(self.model.heads if len(self.model.heads) > 1 else []):
                log_metric(
                    f"reward_models/{self.name}/{head}", sum(x[h] for x in heads) / len(heads)
                )
        return values

    def _remember(self, key: tuple[str, str], value: tuple[float, list[float]]) -> None:
        self.cache[key] = value
        self.cache.move_to_end(key)
        while len(self.cache) > 4096:
            self.cache.popitem(last=False)

    def sentence(self, prompt: Any, completion: Any) -> str:
        """What this signal thought of one completion it scored, in words."""
        key = prompt_key(prompt)
        value, heads = self.cache.get((key, completion_text(completion)), (None, None))
        if value is None:
            return ""
        if self.pairwise:
            return win_rate_sentence(self.name, value, self.group_size.get(key, 1))
        best = self.group_best.get(key)
        text = f"Reward model {self.name!r} scored this reply {value:.2f} (0 to 1)"
        if best is None or self.group_size.get(key, 1) < 2:
            text += "."
        elif value >= best - 1e-6:
            text += ", the best of the replies to this prompt."
        else:
            text += f"; the best reply to this prompt scored {best:.2f}."
        if len(heads) > 1:
            weakest = min(range(len(heads)), key=lambda h: heads[h])
            text += f" Its weakest objective is {self.model.heads[weakest]!r} ({heads[weakest]:.2f}): improve that first."
        return text


def _head_weights(name: str, objectives: dict[str, float] | None, heads: list[str]) -> list[float]:
    """Per-head weights summing to 1, from a mapping of head name (or index) -> weight."""
    if objectives is None:
        return [1 / len(heads)] * len(heads)
    weights = [0.0] * len(heads)
    for head, weight in objectives.items():
        if str(head) in heads:
            weights[heads.index(str(head))] = weight
        elif str(head).isdigit() and int(head) < len(heads):
            weights[int(head)] = weight
        else:
            raise ValueError(f"reward_models.{name}.objectives: no head {head!r}; heads: {heads}")
    total = sum(weights)
    return [w / total for w in weights]


class _PreferenceSignal:
    """A human-feedback function (prompt, a, b) -> preference, as a within-group win rate."""

    def __init__(self, name: str, spec: dict[str, Any]) -> None:
        self.name = name
        self.prefer = load_preference_function(spec["function"])
        self.cache: dict[tuple[str, str], float] = {}
        self.group_size: dict[str, int] = {}

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        values = win_rates(prompts, completions, self.prefer, judge=self.name)
        self.cache = {}
        for rows in group_indices(prompts).values():
            self.group_size[prompt_key(prompts[rows[0]])] = len(rows)
        for prompt, completion, value in zip(prompts, completions, values):
            self.cache[(prompt_key(prompt), completion_text(completion))] = value
        return values

    def sentence(self, prompt: Any, completion: Any) -> str:
        key = prompt_key(prompt)
        value = self.cache.get((key, completion_text(completion)))
        return "" if value is None else win_rate_sentence(self.name, value, self.group_size[key])


def add_learned_signals(
    reward_models: Mapping[str, dict[str, Any]],
    preference_functions: Mapping[str, dict[str, Any]],
    reward_funcs: list[Callable],
    reward_weights: list[float],
    feedback_func: Callable[..., list[str]],
    *,
    device: Any,
    program_feedback: bool = True,
) -> tuple[list[Callable], list[float], Callable[..., list[str]]]:
    """The run's reward functions, weights and feedback with the learned signals added.

    `reward_models` / `preference_functions`: checked recipe entries. `program_feedback`
    False leaves the programs' sentences out (they all have weight 0: they only watch, and
    their feedback would hand the policy the programmatic verdict).
    """
    signals: list[_LearnedSignal | _PreferenceSignal] = []
    loaded: dict[tuple[str, int, int], RewardModel] = {}
    for name, spec in reward_models.items():
        key = (spec["path"], spec["max_length"], spec["batch_size"])
        if key not in loaded:  # one copy of a model used as a scorer and as a judge
            loaded[key] = RewardModel(spec["path"], device, spec["max_length"], spec["batch_size"])
        signals.append(_LearnedSignal(name, spec, loaded[key]))
    signals += [_PreferenceSignal(name, spec) for name, spec in preference_functions.items()]

    funcs, weights = list(reward_funcs), list(reward_weights)
    for signal, spec in zip(signals, [*reward_models.values(), *preference_functions.values()]):
        suffix = "preference" if isinstance(signal, _PreferenceSignal) else "reward_model"
        funcs.append(_named(signal, f"{signal.name}_{suffix}"))
        weights.append(spec["weight"])

    def feedback(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[str]:
        """The programs' feedback (when they count) and what each learned signal thought."""
        base = feedback_func(prompts=prompts, completions=completions, **kwargs)
        out = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
            parts = [base[i]] if program_feedback else []
            parts += [s.sentence(prompt, completion) for s in signals]
            out.append(" ".join(p for p in parts if p))
        return out

    return funcs, weights, feedback


def _named(signal: Callable, name: str) -> Callable:
    """A plain function around `signal` with `__name__` set: TRL logs rewards/<name>/mean."""

    def reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        return signal(prompts, completions, **kwargs)

    reward.__name__ = reward.__qualname__ = name
    reward.__doc__ = f"Learned signal {signal.name!r}: a value in [0, 1] per completion."
    return reward
