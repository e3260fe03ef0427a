"""A TRL environment for the tool-calling tests, written as a user outside the project
writes one for `GRPOTrainer(environment_factory=GuessEnv)`: guess a number by asking.

Besides the environment: its own solutions (binary search, as chat messages) for the SFT
warm-up in `pipeline.models.tool_warmup`, and the dataset the trainer draws rows from.
"""

from __future__ import annotations

LOW, HIGH = 0, 9


class GuessEnv:
    """Find a hidden number from LOW to HIGH; each guess is answered higher, lower or correct.

    What TRL 1.15 makes of this class (`GRPOTrainer.__init__` and
    `_generate_and_score_completions`):
    - `reset(**row)` is called with the whole dataset row (`prompt` and `target`) before each
      episode; the string it returns is appended to the prompt's last message, as is.
    - Tools: `inspect.getmembers(type(env), predicate=inspect.isfunction)`, every public
      function but `reset` and `get_reward`, bound to the instance. So `guess` is the only
      tool. `feedback` is a property: a property object is not a function, so it is never
      offered to the model, and since TRL lists members on the class, not the instance,
      listing them does not evaluate it either.
    - `get_reward()` makes the environment a reward source (weight 1, named "GuessEnv").
    - Instances are pooled and reused: `reset` must clear everything an episode leaves.
    """

    def __init__(self) -> None:
        self.target: int | None = None
        self.guesses: list[int] = []

    def reset(self, target: int, **row) -> str:
        self.target = int(target)
        self.guesses = []
        return f"Guess the number from {LOW} to {HIGH} with the guess tool."

    def guess(self, number: int) -> str:
        """Guess the hidden number; the reply is higher, lower or correct.

        Args:
            number: Your guess, an integer from 0 to 9.
        """
        number = int(number)
        self.guesses.append(number)
        if number == self.target:
            return "correct"
        return "higher" if number < self.target else "lower"

    def get_reward(self) -> float:
        return 1.0 if self.target in self.guesses else 0.0

    @property
    def feedback(self) -> str:
        """One line on the episode, for a reader (or ERL's feedback), never a tool."""
        found = "found" if self.target in self.guesses else "not found"
        return f"Guesses {self.guesses}; the number was {self.target} ({found})."


def guess_rows(targets) -> list[dict]:
    """Dataset rows: an empty user turn (reset's text completes it) and the hidden number."""
    return [{"prompt": [{"role": "user", "content": ""}], "target": t} for t in targets]


def guess_dataset(n: int = 16, seed: int = 0):
    """`n` rows with targets drawn from LOW..HIGH, as a `datasets.Dataset`."""
    import random

    from datasets import Dataset

    rng = random.Random(seed)
    return Dataset.from_list(guess_rows(rng.randint(LOW, HIGH) for _ in range(n)))


def guess_solutions(targets=range(LOW, HIGH + 1)) -> list[list[dict]]:
    """The environment's own solutions: binary search for each target, once rounding the
    middle of an even range down and once up, played against `GuessEnv` itself.

    Each episode is what TRL would hold after a rollout: the user turn as TRL builds it
    (the row's prompt plus reset's text), one assistant turn per call (empty content and
    `tool_calls`), the tool's reply, and a closing plain-text answer."""
    episodes = []
    for round_up in (0, 1):
        for row in guess_rows(targets):
            env = GuessEnv()
            user = row["prompt"][-1]["content"] + env.reset(**row)
            messages = [{"role": "user", "content": user}]
            low, high = LOW, HIGH
            while True:
                number = (low + high + round_up) // 2
                reply = env.guess(number)
                call = {"name": "guess", "arguments": {"number": number}}
                messages += [
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"type": "function", "function": call}],
                    },
                    {"role": "tool", "name": "guess", "content": reply},
                ]
                if reply == "correct":
                    break
                low, high = (number + 1, high) if reply == "higher" else (low, number - 1)
            messages.append({"role": "assistant", "content": f"The number is {number}."})
            episodes.append(messages)
    return episodes
