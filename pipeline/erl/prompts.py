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
import string
from collections.abc import Sequence
from typing import Any

from rewards import completion_text

DEFAULT_REFLECTION_PROMPT = (
    "You tried to solve this task:\n{prompt}\n\n"
    "Your attempt:\n{attempt}\n\n"
    "Feedback: {feedback}\nReward: {reward:.2f}\n\n"
    "Lessons from similar tasks:\n{memory}\n\n"
    "In one or two sentences, say what went wrong and how to fix it. Do not give the final answer."
)
# The retry reads its own attempt's feedback beside the lesson: with the lesson alone, ERL
# learned hidden_code's copyable code in 0 of 8 tuning runs, with both in 7 of 8 (issue 48,
# docs/log.md 2026-12-05): one reflection per group is written for another attempt of the
# group, so the feedback is the one text about the retry's own mistake.
DEFAULT_RETRY_PROMPT = (
    "{prompt}\n\nFeedback on your attempt: {feedback}\n\n"
    "Advice from a previous attempt: {reflection}"
)
REFLECTION_PLACEHOLDERS = ("prompt", "attempt", "feedback", "reward", "memory")
# {feedback} in a retry template: the feedback on the retry's own first attempt (ERLStep then
# asks the feedback function for every gated attempt, not only for the reflecting ones).
RETRY_PLACEHOLDERS = ("prompt", "reflection", "feedback")

NO_MEMORY = "(none yet)"
"""The `{memory}` value when no stored reflection is retrieved."""

EMPTY_TASK = [{"role": "user", "content": ""}]
"""The prompt of a row without one (TRL's: its environment's `reset` text supplies it)."""

CUT_MARK = "\n[... {count} characters cut ...]\n"


def template_fields(template: str) -> set[str]:
    """The `{placeholder}` names used in a str.format template."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


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


def lesson_text(reflection: str) -> str:
    """The lesson a reflection gives, without its reasoning: the text after the last
    `</think>` (a thinking model's template may open the block in the generation prompt),
    else the text before an unclosed `<think>`, stripped. A thinking model's whole trace
    would otherwise go into every retry's prompt and into the memory; TRL's
    `parse_response` separates `reasoning_content` from `content` the same way.

    >>> lesson_text("<think>It said 7, so...</think> Add the tens first.")
    'Add the tens first.'
    """
    if "</think>" in reflection:
        reflection = reflection.rsplit("</think>", 1)[1]
    elif "<think>" in reflection:
        reflection = reflection.split("<think>", 1)[0]
    return reflection.strip()


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


def retry_prompt(prompt: Any, template: str, reflection: str, feedback: str = "") -> Any:
    """The original prompt with its last turn rewritten by the retry template: a
    conversation keeps its system message, so the retry asks the task as before."""
    if not is_chat(prompt):
        return template.format(prompt=prompt, reflection=reflection, feedback=feedback)
    *context, last = prompt
    text = template.format(prompt=last["content"], reflection=reflection, feedback=feedback)
    return [*context, {**last, "content": text}]


def without_reflection(template: str, feedback: str) -> tuple[str, str]:
    """A retry template's ({reflection}, {feedback}) where no reflection was written (the
    raw-feedback baseline): the attempt's own feedback, shown once, where {feedback} stands
    when the template names it (the default does), else as the {reflection}."""
    return ("", feedback) if "feedback" in template_fields(template) else (feedback, feedback)


def task_prompt(row: dict) -> Any:
    """A dataset row's prompt, as TRL reads it (an environment that owns the data may
    leave it out: its `reset` text is then the whole prompt)."""
    return row.get("prompt", EMPTY_TASK)


def lesson_in_system(prompt: list, template: str, reflection: str, feedback: str = "") -> list:
    """An episode's retry prompt: the conversation with the retry template applied to its
    system message (one added first when it has none), every other turn as it was, so
    the episode starts as the first attempt's did, with the lesson as its rulebook.

    >>> lesson_in_system([{"role": "user", "content": "Go."}], "{prompt}\n\nAdvice: {reflection}", "Left.")
    [{'role': 'system', 'content': 'Advice: Left.'}, {'role': 'user', 'content': 'Go.'}]
    """
    if prompt and prompt[0].get("role") == "system":
        system, rest = prompt[0], prompt[1:]
        text = template.format(prompt=system["content"], reflection=reflection, feedback=feedback)
        return [{**system, "content": text.strip()}, *rest]
    text = template.format(prompt="", reflection=reflection, feedback=feedback)
    return [{"role": "system", "content": text.strip()}, *prompt]


def attempt_text(completion: Any, max_chars: int) -> tuple[str, bool]:
    """An attempt as the reflection prompt shows it, and whether it was cut: a single
    answer's text, or an episode turn by turn (the model's text, each tool call with its
    arguments, each tool result). Longer than `max_chars`, the middle is cut (its length
    said in the text): the beginning sets the task up, the end holds how it ended."""
    text = _episode_text(completion) if _is_episode(completion) else completion_text(completion)
    if len(text) <= max_chars:
        return text, False
    head = max_chars // 4
    tail = max_chars - head
    return text[:head] + CUT_MARK.format(count=len(text) - head - tail) + text[-tail:], True


def _is_episode(completion: Any) -> bool:
    return isinstance(completion, list) and any(
        isinstance(m, dict) and (m.get("tool_calls") or m.get("role") == "tool") for m in completion
    )


def _episode_text(messages: list[dict]) -> str:
    lines = []
    for message in messages:
        if message.get("role") == "tool":
            lines.append(f"Result of {message.get('name', 'the tool')}: {message.get('content')}")
            continue
        content = message.get("content")
        if content:
            lines.append(str(content).strip())
        for call in message.get("tool_calls") or []:
            function = call.get("function", call)
            arguments = json.dumps(function.get("arguments"), sort_keys=True, default=str)
            lines.append(f"Call {function.get('name')}({arguments})")
    return "\n".join(lines)
