"""Repeats and their noise: per metric the median of the repeats and their min/max; the regression rule.

Why min/max and not a bootstrap interval: a bench runs 2-5 repeats per level, and a bootstrap over so few values
only re-samples the same handful (its interval is the min/max range or narrower, with a false air of precision).
The range of the repeats is what was measured, and it is what the rule below reads.

The rule: a metric regressed when BOTH
  1. its BEST repeat (highest throughput, lowest latency) is worse than the old best by more than the threshold
     (percent of the old best), and
  2. the two ranges of repeats do not overlap that way: every new repeat is worse than every old one
     (higher-is-better: new max < old min; lower-is-better: new min > old max).
Why the best and not the median: what disturbs a run on a machine is one-sided (another process taking a core,
a cache flushed, a clock lowered only ever slows it), so the least-disturbed repeat is the most robust estimate
of what the image can do (Chen & Revels, "Robust benchmarking in noisy environments", 2016: under positive
noise the minimum time is the estimator to use). A median moves when two of three repeats were disturbed; the
best moves only when every repeat was, while a real slowdown moves every repeat, the best included. Condition 2
is the rank test at its extreme (Mann-Whitney U = 0): with n repeats a side and nothing changed, every new
repeat falls below every old one with probability 1/C(2n, n) (n=2: 1/6, n=3: 1/20, n=5: 1/252) when repeats are
exchangeable, which the runner makes them by running levels in interleaved rounds (suites.run_order).
With one repeat each side the ranges are points and the rule is the threshold alone.
The median (with min..max) stays what reports and charts show: it is the typical figure.
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

    def best(self, higher_is_better: bool) -> float:
        """The least-disturbed repeat: the highest throughput, the lowest latency."""
        return self.high if higher_is_better else self.low

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    @property
    def noise_pct(self) -> float:
        """The range of the repeats as a percent of their median (0 with one repeat)."""
        return (self.high - self.low) / self.median * 100 if self.median else 0.0


@dataclass(frozen=True)
class Verdict:
    regressed: bool
    change_pct: float  # signed change of the median, new vs old (what reports show)
    best_change_pct: float  # signed change of the best repeat, new vs old (what the rule reads)
    beyond_threshold: bool
    beyond_noise: bool

    def reason(self, old: Spread, new: Spread, threshold_pct: float) -> str:
        ranges = f"[{old.low:.4g}..{old.high:.4g}] -> [{new.low:.4g}..{new.high:.4g}]"
        best = f"best {self.best_change_pct:+.1f}%"
        if self.regressed:
            why = f"regressed: {best}, beyond {threshold_pct:g}%, and outside the old repeats' range {ranges}"
        elif self.beyond_threshold:
            why = f"within noise: {best}, beyond {threshold_pct:g}%, but the repeats' ranges overlap {ranges}"
        else:
            why = f"within {threshold_pct:g}% ({best})"
        return f"median {old.median:.4g} -> {new.median:.4g} ({self.change_pct:+.1f}%), {why}"


def _pct(new: float, old: float) -> float:
    return (new - old) / old * 100 if old else 0.0


def judge(old: Spread, new: Spread, higher_is_better: bool, threshold_pct: float) -> Verdict:
    """The regression rule (module docstring) for one metric of one level."""
    best_change = _pct(new.best(higher_is_better), old.best(higher_is_better))
    beyond_threshold = (-best_change if higher_is_better else best_change) > threshold_pct
    beyond_noise = new.high < old.low if higher_is_better else new.low > old.high
    return Verdict(
        beyond_threshold and beyond_noise,
        _pct(new.median, old.median),
        best_change,
        beyond_threshold,
        beyond_noise,
    )


def summarize_repeats(repeats: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """{metric: {"median", "min", "max"}} over the repeats, for every metric each repeat measured."""
    out: dict[str, dict[str, float]] = {}
    for metric in METRICS:
        values = [r[metric] for r in repeats if metric in r]
        if values and len(values) == len(repeats):
            s = Spread.of(values)
            out[metric] = {"median": s.median, "min": s.low, "max": s.high}
    return out
