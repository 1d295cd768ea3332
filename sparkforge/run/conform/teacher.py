"""The `reference` row's rule: transformers scores the SERVED continuation teacher-forced (the prompt and every
served token in one forward pass, hf_reference.py) and each position is judged on logprob values, not only on
top-k membership.

At every position of every prompt:
- the served token's logprob, and the logprob of every token in either side's top-k, differ between the server
  and the reference by at most `tolerance` nats (a token one side ranks in its top-k and the other below its
  k-th value differs at least by the distance to that value; the profile's
  `conform.reference.tolerance`; the default, 0.212, is 4 x the largest delta measured between a cached decode
  and a teacher-forced pass on a GPU: benchmarks/conform-gpu.md);
- where the reference would have chosen another token (its top-1 is not the served one), the served token must be
  a near tie: the reference ranks its own top-1 at most `tolerance` nats above the served token. Teacher forcing
  follows the served tokens, so the continuation after such a divergence is scored like the rest: a divergence
  is accepted only when everything after it is within tolerance too.

A fault that changes no greedy token (an output layer at half scale) moves the values (1.6-2.1 nats on a GPU;
on a model so sure of its tokens that their own logprobs stay near 0, the top-k behind them move) and fails here; vLLM's `check_logprobs_close` (logprobs.py), which other rows use to compare the server with itself, would
pass it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sparkforge.run.conform.logprobs import Decode

DEFAULT_TOLERANCE = 0.212  # nats: 4 x 0.053, the largest noise measured on a GPU (benchmarks/conform-gpu.md)


@dataclass(frozen=True)
class Scored:
    """The reference's scores of one served continuation: per position, the logprob of the served token and the
    reference's own top-k {token id: logprob}."""

    logprob: tuple[float, ...]
    top: tuple[Mapping[int, float], ...]


@dataclass(frozen=True)
class Miss:
    """The first position of a prompt outside the rule, with what both sides said there."""

    prompt: int
    position: int
    token: int
    served: float | None  # the server's logprob of its own token (None: it gave none)
    reference: float
    served_top: Mapping[int, float] = field(default_factory=dict)
    reference_top: Mapping[int, float] = field(default_factory=dict)
    why: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "prompt": self.prompt,
            "position": self.position,
            "token": self.token,
            "logprobs": [_round(self.served), _round(self.reference)],
            "top": [_pairs(self.served_top), _pairs(self.reference_top)],
            "why": self.why,
        }


@dataclass(frozen=True)
class Verdict:
    """One prompt under the rule: its largest delta, the near ties it accepted, and the first miss (None: none)."""

    prompt: int
    deltas: tuple[float, ...]
    near_ties: int = 0
    miss: Miss | None = None

    @property
    def max_delta(self) -> float:
        return max(self.deltas, default=0.0)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _pairs(top: Mapping[int, float]) -> list[list[float]]:
    return [[tid, round(lp, 4)] for tid, lp in sorted(top.items(), key=lambda kv: -kv[1])]


def _worst(
    mine: Mapping[int, float], theirs: Mapping[int, float], token: int, served_lp: float, ref_lp: float
) -> tuple[float, str]:
    """The largest logprob difference at one position, and what it was: the served token's, then every token in
    either top-k (a token one side ranks in its top-k and the other below its own k-th value differs by at least
    the distance to that k-th value)."""
    worst, what = abs(served_lp - ref_lp), f"the served token {token}'s logprobs differ"
    for side, other, name in ((mine, theirs, "transformers"), (theirs, mine, "vLLM")):
        floor = min(other.values(), default=0.0)
        for tid, lp in side.items():
            gap = abs(lp - other[tid]) if tid in other else lp - floor
            if gap > worst:
                where = "" if tid in other else f" ({name} ranks it below its top-{len(other)})"
                worst, what = gap, f"token {tid}'s logprobs differ{where}"
    return worst, what


def judge_prompt(n: int, served: Decode, scored: Scored, tolerance: float) -> Verdict:
    """Every position of one prompt: the largest logprob difference (the served token and both top-k lists), and
    near ties where the reference prefers another token; the first position outside the rule is the miss."""
    if len(scored.logprob) != len(served.token_ids) or len(scored.top) != len(served.token_ids):
        raise ValueError(
            f"prompt {n}: the reference scored {len(scored.logprob)} positions of {len(served.token_ids)} served"
        )
    deltas: list[float] = []
    near_ties = 0
    for pos, token in enumerate(served.token_ids):
        mine = served.top_at(pos) or {}
        theirs, ref_lp = scored.top[pos], scored.logprob[pos]
        seen = {"served_top": dict(mine), "reference_top": dict(theirs)}
        served_lp = mine.get(token)
        if served_lp is None:
            why = "the server gave no logprob for its own token"
            return Verdict(n, tuple(deltas), near_ties, Miss(n, pos, token, None, ref_lp, **seen, why=why))
        delta, what = _worst(mine, {**theirs, token: ref_lp}, token, served_lp, ref_lp)
        deltas.append(delta)
        if delta > tolerance:
            why = f"{what} by {delta:.3f} nats (tolerance {tolerance:g})"
            return Verdict(
                n, tuple(deltas), near_ties, Miss(n, pos, token, served_lp, ref_lp, **seen, why=why)
            )
        best, best_lp = max(theirs.items(), key=lambda kv: kv[1], default=(token, ref_lp))
        if best != token:
            gap = best_lp - ref_lp
            if gap > tolerance:
                why = (
                    f"transformers ranks {best} {gap:.3f} nats above the served token (a near tie is at most "
                    f"{tolerance:g})"
                )
                return Verdict(
                    n, tuple(deltas), near_ties, Miss(n, pos, token, served_lp, ref_lp, **seen, why=why)
                )
            near_ties += 1
    return Verdict(n, tuple(deltas), near_ties)


def judge(served: Sequence[Decode], scored: Sequence[Scored], tolerance: float) -> list[Verdict]:
    """Every prompt's verdict, in prompt order."""
    if len(served) != len(scored):
        raise ValueError(f"{len(served)} served decodes against {len(scored)} scored: different prompt sets")
    return [judge_prompt(n, d, s, tolerance) for n, (d, s) in enumerate(zip(served, scored, strict=True))]


def noise(verdicts: Sequence[Verdict]) -> dict[str, float | int]:
    """The deltas of every judged position: how many, median, 99th percentile and largest (nats): the figures a
    tolerance is derived from (run on a clean model)."""
    deltas = sorted(d for v in verdicts for d in v.deltas)
    if not deltas:
        return {"positions": 0}
    p99 = deltas[min(len(deltas) - 1, int(0.99 * len(deltas)))]
    return {
        "positions": len(deltas),
        "median": round(statistics.median(deltas), 4),
        "p99": round(p99, 4),
        "max": round(deltas[-1], 4),
    }


def rule_name(tolerance: float) -> str:
    return (
        f"teacher-forced: every served token's logprob within {tolerance:g} nats of transformers', a token "
        f"transformers would not choose only as a near tie (within {tolerance:g} nats of its top-1)"
    )
