"""The `<answer>...</answer>` tag every task family reads, and the verdicts shared around it.

One convention for all families: the answer is the LAST `<answer>...</answer>` pair (the
last opening tag and the first closing tag after it), so a model that changes its mind
is scored on its final answer. Locating it uses only `str.find`/`rfind`: a lazy
`<answer>(.*?)</answer>` regex rescans the tail for every opening tag, which is quadratic
on a completion full of unclosed tags and would stall training.
"""

from __future__ import annotations

from dataclasses import dataclass

from curriculum.tasks.base import Evaluation

OPEN, CLOSE = "<answer>", "</answer>"
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"

NO_ANSWER = "No <answer>...</answer> tag found; give the final answer inside one."


@dataclass(frozen=True)
class TaggedAnswer:
    """What `extract_answer` found: the answer text and whether the reply was well formed."""

    text: str
    """The stripped content of the last `<answer>...</answer>` pair."""
    strict: bool
    """True when the reply is exactly one answer, optionally after one think block."""
    bare: bool
    """True when the reply is that one answer tag alone: no think block, no other text."""


def extract_answer(completion: object) -> TaggedAnswer | None:
    """The last `<answer>...</answer>` in `completion`, or None when there is none.

    >>> extract_answer("<think>hm</think> <answer> 7 </answer>")
    TaggedAnswer(text='7', strict=True, bare=False)
    """
    if not isinstance(completion, str):
        return None
    end = completion.rfind(CLOSE)
    if end < 0:
        return None
    start = completion.rfind(OPEN, 0, end)
    if start < 0:
        return None
    close = completion.find(CLOSE, start)  # the first close after the last open
    text = completion[start + len(OPEN) : close]
    before, after = completion[:start].strip(), completion[close + len(CLOSE) :].strip()
    strict = not after and _is_think_block(before) and OPEN not in before
    return TaggedAnswer(text.strip(), strict, bare=not before and not after)


def _is_think_block(text: str) -> bool:
    """True for "" or one `<think>...</think>` block with no other tags around it."""
    if not text:
        return True
    return (
        text.startswith(_THINK_OPEN)
        and text.endswith(_THINK_CLOSE)
        and text.count(_THINK_OPEN) == 1
        and text.count(_THINK_CLOSE) == 1
    )


# ----------------------------------------------------------------------------- verdicts


def shorten(text: str, limit: int = 40) -> str:
    """`text` cut to `limit` characters for feedback sentences."""
    return text if len(text) <= limit else text[:limit] + "..."


def failed_evaluation(signals: tuple[str, ...], message: str) -> Evaluation:
    """The verdict on a reply that cannot be scored: every signal 0, `message` everywhere."""
    return Evaluation(0.0, dict.fromkeys(signals, 0.0), dict.fromkeys(signals, message), message)


def no_tag(shape: str) -> str:
    """The error for a reply without an answer tag, showing the `shape` the answer takes.

    >>> no_tag("EXPRESSION")
    'No <answer>...</answer> tag found; reply <answer>EXPRESSION</answer>.'
    """
    return f"No {OPEN}...{CLOSE} tag found; reply {OPEN}{shape}{CLOSE}."


def only_tag_feedback(shape: str) -> str:
    """The `format` feedback of a family whose reply is one tag of `shape`, thinking allowed."""
    return (
        f"Reply with only {OPEN}{shape}{CLOSE} (a <think>...</think> block before it is "
        "allowed) and no other text."
    )


def format_feedback(answer: TaggedAnswer) -> str | None:
    """The `format` feedback of a free-form answer, None when the format is right."""
    if answer.strict:
        return None
    return (
        "Reply with one <answer>...</answer>, optionally after one <think>...</think> "
        "block, and nothing else."
    )


def free_answer_verdict(answer: TaggedAnswer, score: float, reveal: str | None) -> Evaluation:
    """The `format` and `correctness` verdict on a free-form answer whose text scored
    `score` in [0, 1]; `reveal` is the expected answer to state in feedback, or None."""
    feedback: dict[str, str] = {}
    fmt = format_feedback(answer)
    if fmt is not None:
        feedback["format"] = fmt
    if score < 1.0:
        feedback["correctness"] = (
            "The answer is empty."
            if not answer.text
            else f"The answer {shorten(answer.text)!r} is not correct."
        )
        if reveal is not None:
            feedback["correctness"] += f" The correct answer is {shorten(reveal)!r}."
    elif not answer.strict:
        feedback["correctness"] = (
            "The answer is right but counts in full only in a well-formed reply."
        )
    # A right answer in a malformed reply earns half: a lenient match taught the
    # project's tiny model not to stop after the answer.
    correctness = score if answer.strict else 0.5 * score
    breakdown = {"format": 1.0 if answer.strict else 0.5, "correctness": correctness}
    return Evaluation(correctness, breakdown, feedback)
