"""Shared fixtures (the offline tiny model, small arithmetic datasets) and the session's
settings: one torch thread per test process, and a compile cache of Unsloth's per process.

`make test` runs `pytest -n 2 -m "not slow"`: two xdist workers, each on one core. The
tiny model's matrices are too small for a second thread to help, and two threads per
worker on two cores made the tests several times slower (OpenMP's threads wait on each
other's cores). Subprocesses inherit OMP_NUM_THREADS.
"""

from __future__ import annotations

import os
import tempfile

# Before torch is imported anywhere in this process (and inherited by every subprocess).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from rewards import completion_text  # noqa: E402


def pytest_configure(config):
    """One torch thread here too, and Unsloth's generated trainer written to this process's
    own folder: by default Unsloth writes `unsloth_compiled_cache/` into the working
    directory, which two workers (or a test run beside another checkout's) would rewrite
    at the same time. Child processes inherit the variable."""
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    if "UNSLOTH_COMPILE_LOCATION" not in os.environ:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        config._erl_unsloth_cache = tempfile.mkdtemp(prefix=f"erl-unsloth-cache-{worker}-")
        os.environ["UNSLOTH_COMPILE_LOCATION"] = config._erl_unsloth_cache


def pytest_unconfigure(config):
    import shutil

    folder = getattr(config, "_erl_unsloth_cache", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """The project's tiny Llama model + tokenizer, built once per test session."""
    from pipeline.models.tiny import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A tiny dataset on disk for the `dataset` family: 3 difficulties × 12 questions."""
    datasets = pytest.importorskip("datasets")
    folder = tmp_path_factory.mktemp("contract")
    records = [
        {"question": f"What is {a} + {b * d}?", "answer": str(a + b * d), "difficulty": d}
        for d in (1, 2, 3)
        for a in range(3)
        for b in range(4)
    ]
    datasets.Dataset.from_list(records).save_to_disk(str(folder / "tiny_dataset"))
    return folder


def family_config(name: str, data_dir) -> dict:
    """The config a built-in family needs to run offline here (`data_dir`: the fixture's)."""
    if name == "reasoning_gym":
        return {"dataset": "chain_sum"}
    if name == "dataset":
        return {"path": str(data_dir / "tiny_dataset")}
    return {}


@pytest.fixture
def arithmetic_dataset():
    """32 level-1 arithmetic rows (conversational prompts + answer/meta columns)."""
    from datasets import Dataset

    from curriculum.tasks import get_task

    return Dataset.from_list(get_task("arithmetic").generate(1, 32, seed=0))


UNGROUPED = (
    "--dist loadgroup did not group this test (pytest-xdist marks a grouped test's id with "
    "@group): this pytest and pytest-xdist do not work together; install the dev extras' pytest"
)
UNGROUPED_KEY = pytest.StashKey[bool]()


def pytest_runtest_setup(item):
    if item.stash.get(UNGROUPED_KEY, False):
        pytest.fail(UNGROUPED)


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own hook, which names the groups
def pytest_collection_modifyitems(config, items):
    """Skip `gpu` tests on machines without CUDA; fail a grouped test that `--dist
    loadgroup` did not group, since tests sharing a module fixture would then build it on
    two workers at once."""
    if getattr(config.option, "loadgroup", False):
        for item in items:
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
                item.stash[UNGROUPED_KEY] = True

    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def erl_args(tmp_path):
    """A factory of small CPU ERLConfigs: `erl_args(reward_threshold=2.0, ...)`; with
    `config_cls=GRPOConfig`, the base trainer's config from the same settings."""

    def make(config_cls=None, **overrides):
        from pipeline import ERLConfig

        settings = dict(
            output_dir=str(tmp_path / "out"),
            per_device_train_batch_size=8,
            num_generations=4,
            max_completion_length=12,
            reflection_max_completion_length=12,
            max_steps=2,
            learning_rate=1e-3,
            bf16=False,
            use_cpu=True,
            report_to=[],
            logging_steps=1,
            save_strategy="no",
            seed=0,
        )
        config_cls = config_cls or ERLConfig
        if config_cls is not ERLConfig:
            del settings["reflection_max_completion_length"]  # ERL's own option
        settings.update(overrides)
        return config_cls(**settings)

    return make


def length_reward(completions, **kwargs) -> list[float]:
    """A reward that varies between completions, so GRPO has a gradient to follow."""
    return [(len(completion_text(c)) % 4) / 3 for c in completions]


def alternating_reward():
    """y1 calls score 0 and y2 calls score 1: with every row gated, every retry succeeds."""
    calls = []

    def reward(prompts, completions, answer, **kwargs):
        calls.append(
            {"prompts": list(prompts), "answer": list(answer), "completions": list(completions)}
        )
        value = 0.0 if len(calls) % 2 == 1 else 1.0
        return [value] * len(completions)

    return reward, calls


def first_generation_batch(trainer):
    """One training generation batch and what ERLTrainer makes of it (GRPO's rows + ERL's)."""
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.train()
    return batch, trainer._generate_and_score_completions(batch)


# The tool model's warm-up: ~300 steps are what it takes to call `guess` in nearly every
# episode (100 steps left about a third of the episodes without a parsable call).
TOOL_MODEL_WARMUP = {"steps": 300, "lr": 3e-3, "batch_size": 8, "seed": 0}


@pytest.fixture(scope="session")
def tool_model_dir() -> str:
    """The tiny tool-calling model (`build_tiny_model(..., tool_calling=True)`) after an SFT
    warm-up on `GuessEnv`'s own solutions (tests/agent_env.py): in GRPO it calls `guess`
    about twice an episode and finds the number in about 4 episodes out of 10.

    The warm-up takes 15-25 s on one thread, so the folder is cached in
    `.cache/tool-model/<key>`: the key hashes the code that builds it and the library
    versions, and the stamps inside (`tiny_model.json`, `tool_warmup.json`) every setting.
    A file lock lets one xdist worker build it while the other waits, then reuses it."""
    import hashlib
    from importlib import metadata
    from pathlib import Path

    import agent_env
    from filelock import FileLock

    from curriculum.tasks.agent import environment_tools
    from pipeline.models import tiny, tool_warmup

    key = hashlib.sha256()
    for module in (tiny, tool_warmup, agent_env):
        key.update(Path(module.__file__).read_bytes())
    for package in ("torch", "transformers", "tokenizers", "trl"):
        key.update(metadata.version(package).encode())
    folder = Path(__file__).resolve().parents[1] / ".cache" / "tool-model" / key.hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder / ".lock")):
        base = tiny.build_tiny_model(str(folder / "base"), tool_calling=True)
        return tool_warmup.warm_up_on_episodes(
            base,
            agent_env.guess_solutions(),
            environment_tools(agent_env.GuessEnv()),
            str(folder / "warm"),
            **TOOL_MODEL_WARMUP,
        )
