"""Repeats and their noise: the metrics a bench measures, and per metric the median of the repeats and their
min..max (what tables, charts and `bench.history` show: the typical figure and the range it was seen in).

The comparison of two results reads the repeats themselves (interval.py: the ratio new/old with a confidence
interval); the median and range are descriptive only.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# metric -> True when higher is better; the figures every suite reports per repeat (absent: not measured)
METRICS: dict[str, bool] = {
    "output_tok_s": True,  # generated tokens per second, all requests of the level together
    "request_output_tok_s": True,  # median per-request decode tokens per second
    "ttft_ms": False,  # median time to first token
    "itl_ms": False,  # median inter-token latency (vLLM's client)
    "prefill_tok_s": True,  # prompt tokens per second (llama-benchy's pp)
    "decode_steps_s": True,  # output_tok_s / vLLM's mean acceptance length (speculative decoding only)
    "acceptance_rate_pct": True,  # vLLM's draft acceptance rate (speculative decoding only)
}


@dataclass(frozen=True)
class Spread:
    """A metric over the repeats of one level."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))


def summarize_repeats(repeats: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """{metric: {"median", "min", "max"}} over the repeats, for every metric each repeat measured."""
    out: dict[str, dict[str, float]] = {}
    for metric in METRICS:
        values = [r[metric] for r in repeats if metric in r]
        if values and len(values) == len(repeats):
            s = Spread.of(values)
            out[metric] = {"median": s.median, "min": s.low, "max": s.high}
    return out
