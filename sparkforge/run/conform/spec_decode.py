"""Speculative decoding's acceptance as vLLM counts it: the draft and accepted token counters of a server's
Prometheus endpoint (`/metrics`), read strictly, and whether a profile serves with speculative decoding.

The text comes from the served deployment, so it is untrusted: only the allow-listed counters are read, each
sample line must be a counter name, optional `{label="value",...}` and a non-negative whole number; anything else
on such a line is an error naming the URL, never a guess. Every other metric is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkforge.errors import RunError
from sparkforge.recipe.profile import Profile
from sparkforge.run.promtext import read_counters

# vLLM's names (vllm/v1/spec_decode/metrics.py: Counter "vllm:spec_decode_num_draft_tokens"; prometheus_client
# exports a counter's samples as <name>_total); summed over their label sets (one per engine).
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
COUNTERS = (DRAFT_TOKENS, ACCEPTED_TOKENS)


@dataclass(frozen=True)
class SpecDecodeCounts:
    """What vLLM counted since the server started: tokens the drafter proposed and tokens the target accepted."""

    draft_tokens: int
    accepted_tokens: int

    @property
    def acceptance(self) -> float | None:
        """Accepted over drafted; None before any draft."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    def as_report(self) -> dict[str, Any]:
        """The `spec_decode` entry of a server in conform's report (these three keys, a stable interface)."""
        acceptance = self.acceptance
        return {
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance": None if acceptance is None else round(acceptance, 6),
        }

    @classmethod
    def from_report(cls, entry: dict[str, Any]) -> SpecDecodeCounts:
        return cls(int(entry["draft_tokens"]), int(entry["accepted_tokens"]))


def uses_speculative(profile: Profile) -> bool:
    """Whether the profile serves with speculative decoding (a non-empty `speculative-config`)."""
    return any(k.replace("_", "-") == "speculative-config" and v for k, v in profile.model.args.items())


def parse_spec_decode(text: str, where: str) -> SpecDecodeCounts:
    """The two counters of a Prometheus text exposition `where` answered; an error when they are missing or a
    line of theirs is not a plain sample (a whole number of tokens)."""
    fix = "fix: check that the server is vLLM serving with a speculative-config (its /metrics)"
    totals = read_counters(text, COUNTERS, where, fix)
    missing = [n for n in COUNTERS if n not in totals]
    if missing:
        raise RunError(
            f"{where}: no {' or '.join(missing)} counter (speculative decoding is not counted); {fix}"
        )
    counts = SpecDecodeCounts(totals[DRAFT_TOKENS], totals[ACCEPTED_TOKENS])
    if counts.accepted_tokens > counts.draft_tokens:
        raise RunError(
            f"{where}: {counts.accepted_tokens} tokens accepted of {counts.draft_tokens} drafted, more than "
            f"drafted; {fix}"
        )
    return counts
