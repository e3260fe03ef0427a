"""ERLConfig: the seed's defaults and clear errors for bad values."""

from __future__ import annotations

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
    assert (config.memory_scope, config.loss_normalization) == ("same_prompt", "merged")
    for placeholder in ("{prompt}", "{attempt}", "{feedback}", "{reward:.2f}", "{memory}"):
        assert placeholder in config.reflection_system_prompt
    assert "{prompt}" in config.retry_system_prompt and "{reflection}" in config.retry_system_prompt


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"reflection_system_prompt": "Fix {answer}"}, r"reflection_system_prompt.*\['answer'\]"),
        ({"retry_system_prompt": "{prompt} {feedback}"}, r"retry_system_prompt.*\['feedback'\]"),
        ({"retry_system_prompt": "{prompt"}, "retry_system_prompt is not a valid template"),
        ({"memory_size": -1}, "memory_size must be >= 0, got -1"),
        ({"memory_top_k": -2}, "memory_top_k must be >= 0, got -2"),
        ({"internalization_coef": float("nan")}, "internalization_coef"),
        ({"reward_threshold": float("inf")}, "reward_threshold"),
        ({"reflection_max_completion_length": 0}, "reflection_max_completion_length"),
        ({"peak_memory_factor": 0.0}, "peak_memory_factor must be a finite number > 0, got 0.0"),
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


def test_the_old_name_of_the_peak_memory_factor_still_works_with_a_warning():
    """`memory_budget` was the peak-memory factor's name; the reflection memory keeps the
    `memory_*` options."""
    assert make().peak_memory_factor == 1.5
    with pytest.warns(FutureWarning, match="memory_budget is deprecated: use peak_memory_factor"):
        config = make(memory_budget=1.2)
    assert config.peak_memory_factor == 1.2 and config.memory_budget is None
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match="peak_memory_factor"):
        make(memory_budget=-1.0)
