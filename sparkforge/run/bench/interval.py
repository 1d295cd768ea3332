"""The comparison's statistics: per metric, the ratio new/old with a confidence interval, the verdict it supports
and the smallest slowdown the comparison could have detected.

The estimate: Student's t interval on the logarithms of the repeats, the variance pooled over both sides. The
difference of the mean logs is the log of the ratio of geometric means new/old (for spreads like a bench's,
within a fraction of a percent of the ratio of means); logs make a slowdown and a speed-up of one factor
symmetric and the repeats' noise, which is multiplicative (a disturbance slows a run by a fraction), closer to
normal and alike for both images on one machine.
Why the pooled variance and not Welch's: when nothing changed, both sides sample the same machine's noise, and
the new side's 3-5 repeats estimate it poorly; pooled, every baseline repeat sharpens the estimate and adds a
degree of freedom (df = n_old + n_new - 2). Welch's degrees of freedom are bounded by the smaller side, so
pooling more baselines against 3 new repeats can widen its interval (n_old 6 -> 12: the expected width grows
~4 %): more data would weaken the comparison. The cost: a new side much noisier than the old (a busier machine)
is judged with the old side's spread too; the false-alarm rates measured on a busy machine are in
benchmarks/bench-noise.md. Why not a bootstrap: with 3-10 repeats a side it re-samples the same handful of
values and its percentile interval covers far less than its nominal 95 %.

Drift between benches (a random effect). The project's own studies show the machine's state moving from one bench
to the next (between-bench / within-bench standard deviation about 0.5 quiet, 1.5 busy: benchmarks/bench-drift.md):
repeats of one bench share that bench's draw, so they are not independent, and treating them so makes more repeats
raise the false alarms. The interval is a random-effects one: a log figure = image + bench + repeat noise; the old
mean is the mean of its benches' means, and its variance sigma^2 * mean(1/n_b)/k + tau^2/k (k benches), the new
side's sigma^2/m + tau^2 (one bench; j benches of an interleaved two-image run: as the old side's, over j);
sigma^2 is the within-bench variance pooled over every bench of both sides,
tau^2 the between-bench variance estimated from the bench store (compare.drift_from_results: every image with
two or more alike results, method of moments, pooled), else from the pooled baseline's own benches; the degrees
of freedom by Satterthwaite. The drift also sets a floor no number of repeats goes below (`drift_floor_pct`: the
smallest slowdown caught with infinite repeats on each side). Without any estimate (one baseline bench, an empty
store) tau^2 is 0 and the line says the repeats were treated as independent. Pooled baselines narrow the
interval on average, but do not always raise the power: benchmarks/bench-drift.md restates that claim from a
seeded simulation.

The verdict, with threshold T percent (the change a metric may show before it counts):
- `regressed`: the whole interval is worse than T (a throughput ratio whose upper bound is below 1 - T/100, a
  latency ratio whose lower bound is above 1 + T/100). A metric whose true change is at most T is called
  regressed in at most (1 - CONFIDENCE) / 2 = 2.5 % of comparisons.
- `passed`: the whole interval is better than that limit: the change is within T, at the same confidence.
- `inconclusive`: the interval straddles the limit: the data cannot tell. It is never reported as passed.
The smallest detectable slowdown (`mde_pct`) is the true slowdown this comparison's noise and repeat counts would
call regressed with probability POWER: log-limit + (t + z(POWER) * sqrt(1 + t^2 / 2df)) * standard error, with
t = t(1 - alpha/2, df) (the noncentral t's quantile, approximated after Jennett & Welch 1939: the estimated
standard error varies too, which matters with few repeats). It is never below T; it shrinks with more repeats
or more pooled baselines. With one repeat on one side the spread comes from the other side alone; with one
repeat on each side there is no interval and the verdict is inconclusive.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any, Literal

from sparkforge.run.bench.tdist import t_quantile

CONFIDENCE = 0.95  # two-sided: each side of the interval errs 2.5 % of the time
POWER = 0.80  # the detection probability the smallest detectable slowdown is stated at
VerdictName = Literal["regressed", "inconclusive", "passed"]


@dataclass(frozen=True)
class Estimate:
    """One metric of one level: new/old with its interval, and what the comparison could detect."""

    verdict: VerdictName
    ratio: float | None  # geometric mean new / geometric mean old (None: a repeat measured 0)
    low: float | None  # the CONFIDENCE interval of the ratio (None: no interval, one repeat a side)
    high: float | None
    mde_pct: float | None  # smallest slowdown (percent worse) flagged with POWER; None: not computable
    worse_pct: float | None  # the ratio as percent worse (> 0: slower), the direction the metric counts
    n_old: int
    n_new: int
    df: float | None
    threshold_pct: float
    benches_old: int = 1  # baseline benches pooled
    drift_sd_pct: float | None = (
        None  # the between-bench standard deviation used, percent (None: none estimated)
    )
    drift_source: str = "none"  # "store (N benches)", "baseline (N benches)" or "none" (repeats independent)
    drift_floor_pct: float | None = None  # the smallest slowdown caught with POWER however many repeats

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(confidence=CONFIDENCE, power=POWER)
        return data

    def describe(self) -> str:
        """`ratio 0.93 [0.85..1.02], could detect >= 24% (n 9 vs 3)`: what every verdict line shows."""
        n = f"n {self.n_old} vs {self.n_new}"
        if self.ratio is None:
            return f"no ratio (a repeat measured 0), {n}"
        interval = f"[{self.low:.3f}..{self.high:.3f}]" if self.low is not None else "[no interval]"
        floor = f"could detect >= {self.mde_pct:.0f}%" if self.mde_pct is not None else "could detect nothing"
        if self.drift_sd_pct is None:
            drift = "; repeats taken as independent (no between-bench drift estimated)"
        else:
            drift = f"; drift between benches sd {self.drift_sd_pct:.1f}% ({self.drift_source})" + (
                f", no repeat count detects below {self.drift_floor_pct:.0f}%" if self.drift_floor_pct else ""
            )
        return f"ratio {self.ratio:.3f} {interval}, {floor} ({n}){drift}"


def _logs(values: list[float]) -> list[float] | None:
    return [math.log(v) for v in values] if values and all(v > 0 for v in values) else None


def _worse(log_ratio: float, higher_is_better: bool) -> float:
    """A log ratio as percent worse (throughput: percent lower; latency: percent higher)."""
    return (1 - math.exp(log_ratio)) * 100 if higher_is_better else (math.exp(log_ratio) - 1) * 100


def _limit(threshold_pct: float, higher_is_better: bool) -> float:
    """The log ratio at the threshold, as a slowdown in log units (> 0)."""
    if higher_is_better:
        return -math.log(1 - threshold_pct / 100) if threshold_pct < 100 else math.inf
    return math.log(1 + threshold_pct / 100)


def mde(se: float, df: float, threshold_pct: float, higher_is_better: bool) -> float:
    """The smallest true slowdown (percent worse) flagged with probability POWER at this standard error."""
    slow = _limit(threshold_pct, higher_is_better)
    if se > 0:
        crit = t_quantile(1 - (1 - CONFIDENCE) / 2, df)
        # the noncentrality that puts POWER of the noncentral t beyond crit (Jennett & Welch's approximation:
        # the estimated standard error varies too, which t(POWER) alone leaves out and few repeats make large)
        slow += (crit + NormalDist().inv_cdf(POWER) * math.sqrt(1 + crit * crit / (2 * df))) * se
    sign = -1 if higher_is_better else 1
    return _worse(sign * slow, higher_is_better)


@dataclass(frozen=True)
class Drift:
    """A between-bench variance of a metric's log figure, with its degrees of freedom and where it came from."""

    tau2: float
    df: float
    benches: int
    source: str  # "store" or "baseline"


def between_variance(benches: Sequence[Sequence[float]]) -> tuple[float, float] | None:
    """(tau^2, df) of the log figures of one image's benches by the method of moments (one-way random effects,
    unbalanced: (MSB - MSW) / n0, floored at 0); None with fewer than two benches or no within-bench spread."""
    groups = [list(b) for b in benches if len(b) >= 1]
    k, total = len(groups), sum(len(g) for g in groups)
    if k < 2 or total - k < 1:
        return None
    grand = statistics.fmean(x for g in groups for x in g)
    msb = sum(len(g) * (statistics.fmean(g) - grand) ** 2 for g in groups) / (k - 1)
    msw = sum((x - statistics.fmean(g)) ** 2 for g in groups for x in g) / (total - k)
    n0 = (total - sum(len(g) ** 2 for g in groups) / total) / (k - 1)
    return max(0.0, (msb - msw) / n0), float(k - 1)


def pool_drift(parts: Sequence[tuple[float, float]], source: str, benches: int) -> Drift | None:
    """Several (tau^2, df) estimates (one per image and level) as one, weighted by their degrees of freedom;
    `benches`: how many results they came from."""
    df = sum(d for _, d in parts)
    if df <= 0:
        return None
    return Drift(sum(t * d for t, d in parts) / df, df, benches, source)


def _split(values: list[float], sizes: Sequence[int] | None) -> list[list[float]]:
    if not sizes or sum(sizes) != len(values):
        return [values]
    out, at = [], 0
    for size in sizes:
        out.append(values[at : at + size])
        at += size
    return [g for g in out if g]


def estimate(
    old: list[float],
    new: list[float],
    higher_is_better: bool,
    threshold_pct: float,
    *,
    old_benches: Sequence[int] | None = None,
    drift: Drift | None = None,
    new_benches: Sequence[int] | None = None,
) -> Estimate:
    """The interval and verdict for one metric: old = every baseline repeat (pooled; `old_benches` the repeats
    of each pooled bench, in order), new = the new repeats (one bench, or several: `new_benches`, as an
    interleaved two-image bench makes); `drift` the store's between-bench variance (else estimated from the
    baseline's benches when there are two or more, else none: repeats independent)."""
    a, b = _logs(old), _logs(new)
    groups = _split(a, old_benches) if a is not None else [old]
    base = {"n_old": len(old), "n_new": len(new), "threshold_pct": threshold_pct, "benches_old": len(groups)}
    if a is None or b is None:
        return Estimate("inconclusive", None, None, None, None, None, df=None, **base)
    news = _split(b, new_benches)
    k, j = len(groups), len(news)
    # each side's mean is the mean of its benches' means; one new bench: the mean of its repeats
    diff = statistics.fmean(statistics.fmean(h) for h in news) - statistics.fmean(
        statistics.fmean(g) for g in groups
    )
    ratio, worse = math.exp(diff), _worse(diff, higher_is_better)
    within_df = len(a) + len(b) - k - j
    if drift is None and k >= 2:
        own = between_variance(groups)
        drift = Drift(own[0], own[1], k, "baseline") if own else None
    if within_df < 1 and drift is None:
        return Estimate("inconclusive", ratio, None, None, None, worse, df=None, **base)
    sw2 = (
        sum((x - statistics.fmean(g)) ** 2 for g in groups for x in g)
        + sum((x - statistics.fmean(h)) ** 2 for h in news for x in h)
    ) / max(within_df, 1)
    within = (
        sw2 * (sum(1 / len(g) for g in groups) / k**2 + sum(1 / len(h) for h in news) / j**2)
        if within_df >= 1
        else 0.0
    )
    between = drift.tau2 * (1 / k + 1 / j) if drift else 0.0
    if within + between <= 0 and within_df < 1:
        return Estimate("inconclusive", ratio, None, None, None, worse, df=None, **base)
    se = math.sqrt(within + between)
    parts = [(within, float(within_df))] if within_df >= 1 else []
    parts += [(between, drift.df)] if drift and between > 0 else []
    df = (within + between) ** 2 / sum(v * v / d for v, d in parts) if se > 0 else float(max(within_df, 1))
    half = t_quantile(1 - (1 - CONFIDENCE) / 2, df) * se if se > 0 else 0.0
    low, high = math.exp(diff - half), math.exp(diff + half)
    slow = _limit(threshold_pct, higher_is_better)
    # the interval's best and worst ends, as slowdowns in log units
    best, worst = (-(diff + half), -(diff - half)) if higher_is_better else (diff - half, diff + half)
    verdict: VerdictName = "regressed" if best > slow else "passed" if worst <= slow else "inconclusive"
    drift_info: dict[str, Any] = {}
    if drift is not None:
        drift_info = {
            "drift_sd_pct": (math.exp(math.sqrt(drift.tau2)) - 1) * 100,
            "drift_source": f"{drift.source}, {drift.benches} benches",
            "drift_floor_pct": mde(math.sqrt(between), drift.df, threshold_pct, higher_is_better)
            if between > 0
            else None,
        }
    return Estimate(
        verdict,
        ratio,
        low,
        high,
        mde(se, df, threshold_pct, higher_is_better),
        worse,
        df=df,
        **base,
        **drift_info,
    )


def needed_mde(values: list[float], higher_is_better: bool, threshold_pct: float = 0.0) -> float | None:
    """The smallest slowdown beyond the threshold a comparison of this bench with an equal one would detect.

    What `bench --target-detect` reads after each round: the repeats' own spread stands for both sides (an
    unchanged rerun of the same length). None with fewer than 2 repeats or a repeat of 0.
    """
    logs = _logs(values)
    if logs is None or len(logs) < 2:
        return None
    n = len(logs)
    se = math.sqrt(statistics.variance(logs) * 2 / n)
    return mde(se, float(2 * n - 2), threshold_pct, higher_is_better)
