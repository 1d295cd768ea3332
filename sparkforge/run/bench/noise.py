"""Repeats and their noise: per metric the median of the repeats and their min/max; the regression rule.

Why min/max and not a bootstrap interval: a bench runs 2-5 repeats per level, and a bootstrap over so few values
only re-samples the same handful (its interval is the min/max range or narrower, with a false air of precision).
The range of the repeats is what was measured, and it is what the rule below reads.

The rule: a metric regressed when even its BEST new repeat (highest throughput, lowest latency) is worse than
the WORST old repeat by more than the threshold (percent of that old repeat): the change exceeds the measured
noise (the old repeats' range) and, beyond it, the threshold. So every new repeat is worse than every old one
(the ranges are apart) and the best moved by more than the threshold too.
Why the best new repeat: what disturbs a run on a machine is one-sided (another process taking a core, a cache
flushed, a clock lowered only ever slows it), so the least-disturbed repeat is the robust estimate of what the
image can do (Chen & Revels, "Robust benchmarking in noisy environments", 2016: under positive noise use the
minimum time); a median moves when two of three repeats were disturbed, the best only when all were, while a
real slowdown moves every repeat. Why against the worst old repeat: it is the most the machine was seen to
disturb the old image; a new best beyond it by the threshold is a slowdown no disturbance in the baseline
explains. The ordering alone (every new repeat below every old one) is the rank test at its extreme
(Mann-Whitney U = 0): by chance with probability 1/C(m + n, n) for m old and n new exchangeable repeats (3 and
3: 1/20; a baseline pooled from three benches, 9 and 3: 1/220). The runner makes repeats exchangeable within a
bench (interleaved rounds, suites.run_order); pooling several benches as the baseline (compare.pool) samples
the noise between benches, which one bench's repeats cannot. The cost: a slowdown smaller than the machine's
own noise band is not called a regression (measured: benchmarks/bench-noise.md).
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
    best_change_pct: float  # signed change of the best repeat, new vs old
    gap_pct: float  # how much worse the best new repeat is than the worst old one (what the rule reads; < 0: overlap)
    beyond_threshold: bool  # the best repeat moved by more than the threshold
    beyond_noise: bool  # the ranges are apart: every new repeat worse than every old one

    def reason(self, old: Spread, new: Spread, threshold_pct: float) -> str:
        ranges = f"[{old.low:.4g}..{old.high:.4g}] -> [{new.low:.4g}..{new.high:.4g}]"
        if self.regressed:
            why = (f"regressed: even the best new repeat is {self.gap_pct:.1f}% worse than the worst old one, "
                   f"beyond {threshold_pct:g}% outside the old repeats' range {ranges}")  # fmt: skip
        elif self.beyond_noise:
            why = (f"within noise + {threshold_pct:g}%: the ranges are apart {ranges} but only by "
                   f"{self.gap_pct:.1f}%")  # fmt: skip
        elif self.beyond_threshold:
            why = f"within noise: best {self.best_change_pct:+.1f}%, but the repeats' ranges overlap {ranges}"
        else:
            why = f"within {threshold_pct:g}% (best {self.best_change_pct:+.1f}%)"
        return f"median {old.median:.4g} -> {new.median:.4g} ({self.change_pct:+.1f}%), {why}"


def _pct(new: float, old: float) -> float:
    return (new - old) / old * 100 if old else 0.0


def judge(old: Spread, new: Spread, higher_is_better: bool, threshold_pct: float) -> Verdict:
    """The regression rule (module docstring) for one metric of one level."""
    sign = -1 if higher_is_better else 1  # a change in the bad direction comes out positive
    best_change = _pct(new.best(higher_is_better), old.best(higher_is_better))
    gap = sign * _pct(new.best(higher_is_better), old.best(not higher_is_better))
    return Verdict(
        regressed=gap > threshold_pct,
        change_pct=_pct(new.median, old.median),
        best_change_pct=best_change,
        gap_pct=gap,
        beyond_threshold=sign * best_change > threshold_pct,
        beyond_noise=new.high < old.low if higher_is_better else new.low > old.high,
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
