"""The GPU-nondeterminism rule (vLLM's check_logprobs_close), which the rows comparing the server with itself use,
on decodes shaped as vLLM gives them: top-5 {token id: logprob} per position (the reference row's teacher-forced
rule: test_conform_teacher.py)."""

from __future__ import annotations

import math

import pytest

from sparkforge.run.conform.logprobs import Decode, first_difference, judge, judge_prompt


def _top(*pairs: tuple[int, float]) -> dict[int, float]:
    return dict(pairs)


# A near tie (p 0.50 vs 0.49): numerics of another batch size may flip it.
TIE_A = _top((42, math.log(0.50)), (43, math.log(0.49)), (7, -6.1), (9, -7.3), (11, -8.0))
TIE_B = _top((43, math.log(0.505)), (42, math.log(0.485)), (7, -6.0), (9, -7.2), (11, -8.1))
# A confident answer (p 0.98): the second choice is 4.6 nats below.
SURE = _top((42, -0.0202), (17, -4.62), (7, -6.5), (9, -7.4), (11, -8.2))
SURE_WRONG = _top((104, -0.01), (5, -5.9), (6, -6.3), (8, -7.0), (10, -7.7))


def test_identical_decodes_have_no_divergence() -> None:
    a = Decode((5, 6, 42), (SURE, SURE, SURE))
    assert judge_prompt(0, a, a) is None and judge([a], [a]) == []


def test_a_near_tie_flipped_is_accepted_with_both_tokens_in_the_other_top5() -> None:
    left = Decode((5, 6, 42, 44), (SURE, SURE, TIE_A, SURE))
    right = Decode((5, 6, 43, 45), (SURE, SURE, TIE_B, SURE))
    found = judge_prompt(3, left, right)
    assert found is not None and found.accepted and (found.prompt, found.position) == (3, 2)
    assert (found.left, found.right) == (42, 43) and "top-5" in found.why
    # Whatever follows the first divergence is not compared (the sequences then go their own ways).
    assert found.to_dict()["top"][0][0] == [42, round(math.log(0.50), 4)]


def test_a_token_outside_the_other_top5_fails_and_says_which() -> None:
    left = Decode((5, 6, 42), (SURE, SURE, SURE))
    right = Decode((5, 6, 104), (SURE, SURE, SURE_WRONG))
    found = judge_prompt(0, left, right)
    assert found is not None and not found.accepted
    assert "42 not in the right's top-5" in found.why and "104 not in the left's top-5" in found.why


def test_one_way_membership_is_not_enough() -> None:
    # right's 43 is in left's top-5, but left's 42 is not in right's: vLLM's rule needs both.
    right_top = _top((43, -0.1), (50, -2.5), (51, -3.0), (52, -3.1), (53, -3.5))
    found = judge_prompt(0, Decode((42,), (TIE_A,)), Decode((43,), (right_top,)))
    assert found is not None and not found.accepted and found.why == "42 not in the right's top-5"


def test_exact_mode_missing_logprobs_and_an_early_end_fail() -> None:
    left, right = Decode((42,), (TIE_A,)), Decode((43,), (TIE_B,))
    exact = judge_prompt(0, left, right, exact=True)
    assert exact is not None and not exact.accepted and "exact" in exact.why
    bare = judge_prompt(0, Decode((42,)), Decode((43,), (TIE_B,)))
    assert bare is not None and not bare.accepted and "no logprobs" in bare.why
    ended = judge_prompt(0, Decode((5, 6), (SURE, SURE)), Decode((5, 6, 7), (SURE, SURE, SURE)))
    assert ended is not None and ended.position == 2 and ended.left is None and not ended.accepted
    assert first_difference([1, 2], [1, 2]) is None and first_difference([1, 2], [1, 3]) == 1


def test_different_prompt_sets_are_refused() -> None:
    with pytest.raises(ValueError, match="different prompt sets"):
        judge([Decode((1,))], [])


def test_the_golden_identifies_weights_by_their_bytes_not_their_size(tmp_path, monkeypatch) -> None:
    import hashlib

    from sparkforge.run.conform.golden import model_revision

    monkeypatch.setenv("SPARKFORGE_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["Qwen3_5MoeForConditionalGeneration"]}')
    shard = model / "model.safetensors"
    shard.write_bytes(b"\x01" * 4096)
    first = model_revision(model, "tiny")
    assert first["weights_sha256"] == {"model.safetensors": hashlib.sha256(b"\x01" * 4096).hexdigest()}
    shard.write_bytes(b"\x01" * 4095 + b"\x02")  # one byte flipped: the same size
    second = model_revision(model, "tiny")
    assert second["revision"] != first["revision"]
    assert (
        second["weights_sha256"]["model.safetensors"] == hashlib.sha256(b"\x01" * 4095 + b"\x02").hexdigest()
    )
