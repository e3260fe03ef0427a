"""The lookup family: multi-hop questions over a row's own knowledge base, answered by
calling `lookup` (and `search`) and replying <answer>NAME</answer>."""

from __future__ import annotations

import json
import math
import time

import pytest

from curriculum.tasks import get_task
from curriculum.tasks.agent import environment_tools
from curriculum.tasks.base import HELD_OUT_SEED_BASE
from curriculum.tasks.lookup import (
    RELATIONS,
    LookupEnv,
    LookupTask,
    entry_text,
    question_text,
    turn_limit,
)

LEVELS = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def task() -> LookupTask:
    return get_task("lookup")


def call(name, arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def episode(calls: list, reply: str) -> list[dict]:
    """An episode of one call per assistant turn, each answered, then `reply`."""
    messages: list[dict] = []
    for tool_call in calls:
        messages.append({"role": "assistant", "content": "", "tool_calls": [tool_call]})
        messages.append({"role": "tool", "name": "lookup", "content": ""})
    messages.append({"role": "assistant", "content": reply})
    return messages


def lookups(names) -> list[dict]:
    return [call("lookup", {"name": name}) for name in names]


def kb_of(row) -> dict:
    return json.loads(row["meta"])["kb"]


def chain_of(row) -> list[str]:
    return json.loads(row["meta"])["chain"]


def off_chain(row) -> str:
    """An entity the question does not lead through."""
    return next(name for name in sorted(kb_of(row)) if name not in chain_of(row))


def wrong_answer(row) -> str:
    """Another entity of the answer's kind: a plausible, wrong answer."""
    kb = kb_of(row)
    kind = kb[row["answer"]]["kind"]
    return next(name for name in sorted(kb) if kb[name]["kind"] == kind and name != row["answer"])


def check_signals(evaluation) -> None:
    assert 0.0 <= evaluation.reward <= 1.0 and math.isfinite(evaluation.reward)
    assert set(evaluation.breakdown) == {"format", "correctness", "milestones"}
    for value in evaluation.breakdown.values():
        assert math.isfinite(value) and 0.0 <= value <= 1.0


# Rows ----------------------------------------------------------------------------------


def test_rows_are_deterministic_and_the_environment_is_rebuilt_from_meta(task):
    for level in LEVELS:
        rows = task.generate(level, 10, seed=7)
        assert rows == get_task("lookup").generate(level, 10, seed=7)
        assert rows != task.generate(level, 10, seed=8)
        for row in rows:
            first = chain_of(row)[0]
            replies = []
            for _ in range(2):  # two environments, reset from the row alone, agree
                environment = LookupEnv()
                environment.reset(**row)
                replies.append(environment.lookup(first))
            assert replies[0] == replies[1]
            assert replies[0].startswith(entry_text(first, kb_of(row)[first]))
            assert row["prompt"][1]["content"] == (
                f"{question_text(first, json.loads(row['meta'])['relations'])} "
                f"You may look up {turn_limit(level)} entries."
            )


def test_a_pooled_environment_forgets_its_last_episode(task):
    first, second = task.generate(4, 1, seed=1)[0], task.generate(1, 1, seed=2)[0]
    environment = LookupEnv()
    environment.reset(**first)
    for _ in range(turn_limit(4) + 2):
        environment.lookup("nobody")
    environment.reset(**second)
    assert (environment.lookups_left, environment.calls, environment.refused) == (3, 0, 0)
    assert environment.found == [] and environment.not_found == 0
    assert environment.lookup(chain_of(first)[0]).startswith("No entry named")


def test_the_reference_solves_every_level_within_the_turn_limit(task):
    for level in LEVELS:
        for row in task.generate(level, 40, seed=100 * level):
            reference = task.reference(row)
            calls = [m for m in reference if m.get("tool_calls")]
            assert len(calls) == level <= task.turn_limit(level) == level + 2
            evaluation = task.evaluate(row, reference)
            assert evaluation.solved and evaluation.breakdown == {
                "format": 1.0,
                "correctness": 1.0,
                "milestones": 1.0,
            }, evaluation
            assert evaluation.feedback == {}
    assert task.max_turns() == 6


def test_each_question_takes_exactly_level_hops(task):
    """The chain's entries, looked up in order: the answer is named only in the last one,
    and no entity is named before the entry just ahead of it, so no lookup is skipped."""
    for level in LEVELS:
        for row in task.generate(level, 60, seed=3):
            meta = json.loads(row["meta"])
            chain, relations = meta["chain"], meta["relations"]
            assert len(relations) == level and len(chain) == level + 1
            assert len(set(chain)) == len(chain), chain
            assert chain[-1] == row["answer"]
            environment, _ = task.start(row)
            replies = [environment.lookup(name) for name in chain[:-1]]
            assert row["answer"] in replies[-1]
            for j, name in enumerate(chain[1:], start=1):
                # e_j is named in e_{j-1}'s entry, and in none before it (nor the question).
                assert name in replies[j - 1]
                assert not any(name in reply for reply in replies[: j - 1]), (row, name)
                assert name not in row["prompt"][1]["content"]
            # Replaying only the first k-1 lookups never reveals the answer.
            assert not any(row["answer"] in reply for reply in replies[:-1])


def test_the_answer_is_unique(task):
    """Names are unique and none is part of another, every relation names one entity, and
    following the question's relations through the knowledge base reaches the answer."""
    for level in LEVELS:
        for row in task.generate(level, 40, seed=11):
            kb = kb_of(row)
            names = sorted(kb)
            lowered = [name.lower() for name in names]
            assert len(set(lowered)) == len(names)
            for a in lowered:
                assert sum(a in b for b in lowered) == 1, a  # only in itself
            for name, facts in kb.items():
                assert set(facts) == {"kind", *RELATIONS[facts["kind"]]}
                for relation in RELATIONS[facts["kind"]]:
                    assert facts[relation] in kb and facts[relation] != name
                if facts["kind"] == "country":  # a capital lies in its country
                    assert kb[facts["capital"]]["in_country"] == name
            meta = json.loads(row["meta"])
            entity = meta["chain"][0]
            for relation in meta["relations"]:
                entity = kb[entity][relation]
            assert entity == row["answer"]
            # The answer's name is found in exactly one place in the last entry.
            last = entry_text(meta["chain"][-2], kb[meta["chain"][-2]])
            assert last.count(row["answer"]) == 1


def test_knowledge_bases_grow_with_the_level(task):
    sizes = [len(kb_of(task.generate(level, 1, seed=0)[0])) for level in LEVELS]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]


def test_held_out_questions_are_disjoint_from_training_ones(task):
    for level in LEVELS:
        train = task.generate(level, 300, seed=0)
        held = task.generate(level, 300, seed=HELD_OUT_SEED_BASE)
        assert {json.loads(r["meta"])["split"] for r in train} == {"train"}
        assert {json.loads(r["meta"])["split"] for r in held} == {"held_out"}

        def questions(rows):
            return {(r["prompt"][1]["content"], r["answer"]) for r in rows}

        assert not questions(train) & questions(held)
        starts = [{chain_of(r)[0] for r in rows} for rows in (train, held)]
        assert not starts[0] & starts[1]  # a start name belongs to one split only
        assert len(questions(held)) > 250  # and the held-out questions are varied


def test_config_is_validated():
    for bad in (1, 0, "5", True, 2.5):
        with pytest.raises(ValueError, match="held_out_mod"):
            get_task("lookup", held_out_mod=bad)
    with pytest.raises(ValueError, match="unknown config"):
        get_task("lookup", hops=3)
    assert get_task("lookup", held_out_mod=3).generate(2, 3, seed=HELD_OUT_SEED_BASE)


# Tools ---------------------------------------------------------------------------------


def test_the_tools_are_lookup_and_search_with_schemas_trl_can_build():
    utils = pytest.importorskip("transformers.utils")
    tools = environment_tools(LookupEnv())
    assert sorted(tool.__name__ for tool in tools) == ["lookup", "search"]
    for tool in tools:
        schema = utils.get_json_schema(tool)
        parameters = schema["function"]["parameters"]
        assert parameters["required"] == list(parameters["properties"])
        for spec in parameters["properties"].values():
            assert spec["type"] == "string" and spec["description"]


def test_lookup_matches_names_loosely_and_says_when_nothing_is_found(task):
    row = task.generate(2, 1, seed=4)[0]
    first = chain_of(row)[0]
    entry = entry_text(first, kb_of(row)[first])
    environment, _ = task.start(row)
    loose = "  " + "   ".join(first.upper().split()) + "\n"
    assert environment.lookup(loose) == f"{entry}\nLookups left: 3."
    assert environment.found == [first]
    long_name = "Zz" * 50
    assert environment.lookup(long_name) == (
        f"No entry named '{long_name[:40]}...'.\nLookups left: 2."
    )
    assert environment.not_found == 1
    search = environment.search(first.split()[0].lower())
    assert first in search and search.endswith("Lookups left: 1.")
    assert environment.lookup(first).endswith("Lookups left: 0.")
    refused = "No lookups left; reply with <answer>...</answer>."
    assert environment.lookup(first) == refused and environment.search("a") == refused
    assert environment.refused == 2 and environment.calls == 4


def test_search_lists_at_most_three_entries(task):
    row = task.generate(4, 1, seed=0)[0]
    environment, _ = task.start(row)
    reply = environment.search("works for")  # every person's entry
    listed = reply.split(": ", 1)[1].split("\n")[0].rstrip(".").split("; ")
    people = [name for name, facts in kb_of(row).items() if facts["kind"] == "person"]
    assert len(listed) == 3 and set(listed) <= set(people)
    assert environment.search("qqqq").startswith("No entry contains 'qqqq'.")


def test_hostile_tool_calls_never_raise_and_count_as_invalid_or_not_found(task, tmp_path):
    row = task.generate(3, 1, seed=9)[0]
    marker = tmp_path / "pwned"
    hostile = f"__import__('os').system('touch {marker}')"
    cases = {
        # call -> (valid, found nothing)
        "unknown tool": (call("eval", {"name": hostile}), False, False),
        "arguments a list": (call("lookup", ["Ilsa Varn"]), False, False),
        "arguments a string": (call("lookup", "not json"), False, False),
        "arguments null": (call("lookup", None), False, False),
        "wrong keyword": (call("lookup", {"entity": chain_of(row)[0]}), False, False),
        "extra keyword": (call("lookup", {"name": "x", "depth": 2}), False, False),
        "no function": ({"type": "function"}, False, False),
        "not a dict": ("lookup('x')", False, False),
        "name an int": (call("lookup", {"name": 42}), False, False),
        "name a list": (call("lookup", {"name": ["a"] * 1000}), False, False),
        "name null": (call("lookup", {"name": None}), False, False),
        "query an int": (call("search", {"query": 7}), False, False),
        "query empty": (call("search", {"query": "   "}), False, False),
        "query 1 MB": (call("search", {"query": "a" * 1_000_000}), False, False),
        "hostile name": (call("lookup", {"name": hostile}), True, True),
        "name 1 MB": (call("lookup", {"name": "A" * 1_000_000}), True, True),
        "surrogates": (call("lookup", {"name": "\udcff\x00" * 20}), True, True),
        # JSON text fails as TRL's tool loop fails it (`lookup(**text)` raises).
        "JSON text arguments": (call("lookup", json.dumps({"name": hostile})), False, False),
    }
    for kind, (tool_call, valid, not_found) in cases.items():
        start = time.perf_counter()
        environment, played = task.play(row, episode([tool_call], "<answer>x</answer>"))
        assert time.perf_counter() - start < 0.5, kind
        [record] = played.calls
        assert record.valid is valid, (kind, record)
        assert len(record.reply) < 300, kind
        # An invalid call uses no lookup; a valid one that found nothing uses one.
        assert environment.lookups_left == turn_limit(3) - valid, kind
        assert environment.not_found == int(not_found), kind
        if not_found:
            assert record.reply.startswith("No entry named "), kind
        evaluation = task.judge(row, environment, played)
        check_signals(evaluation)
        # The reply's tag is bare: only an invalid call marks the format down.
        assert evaluation.reward == 0.0 and evaluation.breakdown["format"] == (
            1.0 if valid else 0.5
        ), kind
        if not valid:
            assert "1 of 1 tool calls were invalid" in evaluation.feedback["format"], kind
    assert not marker.exists()


def test_calls_past_the_limit_are_refused_and_counted(task):
    row = task.generate(1, 1, seed=2)[0]
    first = chain_of(row)[0]
    calls = lookups(["nobody"] * turn_limit(1) + [first, first])
    environment, played = task.play(row, episode(calls, f"<answer>{row['answer']}</answer>"))
    assert environment.refused == 2 and environment.found == []
    assert played.calls[-1].reply == "No lookups left; reply with <answer>...</answer>."
    evaluation = task.evaluate(row, episode(calls, "<answer>nobody</answer>"))
    assert "2 call(s) refused: no lookups left." in evaluation.feedback["correctness"]
    assert "3 lookup(s) found nothing." in evaluation.feedback["correctness"]
    assert evaluation.breakdown["milestones"] == 0.0


# Judging -------------------------------------------------------------------------------


def test_format_marks_the_reply_tag_and_the_calls(task):
    row = task.generate(2, 1, seed=5)[0]
    answer, chain = row["answer"], chain_of(row)
    tagged = f"<answer>{answer}</answer>"
    cases = {
        # (calls, reply) -> (format, correctness)
        "reference": (lookups(chain[:-1]), tagged, 1.0, 1.0),
        "no tools, bare tag": ([], tagged, 1.0, 1.0),
        "no tools, extra text": ([], f"It is {tagged}", 0.5, 1.0),
        "no tools, think block": ([], f"<think>hm</think>{tagged}", 0.5, 1.0),
        "case and spaces": ([], f"<answer>  {answer.upper()} </answer>", 1.0, 1.0),
        "no tools, no tag": ([], answer, 0.0, 0.0),
        "no tag": (lookups(chain[:-1]), answer, 0.5, 0.0),
        "one invalid call": (
            [*lookups(chain[:-1]), call("lookup", {"name": 1})],
            tagged,
            (2 / 3 + 1) / 2,
            1.0,
        ),
        "one invalid call, extra text": (
            [call("lookup", {"name": 1}), *lookups(chain[:-1])],
            f"{tagged}.",
            (2 / 3 + 0.5) / 2,
            1.0,
        ),
    }
    for kind, (calls, reply, fmt, correctness) in cases.items():
        evaluation = task.evaluate(row, episode(calls, reply))
        check_signals(evaluation)
        assert evaluation.breakdown["format"] == pytest.approx(fmt), (kind, evaluation)
        assert evaluation.breakdown["correctness"] == correctness == evaluation.reward, kind
        if fmt < 1.0:
            assert evaluation.feedback["format"], kind
    no_tag = task.evaluate(row, episode(lookups(chain[:-1]), answer))
    assert "No <answer>...</answer> tag in the final reply." in no_tag.feedback["format"]
    extra = task.evaluate(row, f"Sure: {tagged}")
    assert "no text before or after" in extra.feedback["format"]


def test_milestones_count_the_chain_entries_looked_up(task):
    for level in LEVELS:
        row = task.generate(level, 1, seed=21)[0]
        chain, wrong = chain_of(row), wrong_answer(row)
        for k in range(level + 1):
            evaluation = task.evaluate(
                row, episode(lookups(chain[:k]), f"<answer>{wrong}</answer>")
            )
            assert evaluation.breakdown["milestones"] == pytest.approx(k / level)
            assert evaluation.reward == 0.0
            feedback = evaluation.feedback_text()
            if k < level:
                assert f"Looked up {k} of the" in evaluation.feedback["milestones"]
                assert (repr(chain[k - 1]) if k else repr(chain[0])) in feedback
            else:
                assert "milestones" not in evaluation.feedback
                assert f"the answer is in the entry of {chain[-2]!r}" in feedback
        # Entries looked up out of order, or twice, or off the chain count once each.
        calls = lookups([chain[level - 1], chain[level - 1], off_chain(row), "nobody"])
        evaluation = task.evaluate(row, episode(calls, "<answer>nobody</answer>"))
        assert evaluation.breakdown["milestones"] == pytest.approx(1 / level)
        # A right answer earns every milestone.
        right = task.evaluate(row, episode([], f"<answer>{row['answer']}</answer>"))
        assert right.breakdown["milestones"] == 1.0


def test_hostile_replies_never_raise(task, tmp_path):
    marker = tmp_path / "pwned"
    for level in LEVELS:
        row = task.generate(level, 1, seed=13)[0]
        answer, calls = row["answer"], lookups(chain_of(row)[:-1])
        replies = {
            "empty": ("", False),
            "plain text": ("I think it is somebody.", False),
            "nested tags": (f"<answer><answer>{answer}</answer></answer>", True),
            "nested wrong": (f"<answer>{answer}<answer>no</answer></answer>", False),
            "unclosed": ("<answer>" * 8000, False),
            "1 MB": ("A" * 1_000_000, False),
            "1 MB answer": ("<answer>" + "x " * 500_000 + "</answer>", False),
            "hostile": (f"<answer>__import__('os').system('touch {marker}')</answer>", False),
            "surrogates": ("<answer>\udcff\x00</answer>", False),
        }
        for kind, (reply, correct) in replies.items():
            for completion in (reply, episode(calls, reply)):
                start = time.perf_counter()
                evaluation = task.evaluate(row, completion)
                assert time.perf_counter() - start < 0.5, kind
                check_signals(evaluation)
                assert evaluation.breakdown["correctness"] == float(correct), kind
                if correct:  # the right name, but not the tag alone
                    assert evaluation.breakdown["format"] < 1.0
                assert evaluation.feedback_text().strip()
                assert all(len(text) <= 300 for text in evaluation.feedback.values()), kind
        for malformed in (42, None, [1, 2], [{"role": "assistant"}, "text"]):
            evaluation = task.evaluate(row, malformed)
            assert evaluation.error and evaluation.reward == 0.0
            assert set(evaluation.breakdown.values()) == {0.0}
    assert not marker.exists()


def test_feedback_never_reveals_the_answer_unless_configured(task):
    revealing = get_task("lookup", reveal_answer=True)
    for level in LEVELS:
        for row in task.generate(level, 30, seed=500):
            chain, answer = chain_of(row), row["answer"]
            for k in range(level + 1):
                for reply in (
                    f"<answer>{wrong_answer(row)}</answer>",
                    "no idea",
                    "<answer></answer>",
                ):
                    completion = episode(lookups(chain[:k]), reply)
                    evaluation = task.evaluate(row, completion)
                    assert evaluation.reward == 0.0
                    assert answer not in evaluation.feedback_text(), evaluation.feedback
                    assert answer.lower() not in evaluation.feedback_text().lower()
                    shown = revealing.evaluate(row, completion)
                    assert f"The answer is {answer!r}." in shown.feedback["correctness"]


def test_feedback_stays_short_and_ascii_in_the_worst_case():
    """Every signal's feedback fits in 300 characters (what reflection prompts and logs take)
    with everything going wrong at once, odd text included."""
    task = get_task("lookup", reveal_answer=True)
    odd = "\udcff\x00\U0001f600" * 200
    for level in LEVELS:
        row = task.generate(level, 1, seed=17)[0]
        calls = [
            call(odd, {"name": odd}),  # unknown tool
            call("lookup", {"name": 3}),
            *lookups(chain_of(row)[:-1]),
            *lookups([odd] * 8),  # two found nothing, the rest refused
        ]
        for reply in (f"{odd}<answer>{odd}</answer>{odd}", odd):
            evaluation = task.evaluate(row, episode(calls, reply))
            assert evaluation.feedback.keys() == {"format", "correctness"}, evaluation.feedback
            for text in evaluation.feedback.values():
                assert len(text) <= 300 and text.isascii(), text
            assert "refused" in evaluation.feedback["correctness"]
