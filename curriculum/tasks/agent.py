"""Agent tasks: a task played turn by turn, as an episode of tool calls in an environment.

An `AgentTask` is a `Task` whose rows are played, not answered once. Its
`environment_class` is an environment as TRL 1.15's `GRPOTrainer(environment_factory=...)`
takes one:

- `reset(**row) -> str | None` starts an episode for a dataset row (TRL passes the whole
  row: `prompt`, `task`, `level`, `answer`, `meta`); a string it returns is appended to the
  prompt's last message, as TRL does;
- every other public method of the class is a tool the model may call, described to it
  by the method's signature and Google-style docstring; a tool returns the observation
  the model reads next, as text;
- instances are pooled and reused, so `reset` clears everything an episode leaves.

The model's episode is the completion the task scores: the assistant turns with their
`tool_calls`, each followed by the tools' replies, and a closing plain-text reply. The
verdict is made by *replaying* the episode's answered tool calls on a fresh environment
(`play`) and judging where it ended (`judge`), so scoring needs nothing but the row and
the transcript: the reward functions, the feedback ERL reads, `pipeline.evaluate` and a
log reader all score an episode the same way. The environment must therefore be
deterministic given the row (draw any randomness from the row's `meta`).

A call that was never answered (TRL stops at `max_tool_calling_iterations`, or drops a
reply that would pass `max_completion_length`) is not replayed: the verdict is on what the
model saw. Each call runs exactly as TRL's tool loop ran it (`run_tool_call`, which
`pipeline.evaluate` plays episodes with too): a call to an unknown tool, with arguments
that are not a mapping (a JSON string of one included, as TRL calls `tool(**arguments)`),
or one that raises, is an *invalid call*: its reply is the error TRL showed, and `judge`
may mark the format down for it. Model output is only ever passed to tools as arguments.

A subclass sets `environment_class`, implements `solution` (the calls that solve a row,
and the closing reply) and `judge`, plus the `Task` methods that draw rows
(`num_levels`, `_generate_one`). `reference` plays `solution` into an episode, which is
what the warm-up trains on. docs/agents.md writes one from scratch.
"""

from __future__ import annotations

import inspect
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from curriculum.tasks.answer_tags import failed_evaluation
from curriculum.tasks.base import Evaluation, Row, Task

Message = dict[str, Any]
ToolCall = tuple[str, dict[str, Any]]

# What TRL does not run as a tool, besides private names (`GRPOTrainer.__init__`).
NOT_TOOLS = ("reset", "get_reward")

MAX_REPLAYED_CALLS = 1000
"""Calls replayed from one episode; more are counted invalid and not run, so a huge
completion costs no more than a long episode."""


def environment_tools(environment: Any) -> list[Callable]:
    """The environment's tools as TRL 1.15 collects them: every public function of its
    class but `reset` and `get_reward`, bound to the instance. Listed on the class, as TRL
    does, so that a property is neither a tool nor evaluated."""
    return [
        getattr(environment, name)
        for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
        if name not in NOT_TOOLS and not name.startswith("_")
    ]


@dataclass
class CallRecord:
    """One replayed tool call."""

    name: str
    arguments: Any
    reply: str
    """The text the model read back (an error's text for an invalid call)."""
    valid: bool
    """False for an unknown tool, arguments that are not a mapping, or a tool that raised
    (what TRL's tool loop counts as a tool failure)."""


@dataclass
class Played:
    """An episode replayed on a fresh environment: what `judge` reads beside it."""

    calls: list[CallRecord] = field(default_factory=list)
    reply: str = ""
    """The last assistant message's text: the model's closing reply."""
    unanswered: int = 0
    """Calls in the transcript with no tool reply after them, not replayed."""
    malformed: str | None = None
    """Why the completion is not an episode at all (then nothing was replayed)."""

    @property
    def invalid_calls(self) -> list[CallRecord]:
        return [call for call in self.calls if not call.valid]

    def format_score(self) -> float:
        """The share of replayed calls that were valid; 0 when there was no call at all."""
        return (len(self.calls) - len(self.invalid_calls)) / len(self.calls) if self.calls else 0.0

    def format_feedback(self) -> str | None:
        """One sentence about invalid calls (or none made), None when every call was valid."""
        if not self.calls:
            return "No tool was called: act by calling the tools, one call per turn."
        invalid = self.invalid_calls
        if not invalid:
            return None
        first = invalid[0]
        # ascii(): odd model text (lone surrogates, NULs) never reaches feedback raw.
        return (
            f"{len(invalid)} of {len(self.calls)} tool calls were invalid; the first, "
            f"{ascii(first.name[:40])}, got: {first.reply[:160]}"
        )


class AgentTask(Task):
    """A task family played as a multi-turn episode in `environment_class`."""

    environment_class: ClassVar[type]
    """The environment, TRL-style (see the module docstring). Built with no arguments by
    `make_environment`; override that to pass the task's config."""

    def make_environment(self) -> Any:
        """A new environment: what the run hands TRL as `environment_factory`."""
        return self.environment_class()

    @abstractmethod
    def turn_limit(self, level: int) -> int:
        """Tool calls an episode at `level` may make; the environment refuses more. The run
        sets TRL's `max_tool_calling_iterations` to the largest, unless the user sets it."""

    @abstractmethod
    def solution(self, row: Row) -> tuple[list[ToolCall], str]:
        """The calls that solve `row`, in order, and the closing reply."""

    @abstractmethod
    def judge(self, row: Row, environment: Any, played: Played) -> Evaluation:
        """The verdict on an episode, from the environment it left (`play`) and the
        replayed calls and reply. Never raises on model output. A completion that is not
        an episode at all never reaches it (`evaluate` fails it with every signal 0)."""

    # What every agent task shares ------------------------------------------------------

    def max_turns(self) -> int:
        """The largest turn limit over the levels."""
        return max(self.turn_limit(level) for level in self.levels)

    def start(self, row: Row) -> tuple[Any, list[Message]]:
        """A fresh environment reset for `row`, and the prompt the model sees: the row's,
        with the reset text appended to the last message (as TRL 1.15 does)."""
        environment, observation = self._reset(row)
        prompt = [dict(message) for message in row["prompt"]]
        if isinstance(observation, str) and observation:
            prompt[-1]["content"] += observation
        return environment, prompt

    def _reset(self, row: Row) -> tuple[Any, Any]:
        """A new environment reset for `row`, and what its reset returned."""
        environment = self.make_environment()
        return environment, environment.reset(**row)

    def play(self, row: Row, completion: Any) -> tuple[Any, Played]:
        """Replay the answered tool calls of `completion` (an episode's messages, or a
        plain reply) on a fresh environment; returns it with what happened. Never raises
        on the completion."""
        environment, _ = self._reset(row)  # the prompt is not needed
        tools = {tool.__name__: tool for tool in environment_tools(environment)}  # once
        played = Played()
        messages = episode_messages(completion)
        if messages is None:
            played.malformed = "The reply is not an episode of chat messages."
            return environment, played
        for k, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list):
                calls = [calls]
            answered = _replies_after(messages, k)
            played.unanswered += max(0, len(calls) - answered)
            for call in calls[:answered]:
                played.calls.append(_run_call(tools, call, len(played.calls)))
        last = messages[-1] if messages else {}
        if last.get("role") == "assistant" and isinstance(last.get("content"), str):
            played.reply = last["content"]
        return environment, played

    def environment_reward(self, row: Row, completion: Any) -> float:
        """The environment's own reward for the episode, as TRL reads it after the episode:
        `get_reward()` on the environment the replayed calls left (awaited when it is a
        coroutine). 0.0 where the environment has none, or returns None (TRL turns a None
        into NaN, which adds nothing to the weighted sum); an episode that is not one is
        replayed as no calls."""
        environment, _ = self.play(row, completion)
        get_reward = getattr(type(environment), "get_reward", None)
        if not callable(get_reward):
            return 0.0
        value = get_reward(environment)
        if inspect.isawaitable(value):
            import asyncio

            value = asyncio.run(_awaited(value))
        return 0.0 if value is None else float(value)

    def evaluate(self, row: Row, completion: Any) -> Evaluation:
        environment, played = self.play(row, completion)
        if played.malformed is not None:  # not an episode: nothing to judge
            return failed_evaluation(self.signals, played.malformed)
        return self.judge(row, environment, played)

    def reference(self, row: Row) -> list[Message]:
        """`solution` played into an episode: one assistant turn per call, each followed by
        the tool's reply, then the closing reply."""
        environment, _ = self._reset(row)  # the prompt is not needed
        tools = {tool.__name__: tool for tool in environment_tools(environment)}
        calls, reply = self.solution(row)
        messages: list[Message] = []
        for name, arguments in calls:
            messages.append(
                {"role": "assistant", "content": "", "tool_calls": [_call(name, arguments)]}
            )
            messages.append(
                {"role": "tool", "name": name, "content": str(tools[name](**arguments))}
            )
        messages.append({"role": "assistant", "content": reply})
        return messages


def is_agent_task(task: Any) -> bool:
    return isinstance(task, AgentTask)


ENVIRONMENT_REWARD_WEIGHT = 1.0
"""The weight TRL 1.15 gives an environment's `get_reward` beside the reward functions
(`GRPOTrainer.__init__` appends it with weight 1; no option changes it)."""


def environment_reward_weights(task: Any) -> dict[str, float]:
    """The reward TRL adds for `task`'s environment, as {the column's name: its weight}: the
    environment's class name and ENVIRONMENT_REWARD_WEIGHT when the class defines
    `get_reward` (TRL looks on the class of one environment the factory made); {} for an
    environment without one and for any task that is not an agent task."""
    if not is_agent_task(task):
        return {}
    cls = type(task.make_environment())
    if not callable(getattr(cls, "get_reward", None)):
        return {}
    return {cls.__name__: ENVIRONMENT_REWARD_WEIGHT}


async def _awaited(value: Any) -> Any:
    return await value


def episode_messages(completion: Any) -> list[Message] | None:
    """`completion` as a list of message dicts: a plain string is one assistant message; a
    message dict is a list of one; anything that is not messages gives None."""
    if isinstance(completion, str):
        return [{"role": "assistant", "content": completion}]
    if isinstance(completion, dict):
        completion = [completion]
    if not isinstance(completion, (list, tuple)) or not all(
        isinstance(m, dict) for m in completion
    ):
        return None
    return list(completion)


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _replies_after(messages: list[Message], k: int) -> int:
    """How many tool messages follow message `k` before the next other message."""
    count = 0
    for message in messages[k + 1 :]:
        if message.get("role") != "tool":
            break
        count += 1
    return count


def run_tool_call(tools: dict[str, Callable], call: Any) -> CallRecord:
    """One tool call run exactly as TRL 1.15's tool loop runs it (`GRPOTrainer.
    _tool_call_loop`): `tools[name](**arguments)`, and anything that raises (an unknown
    tool, arguments that are not a mapping, even a JSON string of one, a tool's own error)
    becomes the reply `{'error': '<text>'}` with TRL's text. Replay, evaluation and
    training therefore agree on every call. A call TRL's parser could not have produced (not
    a mapping) is an unsupported call, never an exception."""
    if not isinstance(call, dict) or call.get("type") != "function":
        kind = call.get("type") if isinstance(call, dict) else type(call).__name__
        name = call.get("name", "unknown") if isinstance(call, dict) else "unknown"
        name = name if isinstance(name, str) else repr(name)
        return CallRecord(name, None, str({"error": f"Unsupported tool call type: {kind}"}), False)
    function = call.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    label = name if isinstance(name, str) else repr(name)
    try:
        if name in tools:
            result = tools[name](**function["arguments"])
        else:
            raise ValueError(f"Tool {name} not found.")
    except Exception as err:  # the model's call, not our bug: it reads the error, as in TRL
        return CallRecord(label, arguments, str({"error": str(err)}), False)
    return CallRecord(label, arguments, str(result), True)


def _run_call(tools: dict[str, Callable], call: Any, index: int) -> CallRecord:
    """Replay one call (the episode's `index`-th) as TRL ran it (`run_tool_call`); past
    MAX_REPLAYED_CALLS calls none is run."""
    if index >= MAX_REPLAYED_CALLS:
        name = "unknown"
        error = f"More than {MAX_REPLAYED_CALLS} calls; this one was not run."
        return CallRecord(name, None, str({"error": error}), False)
    return run_tool_call(tools, call)
