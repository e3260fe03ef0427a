"""The learning bench's warm-up holds no rule it will be run on, nor an answer to a held-out
question (issue 26: the old warm-up's decoys included the run's own rule, and the reported
rule's text was in 170 of its 9,500 rows). It builds the rows only; nothing is trained."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

learning = pytest.importorskip("learning")  # imports learning_arms (the backend) first
arms = sys.modules["learning_arms"]
gates = sys.modules["learning_gates"]


def distinct_rules() -> list[tuple[int, int]]:
    """One (level, rule_seed) per distinct rule of every level the bench accepts."""
    from curriculum.tasks import get_task

    rules, seen = [], set()
    for level in gates.WARM_LEVELS:
        for rule_seed in range(200):
            text = get_task("hidden_rule", rule_seed=rule_seed).rule_text(level)
            if text not in seen:
                seen.add(text)
                rules.append((level, rule_seed))
    return rules


def test_the_rules_enumerated_are_every_constant_of_each_level():
    from curriculum.tasks.hidden_rule import LEVELS

    rules = distinct_rules()
    for level in gates.WARM_LEVELS:
        (low, high), = LEVELS[level][2].values()  # fmt: skip
        assert sum(lv == level for lv, _ in rules) == high - low + 1


def test_no_warmup_row_leaks_any_rule_the_bench_accepts():
    """Every distinct rule of every level the bench accepts, on the preset's operands: no
    row states the rule or answers one of its held-out questions, and the "+" prior that
    keeps GRPO fed is the same for every rule (nothing in it is tuned to the rule run)."""
    _, s = learning.parse_options([])
    priors = set()
    for level, rule_seed in distinct_rules():
        rs = learning.rule_settings(s, level, rule_seed)
        task = arms.make_task(rs)
        rows = gates.warm_dataset(rs).to_list()
        leaks = gates.warmup_leaks(rows, task, level)
        assert leaks["rule_text"] == leaks["held_out_answer"] == 0, (rs.rule, leaks)
        assert leaks["run_symbol"] > 1000  # the run's symbol is read, under other rules
        prior = gates.prior_rows(task, rs)
        shown = {arms.digest(row) for row in rows}
        assert all(arms.digest(row) in shown for row in prior)  # the warm-up's own prior
        assert gates.warmup_leaks(prior, task, level)["run_symbol"] == 0
        priors.add(arms.digest(prior))
    assert len(priors) == 1


def test_one_warmup_keeps_out_every_rule_of_the_comparison_and_teaches_induction():
    """The preset's one warm-up (issue 32) keeps out every reported and tuning rule. Its
    reflection targets follow the feedback: the '#' rules it teaches span many constants
    (recalling one does not pay), the attempt shown is not always a+b, and the memory a
    reflection prompt shows is sometimes a wrong rule."""
    import re

    opts, s = learning.parse_options([])
    excluded = learning.warm_excluded(opts)
    assert len(excluded) == 5  # 3 reported rules, the tuning rule and the memory check's
    rows = gates.warm_dataset(learning.rule_settings(s, *excluded[0]), excluded).to_list()
    for level, rule_seed in excluded:
        task = arms.make_task(learning.rule_settings(s, level, rule_seed))
        leaks = gates.warmup_leaks(rows, task, level)
        assert leaks["rule_text"] == leaks["held_out_answer"] == 0, (level, rule_seed, leaks)
    reflections = [r for r in rows if r["prompt"][-1]["content"].endswith("Fix:")]
    targets = [r["completion"][0]["content"] for r in reflections]
    assert len({t for t in targets if t.startswith("a#b = a+b+")}) >= 20
    not_plus = wrong_memory = 0
    for row, target in zip(reflections, targets):
        text = row["prompt"][-1]["content"]
        a, b = (int(x) for x in re.search(r"(\d+)\D(\d+)\nAttempt", text).groups())
        not_plus += f"<answer>{a + b}</answer>" not in text
        lessons = text.split("Lessons:\n")[1].split("\nFix:")[0]
        wrong_memory += lessons != "(none yet)" and f"- {target}" not in lessons.splitlines()
    assert 0.25 < not_plus / len(reflections) < 0.6
    assert 0.15 < wrong_memory / len(reflections) < 0.35


def test_the_bench_refuses_levels_its_warmup_does_not_teach():
    with pytest.raises(SystemExit):
        learning.parse_options(["--rules", "3:0"])


def _row(user: str, completion: str, system: str = "The operation # is hidden.") -> dict:
    return {
        "prompt": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "completion": [{"role": "assistant", "content": completion}],
    }


def test_the_leak_check_finds_each_kind_of_leak_and_nothing_else():
    """The check the test above relies on: planted leaks of every kind are counted, and
    look-alikes that are not leaks are not."""
    from curriculum.tasks import get_task

    task = get_task("hidden_rule", rule_seed=11, max_operand=24)  # a#b = a+b+5
    (a, b), (c, d) = task.pairs(1, "held_out")[0], task.pairs(1, "train")[0]
    answer = a + b + 5
    leaks = {
        "rule_text": [
            _row(f"{c}@{d}\nAttempt: <answer>1</answer>\nFix:", "a#b = a+b+5"),  # a target
            _row(f"{c}@{d}\nHint: a#b = a+b+5", "<answer>3</answer>"),  # a hint or lesson
        ],
        "held_out_answer": [
            _row(f"{a}#{b}\nHint: a#b = a+b+4", f"<answer>{answer}</answer>"),  # a retry row
            _row(f"{a}#{b}", f"<answer>{answer}</answer>"),  # a plain first attempt
            _row(
                f"{a}#{b}\nCorrect solution:\n\n<answer>{answer}</answer>\n\n", "<answer>0</answer>"
            ),
            # the answer implied by an attempt and the feedback's gap
            _row(
                f"{a}#{b}\nAttempt: <answer>{a + b}</answer>\nFeedback: The answer {a + b} "
                "is wrong: it is 5 too low.\nFix:",
                "a#b = a+b+3",
            ),  # fmt: skip
        ],
    }
    for kind, rows in leaks.items():
        for row in rows:
            assert gates.warmup_leaks([row], task, 1)[kind] == 1, (kind, row)
    benign = [
        _row(f"{c}#{d}", f"<answer>{c + d + 5}</answer>"),  # a training pair's answer
        _row(f"{a}@{b}", f"<answer>{answer}</answer>", "The operation @ is hidden."),
        _row(f"{a}#{b}", f"<answer>{answer + 1}</answer>"),  # a wrong answer
        _row(f"1{a}#{b}", f"<answer>{answer}</answer>"),  # another question (1a#b)
        _row(f"{c}@{d}\nHint: a@b = a+b+5", "<answer>3</answer>"),  # the rule, another symbol
        _row(f"{c}@{d}\nHint: a#b = a+b+57", "<answer>3</answer>"),  # another constant
    ]
    counts = gates.warmup_leaks(benign, task, 1)
    assert counts["rule_text"] == counts["held_out_answer"] == 0
    assert counts["run_symbol"] == 5


def test_the_hidden_code_warmup_keeps_out_every_code_and_teaches_no_letters_digit():
    """hidden_code (issue 43): the preset's one warm-up, built for any of its codes, is the
    same rows; no row states a code of the comparison or poses one of its held-out
    combinations; the lessons it teaches give every letter many digits (copying pays,
    recalling does not); and it shows the raw-feedback retry, SDPO's teacher and lookups in
    a whole code too."""
    from collections import defaultdict

    opts, s = learning.parse_options(["--task", "hidden_code", "--feedback_examples", "300"])
    excluded = learning.warm_excluded(opts)
    assert len(excluded) == 5  # 3 reported codes and the 2 tuning ones (issue 48)
    built = [gates.warm_dataset(learning.rule_settings(s, *rule), excluded) for rule in excluded]
    rows = built[0].to_list()
    assert all(b.to_list() == rows for b in built[1:])
    for level, rule_seed in excluded:
        task = arms.make_task(learning.rule_settings(s, level, rule_seed))
        leaks = gates.code_leaks(rows, task, level)
        assert leaks["rule_text"] == leaks["held_out_question"] == 0, (level, rule_seed, leaks)
        assert leaks["true_meaning"] > 0  # letters are read, under codes drawn apart from it
    digits = defaultdict(set)
    for row in rows:
        if row["prompt"][-1]["content"].endswith("Fix:"):
            for letter, digit in re.findall(r"([A-Z])=(\d)", row["completion"][0]["content"]):
                digits[letter].add(digit)
    assert len(digits) == 10 and all(len(d) >= 8 for d in digits.values())
    texts = [row["prompt"][-1]["content"] for row in rows]
    assert sum("\nHint: The answer " in t for t in texts) == 150  # raw feedback retries
    assert sum("feedback from your unsuccessful earlier attempt" in t for t in texts) > 30
    # Lookups: a retry whose hint is a decoy's whole code (5 or 6 letters, each once), the
    # answer copied from it.
    whole = re.compile(r"\nHint: ((?:[A-Z]=\d ){4,5}[A-Z]=\d)$")
    lookups = [(whole.search(t), row) for t, row in zip(texts, rows)]
    lookups = [(m.group(1), row) for m, row in lookups if m]
    assert len(lookups) == 150
    for hint, row in lookups:
        code = dict(re.findall(r"([A-Z])=(\d)", hint))
        assert len(code) == hint.count("=")
        answer = re.findall(r"([A-Z])=(\d)", row["completion"][0]["content"])
        assert answer and all(code[letter] == digit for letter, digit in answer)


def test_the_hidden_code_copy_phase_copies_and_looks_up_and_keeps_out_every_code():
    """hidden_code's first warm-up phase (`copy_steps`): retries on decoys alone, half whose
    hint is the reply itself and half whose hint is the decoy's whole code; none states a
    code of the comparison or poses one of its held-out combinations."""
    opts, s = learning.parse_options(["--task", "hidden_code", "--feedback_examples", "200"])
    excluded = learning.warm_excluded(opts)
    rows = gates.copy_dataset(s, excluded).to_list()
    assert len(rows) == 200 and rows == gates.copy_dataset(s, excluded).to_list()
    copies = lookups = 0
    for row in rows:
        hint = row["prompt"][-1]["content"].rpartition("\nHint: ")[2]
        answer = row["completion"][0]["content"]
        code = dict(re.findall(r"([A-Z])=(\d)", hint))
        pairs = re.findall(r"([A-Z])=(\d)", answer)
        assert pairs and all(code[letter] == digit for letter, digit in pairs)
        copies += answer == f"<answer>{hint}</answer>"
        lookups += len(code) in (5, 6) and len(code) == hint.count("=")
    assert copies == lookups == 100
    for level, rule_seed in excluded:
        task = arms.make_task(learning.rule_settings(s, level, rule_seed))
        leaks = gates.code_leaks(rows, task, level)
        assert leaks["rule_text"] == leaks["held_out_question"] == 0, (level, rule_seed, leaks)
