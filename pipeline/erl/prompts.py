"""The text ERL shows the model: reflection and retry prompts, and the memory's lines.

`ERLTrainer` builds its reflection and retry rows with these, the feedback-reading warm-up
(`bench/feedback_warmup.py`) builds its SFT rows with them, so that a warm-up shows
the model exactly what training will, and evaluation prints prompts the same way.
No torch or trl here.

    >>> prompt = [{"role": "user", "content": "What is 3 + 4?"}]
    >>> retry_prompt(prompt, "{prompt}\\n\\nAdvice: {reflection}", "Add 3 and 4.")
    [{'role': 'user', 'content': 'What is 3 + 4?\\n\\nAdvice: Add 3 and 4.'}]
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

DEFAULT_REFLECTION_PROMPT = (
    "You tried to solve this task:\n{prompt}\n\n"
    "Your attempt:\n{attempt}\n\n"
    "Feedback: {feedback}\nReward: {reward:.2f}\n\n"
    "Lessons from similar tasks:\n{memory}\n\n"
    "In one or two sentences, say what went wrong and how to fix it. Do not give the final answer."
)
DEFAULT_RETRY_PROMPT = "{prompt}\n\nAdvice from a previous attempt: {reflection}"
REFLECTION_PLACEHOLDERS = ("prompt", "attempt", "feedback", "reward", "memory")
RETRY_PLACEHOLDERS = ("prompt", "reflection")

NO_MEMORY = "(none yet)"
"""The `{memory}` value when no stored reflection is retrieved."""


def is_chat(prompt: Any) -> bool:
    """Whether a prompt is a conversation (a list of {role, content} messages), as TRL's
    `is_conversational` decides for a dataset row."""
    return (
        isinstance(prompt, list)
        and bool(prompt)
        and isinstance(prompt[0], dict)
        and ("role" in prompt[0])
    )


def prompt_text(prompt: Any) -> str:
    """A prompt as plain text for the templates: a conversation's non-assistant turns,
    joined by newlines."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(m["content"]) for m in prompt if m.get("role") != "assistant")


def prompt_key(prompt: Any) -> str:
    """What names a prompt exactly, roles and all: GRPO's generations of one prompt share
    it, and so do the retries of one shared reflection."""
    return json.dumps(prompt, sort_keys=True, default=str)


def memory_text(lessons: Sequence[str]) -> str:
    """The `{memory}` value for retrieved `lessons`: one "- lesson" line each."""
    return "\n".join(f"- {lesson}" for lesson in lessons) if lessons else NO_MEMORY


def as_prompt(original: Any, text: str) -> Any:
    """`text` as a prompt in the format of `original`: one user message, or plain text."""
    return [{"role": "user", "content": text}] if is_chat(original) else text


def as_completion(prompt: Any, text: str) -> Any:
    """`text` as a completion in the format reward functions get for `prompt`'s dataset."""
    return [{"role": "assistant", "content": text}] if is_chat(prompt) else text


def reflection_prompt(
    prompt: Any, template: str, *, attempt: str, feedback: str, reward: float, memory: str
) -> Any:
    """The reflection prompt for a gated first attempt, in the format of `prompt`."""
    text = template.format(
        prompt=prompt_text(prompt), attempt=attempt, feedback=feedback, reward=reward, memory=memory
    )
    return as_prompt(prompt, text)


def retry_prompt(prompt: Any, template: str, reflection: str) -> Any:
    """The original prompt with its last turn rewritten by the retry template: a
    conversation keeps its system message, so the retry asks the task as before."""
    if not is_chat(prompt):
        return template.format(prompt=prompt, reflection=reflection)
    *context, last = prompt
    return [
        *context,
        {**last, "content": template.format(prompt=last["content"], reflection=reflection)},
    ]
