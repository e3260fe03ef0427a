"""`pipeline.sdpo`: TRL's SDPOTrainer with the feedback on each rollout as the teacher's
context, the config the run gives it, and its teacher's start."""

from __future__ import annotations

import torch

from curriculum.tasks import get_task
from pipeline.sdpo.trainer import RUN_SETTINGS, FeedbackSDPOTrainer, sdpo_config


def test_the_config_takes_the_runs_options_and_the_projects_sdpo_settings(erl_args):
    args = erl_args(learning_rate=3e-4, per_device_train_batch_size=8, num_generations=4, seed=7)
    config = sdpo_config(args, success_threshold=0.8)
    for name in ("learning_rate", "per_device_train_batch_size", "num_generations", "seed",
                 "max_completion_length", "output_dir", "lr_scheduler_type", "loss_type"):  # fmt: skip
        assert getattr(config, name) == getattr(args, name), name
    assert config.success_reward_threshold == 0.8 and config.max_prompt_length is None
    assert {k: getattr(config, k) for k in RUN_SETTINGS} == RUN_SETTINGS
    assert config.steps_per_generation == args.steps_per_generation


def test_the_ema_teacher_starts_at_the_students_weights(tiny_model_dir, erl_args):
    """TRL loads the EMA teacher from the model's path; the run's student has trained since
    (a warm-up, earlier stages), so the teacher must start from the student's weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)  # trained since it was loaded
    trainer = FeedbackSDPOTrainer(
        model=model, args=sdpo_config(erl_args(), success_threshold=1.0),
        train_dataset=_dataset(), reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
    )  # fmt: skip
    teacher = trainer.teacher_model.state_dict()
    assert trainer.teacher_model is not trainer.model
    for name, value in trainer.model.state_dict().items():
        torch.testing.assert_close(teacher[name], value, rtol=0, atol=0)


def _dataset():
    from datasets import Dataset

    return Dataset.from_list(get_task("arithmetic").generate(1, 8, seed=0))


def test_the_teacher_reads_each_rollouts_own_feedback(tiny_model_dir, erl_args):
    """The per-rollout context: every teacher prompt without a successful sibling holds
    the feedback on its own completion (a feedback function that quotes the completion
    tells them apart); with a successful sibling it shows the solution and no feedback
    (environment_feedback_only_without_solution), and a success shows none."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = get_task("arithmetic").generate(1, 8, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    def quote(completions, **_):
        return [f"QUOTE[{c[0]['content']}]" for c in completions]

    def first_is_right(completions, **_):  # the first rollout of the second prompt succeeds
        return [1.0 if i == 4 else 0.0 for i in range(len(completions))]

    args = sdpo_config(erl_args(learning_rate=1e-4), success_threshold=1.0)
    trainer = FeedbackSDPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), args=args,
        train_dataset=Dataset.from_list(rows), reward_funcs=[first_is_right],
        processing_class=tokenizer, rollout_feedback=quote,
    )  # fmt: skip
    batch = trainer._prepare_training_batch([rows[0]] * 4 + [rows[1]] * 4)
    completions = tokenizer.batch_decode(batch["completion_ids"], skip_special_tokens=True)
    teachers = tokenizer.batch_decode(batch["teacher_input_ids"], skip_special_tokens=True)
    for i, (completion, teacher) in enumerate(zip(completions, teachers)):
        quotes = [c for c in completions if f"QUOTE[{c}]" in teacher]
        if i < 4:  # no sibling succeeded: the feedback on this very rollout, and only it
            assert f"QUOTE[{completion}]" in teacher and len(set(quotes)) == 1, (i, teacher)
        elif i == 4:  # the success itself: no teacher context at all
            assert "QUOTE[" not in teacher and "Correct solution" not in teacher
        else:  # a sibling succeeded: its solution, not this rollout's feedback
            assert "Correct solution" in teacher and "QUOTE[" not in teacher, (i, teacher)
    assert batch["self_distillation_mask"].tolist() == [1, 1, 1, 1, 0, 1, 1, 1]


def test_a_rollout_no_reward_function_scored_logs_nan_as_grpo_does(tiny_model_dir, erl_args):
    """The run's r1 reads each rollout's weighted reward: where every function returned None
    it is NaN (TRL's rule, which the controller leaves out of its mean), not 0."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def half_unscored(completions, **_):
        return [None if i % 2 else 1.0 for i in range(len(completions))]

    trainer = FeedbackSDPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        args=sdpo_config(erl_args(), success_threshold=1.0), train_dataset=_dataset(),
        reward_funcs=[half_unscored], processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
    )  # fmt: skip
    rows = get_task("arithmetic").generate(1, 4, seed=0)
    completions = [[{"role": "assistant", "content": "<answer>1</answer>"}]] * 4
    trainer.model.train()
    trainer._calculate_rewards(rows, [r["prompt"] for r in rows], completions, [[1]] * 4)
    logged = [reward for reward, _ in trainer.pop_first_attempts()]
    assert logged[0::2] == [1.0, 1.0] and all(r != r for r in logged[1::2]), logged
