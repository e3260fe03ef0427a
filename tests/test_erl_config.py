"""ERLConfig: the seed's defaults and clear errors for bad values."""

from __future__ import annotations

import re

import pytest

from pipeline import ERLConfig


def make(**kwargs):
    return ERLConfig(output_dir="unused", use_cpu=True, bf16=False, **kwargs)


def test_seed_defaults():
    config = make()
    assert (config.reward_threshold, config.memory_size, config.memory_top_k) == (1.0, 50, 3)
    assert config.internalization_coef == 1.0
    assert config.enable_memory and config.enable_internalization
    # Chosen by measurement (docs/log.md, "memory_scope and loss_normalization").
    assert config.memory_scope == "same_prompt"
    for placeholder in ("{prompt}", "{attempt}", "{feedback}", "{reward:.2f}", "{memory}"):
        assert placeholder in config.reflection_system_prompt
    assert "{prompt}" in config.retry_system_prompt and "{reflection}" in config.retry_system_prompt


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"reflection_system_prompt": "Fix {answer}"}, r"reflection_system_prompt.*\['answer'\]"),
        ({"retry_system_prompt": "{prompt} {memory}"}, r"retry_system_prompt.*\['memory'\]"),
        ({"retry_system_prompt": "{prompt"}, "retry_system_prompt is not a valid template"),
        ({"memory_size": -1}, "memory_size must be >= 0, got -1"),
        ({"memory_scope": "nearest"}, "memory_scope must be one of"),
        ({"memory_top_k": -2}, "memory_top_k must be >= 0, got -2"),
        ({"internalization_coef": float("nan")}, "internalization_coef"),
        ({"reward_threshold": float("inf")}, "reward_threshold"),
        ({"reflection_max_completion_length": 0}, "reflection_max_completion_length"),
        ({"peak_memory_factor": 0.0}, "peak_memory_factor must be a finite number > 0, got 0.0"),
        ({"reflections_per_group": -1}, "reflections_per_group must be an integer >= 0, got -1"),
        ({"reflections_per_group": 1.5}, "reflections_per_group must be an integer >= 0, got 1.5"),
        (
            {"reflection_system_prompt": "{prompt} scored {reward:d}"},
            "reflection_system_prompt cannot be formatted",
        ),
        (
            {"retry_system_prompt": "{prompt:.2f} {reflection}"},
            "retry_system_prompt cannot be formatted",
        ),
    ],
)
def test_bad_values_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(**kwargs)


def test_reward_takes_a_float_format_spec():
    config = make(
        reflection_system_prompt="{prompt} {attempt} {feedback} {memory} scored {reward:.1f}"
    )
    assert config.reflection_system_prompt.format(
        prompt="", attempt="", feedback="", memory="", reward=0.25
    ).endswith("scored 0.2")


def test_literal_braces_are_allowed():
    config = make(retry_system_prompt='{prompt} -- JSON like {{"a": 1}} -- {reflection}')
    assert (
        config.retry_system_prompt.format(prompt="p", reflection="r")
        == 'p -- JSON like {"a": 1} -- r'
    )


def test_erl_config_keeps_at_most_15_options_of_its_own_the_seeds_among_them():
    """What earned its place: the seed's API, what a recipe sets, a measured default."""
    import dataclasses

    from trl import GRPOConfig

    own = {f.name for f in dataclasses.fields(ERLConfig)} - {
        f.name for f in dataclasses.fields(GRPOConfig)
    }
    seed = {"reward_threshold", "memory_size", "memory_top_k", "reflection_system_prompt"}
    seed |= {"retry_system_prompt", "internalization_coef", "enable_memory"}
    seed |= {"enable_internalization"}
    assert seed <= own and len(own) <= 15, sorted(own)


def test_the_removed_select_reflecting_hook_names_what_chooses_instead():
    """reflections_per_group is the one way to choose who reflects: the old hook is refused
    before any model is loaded, naming it."""
    from pipeline import ERLTrainer

    with pytest.raises(TypeError, match="select_reflecting= hook was removed: ERLConfig.reflec"):
        ERLTrainer(
            model="not-loaded",
            args=make(reflections_per_group=0),
            reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
            select_reflecting=lambda groups: [True] * len(groups),
        )


@pytest.mark.parametrize(
    "name, value, says",
    [
        ("reflect_per_group", 1, "removed: reflections_per_group chooses who reflects"),
        ("memory_lessons_only", True, "ReflectionMemory.from_config(args, lessons_only=True)"),
        ("train_retries", False, "removed: it measured nothing"),
        ("memory_budget", 1.2, "renamed: use peak_memory_factor"),
    ],
)
def test_a_removed_option_is_refused_with_what_became_of_it(name, value, says):
    with pytest.raises(ValueError, match=f"ERLConfig option {name} was .*{re.escape(says)}"):
        make(**{name: value})


def test_the_readmes_erlconfig_example_builds(tmp_path, monkeypatch):
    """README's "Swap GRPOTrainer for ERLTrainer" config, as written (the trainer itself
    needs a hub model; examples/quickstart.py runs the same swap on the tiny model)."""
    import ast
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("config = ERLConfig(", 1)[1]
    call = "ERLConfig(" + block[: block.index("\n)\n") + 2]
    tree = ast.parse(call, mode="eval")
    assert isinstance(tree.body, ast.Call) and tree.body.func.id == "ERLConfig"
    monkeypatch.chdir(tmp_path)
    kwargs = {k.arg: ast.literal_eval(k.value) for k in tree.body.keywords}
    config = make(**{k: v for k, v in kwargs.items() if k != "output_dir"})
    assert all(getattr(config, k) == v for k, v in kwargs.items() if k != "output_dir")
