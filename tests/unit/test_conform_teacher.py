"""The reference row's teacher-forced rule (run/conform/teacher.py) and its verdict (run/conform/reference.py), on
served decodes shaped as vLLM gives them and scores shaped as hf_reference.py answers them."""

from __future__ import annotations

import math

import pytest

from sparkforge.errors import RunError
from sparkforge.run.conform.client import Completion
from sparkforge.run.conform.logprobs import Decode
from sparkforge.run.conform.reference import compare, pieces_text, reference_scores
from sparkforge.run.conform.teacher import Scored, Tolerances, judge, judge_prompt, noise

TOL = Tolerances(0.212, 1.0)
# A confident answer (p 0.98): the second choice is 4.6 nats below.
SURE = {42: -0.0202, 17: -4.62, 7: -6.5, 9: -7.4, 11: -8.2}
# The same distribution at half the output scale: the same argmax, every value moved (a fault greedy never sees).
HALF = {42: -0.28, 17: -2.58, 7: -3.5, 9: -3.9, 11: -4.4}
# A near tie (p 0.50 vs 0.49).
TIE = {42: math.log(0.50), 43: math.log(0.49), 7: -6.1, 9: -7.3, 11: -8.0}


def _scored(tokens: list[int], tops: list[dict[int, float]]) -> Scored:
    return Scored(tuple(top[t] for t, top in zip(tokens, tops, strict=True)), tuple(tops))


def test_identical_values_pass_with_zero_delta() -> None:
    served = Decode((42, 42), (SURE, SURE))
    verdict = judge_prompt(0, served, _scored([42, 42], [SURE, SURE]), TOL)
    assert verdict.miss is None and verdict.max_delta == 0.0 and verdict.near_ties == 0


def test_a_scaled_output_layer_that_changes_no_token_fails_on_the_values() -> None:
    # The served side at half scale, the reference clean: the same greedy tokens, top-5 membership identical
    # (check_logprobs_close would pass); the served token's logprob 0.26 nats away, the top-5 behind it 3.8.
    served = Decode((42, 42), (HALF, HALF))
    verdict = judge_prompt(2, served, _scored([42, 42], [SURE, SURE]), TOL)
    assert verdict.miss is not None and (verdict.miss.prompt, verdict.miss.position) == (2, 0)
    assert verdict.miss.why == "the served token's logprobs differ by 0.260 nats (tolerance 0.212)"
    # A model so sure of its token that its logprob stays near 0 at half scale: the top-5 behind it still move.
    sure = {42: -1e-9, 17: -21.0, 7: -22.0, 9: -23.0, 11: -24.0}
    halved = {42: -3e-5, 17: -10.5, 7: -11.0, 9: -11.5, 11: -12.0}
    caught = judge_prompt(0, Decode((42,), (halved,)), _scored([42], [sure]), TOL)
    assert caught.miss is not None and "differ by 12.000 nats" in caught.miss.why


def test_small_noise_within_the_tolerance_passes() -> None:
    noisy = {t: lp + 0.05 for t, lp in SURE.items()}
    verdict = judge_prompt(0, Decode((42,), (noisy,)), _scored([42], [SURE]), TOL)
    assert verdict.miss is None and verdict.max_delta == pytest.approx(0.05)


def test_the_tail_has_its_own_tolerance() -> None:
    # A tail token 0.23 nats off (the twin's clean bf16 server against float32 transformers) passes the top-k
    # tolerance; 1.5 nats fails it, named with that tolerance.
    tail = {**SURE, 11: -8.2 + 0.23}
    assert judge_prompt(0, Decode((42,), (tail,)), _scored([42], [SURE]), TOL).miss is None
    far = {**SURE, 11: -8.2 + 1.5}
    verdict = judge_prompt(0, Decode((42,), (far,)), _scored([42], [SURE]), TOL)
    assert verdict.miss is not None and verdict.top_deltas == (pytest.approx(1.5),)
    assert verdict.miss.why == "token 11's logprobs differ by 1.500 nats (top-k tolerance 1)"


def test_a_near_tie_the_reference_would_flip_is_accepted_and_counted() -> None:
    # vLLM chose 43 (its own top-1 after noise); transformers ranks 42 first by 0.02 nats.
    mine = {43: math.log(0.50), 42: math.log(0.49), 7: -6.0, 9: -7.2, 11: -8.1}
    verdict = judge_prompt(0, Decode((43, 42), (mine, SURE)), _scored([43, 42], [TIE, SURE]), TOL)
    assert verdict.miss is None and verdict.near_ties == 1


def test_a_token_the_reference_ranks_far_below_its_top1_fails_even_inside_its_top5() -> None:
    # vLLM's top-1 17 at -0.70, 42 just behind; transformers gives every token within the tolerance of vLLM's
    # values but ranks 42 first, 0.33 nats above 17: more than a near tie.
    mine = {17: -0.70, 42: -0.75, 7: -4.0, 9: -5.0, 11: -6.0}
    ref = {42: -0.55, 17: -0.88, 7: -4.0, 9: -5.0, 11: -6.0}
    verdict = judge_prompt(0, Decode((17,), (mine,)), _scored([17], [ref]), TOL)
    assert verdict.miss is not None and "ranks 42 0.330 nats above the served token" in verdict.miss.why


def test_a_divergence_is_accepted_only_if_the_continuation_after_it_is_within_tolerance() -> None:
    mine = {43: math.log(0.50), 42: math.log(0.49), 7: -6.0, 9: -7.3, 11: -8.1}
    wrong_after = {104: -0.01, 42: -6.0, 7: -6.5, 9: -7.0, 11: -7.5}
    ref_after = {42: -0.02, 104: -5.0, 7: -6.5, 9: -7.0, 11: -7.5}
    verdict = judge_prompt(
        0, Decode((43, 104), (mine, wrong_after)), _scored([43, 104], [TIE, ref_after]), TOL
    )
    assert verdict.miss is not None and verdict.miss.position == 1 and verdict.near_ties == 1


def test_no_served_logprob_and_shape_mismatches_are_named() -> None:
    bare = judge_prompt(0, Decode((42,), ({7: -1.0},)), _scored([42], [SURE]), TOL)
    assert bare.miss is not None and "no logprob for its own token" in bare.miss.why
    with pytest.raises(ValueError, match="scored 1 positions of 2 served"):
        judge_prompt(0, Decode((42, 42), (SURE, SURE)), _scored([42], [SURE]), TOL)
    with pytest.raises(ValueError, match="different prompt sets"):
        judge([Decode((1,))], [], TOL)


def test_noise_figures_cover_every_judged_position() -> None:
    verdicts = judge(
        [Decode((42, 42), (SURE, SURE)), Decode((42,), ({t: lp + 0.1 for t, lp in SURE.items()},))],
        [_scored([42, 42], [SURE, SURE]), _scored([42], [SURE])],
        TOL,
    )
    figures = noise(verdicts)
    assert figures["positions"] == 3 and figures["max"] == pytest.approx(0.1) and figures["median"] == 0.0
    assert noise([]) == {"positions": 0}


def _answer(scored: list[tuple[list[int], list[dict[int, float]]]]) -> dict:
    pieces = {str(i): str(i - 4) for i in range(4, 104)} | {"104": "user"}
    return {
        "scored": [{"logprob": [top[t] for t, top in zip(ids, tops, strict=True)],
                    "top": [[[t, lp] for t, lp in top.items()] for top in tops]} for ids, tops in scored],
        "pieces": pieces, "class": "Qwen3_5MoeForConditionalGeneration", "transformers": "5.19.0",
    }  # fmt: skip


def test_the_row_passes_within_the_rule_and_fails_outside_it_with_both_logprobs_and_top5_lists() -> None:
    served = [Completion((9, 10, 42), "", "length", top=(SURE | {9: -0.01}, SURE | {10: -0.01}, SURE))]
    clean = _answer([([9, 10, 42], [SURE | {9: -0.01}, SURE | {10: -0.01}, SURE])])
    ok = compare(served, clean, 3.2, TOL)
    assert ok.status == "passed" and "the largest logprob delta 0.0 nats (tolerance 0.212)" in ok.reason
    assert ok.details["deltas"]["positions"] == 3 and ok.details["max_delta_per_prompt"] == [0.0]
    wrong = [
        Completion((9, 10, 104), "", "length", top=(SURE | {9: -0.01}, SURE | {10: -0.01}, {104: -0.01}))
    ]
    scored = _answer([([9, 10, 104], [SURE | {9: -0.01}, SURE | {10: -0.01}, SURE | {104: -23.4}])])
    bad = compare(wrong, scored, 3.2, TOL)
    assert bad.status == "failed" and bad.details["position"] == 2, bad.reason
    assert bad.reason.startswith("prompt 0 fails at token 2 after '5 6'"), bad.reason
    assert "vLLM served 'user' [104] at logprob -0.010, transformers gives it -23.400" in bad.reason
    assert "'38'=42 -0.02" in bad.reason and "differ by 23.390 nats" in bad.reason
    assert "1 of 1 prompts outside the rule" in bad.reason and "run after the servers stopped" in bad.reason


def test_a_malformed_reference_answer_is_refused() -> None:
    served = [Completion((1, 2), "", "length", top=({1: -0.1}, {2: -0.1}))]
    with pytest.raises(RunError, match="for 1 prompts"):
        reference_scores({"scored": []}, served)
    with pytest.raises(RunError, match="a logprob and top-K pairs per served token"):
        reference_scores({"scored": [{"logprob": [-0.1], "top": [[[1, -0.1]]]}]}, served)
    with pytest.raises(RunError, match="a logprob and top-K pairs per served token"):
        reference_scores({"scored": [{"logprob": ["x", True], "top": [[], []]}]}, served)
    assert pieces_text({"pieces": {"1": " a", "2": "b"}})([1, 2]) == " ab"
    assert pieces_text({"pieces": {"1": "a", "2": "b"}})([1, 2]) == "a b" and pieces_text({})([1]) is None
