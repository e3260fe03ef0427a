"""Gate a on an agent task: before any RL, does a retry episode with a reflection in its
system message solve more failed first episodes than a fresh episode of the same row?

    python bench/agent_gates.py --task frozenlake_agent --level 1 --n 400
    python bench/agent_gates.py --task hidden_code_agent --rule_seed 1 --level 1 --n 400

The bench's rule (bench/learning_gates.py) applied to episodes, with ERL's own prompts:
- the policy: the project's tool-calling tiny model after an SFT warm-up on the task's
  solved episodes (`--warmup_steps`), drawn from training seeds, none of them a probe row.
  A hidden-code task (a code shared by every row, `--rule_seed`) warms up on other codes
  instead, never the probe's (which would teach its answers), and with lessons: a wrong
  episode's reflection prompt -> the lesson its feedback gives ("Q=3 Z=8"), the retry
  episode with that lesson, or the raw feedback, in its system message (ERL's retry
  prompt) -> the solution, and plain episodes of other codes (`code_warmup`). So a lesson
  in the system message does not stop the model calling tools;
- first attempts: one sampled episode per probe row (`pipeline.evaluate.episodes`);
- for each failed one: the task's feedback and reward, a sampled reflection from ERL's
  reflection prompt (the episode turn by turn, memory empty as at step 1), then a retry
  episode with the reflection in its system message (`lesson_in_system`), as ERLTrainer
  retries an episode; beside it, the retry with the raw feedback as the lesson (no
  reflection) and a fresh episode of the same row;
- printed: each rate, each retry minus fresh, paired per failed row, with its 95%
  interval, and tool calls per episode of first attempts, retries and fresh episodes. Gate a passes when the retry after reflection is clearly above fresh (twice
  its rate and 0.1 above it, `learning_gates.probe_passes`).

Every sample is at temperature 1 with its own seed, as the arms sample.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from curriculum.tasks import get_task  # noqa: E402
from curriculum.tasks.agent import environment_tools, run_tool_call  # noqa: E402
from curriculum.tasks.base import prompt_key  # noqa: E402
from pipeline.compare.stats import paired  # noqa: E402
from pipeline.erl.prompts import (  # noqa: E402
    DEFAULT_REFLECTION_PROMPT,
    attempt_text,
    lesson_in_system,
    lesson_text,
    memory_text,
    reflection_prompt,
)
from pipeline.models.tiny import build_tiny_model  # noqa: E402
from pipeline.models.tool_warmup import warm_up_on_episodes  # noqa: E402
from rewards import build_feedback_func, build_reward_funcs  # noqa: E402

PROBE_SEED = 500_000  # training seeds, as bench/learning_gates.py's probe
WARM_SEED = 900_000  # the run's warm-up seeds (pipeline.run.warmup)
WEIGHTS = {"correctness": 0.7, "milestones": 0.2, "format": 0.1}  # the agent recipe's
# The retry's system message as this gate measured it (docs/results.md): the lesson or the
# raw feedback alone. (Since issue 48 the product's default retry also shows the attempt's
# feedback beside the lesson.)
LESSON_RETRY = "{prompt}\n\nAdvice from a previous attempt: {reflection}"


def warm_model(
    task,
    level: int,
    steps: int,
    examples: int,
    probe_keys: set[str],
    lr: float = 3e-3,
    copy_steps: int = 0,
) -> tuple[str, int]:
    """The tiny tool model warmed up on `examples` solved episodes at `level` whose prompts
    are not probe prompts (a hidden-code task: `code_warmup`, after `copy_steps` on its
    copying episodes alone); cached by every setting. Returns the folder and the rows left
    out."""
    untooled: list[list[dict]] = []
    copies: list[list[dict]] = []
    if hasattr(task, "code"):  # a code shared by every row: warm up on other codes
        copies, episodes, untooled = code_warmup(task, level, examples)
        left_out = 0
    else:
        rows = task.generate(level, examples, seed=WARM_SEED)
        kept = [row for row in rows if prompt_key(row["prompt"]) not in probe_keys]
        episodes = [task.start(row)[1] + task.reference(row) for row in kept]
        left_out = len(rows) - len(kept)
    tools = environment_tools(task.make_environment())
    key = hashlib.sha256(
        json.dumps([task.name, vars(task.config), level, steps, examples, sorted(probe_keys),
                    lr, copy_steps], default=str).encode()
    ).hexdigest()[:16]  # fmt: skip
    cache = REPO / ".cache" / "bench-agent" / key
    start = build_tiny_model(str(cache / "base"), tool_calling=True)
    if copy_steps:  # copying comes through a phase change, alone first (bench/copy_phase.py)
        start = warm_up_on_episodes(
            start, copies, tools, str(cache / "copy"), steps=copy_steps, lr=lr
        )
    folder = warm_up_on_episodes(
        start, episodes, tools, str(cache / "warm"), steps=steps, lr=lr, untooled=untooled
    )
    return folder, left_out


def entered(task, row, digits: str) -> list[dict]:
    """An episode that enters each letter of `row` with `digits`, answered by the
    environment as TRL's tool loop answers it, then closes."""
    environment, _ = task.start(row)
    tools = {tool.__name__: tool for tool in environment_tools(environment)}
    messages = []
    for letter, digit in zip(task.meta(row)["symbols"], digits):
        arguments = {"entry": f"{letter}={digit}"}
        call = {"type": "function", "function": {"name": "enter", "arguments": arguments}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        reply = run_tool_call(tools, call).reply
        messages.append({"role": "tool", "name": "enter", "content": reply})
    messages.append({"role": "assistant", "content": "Every letter is entered."})
    return messages


def code_warmup(task, level: int, examples: int) -> tuple[list, list, list]:
    """Warm-up conversations of a hidden-code agent task on other codes than `task`'s:
    for each of `examples` rows of a code of its own, a wrong episode (every digit wrong),
    its reflection prompt -> the lesson the feedback gives ("Q=3 Z=8", untooled, as ERL
    renders a reflection), and the retry episode from that lesson in the system message ->
    the solution; for every other row, the retry reads the raw feedback instead; and one
    plain solved episode (the prior: any letter, any digit). Returns (copies, episodes,
    untooled): `copies` are the retry episodes whose lesson is the row's letters or the
    whole code (a rulebook), for a copying phase first. No row is of `task`'s code."""
    rng = random.Random(WARM_SEED)
    feedback_func = build_feedback_func(task, WEIGHTS)  # reads only the row, not the code
    reward_funcs, weights = build_reward_funcs(task, WEIGHTS)
    copies, episodes, untooled = [], [], []
    for i in range(examples):
        other = type(task)(rule_seed=rng.randrange(10**9), split="all")
        if other.rule_text(level) == task.rule_text(level):
            continue
        row = other.generate(level, 1, seed=rng.randrange(10**6))[0]
        wrong = "".join(rng.choice([d for d in "0123456789" if d != a]) for a in row["answer"])
        first = entered(other, row, wrong)
        columns = {k: [row[k]] for k in ("task", "level", "answer", "meta")}
        feedback = feedback_func(completions=[first], **columns)[0]
        reward = sum(
            w * f(completions=[first], **columns)[0] for f, w in zip(reward_funcs, weights)
        )
        symbols = other.meta(row)["symbols"]
        lesson = " ".join(dict.fromkeys(f"{s}={d}" for s, d in zip(symbols, row["answer"])))
        _, prompt = other.start(row)
        reflect = reflection_prompt(
            prompt, DEFAULT_REFLECTION_PROMPT, attempt=attempt_text(first, 4000)[0],
            feedback=feedback, reward=reward, memory=memory_text([]),
        )  # fmt: skip
        untooled.append([*reflect, {"role": "assistant", "content": lesson}])
        hint = lesson if i % 2 == 0 else feedback
        episodes.append(lesson_in_system(prompt, LESSON_RETRY, hint) + other.reference(row))
        plain = other.generate(level, 1, seed=rng.randrange(10**6))[0]
        episodes.append(other.start(plain)[1] + other.reference(plain))
        rulebook = lesson if i % 2 == 0 else other.rule_text(level)
        copies.append(lesson_in_system(prompt, LESSON_RETRY, rulebook) + other.reference(row))
    return copies, episodes, untooled


def tool_calls(episode) -> int:
    """The tool calls an episode made."""
    return sum(len(m.get("tool_calls") or []) for m in episode if m.get("role") == "assistant")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="frozenlake_agent")
    parser.add_argument("--rule_seed", type=int, default=None,
                        help="a hidden-code task's code (its task config)")  # fmt: skip
    parser.add_argument("--level", type=int, default=1)
    parser.add_argument("--n", type=int, default=400, help="probe rows")
    parser.add_argument("--warmup_steps", type=int, default=300)
    parser.add_argument("--warmup_examples", type=int, default=400)
    parser.add_argument("--warmup_lr", type=float, default=3e-3)
    parser.add_argument("--copy_steps", type=int, default=0,
                        help="a code task's copying phase before the warm-up")  # fmt: skip
    parser.add_argument("--budget", type=int, default=256, help="an episode's tokens")
    parser.add_argument("--reflection_tokens", type=int, default=48)
    args = parser.parse_args()

    from pipeline.evaluate.episodes import play_episodes
    from pipeline.evaluate.first_attempts import generate_completions, load_for_evaluation

    config = {} if args.rule_seed is None else {"rule_seed": args.rule_seed}
    task = get_task(args.task, **config)
    rows = task.generate(args.level, args.n, seed=PROBE_SEED)
    folder, left_out = warm_model(
        task, args.level, args.warmup_steps, args.warmup_examples,
        {prompt_key(row["prompt"]) for row in rows}, lr=args.warmup_lr,
        copy_steps=args.copy_steps,
    )  # fmt: skip
    model, tokenizer = load_for_evaluation(folder)
    reward_funcs, weights = build_reward_funcs(task, WEIGHTS)
    feedback_func = build_feedback_func(task, WEIGHTS)

    def episodes(rows_, seed):
        return play_episodes(
            model, tokenizer, task, rows_, max_completion_length=args.budget,
            do_sample=True, seed=seed, batch_size=64, progress=False,
        )  # fmt: skip

    def solved(rows_, episodes_) -> list[float]:
        return [float(task.evaluate(r, e).solved) for r, e in zip(rows_, episodes_)]

    def with_lessons(rows_, lessons):
        """The rows with their prompts carrying `lessons` as ERL's retries carry them."""
        return [
            {**r, "prompt": lesson_in_system(r["prompt"], LESSON_RETRY, lesson)}
            for r, lesson in zip(rows_, lessons)
        ]

    first = episodes(rows, 1)
    wrong = [i for i, ok in enumerate(solved(rows, first)) if not ok]
    w_rows, w_first = [rows[i] for i in wrong], [first[i] for i in wrong]
    columns = {k: [r[k] for r in w_rows] for k in ("task", "level", "answer", "meta")}
    feedback = feedback_func(completions=w_first, **columns)
    rewards = [0.0] * len(w_rows)
    for func, weight in zip(reward_funcs, weights):
        rewards = [r + weight * v for r, v in zip(rewards, func(completions=w_first, **columns))]
    prompts = [
        reflection_prompt(
            task.start(r)[1], DEFAULT_REFLECTION_PROMPT, attempt=attempt_text(e, 4000)[0],
            feedback=f, reward=x, memory=memory_text([]),
        )
        for r, e, f, x in zip(w_rows, w_first, feedback, rewards)
    ]  # fmt: skip
    reflections = generate_completions(
        model, tokenizer, prompts, max_new_tokens=args.reflection_tokens, do_sample=True,
        seed=2, batch_size=64, progress=False,
    )  # fmt: skip
    retry_episodes = episodes(with_lessons(w_rows, [lesson_text(t) for t in reflections]), 3)
    fresh_episodes = episodes(w_rows, 4)
    raw_episodes = episodes(with_lessons(w_rows, feedback), 5)
    retried, fresh = solved(w_rows, retry_episodes), solved(w_rows, fresh_episodes)
    raw = solved(w_rows, raw_episodes)

    out = {
        "task": task.name,
        "task_config": {k: str(v) for k, v in vars(task.config).items()},
        "level": args.level,
        "probe_rows": len(rows),
        "warm_checkpoint": folder,  # the policy the gate probed (what pipeline.compare starts from)
        "warmup_rows_left_out_as_probe_rows": left_out,
        "first_attempt_success": 1 - len(wrong) / len(rows),
        "failed_first_attempts": len(wrong),
        "resample_success": statistics.fmean(fresh) if fresh else float("nan"),
    }
    for name, played in (("first_attempts", first), ("retries_after_reflection", retry_episodes),
                         ("retries_from_raw_feedback", raw_episodes), ("fresh", fresh_episodes)):  # fmt: skip
        out[f"tool_calls_per_episode_{name}"] = (
            statistics.fmean(tool_calls(e) for e in played) if played else float("nan")
        )
    for name, values in (("retry_success_after_reflection", retried),
                         ("retry_success_from_raw_feedback", raw)):  # fmt: skip
        _, diff = paired(values, fresh)
        out[name] = statistics.fmean(values) if values else float("nan")
        out[f"{name}_minus_fresh"] = diff.mean
        out[f"{name}_minus_fresh_95"] = [diff.low, diff.high]
    fixed, again = out["retry_success_after_reflection"], out["resample_success"]
    out["gate_a_passes"] = fixed >= max(2 * again, again + 0.1)
    for i in range(min(2, len(w_rows))):
        print(f"  feedback: {feedback[i]!r}\n  reflection: {reflections[i]!r}")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
