"""ERL on an environment (tests/agent_env.py's GuessEnv) in several processes; used by
tests/test_multiprocess.py.

    accelerate launch --config_file configs/accelerate/ddp.yaml tests/multiprocess_agents.py MODEL OUT

Every first attempt is gated and every retry succeeds (the reward below), so every rank
reflects, runs retry episodes through TRL's tool loop, stores lessons and trains
internalized episodes. Each process writes OUT/rank<i>.pt: its world size, final
parameters, the erl/ metrics it logged and its reflection memory.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # agent_env, a user's module

from agent_env import GuessEnv, guess_dataset  # noqa: E402
from rank_results import save_rank_result  # noqa: E402

from pipeline import ERLConfig, ERLTrainer  # noqa: E402
from rewards import completion_text  # noqa: E402


def retries_succeed(completions, attempt=None, **kwargs) -> list[float]:
    """Under 1 by length for first attempts (below the gate), 5 and more for retries."""
    base = [(len(completion_text(c)) % 4) / 4 for c in completions]
    return base if attempt is None else [5 + b for b in base]


def train(model_dir: str, out: Path) -> None:
    args = ERLConfig(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=48,
        max_tool_calling_iterations=4,
        reflection_max_completion_length=16,
        reward_threshold=3.0,
        max_steps=2,
        learning_rate=1e-2,
        bf16=False,
        use_cpu=True,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = ERLTrainer(
        model=model_dir,
        args=args,
        train_dataset=guess_dataset(16, seed=1),
        reward_funcs=retries_succeed,
        environment_factory=GuessEnv,
    )
    trainer.train()
    save_rank_result(trainer, out)


if __name__ == "__main__":
    train(sys.argv[1], Path(sys.argv[2]))
