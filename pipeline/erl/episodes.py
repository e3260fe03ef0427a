"""A retry's episode: with `tools=` or `environment_factory=`, ERLTrainer plays each retry
as TRL plays a first attempt, through TRL's own tool loop at its turn limit.

`RetryEpisodes` keeps what the retries own apart from TRL's first attempts: their
environments (a pool of their own, made once and reset per retry, so that the first
attempts' stay as their episodes left them) and the count of their tool calls. It also
renders the prompts a rollout sees, each with the tools its environment may call.
"""

from __future__ import annotations

import copy

from curriculum.tasks.base import prompt_key
from pipeline.erl.interface import Attempts, Generated
from pipeline.erl.prompts import task_prompt
from pipeline.erl.upstream import (
    first_turns,
    render_prompt,
    reset_arguments,
    rollout_tools,
    with_observation,
)


class RetryEpisodes:
    """The retries' episodes over an ERLTrainer with tools or environments."""

    def __init__(self, trainer) -> None:
        self.trainer = trainer
        # environment name (None: the one environment) -> the retries' environments
        self.pool: dict[str | None, list] = {}
        self.tool_calls = 0  # tool calls of retry episodes since the trainer last logged

    def play(self, rows: list[dict], prompts: list) -> Attempts:
        """One episode per row from `prompts` (the retry prompts) through TRL's tool loop,
        at its turn limit: in a fresh environment reset with the row (its text appended to
        the prompt, as TRL does), with the tools the row's rollout may call."""
        trainer = self.trainer
        environments = self._environments(rows)
        tasks = [task_prompt(row) for row in rows]
        prompts = copy.deepcopy(prompts)
        if environments is not None:
            for i, (environment, row) in enumerate(zip(environments, rows)):
                text = environment.reset(**reset_arguments(row, trainer._multi_environment))
                prompts[i] = with_observation(prompts[i], text)
                tasks[i] = with_observation(tasks[i], text)
        prompt_ids = self.prompt_ids(prompts, rows)
        length = trainer.max_completion_length
        completion_ids: list = [None] * len(rows)
        logprobs: list = [None] * len(rows)
        completions: list = [None] * len(rows)
        tool_masks: list = [None] * len(rows)
        # A turn after a tool result continues from up to `length` completion tokens and
        # may generate `length` more: the budget plans each call for both.
        for chunk in trainer._generation_calls(prompt_ids, length, span=2 * length):
            ids, lps = trainer._generate_single_turn([prompt_ids[i] for i in chunk], None, {}, 1)
            ids = [list(c) for c in ids]
            turns = first_turns(trainer, [prompt_ids[i] for i in chunk], ids)
            masks = None
            if trainer.tools:
                tools = [
                    rollout_tools(trainer._standalone_tools, _at(environments, i)) for i in chunk
                ]
                masks, turns, ids, lps = self._tool_loop(
                    [copy.deepcopy(prompts[i]) for i in chunk],
                    [prompt_ids[i] for i in chunk],
                    ids,
                    turns,
                    lps,
                    tools,
                )
            for j, i in enumerate(chunk):
                completion_ids[i], completions[i] = ids[j], turns[j]
                logprobs[i] = list(lps[j]) if lps is not None else None
                tool_masks[i] = list(masks[j]) if masks is not None else None
        texts = trainer.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        generated = Generated(prompt_ids, completion_ids, texts, logprobs)
        return Attempts(generated, tasks, completions, tool_masks, environments)

    def prompt_ids(self, prompts: list, rows: list[dict] | None = None) -> list[list[int]]:
        """The token ids TRL feeds the policy for each prompt: a prompt of a task's `rows`
        shows the tools its rollout may call (its environment's), one without rows (a
        reflection) shows none. Each distinct (prompt, tools) is rendered once."""
        names = (
            [self._environment_name(row) for row in rows]
            if rows is not None
            else [False] * len(prompts)  # no tools shown
        )
        rendered: dict[tuple, list[int]] = {}
        result = []
        for prompt, name in zip(prompts, names):
            key = (prompt_key(prompt), name)
            if key not in rendered:
                tools = None if name is False else self._tools_of(name)
                rendered[key] = render_prompt(self.trainer, prompt, tools)
            result.append(list(rendered[key]))
        return result

    def _tool_loop(self, prompts, prompt_ids, completion_ids, turns, logprobs, tools):
        """TRL's tool loop over these rollouts, with their tools in the per-rollout tool
        dicts it reads (the first attempts' are put back after)."""
        trainer = self.trainer
        saved = (
            getattr(trainer, "_sync_tool_dicts", None),
            getattr(trainer, "_async_tool_dicts", None),
        )
        trainer._sync_tool_dicts = [sync for sync, _ in tools]
        trainer._async_tool_dicts = [asynchronous for _, asynchronous in tools]
        try:
            masks, turns, completion_ids, logprobs, calls, *_ = trainer._tool_call_loop(
                prompts, prompt_ids, completion_ids, turns, logprobs, None, {}
            )
        finally:
            trainer._sync_tool_dicts, trainer._async_tool_dicts = saved
        self.tool_calls += calls
        return masks, turns, completion_ids, logprobs

    def _environments(self, rows: list[dict]) -> list | None:
        """One environment per row from the retries' own pool (None without a factory)."""
        factories = self.trainer.environment_factories
        if factories is None:
            return None
        handed: dict[str | None, int] = {}
        environments = []
        for row in rows:
            name = self._environment_name(row)
            pool = self.pool.setdefault(name, [])
            index = handed.get(name, 0)
            if index == len(pool):
                pool.append(factories[name]())
            handed[name] = index + 1
            environments.append(pool[index])
        return environments

    def _environment_name(self, row: dict):
        """The name of a row's environment (None: the one environment, or none), which
        decides the tools its rollout is shown."""
        return row.get("environment") if self.trainer._multi_environment else None

    def _tools_of(self, name) -> list:
        """The tools shown to a rollout of environment `name` (TRL's per-example schema)."""
        trainer = self.trainer
        if trainer.environment_factories is not None:
            return trainer._env_tools[name]
        return trainer.tools


def _at(items: list | None, index: int):
    """`items[index]`, or None without items."""
    return None if items is None else items[index]
