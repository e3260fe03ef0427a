"""A feedback-reading warm-up: SFT rows that teach a small model to use ERL's feedback.

ERL helps only a policy that can turn feedback into a better second attempt. The
project's tiny model cannot do that out of the box, so this module builds SFT rows in
exactly the shape `ERLTrainer` produces at training time, from wrong first attempts whose
feedback carries real information:

- a *reflection* row: the reflection template filled with the prompt, a wrong attempt,
  the feedback the run's `feedback_func` gives for it, its reward and some memory
  -> a short reflection that states the fix;
- a *retry* row: the original prompt rewritten by the retry template with that
  reflection -> the correct answer.

Two feedback kinds (`style`), both produced by the real feedback function:

- `"distance"`: the arithmetic milestones feedback ("The answer 5 is wrong: it is too
  low. The answer 5 is off by 3."); the reflection computes the fix ("5 + 3 = 8.");
- `"reveal"`: the task's `reveal_answer` feedback ("... The correct answer is 8."); the
  reflection restates it ("The answer is 8.").

For the hidden-rule family, `rule_rows` builds the same two rows from the attempt that
reads the unknown operation as + ("3@4" -> 7), its real feedback ("it is 2 too low") and
the rule as the reflection ("a@b = a+b+2"), over many rules, so that the model learns to
read a rule from feedback without learning any one rule.

`sft_warmup(..., dataset=Dataset.from_list(feedback_rows(...)))` (pipeline/run/warmup.py)
trains on them. The learning bench (`bench/learning_gates.py`) is its one user, so it lives
beside it, not in the algorithm's package.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from curriculum.tasks.base import Row, Task
from pipeline.erl.memory import MEMORY_SCOPES
from pipeline.erl.prompts import memory_text, reflection_prompt, retry_prompt

STYLES = ("distance", "reveal")


def reflection_target(attempt: int, answer: int, style: str) -> str:
    """The reflection a feedback-reading model writes for a wrong `attempt`."""
    if style == "reveal":
        return f"The answer is {answer}."
    offset = answer - attempt
    sign = "+" if offset > 0 else "-"
    return f"{attempt} {sign} {abs(offset)} = {answer}."


def feedback_rows(
    task: Task,
    rows: Sequence[Row],
    feedback_func: Callable[..., list[str]],
    reward_funcs: Sequence[Callable[..., list[float]]],
    reward_weights: Sequence[float],
    *,
    reflection_template: str,
    retry_template: str,
    style: str,
    seed: int,
    max_offset: int = 9,
    memory_top_k: int = 3,
    memory_scope: str = "similar",
) -> list[dict[str, Any]]:
    """Two SFT rows (reflection, retry) per row of an integer-answer task, from a wrong
    attempt off by 1..`max_offset`.

    `feedback_func`, `reward_funcs` and `reward_weights` are the ones the ERL run uses, so
    the warm-up shows the model exactly the feedback and (weighted) reward it will read.
    The memory shown is what the run's `memory_scope` retrieves: `"similar"`, up to
    `memory_top_k` reflections written for other prompts; `"same_prompt"`, none (a prompt
    not fixed before) or, for half the rows, this prompt's own earlier fix; `"global"`, none
    (no retry has succeeded yet) or, for three rows in four, one reflection written for
    another prompt (the rulebook: the latest one whose retry succeeded).
    """
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    _check_scope(memory_scope)
    if max_offset < 1:
        raise ValueError(f"max_offset must be >= 1, got {max_offset}")
    rng = random.Random(seed)
    attempts, answers = [], []
    for row in rows:
        answer = int(row["answer"])
        attempts.append(answer + rng.choice([-1, 1]) * rng.randint(1, max_offset))
        answers.append(answer)
    feedback, rewards = _verdicts(rows, attempts, feedback_func, reward_funcs, reward_weights)
    reflections = [reflection_target(a, b, style) for a, b in zip(attempts, answers)]

    out = []
    for i, row in enumerate(rows):
        if memory_scope == "similar":  # reflections that worked on other prompts
            lessons = [reflections[j] for j in rng.sample(range(len(rows)), rng.randint(0, 3))]
            lessons = [lesson for lesson in lessons if lesson != reflections[i]][:memory_top_k]
        elif memory_top_k == 0:
            lessons = []
        elif memory_scope == "global":  # the rulebook: another prompt's successful fix
            others = [j for j in range(len(rows)) if reflections[j] != reflections[i]]
            lessons = [reflections[rng.choice(others)]] if others and rng.random() < 0.75 else []
        elif rng.random() < 0.5:  # same_prompt: this prompt's fix of an earlier attempt
            earlier = answers[i] + rng.choice([-1, 1]) * rng.randint(1, max_offset)
            lessons = [reflection_target(earlier, answers[i], style)]
        else:  # a prompt not seen, or not fixed, before
            lessons = []
        out += _pair(task, row, reflection_template, retry_template, attempts[i], feedback[i],
                     rewards[i], lessons, reflections[i])  # fmt: skip
    return out


def rule_rows(
    task: Task,
    rows: Sequence[Row],
    rules: Sequence[str],
    feedback_func: Callable[..., list[str]],
    reward_funcs: Sequence[Callable[..., list[float]]],
    reward_weights: Sequence[float],
    *,
    reflection_template: str,
    retry_template: str,
    seed: int,
    memory_top_k: int = 3,
    memory_scope: str = "global",
    attempts: Sequence[int] | None = None,
    shown: Sequence[str | None] | None = None,
) -> list[dict[str, Any]]:
    """Two SFT rows (reflection, retry) per row of a hidden-rule task whose rule is
    `rules[i]` (say "a@b = a+b+2", the level-1 form a+b+k): a wrong first attempt
    (`attempts[i]`; by default the reading of the unknown operation as +, a+b), the run's
    feedback on it ("it is 2 too low"), and the reflection that states the rule, which
    follows from the attempt and the feedback; the retry with that reflection gives the
    answer. Rows of many rules (other symbols, other constants) teach the reading without
    teaching any one rule.

    The memory shown: `shown[i]`, a rule the memory holds for that row (None: nothing),
    which may be wrong, so that the model learns to weigh it against the feedback rather
    than copy it. By default, what the run's `memory_scope` retrieves once the rule has been
    found: for half the rows, the rule (once; `similar`: up to `memory_top_k` times, every
    prompt's reflection being the same rule), else none.
    """
    _check_scope(memory_scope)
    for name, values in (("rules", rules), ("attempts", attempts), ("shown", shown)):
        if values is not None and len(values) != len(rows):
            raise ValueError(f"{len(rows)} rows but {len(values)} {name}")
    rng = random.Random(seed)
    if attempts is None:
        attempts = [task.meta(row)["a"] + task.meta(row)["b"] for row in rows]
    feedback, rewards = _verdicts(rows, attempts, feedback_func, reward_funcs, reward_weights)
    out = []
    for i, row in enumerate(rows):
        copies = rng.randint(1, max(1, memory_top_k)) if memory_scope == "similar" else 1
        if shown is not None:
            lessons = [shown[i]] * copies if memory_top_k and shown[i] else []
        else:
            lessons = [rules[i]] * copies if memory_top_k and rng.random() < 0.5 else []
        out += _pair(task, row, reflection_template, retry_template, attempts[i], feedback[i],
                     rewards[i], lessons, rules[i])  # fmt: skip
    return out


def code_lesson(pairs: Sequence[tuple[str, str]]) -> str:
    """A hidden-code lesson: 'Q=3 Z=8', each letter once, in the order given."""
    return " ".join(f"{letter}={digit}" for letter, digit in dict(pairs).items())


def code_rows(
    task: Task,
    rows: Sequence[Row],
    codes: Sequence[dict[str, str]],
    attempts: Sequence[str],
    feedback_func: Callable[..., list[str]],
    reward_funcs: Sequence[Callable[..., list[float]]],
    reward_weights: Sequence[float],
    *,
    reflection_template: str,
    retry_template: str,
    seed: int,
) -> list[dict[str, Any]]:
    """Two SFT rows (reflection, retry) per row of a hidden-code task, row i under the code
    `codes[i]` (letter -> digit) with the wrong first attempt `attempts[i]` ("Q=5 Z=2 X=1").
    The feedback is the run's ("... is wrong: Q=3 Z=8."). The memory shown is, for half the rows,
    nothing, else one lesson from the same code about one to three of its letters (what a
    rulebook holds once retries have succeeded). The reflection is the lesson that follows:
    each letter of the prompt whose digit the feedback names or the memory states, in the
    prompt's order ('Q=3 Z=8'); the retry with it gives the answer. Rows of many codes teach
    copying a lesson without teaching any one code."""
    if not len(rows) == len(codes) == len(attempts):
        raise ValueError(f"{len(rows)} rows, {len(codes)} codes and {len(attempts)} attempts")
    rng = random.Random(seed)
    feedback, rewards = _verdicts(rows, attempts, feedback_func, reward_funcs, reward_weights)
    out = []
    for row, code, attempt, text, reward in zip(rows, codes, attempts, feedback, rewards):
        symbols = task.meta(row)["symbols"]
        # The feedback's own lesson, after the attempt it quotes: "...is wrong: Q=3 Z=8."
        known = set(re.findall(r"\b([A-Z])=\d", text.rpartition(": ")[2]))
        lessons = []
        if rng.random() < 0.5:
            letters = rng.sample(sorted(code), rng.randint(1, 3))
            lessons = [code_lesson((letter, code[letter]) for letter in letters)]
            known |= set(letters)
        reflection = code_lesson((s, code[s]) for s in symbols if s in known)
        out += _pair(task, row, reflection_template, retry_template, attempt, text, reward,
                     lessons, reflection)  # fmt: skip
    return out


def _check_scope(memory_scope: str) -> None:
    if memory_scope not in MEMORY_SCOPES:
        raise ValueError(f"memory_scope must be one of {MEMORY_SCOPES}, got {memory_scope!r}")


def _verdicts(rows, attempts, feedback_func, reward_funcs, reward_weights):
    """The run's feedback and weighted reward for `<answer>attempt</answer>` on each row."""
    completions = [[{"role": "assistant", "content": f"<answer>{a}</answer>"}] for a in attempts]
    columns = {name: [row[name] for row in rows] for name in ("task", "level", "answer", "meta")}
    prompts = [row["prompt"] for row in rows]
    feedback = feedback_func(prompts=prompts, completions=completions, **columns)
    rewards = [0.0] * len(rows)
    for func, weight in zip(reward_funcs, reward_weights, strict=True):
        values = func(prompts=prompts, completions=completions, **columns)
        rewards = [r + weight * v for r, v in zip(rewards, values)]
    return feedback, rewards


def _pair(task, row, reflection_template, retry_template, attempt, feedback, reward, lessons,
          reflection) -> list[dict[str, Any]]:  # fmt: skip
    """The reflection row (prompt, attempt, feedback, reward, memory -> reflection) and the
    retry row (prompt with the reflection -> the reference answer)."""
    return [
        {
            "prompt": reflection_prompt(
                row["prompt"],
                reflection_template,
                attempt=f"<answer>{attempt}</answer>",
                feedback=feedback,
                reward=float(reward),
                memory=memory_text(lessons),
            ),
            "completion": [{"role": "assistant", "content": reflection}],
        },
        {
            "prompt": retry_prompt(row["prompt"], retry_template, reflection),
            "completion": [{"role": "assistant", "content": task.reference(row)}],
        },
    ]
