"""The rule two greedy decodes are judged by when they may legitimately differ: vLLM's own `check_logprobs_close`
(vllm tests/models/utils.py), which its tests of batching, prefix caching and HF-vs-vLLM use.

Per prompt, the decodes are walked token by token; the first position where the ids differ decides: the
divergence is accepted when each side's token is among the other side's top-k logprobs at that position (a near
tie that numerics may flip: batch-size dependent MoE tiling, FP8 atomics, another attention kernel), and the
comparison of that prompt stops there (the sequences then go their own ways). It fails when either token is
outside the other's top-k, when a side has no logprobs there, or when one side ended where the other went on.
With `exact` (vLLM's batch-invariant mode, or no logprobs on one side) any differing id fails.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

TOP_K = 5  # the logprobs conform requests (OpenAI completions `logprobs: 5`; the reference's top-5)


@dataclass(frozen=True)
class Decode:
    """One side's greedy decode of one prompt: its token ids and, per position, its top-k {token id: logprob}."""

    token_ids: tuple[int, ...]
    top: tuple[Mapping[int, float], ...] = ()

    def top_at(self, position: int) -> Mapping[int, float] | None:
        return self.top[position] if position < len(self.top) else None


@dataclass(frozen=True)
class Divergence:
    """The first position where one prompt's two decodes differ, and whether the rule accepts it."""

    prompt: int
    position: int
    left: int | None  # None: that side ended here
    right: int | None
    left_top: Mapping[int, float] = field(default_factory=dict)
    right_top: Mapping[int, float] = field(default_factory=dict)
    accepted: bool = False
    why: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "prompt": self.prompt,
            "position": self.position,
            "tokens": [self.left, self.right],
            "top": [top_pairs(self.left_top), top_pairs(self.right_top)],
            "accepted": self.accepted,
            "why": self.why,
        }


def top_pairs(top: Mapping[int, float]) -> list[list[float]]:
    """A top-k as [token id, logprob] rows, most likely first (logprobs to 4 places), as reports carry it."""
    return [[tid, round(lp, 4)] for tid, lp in sorted(top.items(), key=lambda kv: -kv[1])]


def first_difference(left: Sequence[int], right: Sequence[int]) -> int | None:
    """The first position where two id sequences differ (a length difference counts), None when identical."""
    if list(left) == list(right):
        return None
    return next(
        (i for i, (a, b) in enumerate(zip(left, right, strict=False)) if a != b), min(len(left), len(right))
    )


def judge_prompt(n: int, left: Decode, right: Decode, *, exact: bool = False) -> Divergence | None:
    """One prompt's two decodes under the rule: None when identical, else the first divergence and its verdict."""
    pos = first_difference(left.token_ids, right.token_ids)
    if pos is None:
        return None
    a = left.token_ids[pos] if pos < len(left.token_ids) else None
    b = right.token_ids[pos] if pos < len(right.token_ids) else None
    top_a, top_b = left.top_at(pos), right.top_at(pos)
    seen = {"left_top": dict(top_a or {}), "right_top": dict(top_b or {})}
    if exact:
        return Divergence(n, pos, a, b, **seen, why="the rule is exact (identical token ids)")
    if a is None or b is None:
        return Divergence(n, pos, a, b, **seen, why="one side ended where the other went on")
    if top_a is None or top_b is None:
        return Divergence(n, pos, a, b, **seen, why="no logprobs at this position on one side")
    if a in top_b and b in top_a:
        return Divergence(
            n, pos, a, b, **seen, accepted=True, why=f"each token is in the other's top-{TOP_K}"
        )
    outside = [
        f"{tok} not in the {side}'s top-{len(top)}"
        for tok, top, side in ((a, top_b, "right"), (b, top_a, "left"))
        if tok not in top
    ]
    return Divergence(n, pos, a, b, **seen, why="; ".join(outside))


def judge(left: Sequence[Decode], right: Sequence[Decode], *, exact: bool = False) -> list[Divergence]:
    """Every prompt's first divergence (accepted or not), in prompt order; [] when all are identical."""
    if len(left) != len(right):
        raise ValueError(f"{len(left)} decodes against {len(right)}: the two sides ran different prompt sets")
    found = (judge_prompt(n, a, b, exact=exact) for n, (a, b) in enumerate(zip(left, right, strict=True)))
    return [d for d in found if d is not None]


def rule_name(exact: bool) -> str:
    return (
        "identical token ids (batch-invariant mode)"
        if exact
        else f"check_logprobs_close: at the first divergence each token in the other's top-{TOP_K}"
    )
