"""One record of preference data, checked: TRL's preference formats and the project's ratings.

A pair, in any of TRL's preference formats (`margin` optional in each):

    {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}          # standard
    {"chosen": "The sky is blue.", "rejected": "The sky is green."}              # implicit prompt
    {"prompt": [{"role": "user", "content": "Sky?"}],                            # conversational
     "chosen": [{"role": "assistant", "content": "Blue."}],
     "rejected": [{"role": "assistant", "content": "Green."}]}
    {"chosen": [{"role": "user", "content": "Sky?"}, {"role": "assistant", "content": "Blue."}],
     "rejected": [{"role": "user", "content": "Sky?"}, {"role": "assistant", "content": "Green."}]}

A rating: `{"prompt": ..., "completion": ..., "score": 4}`. A prompt is a string or a list
of {role, content} messages; a reply (chosen, rejected, completion) is a string or a list
of assistant messages, and a pair's two replies take the same form. With the prompt
implicit, it is what both replies share at their start, as TRL's `extract_prompt` reads
it: the leading messages both have, or for text the longest common prefix (a space just
before the first difference stays with the replies). A conversational pair may also carry
a text `prompt` beside it (some TRL datasets do): the prompt is then still the shared part.

Every check names `where` the record came from (a file and line, or a dataset and row)
and what is wrong with it.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

Reply = str | list[dict[str, Any]]
"""A completion: text, or assistant messages."""


@dataclass(frozen=True)
class Pair:
    """One preference: `chosen` is better than `rejected` as a reply to `prompt`."""

    prompt: Any
    chosen: Reply
    rejected: Reply
    margin: float = 0.0
    question: Any = None
    """What the held-out split groups the pair by; None: its prompt. An implicit text prompt
    can end inside the replies' common start (`...<answer>1` for `<answer>15</answer>`
    against `<answer>16</answer>`), so its question is the prompt up to its last line break:
    the pairs of one question then stay on one side of the split."""


def is_pair(record: dict) -> bool:
    """Whether a record is a preference pair (else it should be a rating)."""
    return "chosen" in record or "rejected" in record


def is_rating(record: dict) -> bool:
    """Whether a record is a rating {prompt, completion, score}."""
    return "completion" in record or "score" in record


def read_pair(where: str, record: dict) -> Pair:
    """A pair in any TRL preference format; ValueError saying where and what is wrong."""
    require(where, record, ("chosen", "rejected"))
    chosen = _messages_or_text(where, record, "chosen")
    rejected = _messages_or_text(where, record, "rejected")
    if isinstance(chosen, str) != isinstance(rejected, str):
        form = {True: "text", False: "a list of messages"}
        raise ValueError(
            f"{where}: 'chosen' is {form[isinstance(chosen, str)]} but 'rejected' is "
            f"{form[isinstance(rejected, str)]}: a pair's two replies take the same form"
        )
    margin = finite(where, "margin", record["margin"]) if "margin" in record else 0.0
    prompt = record.get("prompt")
    conversational = not isinstance(chosen, str)
    if prompt is not None and not (isinstance(prompt, str) and conversational):
        prompt = read_prompt(where, prompt)
        return Pair(
            prompt, _reply(where, "chosen", chosen), _reply(where, "rejected", rejected), margin
        )

    # The implicit prompt: what both replies share at their start.
    why = (
        "no 'prompt'"
        if prompt is None
        else "'prompt' is text beside messages (TRL then reads the prompt from the replies)"
    )
    shared = _shared_prefix(chosen, rejected)
    if chosen == rejected:
        raise ValueError(
            f"{where}: {why}, and 'chosen' and 'rejected' are the same: no reply is left to prefer"
        )
    if shared == 0:
        unit = "message" if conversational else "text"
        raise ValueError(
            f"{where}: {why}, and 'chosen' and 'rejected' share no leading {unit} to take "
            "as the prompt (an implicit prompt); give the prompt as 'prompt'"
        )
    for key, reply in (("chosen", chosen), ("rejected", rejected)):
        if shared == len(reply):
            raise ValueError(
                f"{where}: {why}, and all of {key!r} is the start of the other reply: "
                "nothing of it is left as a reply (an implicit prompt); give the prompt as 'prompt'"
            )
    prompt = chosen[:shared]
    question = None  # messages end where a message ends
    if not conversational:
        question = prompt[: prompt.rfind("\n") + 1] or prompt
    return Pair(
        prompt,
        _reply(where, "chosen", chosen[shared:], offset=shared),
        _reply(where, "rejected", rejected[shared:], offset=shared),
        margin,
        question,
    )


def read_rating(where: str, record: dict) -> tuple[Any, Reply, float]:
    """(prompt, completion, score) of a rating; ValueError saying where and what is wrong."""
    require(where, record, ("prompt", "completion", "score"))
    return (
        read_prompt(where, record["prompt"]),
        read_completion(where, record, "completion"),
        finite(where, "score", record["score"]),
    )


def read_prompt(where: str, prompt: Any) -> Any:
    """A prompt: a string, or a non-empty list of {role, content} messages."""
    if isinstance(prompt, str):
        return prompt
    if not isinstance(prompt, list) or not prompt or not all(map(_is_message, prompt)):
        raise ValueError(
            f"{where}: 'prompt' must be a string or a list of {{role, content}} messages"
        )
    return prompt


def read_completion(where: str, record: dict, key: str) -> Reply:
    """A reply under `key`: a string or a list of assistant messages."""
    return _reply(where, key, _messages_or_text(where, record, key))


def require(where: str, record: dict, keys: tuple[str, ...]) -> None:
    """ValueError naming the keys of `keys` that `record` lacks."""
    missing = [k for k in keys if k not in record]
    if missing:
        raise ValueError(f"{where}: missing {missing} (has {sorted(record)})")


def finite(where: str, key: str, value: Any) -> float:
    """`value` as a float; ValueError unless it is a finite number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{where}: {key!r} must be a finite number, got {value!r}")
    return float(value)


def _is_message(message: Any) -> bool:
    return (
        isinstance(message, dict)
        and isinstance(message.get("role"), str)
        and isinstance(message.get("content"), str)
    )


def _messages_or_text(where: str, record: dict, key: str) -> Reply:
    value = record[key]
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ValueError(
            f"{where}: {key!r} must be a string or a list of {{role, content}} messages, "
            f"got {type(value).__name__}"
        )
    for i, message in enumerate(value):
        if not _is_message(message):
            raise ValueError(
                f"{where}: {key!r} must be a string or a list of {{role, content}} messages; "
                f"its message {i} is {_short(message)}"
            )
    return value


def _reply(where: str, key: str, reply: Reply, offset: int = 0) -> Reply:
    """A reply's messages must all be the assistant's (`offset`: shared messages before it)."""
    if isinstance(reply, str):
        return reply
    if not reply:
        raise ValueError(f"{where}: {key!r} holds no message")
    for i, message in enumerate(reply, offset):
        if message["role"] != "assistant":
            after = f" (after the {offset} messages both replies share)" if offset else ""
            raise ValueError(
                f"{where}: {key!r} message {i} has role {message['role']!r}{after}: a reply "
                "holds assistant messages only"
            )
    return reply


def _shared_prefix(chosen: Reply, rejected: Reply) -> int:
    """How many leading characters (or messages) are the implicit prompt, as TRL reads it."""
    shared = 0
    for a, b in zip(chosen, rejected):
        if a != b:
            break
        shared += 1
    if isinstance(chosen, str) and shared < min(len(chosen), len(rejected)):
        if shared and chosen[shared - 1] == " ":  # TRL keeps the space with the replies
            shared -= 1
    return shared


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
