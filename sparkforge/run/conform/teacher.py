"""The `reference` row's rule: transformers scores the SERVED continuation teacher-forced (the prompt and every
served token in one forward pass, hf_reference.py) and each position is judged on logprob values, not only on
top-k membership.

At every position of every prompt:
- the served token's logprob differs between the server and the reference by at most `tolerance` nats (the
  profile's `conform.reference.tolerance`; the default, 0.212, is 4 x the largest delta measured between a
  cached decode and a teacher-forced pass on a GPU: benchmarks/conform-gpu.md);
- every other token of either side's top-k by at most `top_tolerance` (default 1.0): far from 0, a logit's
  rounding is not cancelled, so the tail is noisier (a token one side ranks in its top-k and the other below its
  k-th value differs at least by the distance to that value);
- where the reference would have chosen another token (its top-1 is not the served one), the served token must be
  a near tie: the reference ranks its own top-1 at most `tolerance` nats above the served token. Teacher forcing
  follows the served tokens, so the continuation after such a divergence is scored like the rest: a divergence
  is accepted only when everything after it is within tolerance too.

A fault that changes no greedy token (an output layer at half scale) moves the values (1.6-2.1 nats on a GPU;
on a model so sure of its tokens that their own logprobs stay near 0, the top-k behind them move by 2-5 nats)
and fails here; vLLM's `check_logprobs_close` (logprobs.py), which other rows use to compare the server with
itself, would pass it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sparkforge.recipe.conformspec import ReferenceRule
from sparkforge.run.conform.logprobs import Decode, top_pairs

# The defaults live once, in the profile schema (recipe/conformspec.py ReferenceRule), with where they come from.
_FIELDS = ReferenceRule.model_fields


@dataclass(frozen=True)
class Tolerances:
    """How far the server's logprobs may lie from the reference's: the served token's, the other top-k tokens'."""

    served: float = _FIELDS["tolerance"].default
    top: float = _FIELDS["top_tolerance"].default


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
            "top": [top_pairs(self.served_top), top_pairs(self.reference_top)],
            "why": self.why,
        }


@dataclass(frozen=True)
class Verdict:
    """One prompt under the rule: its largest delta, the near ties it accepted, and the first miss (None: none)."""

    prompt: int
    deltas: tuple[float, ...]  # the served token's, per judged position
    near_ties: int = 0
    miss: Miss | None = None
    top_deltas: tuple[float, ...] = ()  # the largest among the top-k's other tokens, per judged position

    @property
    def max_delta(self) -> float:
        return max(self.deltas, default=0.0)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _worst_top(mine: Mapping[int, float], theirs: Mapping[int, float]) -> tuple[float, int | None, str]:
    """The largest logprob difference among the tokens of either top-k, and which token: a token one side ranks
    in its top-k and the other below its own k-th value differs at least by the distance to that k-th value."""
    worst, which, where = 0.0, None, ""
    for side, other, name in ((mine, theirs, "transformers"), (theirs, mine, "vLLM")):
        floor = min(other.values(), default=0.0)
        for tid, lp in side.items():
            gap = abs(lp - other[tid]) if tid in other else lp - floor
            if gap > worst:
                worst, which = gap, tid
                where = "" if tid in other else f" ({name} ranks it below its top-{len(other)})"
    return worst, which, where


def judge_prompt(n: int, served: Decode, scored: Scored, rule: Tolerances) -> Verdict:
    """Every position of one prompt: the served token's logprob difference, the top-k's largest, and near ties
    where the reference prefers another token; the first position outside the rule is the prompt's miss."""
    if len(scored.logprob) != len(served.token_ids) or len(scored.top) != len(served.token_ids):
        raise ValueError(
            f"prompt {n}: the reference scored {len(scored.logprob)} positions of {len(served.token_ids)} served"
        )
    deltas: list[float] = []
    top_deltas: list[float] = []
    near_ties = 0
    for pos, token in enumerate(served.token_ids):
        mine = served.top_at(pos) or {}
        theirs, ref_lp = scored.top[pos], scored.logprob[pos]
        served_lp = mine.get(token)
        why = ""
        if served_lp is None:
            why = "the server gave no logprob for its own token"
        else:
            delta = abs(served_lp - ref_lp)
            deltas.append(delta)
            spread, which, where = _worst_top(mine, {**theirs, token: ref_lp})
            best, best_lp = max(theirs.items(), key=lambda kv: kv[1], default=(token, ref_lp))
            if delta > rule.served:
                why = f"the served token's logprobs differ by {delta:.3f} nats (tolerance {rule.served:g})"
            else:
                top_deltas.append(spread)
                if spread > rule.top:
                    why = f"token {which}'s logprobs differ{where} by {spread:.3f} nats (top-k tolerance {rule.top:g})"
                elif best != token and best_lp - ref_lp > rule.served:
                    why = (
                        f"transformers ranks {best} {best_lp - ref_lp:.3f} nats above the served token (a near tie "
                        f"is at most {rule.served:g})"
                    )
                elif best != token:
                    near_ties += 1
        if why:
            seen = {"served_top": dict(mine), "reference_top": dict(theirs)}
            found = Miss(n, pos, token, served_lp, ref_lp, **seen, why=why)
            return Verdict(n, tuple(deltas), near_ties, found, tuple(top_deltas))
    return Verdict(n, tuple(deltas), near_ties, None, tuple(top_deltas))


def judge(served: Sequence[Decode], scored: Sequence[Scored], rule: Tolerances) -> list[Verdict]:
    """Every prompt's verdict, in prompt order."""
    if len(served) != len(scored):
        raise ValueError(f"{len(served)} served decodes against {len(scored)} scored: different prompt sets")
    return [judge_prompt(n, d, s, rule) for n, (d, s) in enumerate(zip(served, scored, strict=True))]


def noise(verdicts: Sequence[Verdict], top: bool = False) -> dict[str, float | int]:
    """The served token's deltas of every judged position (`top`: the top-k's largest): how many, median, 99th
    percentile and largest (nats): the figures a tolerance is derived from (run on a clean model)."""
    deltas = sorted(d for v in verdicts for d in (v.top_deltas if top else v.deltas))
    if not deltas:
        return {"positions": 0}
    p99 = deltas[min(len(deltas) - 1, int(0.99 * len(deltas)))]
    return {
        "positions": len(deltas),
        "median": round(statistics.median(deltas), 4),
        "p99": round(p99, 4),
        "max": round(deltas[-1], 4),
    }


def rule_name(rule: Tolerances) -> str:
    return (
        f"teacher-forced: every served token's logprob within {rule.served:g} nats of transformers', every other "
        f"top-k token's within {rule.top:g}, a token transformers would not choose only as a near tie (within "
        f"{rule.served:g} nats of its top-1)"
    )
