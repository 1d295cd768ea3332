"""The known-answers row's parts: the seeded probe sets (the twin's, the instruction model's), the judge of one
reply on its answer span, the Wilson interval and the verdict against the floor, what the floor lets pass (the
figures docs/run.md quotes), the profile keys (strict)."""

from __future__ import annotations

import math
import re

import pytest
from pydantic import ValidationError

from sparkforge.recipe.conformspec import ConformSettings, KnownAnswers
from sparkforge.run.conform.answer_span import answer_spans, judge
from sparkforge.run.conform.instruct_probes import INSTRUCTION, instruct_probe_set
from sparkforge.run.conform.known_answers import PROBE_SETS, reply_text, score, wilson
from sparkforge.run.conform.probes import KINDS, WORDS, probe_set


def test_the_probe_set_is_the_same_for_a_seed_covers_every_kind_and_uses_known_words() -> None:
    one, two = probe_set(3, 60), probe_set(3, 60)
    assert one == two and one != probe_set(4, 60)
    assert [p.kind for p in one[: len(KINDS)]] == list(KINDS)
    vocabulary = set(WORDS) | {str(n) for n in range(100)}
    for probe in one:
        assert set(probe.prompt.split()) <= vocabulary and set(probe.answer.split()) <= vocabulary, probe
        assert probe.judge(probe.answer)


def test_each_kind_has_the_exact_answer() -> None:
    by_kind = {p.kind: p for p in probe_set(11, 12)}
    a, b = (int(w) for w in by_kind["arithmetic"].prompt.split() if w.isdigit())
    assert by_kind["arithmetic"].answer == str(a + b)
    key = by_kind["recall"].prompt.split()[3]
    assert by_kind["recall"].answer == key and by_kind["recall"].prompt.count("the sky is blue .") >= 6
    listed = by_kind["ordering"].prompt.split(":")[1].split(".")[0].split()
    assert by_kind["ordering"].answer.split() == sorted(listed, key=int)
    counted = by_kind["counting"].prompt.split(":")[1].split("?")[0].split()
    assert by_kind["counting"].answer == str(len(counted))


def test_a_reply_is_judged_exactly_with_case_spacing_and_a_full_stop_aside() -> None:
    fmt = next(p for p in probe_set(0, 6) if p.kind == "format")
    numbers = fmt.answer.replace(" , ", " ").split()
    assert fmt.judge(", ".join(numbers) + ".") and fmt.judge(",".join(numbers))
    assert not fmt.judge(" ".join(numbers))  # the commas were asked for
    arithmetic = probe_set(0, 1)[0]
    assert arithmetic.judge(f" {arithmetic.answer}. ") and not arithmetic.judge(f"{arithmetic.answer} 7")
    assert not arithmetic.judge(str(int(arithmetic.answer) + 1)) and not arithmetic.judge("")


def test_the_instruct_set_asks_the_twins_questions_as_prose_with_one_answer_only_instruction() -> None:
    twin, instruct = probe_set(5, 60, 4), instruct_probe_set(5, 60, 4)
    assert [(p.kind, p.answer) for p in instruct] == [(p.kind, p.answer) for p in twin]
    for asked, learnt in zip(instruct, twin, strict=True):
        assert asked.prompt.endswith(INSTRUCTION) and asked.prompt.count("Answer:") == 1, asked.prompt
        assert asked.prompt[0].isupper() and " ?" not in asked.prompt and " ." not in asked.prompt
        assert "answer with the number" not in asked.prompt and " i " not in asked.prompt
        # The question's own numbers, in the twin's order.
        assert re.findall(r"\d+", asked.prompt) == re.findall(r"\d+", learnt.prompt)
    by_kind = {p.kind: p.prompt for p in instruct}
    assert (
        by_kind["arithmetic"].startswith("What is ")
        and "? Reply with the answer only" in by_kind["arithmetic"]
    )
    assert (
        "What number did I ask you to remember?" in by_kind["recall"]
        and "The sky is blue." in by_kind["recall"]
    )


def _lead_ins(answer: str) -> list[str]:
    """A real model's ways of giving `answer` around a sentence of its own."""
    return [
        f"Sure! Here is the answer.\n\n{answer}",
        f"Answer: {answer}",
        f"Sure, here it is.\nAnswer: {answer}",
        f"**Answer:** `{answer}`",
        f"The answer is {answer}.",
        f"{answer}\n\nI hope this helps.",
        f"<think>easy</think>\nAnswer: {answer}",
    ]


@pytest.mark.parametrize("probes", [probe_set(0, 120), instruct_probe_set(0, 120)], ids=["twin", "instruct"])
def test_the_judge_reads_the_answer_span_past_a_lead_in_and_refuses_a_wrong_answer(probes) -> None:
    for probe in probes:
        wrong = " ".join(str((int(w) + 1) % 100) if w.isdigit() else w for w in probe.answer.split())
        assert judge(probe, probe.answer)  # the bare answer, as the twin replies
        for reply in _lead_ins(probe.answer):
            assert judge(probe, reply), (probe, reply)
            assert not judge(probe, reply.replace(probe.answer, wrong)), (probe, reply)
        # The marker decides: a right number first and a wrong "Answer:" line is wrong.
        assert not judge(probe, f"{probe.answer}\nAnswer: {wrong}")
        assert not judge(probe, "Sure, here it is.") and not judge(probe, "")


def test_the_spans_judged() -> None:
    assert answer_spans("Sure.\nAnswer: 4 5\nDone.") == ["Sure.\nAnswer: 4 5\nDone.", "4 5"]
    assert answer_spans("Hello.\n\n12\n") == ["Hello.\n\n12\n", "Hello.", "12"]
    assert answer_spans("Answers vary: 7") == ["Answers vary: 7", "Answers vary: 7", "Answers vary: 7"]


def test_the_twin_set_is_judged_as_the_tiny_model_learnt_it() -> None:
    # Every reply the exact rule (Probe.judge, the trainer's) accepts, the span judge accepts.
    for probe in probe_set(0, 120):
        for reply in (
            probe.answer,
            f" {probe.answer}. ",
            probe.answer.upper(),
            probe.answer.replace(" ", "  "),
        ):
            assert probe.judge(reply) == judge(probe, reply)
    assert set(PROBE_SETS) == {"instruct", "twin"} and PROBE_SETS["twin"] is probe_set


def test_the_floor_at_120_probes_needs_115_right_and_a_model_right_97_in_100_passes_85_percent() -> None:
    # docs/run.md, "What the floor claims", quotes these figures.
    def smallest_pass(total: int, floor: float) -> int:
        return next(k for k in range(total + 1) if wilson(k, total)[0] >= floor)

    def pass_chance(accuracy: float, total: int, floor: float) -> float:
        return sum(
            math.comb(total, k) * accuracy**k * (1 - accuracy) ** (total - k)
            for k in range(smallest_pass(total, floor), total + 1)
        )

    assert (
        smallest_pass(120, 0.9) == 115 and smallest_pass(120, 0.8) == 105 and smallest_pass(500, 0.9) == 464
    )
    chances = {a: round(pass_chance(a, 120, 0.9), 2) for a in (0.9, 0.95, 0.97, 0.98)}
    assert chances == {0.9: 0.02, 0.95: 0.44, 0.97: 0.85, 0.98: 0.97}
    assert round(pass_chance(0.95, 500, 0.9), 2) == 0.99


def test_the_wilson_interval() -> None:
    assert wilson(10, 10) == pytest.approx((0.72247, 1.0), abs=1e-5)
    low, high = wilson(50, 100)
    assert low == pytest.approx(0.4038, abs=1e-4) and high == pytest.approx(0.5962, abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)


def test_the_verdict_against_the_floor_names_the_first_wrong_probe() -> None:
    spec = KnownAnswers()
    probes = probe_set(spec.seed, spec.count)
    right = score(probes, [p.answer for p in probes], spec)
    assert right.status == "passed" and right.details["right"] == 120 and right.details["wilson95"][0] > 0.96
    # A constant fault: every number answer off by one.
    off = [" ".join(str((int(w) + 1) % 100) if w.isdigit() else w for w in p.answer.split()) for p in probes]
    wrong = score(probes, off, spec)
    assert wrong.status == "failed" and wrong.details["right"] == 0
    assert "first wrong" in wrong.reason and probes[0].prompt[:40] in wrong.reason
    # Too few probes to show the floor even when every one is right.
    few = KnownAnswers(count=6, floor=0.9)
    assert score(probe_set(0, 6), [p.answer for p in probe_set(0, 6)], few).status == "failed"


def test_a_chat_reply_without_content_is_an_empty_answer() -> None:
    assert reply_text({"choices": [{"message": {"content": "42"}}]}) == "42"
    for doc in (
        {},
        {"choices": []},
        {"choices": [{"message": None}]},
        ["x"],
        {"choices": [{"message": {"content": 4}}]},
    ):
        assert reply_text(doc) == ""


@pytest.mark.parametrize(
    "bad", [{"floor": "0.9"}, {"count": 3}, {"floor": 1.5}, {"seed": True}, {"extra": 1}, {"probes": "real"}]
)
def test_the_profile_keys_are_strict(bad: dict) -> None:
    with pytest.raises(ValidationError):
        ConformSettings.model_validate({"known_answers": bad})
