"""bench/learning.py: every arm of a comparison trains on one schedule and optimizer (at its
own peak learning rate), a run's cache key changes with anything its result depends on
(issue 18), and the verdict compares each candidate with the better GRPO and SDPO arm
(issue 26). The statistics and SDPO's per-rollout feedback are the product's
(tests/test_compare_stats.py, tests/test_sdpo.py)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

learning = pytest.importorskip("learning")  # imports learning_arms (the backend) first
arms = sys.modules["learning_arms"]
report = sys.modules["learning_report"]
from pipeline.erl.prompts import template_fields  # noqa: E402

PRESETS = [
    ["--task", "hidden_rule"],
    ["--task", "arithmetic"],
    ["--stop", "erl=10"],
    ["--task", "hidden_code"],
]


def lr_sequence(args, steps: int) -> list[float]:
    """The learning rates Trainer's own optimizer and scheduler give over `steps` steps."""
    import torch
    from transformers import Trainer, get_scheduler

    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    optimizer = cls([torch.nn.Parameter(torch.zeros(1))], **kwargs)
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=args.get_warmup_steps(args.max_steps),
        num_training_steps=args.max_steps,
        scheduler_specific_kwargs=args.lr_scheduler_kwargs or {},
    )
    out = []
    for _ in range(steps):
        out.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return out


@pytest.mark.parametrize(
    "options", PRESETS, ids=["hidden_rule", "arithmetic", "stopped", "hidden_code"]
)
def test_every_arm_gets_the_same_schedule_and_optimizer(options):
    """The defect this guards against: GRPO ran max_steps 300 and ERL 100 on transformers'
    default linear decay, so ERL's learning rate was 0 at step 100 and GRPO's 2/3 of peak.
    Only the peak is the arm's own (its swept best): the schedule's shape is shared."""
    from transformers import Trainer

    _, s = learning.parse_options(options)
    configs = {name: arms.arm_config(name, s, "unused", 0) for name in arms.ALL_ARMS}
    reference = configs["grpo"]
    assert reference.max_steps == s.steps  # the horizon is --steps for every arm
    shape = [lr / reference.learning_rate for lr in lr_sequence(reference, s.steps)]
    for name, config in configs.items():
        assert config.learning_rate == s.learning_rate(name), name
        for field in arms.SCHEDULE_FIELDS:
            assert getattr(config, field) == getattr(reference, field), (name, field)
        ours = Trainer.get_optimizer_cls_and_kwargs(config)
        theirs = Trainer.get_optimizer_cls_and_kwargs(reference)
        assert ours[0] == theirs[0], name
        assert {k: v for k, v in ours[1].items() if k != "lr"} == {
            k: v for k, v in theirs[1].items() if k != "lr"
        }, name
        lrs = lr_sequence(config, s.steps)
        assert [lr / config.learning_rate for lr in lrs] == pytest.approx(shape), name
    # A stopped arm is cut off on the shared schedule, not given a shorter one.
    assert s.stop_at("erl") == (10 if "--stop" in options else s.steps)


def test_each_arm_takes_its_own_learning_rate_or_its_swept_parents():
    _, s = learning.parse_options(["--lr", "grpo=1e-4,grpo_matched=2e-4,erl=3e-4,erl_paper=6e-4,"
                                   "sdpo_mixed=4e-4,sdpo_pure=5e-4,erl_shared=7e-4,"
                                   "erl_defaults=8e-4"])  # fmt: skip
    assert [s.learning_rate(a) for a in arms.ARMS] == [1e-4, 2e-4, 3e-4, 6e-4, 4e-4, 5e-4, 3e-4]
    assert s.learning_rate("erl_no_memory") == 3e-4  # an ablation takes ERL's (lr_from)
    assert s.learning_rate("raw_feedback_retry") == 3e-4  # ERL's until swept itself
    assert s.learning_rate("sdpo_rule") == 4e-4
    _, one = learning.parse_options(["--lr", "7e-4", "--methods", "grpo,erl"])
    assert {one.learning_rate(a) for a in arms.ALL_ARMS} == {7e-4}
    for bad, words in (("erl=1e-3", "gives arm 'grpo' no learning rate"),
                       ("grpo=fast", "is not RATE or ARM=RATE"),
                       ("gpro=1e-3", "unknown arm 'gpro'")):  # fmt: skip
        with pytest.raises(SystemExit):
            learning.parse_options(["--lr", bad])
        with pytest.raises(ValueError, match=words):
            learning.rule_settings(s, 1, 11, bad).learning_rate("grpo")


def test_the_sweep_tunes_on_rules_and_seeds_the_report_does_not_use():
    opts, s = learning.parse_options(["--sweep", "1e-4,3e-4,1e-3"])
    # an arm the preset has no rate for yet is swept (the refusal names this command)
    learning.parse_options(["--sweep", "1e-4,3e-4,1e-3", "--lr", "grpo=1e-4", "--methods",
                            "grpo,erl_paper"])  # fmt: skip
    assert not set(opts.tuning_rules) & set(opts.rules) and (s.level, s.rule_seed) == (1, 0)
    assert not set(opts.sweep_seeds) & set(range(learning.PRESETS["hidden_rule"]["seeds"]))
    for bad in (["--sweep", "1e-4,3e-4"], ["--sweep", "1e-4,3e-4,1e-3", "--sweep_seeds", "0,5"],
                ["--sweep", "1e-4,3e-4,1e-3", "--tuning_rules", "1:11"]):  # fmt: skip
        with pytest.raises(SystemExit):
            learning.parse_options(bad)


def test_training_rows_never_come_from_the_held_out_seeds():
    _, s = learning.parse_options([])
    task = arms.make_task(s)
    assert all(task.meta(r)["split"] == "train" for r in arms.train_rows(task, s, 8))
    with pytest.raises(ValueError, match="would reach the held-out seeds"):
        arms.train_rows(task, s, 9)


def test_the_trainers_build_the_same_scheduler(tiny_model_dir, arithmetic_dataset):
    """The real trainers (ERLTrainer for grpo and erl, TRL's SDPOTrainer): their own
    create_optimizer_and_scheduler gives the same learning rates, step for step."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, s = learning.parse_options(
        ["--steps", "12", "--lr_warmup_steps", "3", "--lr_scheduler", "linear", "--lr", "5e-4"]
    )
    task = arms.make_task(s)
    reward_funcs, weights, feedback = arms.make_funcs(task, s)
    rows = Dataset.from_list(arms.train_rows(task, s, 0))
    sequences = {}
    for name in arms.ARMS:
        args = arms.arm_config(name, s, "unused", 0, reward_weights=weights)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
        if arms.ALL_ARMS[name].trainer == "sdpo":
            trainer = arms.counting_sdpo()(
                model=model, args=args, train_dataset=rows, reward_funcs=reward_funcs,
                processing_class=tokenizer,
            )  # fmt: skip
        else:
            trainer = arms.CountingERLTrainer(
                model=model, args=args, train_dataset=rows, reward_funcs=reward_funcs,
                feedback_func=feedback, processing_class=tokenizer,
            )  # fmt: skip
        trainer.create_optimizer_and_scheduler(num_training_steps=args.max_steps)
        lrs = []
        for _ in range(args.max_steps):
            lrs.append(trainer.lr_scheduler.get_last_lr()[0])
            trainer.optimizer.step()
            trainer.lr_scheduler.step()
        sequences[name] = (type(trainer.optimizer).__name__, trainer.optimizer.defaults, lrs)
    lr = s.learning_rate("grpo")
    assert sequences["grpo"][2][:4] == pytest.approx([0.0, lr / 3, 2 * lr / 3, lr])
    for name, sequence in sequences.items():
        assert sequence == sequences["grpo"], name


def test_the_run_key_changes_with_what_decides_a_result(monkeypatch):
    _, s = learning.parse_options([])
    task = arms.make_task(s)
    rows = arms.train_rows(task, s, 0)

    def key(name="erl", settings=s, seed=0, warm="w", data=rows, extra=None):
        config = arms.arm_config(name, settings, "unused", seed)
        return arms.run_key(name, seed, settings, warm, config, data, extra)

    base = key()
    assert key() == base  # deterministic, whatever the output folder
    assert arms.run_key("erl", 0, s, "w", arms.arm_config("erl", s, "elsewhere", 0), rows) == base
    changed = {
        "schedule": key(settings=dataclasses.replace(s, lr_scheduler="linear")),
        "another arm's stop": key(settings=dataclasses.replace(s, stop="erl=5")),
        "seed": key(seed=1),
        "warm checkpoint": key(warm="v"),
        "rows": key(data=rows[1:]),
        "extra": key(extra={"reward_model": "x"}),
        "learning rate": key(settings=dataclasses.replace(s, lr="1e-3")),
        "operands": key(settings=dataclasses.replace(s, max_operand=9)),
        "promotion": key(settings=dataclasses.replace(s, promote=0.6)),
        "promotion window": key(settings=dataclasses.replace(s, promote_window=64)),
    }
    monkeypatch.setattr(arms, "REFLECTION_TEMPLATE", arms.REFLECTION_TEMPLATE + " ")
    changed["template"] = key()
    monkeypatch.undo()
    monkeypatch.setitem(arms.ALL_ARMS, "erl", arms.arm(internalization_coef=2.0))
    changed["the arm's overrides"] = key()
    monkeypatch.undo()
    monkeypatch.setitem(arms.REWARDS, s.reward, {"correctness": 0.5, "format": 0.5})
    changed["reward spec"] = key()
    monkeypatch.undo()
    monkeypatch.setattr(arms, "BENCH_SCHEMA", arms.BENCH_SCHEMA + 1)
    changed["schema"] = key()
    monkeypatch.undo()
    for what, value in changed.items():
        assert value != base, what
    # The unrelated stop or learning rate of another arm leaves this arm's key alone.
    assert key(name="grpo", settings=dataclasses.replace(s, stop="erl=5")) == key(name="grpo")
    own = dataclasses.replace(s, lr="grpo=5e-4,erl=1e-3")
    assert key(name="grpo", settings=own) == key(
        name="grpo", settings=dataclasses.replace(s, lr="grpo=5e-4,erl=2e-3")
    )
    assert key(name="grpo", settings=own) == key(
        name="grpo", settings=dataclasses.replace(s, lr="5e-4")
    )
    assert key(name="erl", settings=own) != key(
        name="erl", settings=dataclasses.replace(s, lr="5e-4")
    )


def test_a_run_stops_where_it_is_promoted_and_is_evaluated_there(tiny_model_dir, tmp_path):
    """--promote: a run ends at the first step whose rolling r1 over --window first attempts
    reaches the threshold (the report's `crossing` finds the same step), with a held-out
    evaluation there; without it, the run trains to --steps."""
    small = ["--task", "hidden_code", "--rules", "1:1", "--batch", "8", "--generations", "4"]
    small += ["--steps", "3", "--eval_every", "10", "--window", "16"]
    _, s = learning.parse_options([*small, "--promote", "-1"])  # any two steps' mean passes
    assert (s.promote, s.promote_window) == (-1.0, 16)
    run = arms.train_one("grpo", 0, Path(tiny_model_dir), s, tmp_path / "promoted")
    assert [r["step"] for r in run["steps"]] == [1, 2]
    assert [e["step"] for e in run["evals"]] == [2]
    assert report.crossing(run, s.promote, s.promote_window)["step"] == 2
    plain = dataclasses.replace(s, promote=0.0)
    run = arms.train_one("grpo", 0, Path(tiny_model_dir), plain, tmp_path / "plain")
    assert [r["step"] for r in run["steps"]] == [1, 2, 3]


def _run(seed, success, tokens=1000):
    return {"seed": seed, "steps": [{"step": 60, "tokens": tokens, "seconds": 1.0, "r1": [0.0]}],
            "evals": [{"step": 60, "tokens": tokens, "success": success}],
            "start": {"success": 0.0}, "retries": []}  # fmt: skip


def test_the_verdict_compares_erl_with_the_better_grpo_and_sdpo_arm(capsys):
    """grpo_matched is the stronger GRPO arm here: ERL beats plain GRPO on every seed but
    not grpo_matched, so the verdict must say it does not beat GRPO."""
    held = {"grpo": [0.1, 0.2, 0.1, 0.2], "grpo_matched": [0.5, 0.6, 0.5, 0.6],
            "erl": [0.5, 0.7, 0.4, 0.6], "sdpo_mixed": [0.0, 0.1, 0.0, 0.1],
            "sdpo_pure": [0.1, 0.1, 0.2, 0.2]}  # fmt: skip
    pooled = {m: held for m in report.MEASURES}
    verdict = report.verdict(list(held), pooled)
    assert verdict["erl"]["beats_grpo_equal_steps"] is False
    assert verdict["erl"]["beats_sdpo_equal_tokens"] is True
    out = capsys.readouterr().out
    assert "erl - grpo_matched (the better GRPO arm)" in out
    assert "erl - sdpo_pure (the better SDPO arm)" in out
    assert "erl_beats_grpo_equal_steps: false" in out


def test_the_probe_pairs_each_failed_attempt_with_a_fresh_sample(tiny_model_dir):
    """Gate a on a real (untrained) tiny model: its figures, the paired difference and its
    interval, on distinct training prompts of the rule."""
    gates = sys.modules["learning_gates"]
    _, s = learning.parse_options(["--rules", "1:11"])
    probe = gates.probe(Path(tiny_model_dir), s, 16, tokens=(6, 4), temperature=0.7)
    assert probe["failed_first_attempts"] == round(16 * (1 - probe["first_attempt_success"]))
    diff = probe["retry_success_after_reflection"] - probe["resample_success"]
    assert probe["retry_success_after_reflection_minus_fresh"] == pytest.approx(diff)
    low, high = (probe[f"retry_success_after_reflection_minus_fresh_{x}"] for x in ("low", "high"))
    assert not low > diff > high  # nan when every difference is 0, else an interval around it
    for name in ("sdpo_teacher_success", "retry_success_with_the_rule"):
        assert f"{name}_minus_fresh_low" in probe
    rows = gates.probe_rows(arms.make_task(s), s, 24)
    assert len({r["prompt"][-1]["content"] for r in rows}) == 24
    assert all(arms.make_task(s).meta(r)["split"] == "train" for r in rows)


def test_the_probe_of_a_code_reads_the_raw_feedback_and_the_whole_code(tiny_model_dir):
    """Gate a on hidden_code (issue 43): the same figures as hidden_rule's, with the retry
    from the raw feedback, SDPO's teacher and the retry given the whole code."""
    gates = sys.modules["learning_gates"]
    _, s = learning.parse_options(["--task", "hidden_code", "--rules", "1:1"])
    probe = gates.probe(Path(tiny_model_dir), s, 12, tokens=(6, 4), temperature=0.7)
    assert probe["failed_first_attempts"] == 12  # the untrained model writes no code
    for name in ("retry_success_from_raw_feedback", "sdpo_teacher_success",
                 "retry_success_with_the_rule"):  # fmt: skip
        assert 0.0 <= probe[name] <= 1.0 and f"{name}_minus_fresh" in probe
    assert probe["reflections_stating_the_rule"] == 0.0
    task = arms.make_task(s)
    assert arms.states_the_rule(task, 1, task.rule_text(1).split(" ")[0])
    assert not arms.states_the_rule(task, 1, "no letters")


def _synthetic_run(
    seed: int, end: float, tokens_per_step: int, processed_per_step: int = 0
) -> dict:
    """A recorded run: 20 steps whose r1 and held-out success rise linearly to `end`; it
    processes `processed_per_step` tokens a step (4x what it generates by default)."""
    processed = processed_per_step or 4 * tokens_per_step
    steps = [{"step": i, "r1": [end * i / 20] * 8, "tokens": tokens_per_step * i,
              "processed": processed * i, "seconds": 0.1 * i} for i in range(1, 21)]  # fmt: skip
    evals = [{"step": i, "tokens": tokens_per_step * i, "processed": processed * i,
              "success": end * i / 20, "train_success": end * i / 20} for i in (10, 20)]  # fmt: skip
    return {"seed": seed, "steps": steps, "evals": evals, "retries": [], "memory_tail": []}


def test_the_report_prints_per_rule_and_pooled_intervals_and_the_verdict(tmp_path, capsys):
    """Two rules, every reported arm, 3 seeds: ERL ends 0.2 above both GRPO arms on every
    seed at equal steps, but at GRPO's token total it is where GRPO is (it generates twice
    the tokens a step), and at GRPO's processed total below it (it reads 4x GRPO's tokens),
    so the verdict must say it beats GRPO at equal steps only."""
    opts, s = learning.parse_options(["--steps", "20", "--seeds", "3"])
    ends = {"grpo": 0.4, "grpo_matched": 0.45, "erl": 0.65, "sdpo_mixed": 0.2, "sdpo_pure": 0.1}
    tokens = {"grpo": 100, "grpo_matched": 200, "erl": 200, "sdpo_mixed": 100, "sdpo_pure": 100}
    processed = {"erl": 1600}  # the others read 4x what they generate
    results, settings = {}, {}
    for level, rule_seed in opts.rules[:2]:
        label = f"{level}:{rule_seed}"
        settings[label] = learning.rule_settings(s, level, rule_seed)
        results[label] = {
            arm: [_synthetic_run(seed, end + 0.01 * seed, tokens[arm], processed.get(arm, 0))
                  | {"start": {
                "success": 0.0, "train_success": 0.0}} for seed in range(3)]
            for arm, end in ends.items()
        }  # fmt: skip
        for run in results[label]["erl"]:  # the rule itself, and a repeated term
            run["memory"] = [{"prompt": "3#4 = ?", "reflection": text, "reads": 2,
                              "successes": 1} for text in ("a#b = a+b+5", "a#b = = = = = =")]  # fmt: skip
    verdict = report.report(results, settings, opts, tmp_path, "synthetic")
    out = capsys.readouterr().out
    assert "erl                      rule 1:11 memory entries/degenerate/share stating" in out
    assert "per seed: 2/1/0.50 2/1/0.50 2/1/0.50" in out
    assert "memory_degenerate_entries[erl, 1:11]: 3" in out
    assert (
        "memory_rule_share[erl, 1:11]: 0.500" in out and "memory_rule_share[erl, 1:3]: 0.000" in out
    )
    assert "memory_rule_share[grpo" not in out  # no memory recorded: no line
    # No run reaches 0.6 over 256 attempts in 20 steps: the totals' ratio, marked as a bound.
    assert "erl_grpo_tokens_ratio: 2.000 [2.000, 2.000] (a bound" in out
    assert "erl_grpo_steps_ratio: 1.000" in out
    assert verdict["erl"] == {"beats_grpo_equal_steps": True, "beats_sdpo_equal_steps": True,
                              "beats_grpo_equal_tokens": False, "beats_sdpo_equal_tokens": True,
                              "beats_grpo_equal_processed": False,
                              "beats_sdpo_equal_processed": False}  # fmt: skip
    assert "erl_tokens_per_step_over_grpo: 2.00" in out
    assert "erl_processed_per_step_over_grpo: 4.00" in out
    assert "erl_grpo_processed_ratio: 4.000 [4.000, 4.000] (a bound" in out
    assert "erl_beats_grpo_equal_processed: false" in out
    assert "erl_minus_erl" not in out  # the variants against erl: none ran here
    assert "erl - grpo_matched equal_steps pooled: +0.200" in out
    assert "=== rule 1:11: a#b = a+b+5 ===" in out and "=== rule 1:3: a#b = a+b+1 ===" in out
    assert "heldout_success_equal_steps[grpo]: 0.410" in out
    assert (tmp_path / "learning_curves.png").exists()


def test_the_sweep_report_picks_each_arms_best_rate(capsys):
    opts, s = learning.parse_options(["--sweep", "1e-4,3e-4,1e-3", "--steps", "20",
                                      "--methods", "grpo,erl"])  # fmt: skip
    best = {"grpo": "0.001", "erl": "0.0003"}
    results, settings = {}, {}
    for rate in ("0.0001", "0.0003", "0.001"):
        label = f"1:0 lr {rate}"
        settings[label] = learning.rule_settings(s, 1, 0, rate)
        results[label] = {
            arm: [_synthetic_run(seed, 0.6 if rate == best[arm] else 0.3, 100)
                  | {"start": {"success": 0.0}} for seed in (5, 6)]
            for arm in ("grpo", "erl")
        }  # fmt: skip
    chosen = report.sweep_report(results, settings, opts)
    assert chosen == {"grpo": 1e-3, "erl": 3e-4}
    assert "best_lr: grpo=0.001,erl=0.0003" in capsys.readouterr().out


def test_processed_tokens_count_what_every_forward_reads(tiny_model_dir):
    """The equal-compute axis (issue 32) on the real tiny model: a padded training forward
    counts its unpadded tokens, and a generation its prefill plus one token per row for each
    token it decodes after the first (the KV cache reads only the new token)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    counter = arms.ProcessedTokens(model, model)  # the same module twice is hooked once
    ids = torch.tensor([[0, 0, 5, 6], [3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    model(input_ids=ids, attention_mask=mask)
    assert counter.total == 6
    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=3, min_new_tokens=3,
                   do_sample=False, pad_token_id=0)  # fmt: skip
    assert counter.total == 6 + 6 + 2 * 2
    counter.counting = False  # the held-out evaluation is not counted
    model(input_ids=ids, attention_mask=mask)
    assert counter.total == 12 + 4


def test_each_erl_variant_is_paired_against_erl(capsys):
    """What a default is chosen by (issue 32): a variant minus erl, paired by seed."""
    held = {"grpo": [0.1, 0.2, 0.3], "erl": [0.2, 0.3, 0.4], "erl_shared": [0.3, 0.4, 0.5],
            "sdpo_mixed": [0.0, 0.0, 0.0]}  # fmt: skip
    report.against_references(list(held), {m: held for m in report.MEASURES})
    out = capsys.readouterr().out
    assert "erl_shared_minus_erl_equal_steps: +0.100" in out
    assert "erl_shared_minus_erl_equal_processed" in out and "sdpo_mixed_minus" not in out


def test_erl_defaults_is_the_product_at_its_defaults_and_erl_stays_as_measured():
    """`erl_defaults` states the product's defaults (issue 32): if a default changes, this
    fails until the arm follows it. `erl` and its variants keep what the bench measured."""
    from pipeline import ERLConfig
    from pipeline.erl.memory import ReflectionMemory

    _, s = learning.parse_options([])
    product = ERLConfig(output_dir="unused", use_cpu=True, bf16=False)
    defaults = arms.arm_config("erl_defaults", s, "unused", 0)
    assert defaults.reflections_per_group == product.reflections_per_group
    assert dict(arms.ALL_ARMS["erl_defaults"].memory) == ReflectionMemory(0).policy
    # The bench's short templates stand for the product's: the retry reads its own
    # attempt's feedback exactly when the product's default retry template does (issue 48).
    fields = template_fields(defaults.retry_system_prompt)
    assert (
        fields
        == template_fields(product.retry_system_prompt)
        == {"prompt", "feedback", "reflection"}
    )
    assert arms.arm_config("erl", s, "unused", 0).reflections_per_group == 0
    assert arms.arm_config("erl_shared", s, "unused", 0).reflections_per_group == 1
    # The raw-feedback baseline (issue 43) is ERL with no reflection, nothing else changed.
    raw = arms.arm_config("raw_feedback_retry", s, "unused", 0)
    assert raw.enable_reflection is False and product.enable_reflection is True
    assert raw.retry_system_prompt == arms.RETRY_TEMPLATE  # the feedback shown as the hint
    assert arms.arm_config("erl", s, "unused", 0).enable_reflection is True


def test_each_code_ablation_changes_one_thing_of_the_defaults_before_issue_48():
    """Issue 48's ablations: `erl_lesson_retry` is erl_defaults with the retry reading the
    lesson alone (the defaults before issue 48), and each other arm is that (its config,
    memory, step and rate) with exactly the one change it names."""
    _, s = learning.parse_options(["--task", "hidden_code"])
    defaults = arms.config_fingerprint(arms.arm_config("erl_defaults", s, "unused", 0))
    before = arms.config_fingerprint(arms.arm_config("erl_lesson_retry", s, "unused", 0))
    assert {k: v for k, v in before.items() if defaults[k] != v} == {
        "retry_system_prompt": arms.RETRY_TEMPLATE
    }
    spec = arms.ALL_ARMS["erl_lesson_retry"]
    assert dataclasses.replace(spec, overrides=arms.ALL_ARMS["erl_defaults"].overrides) == (
        dataclasses.replace(arms.ALL_ARMS["erl_defaults"], lr_from="erl_defaults")
    )
    expected = {
        "erl_lesson_retry_no_reflection_rows": ({}, {"step": "no_reflection_rows"}),
        "erl_lesson_retry_no_memory": ({"enable_memory": False}, {"memory": ()}),
        "erl_lesson_retry_int_loss": ({}, {"step": "loss_weighted_internalization"}),
        "erl_lesson_retry_raft": ({}, {"step": "raft_internalization"}),
    }
    assert set(expected) | {"erl_lesson_retry"} == set(arms.CODE_ABLATIONS)
    for name, (config_change, spec_change) in expected.items():
        config = arms.config_fingerprint(arms.arm_config(name, s, "unused", 0))
        assert {k: v for k, v in config.items() if before[k] != v} == config_change, name
        ablation = arms.ALL_ARMS[name]
        assert dataclasses.replace(ablation, overrides=spec.overrides) == (
            dataclasses.replace(spec, **spec_change)
        ), name
        assert s.learning_rate(name) == s.learning_rate("erl_defaults")
    assert "{feedback}" in arms.RETRY_FEEDBACK_TEMPLATE


# SmolLM2 and the GPU path (issue 35) ---------------------------------------------------------


def test_the_device_follows_cuda_and_its_precision():
    """The trainers run on the GPU where there is one, in bf16 where it runs (else fp16, a
    T4's), and on the CPU in float32 otherwise; this machine has no GPU."""
    assert arms.device_args(cuda=False) == dict(use_cpu=True, bf16=False, fp16=False)
    assert arms.device_args(cuda=True, bf16_supported=True) == dict(use_cpu=False, bf16=True, fp16=False)  # fmt: skip
    assert arms.device_args(cuda=True, bf16_supported=False) == dict(use_cpu=False, bf16=False, fp16=True)  # fmt: skip
    import torch

    if not torch.cuda.is_available():
        assert arms.bench_device() == torch.device("cpu")
        _, s = learning.parse_options(["--base", "smollm2"])
        for name in ("grpo", "erl_paper", "sdpo_mixed"):
            config = arms.arm_config(name, s, "unused", 0)
            assert config.use_cpu and not config.bf16 and not config.fp16


def test_every_arm_takes_the_gpu_settings_where_there_is_one(monkeypatch):
    """On a GPU every arm's trainer settings (`common_args`, which `arm_config` and the
    warm-up build from) carry the GPU's device and precision. TrainingArguments itself
    refuses bf16 on this CPU, so the settings are checked before it."""
    gpu = arms.device_args(cuda=True, bf16_supported=True)
    monkeypatch.setattr(arms, "device_args", lambda: gpu)
    _, s = learning.parse_options(["--base", "smollm2"])
    settings = arms.common_args(s, "unused", 0, s.learning_rate("erl_paper"))
    assert (settings["use_cpu"], settings["bf16"], settings["fp16"]) == (False, True, False)
    assert arms.bench_device().type == "cuda"  # where the gates sample and evaluate


def test_smollm2_takes_its_own_warm_up_settings_and_the_cli_still_overrides_them():
    _, tiny = learning.parse_options([])
    _, smol = learning.parse_options(["--base", "smollm2"])
    assert (tiny.base, smol.base) == ("tiny", "smollm2")
    for name, value in learning.REAL_MODEL.items():
        if name in {f.name for f in dataclasses.fields(arms.Settings)}:
            assert getattr(smol, name) == value, name
    _, longer = learning.parse_options(["--base", "smollm2", "--warmup_steps", "7"])
    assert longer.warmup_steps == 7 and longer.max_tokens == smol.max_tokens
    with pytest.raises(SystemExit):  # no warm-up is the as-shipped probe only
        learning.parse_options(["--base", "smollm2", "--warmup_steps", "0"])
    learning.parse_options(["--base", "smollm2", "--warmup_steps", "0", "--probe"])


def test_the_gpu_script_options_parse_to_the_smollm2_comparison():
    """scripts/gpu_bench_smollm2.sh's options, parsed here as the GPU machine parses them."""
    import shlex

    script = (Path(__file__).resolve().parents[1] / "scripts" / "gpu_bench_smollm2.sh").read_text()
    line = next(x for x in script.splitlines() if x.startswith("QUICK_OPTIONS="))
    opts, s = learning.parse_options(shlex.split(line.partition("=")[2].strip('"')))
    assert s.base == "smollm2" and "grpo" in opts.methods and "erl_paper" in opts.methods
    assert opts.seeds >= 3 and s.prompts_per_step >= 1


def test_wilson_interval():
    gates = sys.modules["learning_gates"]
    low, high = gates.wilson(0.5, 100)
    assert low == pytest.approx(0.4038, abs=1e-3) and high == pytest.approx(0.5962, abs=1e-3)
    assert gates.wilson(0.0, 400)[0] == 0.0 and 0 < gates.wilson(0.0, 400)[1] < 0.01
    assert all(x != x for x in gates.wilson(0.0, 0))


@pytest.mark.slow  # ~26 s: a LoRA warm-up, merged and saved
def test_a_lora_warm_up_is_merged_into_a_plain_checkpoint_with_no_leak(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    """The LoRA warm-up (SmolLM2's, here on the tiny model for speed): it trains, merges
    into a plain checkpoint that differs from the base, prints its leak count (0), and its
    cache key changes with how it trains."""
    import torch
    from safetensors.torch import load_file

    gates = sys.modules["learning_gates"]
    monkeypatch.setitem(gates.TUNING, "tiny", gates.Tuning(batch=4, lora_r=4, capacity_steps=1))
    opts, s = learning.parse_options(["--rules", "1:11", "--warmup_steps", "2"])
    warm, key = gates.warm_checkpoint(s, tmp_path, learning.warm_excluded(opts))
    printed = capsys.readouterr().out
    assert "leaks of the rules kept out {'rule_text': 0, 'held_out_answer': 0}" in printed
    assert not (warm / "adapter_config.json").exists()
    merged = load_file(warm / "model.safetensors")
    base = load_file(Path(gates.base_model(s, tmp_path)) / "model.safetensors")
    assert not any("lora" in name for name in merged)
    assert any(not torch.equal(merged[k], base[k]) for k in base if "proj" in k)
    monkeypatch.setitem(gates.TUNING, "tiny", gates.Tuning(batch=4, lora_r=8, capacity_steps=1))
    assert gates.warm_checkpoint(s, tmp_path, learning.warm_excluded(opts))[1] != key


def test_hidden_codes_copy_phase_trains_first_and_is_in_the_warm_key(tmp_path, monkeypatch, capsys):
    """`copy_steps`: the copies and lookups train before the warm-up, at the warm-up's rate
    held constant; whether it runs, and its steps, are in the checkpoint's key."""
    gates = sys.modules["learning_gates"]
    monkeypatch.setitem(gates.TUNING, "tiny", gates.Tuning(batch=4, lora_r=0, capacity_steps=1))
    argv = ["--task", "hidden_code", "--warmup_steps", "1", "--feedback_examples", "12"]
    opts, s = learning.parse_options([*argv, "--copy_steps", "2"])
    assert (
        learning.parse_options(argv)[1].copy_steps == learning.PRESETS["hidden_code"]["copy_steps"]
    )
    for bad in (["--copy_steps", "-1"], ["--task", "hidden_rule", "--copy_steps", "5"]):
        with pytest.raises(SystemExit):
            learning.parse_options(bad)
        assert "--copy_steps" in capsys.readouterr().err
    for bad in (["--task", "hidden_code", "--code_prior", "-2"], ["--code_prior", "5"]):
        with pytest.raises(SystemExit):
            learning.parse_options(bad)
        assert "--code_prior" in capsys.readouterr().err
    excluded = learning.warm_excluded(opts)
    _, key = gates.warm_checkpoint(s, tmp_path, excluded)
    assert "copy phase: 2 SFT steps on 12 rows" in capsys.readouterr().out
    copy_config = gates._copy_config(s, str(tmp_path / "unused"))
    assert copy_config.lr_scheduler_type == "constant" and copy_config.max_steps == 2
    assert copy_config.learning_rate == s.warmup_lr
    _, without = gates.warm_checkpoint(dataclasses.replace(s, copy_steps=0), tmp_path, excluded)
    assert "warm-up: 1 SFT steps" in (out := capsys.readouterr().out) and "copy phase" not in out
    _, longer = gates.warm_checkpoint(dataclasses.replace(s, copy_steps=3), tmp_path, excluded)
    # the prior's rows and the thread count the build sums with are in the key too
    import torch

    _, no_prior = gates.warm_checkpoint(dataclasses.replace(s, code_prior=0), tmp_path, excluded)
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        _, other_threads = gates.warm_checkpoint(s, tmp_path, excluded)
    finally:
        torch.set_num_threads(threads)
    assert len({key, without, longer, no_prior, other_threads}) == 5


def test_a_users_model_folder_is_probed_as_it_ships(tiny_model_dir, tmp_path, capsys):
    """`--base PATH`: a user's own model (here the tiny one's folder) takes a real model's
    settings, and `--probe --warmup_steps 0` runs gate a on it as it is, cached."""
    with pytest.raises(SystemExit):
        learning.parse_options(["--base", str(tmp_path)])  # no config.json there
    assert "not a model folder" in capsys.readouterr().err
    argv = ["--base", tiny_model_dir, "--probe", "--warmup_steps", "0", "--rules", "1:11,1:3",
            "--probe_prompts", "4", "--out", str(tmp_path / "out")]  # fmt: skip
    _, s = learning.parse_options(argv)
    assert s.base == tiny_model_dir and s.max_tokens == learning.REAL_MODEL["max_tokens"]
    learning.main(argv)
    printed = capsys.readouterr().out
    for rule in ("1:11", "1:3"):  # each rule's header names the model
        assert f"gate a on {tiny_model_dir}, no warm-up, rule {rule}" in printed
        assert f"shipped_probe_failed_first_attempts[{rule}]" in printed
    assert len(list((tmp_path / "out" / "gates").glob("probe-shipped-*.json"))) == 2


def _gates(fixed: float, fresh: float, n: int = 200) -> dict:
    """Gates as `print_gates` returns them, from a paired gate a with these rates."""
    diff = fixed - fresh
    probe = {
        "first_attempt_success": 0.5, "failed_first_attempts": n,
        "retry_success_after_reflection": fixed, "resample_success": fresh,
        "retry_success_after_reflection_minus_fresh": diff,
        "retry_success_after_reflection_minus_fresh_low": diff - 0.05,
        "retry_success_after_reflection_minus_fresh_high": diff + 0.05,
        "retry_success_with_the_rule": 0.3, "reflections_stating_the_rule": 0.1,
    }  # fmt: skip
    capacity = {"held_out_before": 0.1, "held_out_after": 0.7}
    return {"probe": probe, "capacity": capacity, "c": 4.0}


def test_the_gate_table_puts_two_models_side_by_side(capsys):
    """`--gates_only --beside tiny`: a row per rule and model, the intervals, and per rule
    which model reads a reflection better (its gate a difference's interval above 0)."""
    opts, s = learning.parse_options(["--base", "smollm2", "--rules", "1:11,1:3"])
    tables = {
        "smollm2": {(1, 11): _gates(0.6, 0.1), (1, 3): _gates(0.2, 0.18)},
        "tiny": {(1, 11): _gates(0.15, 0.1), (1, 3): _gates(0.2, 0.18)},
    }
    learning.print_gate_table(tables, s, opts)
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.startswith("| 1:")]
    assert [row.split(" | ")[1] for row in rows] == ["smollm2", "tiny", "smollm2", "tiny"]
    assert "+0.500 [+0.450, +0.550] passes" in rows[0] and "fails" in rows[1]
    assert "0.500 [0.451, 0.549]" in rows[0]  # first attempt, Wilson, n = 400 prompts
    assert "gate_a_smollm2_minus_tiny[1:11]: +0.450" in printed
    assert "reads a reflection better: smollm2" in printed
    assert "gate_a_smollm2_minus_tiny[1:3]: +0.000 [-0.071, +0.071]; reads a reflection better: neither" in printed  # fmt: skip
    assert "gate_a_passes[smollm2]: {'1:11': True, '1:3': False}" in printed
    argv = ["--base", "smollm2", "--gates_only", "--beside=tiny", "--rules", "1:11"]
    assert learning.without_base(argv) == ["--gates_only", "--rules", "1:11"]
    for bad in (["--gates_only", "--beside", "nowhere"], ["--beside", "tiny"]):  # refused at once
        with pytest.raises(SystemExit):
            learning.parse_options(["--base", "smollm2", *bad])
    assert "--beside 'nowhere': not one of" in capsys.readouterr().err
