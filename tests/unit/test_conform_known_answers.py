"""The known-answers row's parts: the seeded probe set, the judge of one reply, the Wilson interval and the verdict
against the floor, the profile keys (strict)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sparkforge.recipe.conformspec import ConformSettings, KnownAnswers
from sparkforge.run.conform.known_answers import reply_text, score, wilson
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
    "bad", [{"floor": "0.9"}, {"count": 3}, {"floor": 1.5}, {"seed": True}, {"extra": 1}]
)
def test_the_profile_keys_are_strict(bad: dict) -> None:
    with pytest.raises(ValidationError):
        ConformSettings.model_validate({"known_answers": bad})
