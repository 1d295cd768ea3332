"""`bench.compare OLD NEW`: per level and metric, the ratio new/old with its confidence interval, and a verdict.

The statistics are interval.py's (a t interval on log values, random effects: within-bench variance pooled over
both sides plus the drift between benches estimated from the store, drift_from_results): `regressed` when the whole interval is worse than the
threshold, `passed` when the whole interval is within it, `inconclusive` when it straddles it; every verdict line
shows the ratio, its interval and the smallest slowdown the comparison could have detected.

OLD may be several results of one image measured alike (`A1.json,A2.json,A3.json`): pooled into one baseline,
each level's repeats side by side. More repeats on the old side narrow the interval; several benches also sample
the noise between benches (the machine's state from one to the next), which is what an unchanged rerun differs
by (Kalibera & Jones, "Rigorous benchmarking in reasonable time", 2013: repeat at the level where the variation
is).

Refused outright: results of different models or suites (their figures measure different things). Refused
unless `--allow-different`: different suite settings, model revision, hardware, serve command or corpus (then
listed first in the report). Always shown: what the comparison is for (image, recipe hash, vLLM, backends,
GPU readings). Every level of either file is judged: a level failed or missing in either file fails the
comparison; in a level both passed, each metric both measured gets interval.estimate's verdict.
Check statuses: regressed -> failed, passed -> passed, inconclusive -> skipped (with `verdict` in its details);
the report's `verdict` is `regressed` if any check failed, else `inconclusive` if any could not tell, else
`passed`.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

from sparkforge.errors import RunError
from sparkforge.report import Check, Report
from sparkforge.run.bench.interval import CONFIDENCE, POWER, Drift, between_variance, estimate, pool_drift
from sparkforge.run.bench.noise import METRICS, Spread
from sparkforge.run.bench.provenance import describe, refusing_differences, shown_differences
from sparkforge.run.bench.results import levels, load_result

RULE = (
    f"ratio new/old of geometric means with a {CONFIDENCE:.0%} t interval on log values (random effects: the "
    "within-bench variance pooled over both sides plus the between-bench drift from the store): regressed when the whole interval is worse than the threshold, passed when the whole interval is "
    f"within it, inconclusive otherwise; mde_pct = the slowdown caught with {POWER:.0%} power (interval.py)"
)
VERDICT_STATUS = {"regressed": "failed", "passed": "passed", "inconclusive": "skipped"}


def check_threshold(threshold_pct: Any) -> float:
    """A threshold in percent: a finite number > 0."""
    try:
        value = float(threshold_pct)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise RunError(
            f"bench.compare: --threshold {threshold_pct!r} is not a finite percent > 0; fix: pass e.g. "
            "--threshold 10 (a metric may get 10% worse, beyond the noise, before the comparison fails)"
        )
    return value


def _values(check: dict[str, Any]) -> dict[str, list[float]]:
    """{metric: one value per repeat} for every metric each repeat of the level measured."""
    repeats = check["details"]["repeats"]
    return {m: [r[m] for r in repeats] for m in METRICS if repeats and all(m in r for r in repeats)}


def _outside(check: dict[str, Any]) -> float | None:
    """The mean CPU load from outside the bench's container over a level's repeats (None: not read)."""
    loads = [r["outside_cpu_pct"] for r in check["details"]["repeats"] if "outside_cpu_pct" in r]
    return round(sum(loads) / len(loads), 1) if loads else None


def compare_docs(
    old: dict[str, Any],
    new: dict[str, Any],
    names: tuple[str, str],
    threshold_pct: float,
    *,
    allow_different: bool,
    drift: dict[str, Drift] | None = None,
) -> Report:
    """The comparison of two loaded results (results.load_result); `drift`: per metric, the between-bench
    variance from the store (drift_from_results)."""
    threshold_pct = check_threshold(threshold_pct)
    a, b = names
    for key, what in (("model", "models"), ("suite", "suites")):
        x = old.get(key) if key == "model" else old["suite"]["name"]
        y = new.get(key) if key == "model" else new["suite"]["name"]
        if x != y:
            raise RunError(
                f"{a} measured {what[:-1]} {x!r} but {b} measured {y!r}: different {what} measure different "
                f"things; fix: compare results of the same {what[:-1]} (invoke bench --suite {x} on both)"
            )
    refusing = refusing_differences(old, new)
    if refusing and not allow_different:
        listed = "; ".join(f"{k}: {describe(v['old'])} -> {describe(v['new'])}" for k, v in refusing.items())
        raise RunError(
            f"{a} and {b} were not measured alike ({listed}); their figures are not comparable; fix: measure "
            "both with the same settings on the same machine, or pass --allow-different to compare anyway "
            "(the differences are then printed first)"
        )
    report = Report(
        command="bench.compare", subject=f"{a} -> {b}", recipe=(new.get("identity") or {}).get("recipe")
    )
    report.extra.update(
        {
            "threshold_pct": threshold_pct,
            "rule": RULE,
            "model": new.get("model"),
            "suite": new["suite"]["name"],
            "allowed_differences": refusing,
            "differences": shown_differences(old, new),
        }
    )
    before, after = levels(old), levels(new)
    for name in sorted(set(before) | set(after), key=lambda n: (len(n), n)):
        if name not in before or name not in after:
            side = a if name not in before else b
            report.add(Check(name, "failed", f"level {name} is missing in {side}: no figure to compare"))
            continue
        failed = [s for s, c in ((a, before[name]), (b, after[name])) if c["status"] != "passed"]
        if failed:
            why = "; ".join(
                f"{s}: {c['reason']}" for s, c in ((a, before[name]), (b, after[name])) if s in failed
            )
            report.add(Check(name, "failed", f"level {name} failed in {' and '.join(failed)} ({why})"))
            continue
        load = {"old": _outside(before[name]), "new": _outside(after[name])}
        old_v, new_v = _values(before[name]), _values(after[name])
        sizes = before[name]["details"].get("bench_sizes")
        new_sizes = after[name]["details"].get("bench_sizes")  # several candidate benches (pooled)
        for metric in (m for m in METRICS if m in old_v and m in new_v):
            report.add(
                metric_check(
                    name,
                    metric,
                    (old_v[metric], new_v[metric]),
                    threshold_pct,
                    load,
                    old_benches=sizes,
                    drift=(drift or {}).get(metric),
                    new_benches=new_sizes,
                )
            )
    report.extra.update(verdict_summary(report))
    return report


def metric_check(
    level: str,
    metric: str,
    sides: tuple[list[float], list[float]],
    threshold_pct: float,
    load: dict[str, Any],
    *,
    old_benches: list[int] | None = None,
    drift: Drift | None = None,
    new_benches: list[int] | None = None,
) -> Check:
    """One metric of one level (the check `LEVEL:METRIC`): interval.estimate's verdict of the (old, new) repeats,
    its line (ratio, interval, floor) and evidence."""
    old, new = sides
    est = estimate(
        old,
        new,
        METRICS[metric],
        threshold_pct,
        old_benches=old_benches,
        drift=drift,
        new_benches=new_benches,
    )
    a, b = Spread.of(old), Spread.of(new)
    return Check(
        f"{level}:{metric}",
        VERDICT_STATUS[est.verdict],
        f"{est.verdict}: {est.describe()}; median {a.median:.4g} -> {b.median:.4g}",
        {
            **est.to_dict(),
            "old": vars(a),
            "new": vars(b),
            "change_pct": (b.median - a.median) / a.median * 100 if a.median else None,  # the medians (shown)
            "outside_cpu_pct": load,  # what each side's repeats ran beside (not judged)
        },
    )


def verdict_summary(report: Report) -> dict[str, Any]:
    """The comparison's verdict and floor: regressed > inconclusive > passed; the largest smallest-detectable
    slowdown over the metrics compared (the comparison could not have caught a slowdown below it everywhere)."""
    verdicts = [c.details.get("verdict") for c in report.checks]
    failed = any(c.status == "failed" for c in report.checks)
    floors = [c.details["mde_pct"] for c in report.checks if c.details.get("mde_pct") is not None]
    undetectable = any("mde_pct" in c.details and c.details["mde_pct"] is None for c in report.checks)
    drifts = [
        c.details["drift_floor_pct"] for c in report.checks if c.details.get("drift_floor_pct") is not None
    ]
    return {
        "verdict": "regressed" if failed else "inconclusive" if "inconclusive" in verdicts else "passed",
        "confidence": CONFIDENCE,
        "power": POWER,
        "inconclusive_checks": [c.name for c in report.checks if c.details.get("verdict") == "inconclusive"],
        "mde_pct": {"min": min(floors), "max": None if undetectable else max(floors)} if floors else None,
        "drift_floor_pct": {"min": min(drifts), "max": max(drifts)} if drifts else None,
        "drift_estimated": any(c.details.get("drift_sd_pct") is not None for c in report.checks),
    }


def verdict_line(report: Report) -> str:
    """The line a user reads first: the verdict, and what the comparison could have detected."""
    extra, threshold = report.extra, report.extra["threshold_pct"]
    floor = extra.get("mde_pct")
    could = (
        (
            f"it could detect slowdowns of {floor['min']:.0f}% to "
            + (f"{floor['max']:.0f}%" if floor["max"] is not None else "nothing (one repeat a side)")
            + f" ({extra['power']:.0%} power)"
        )
        if floor
        else "no metric was compared"
    )
    if extra["verdict"] == "regressed":
        what = f"{len(report.failed)} metric(s) worse than {threshold:g}% across their whole interval"
    elif extra["verdict"] == "inconclusive":
        what = (
            f"{len(extra['inconclusive_checks'])} metric(s) could not tell whether the change is within "
            f"{threshold:g}% (the interval straddles it); more repeats or pooled baselines narrow it"
        )
    else:
        what = f"every metric within {threshold:g}% across its whole {extra['confidence']:.0%} interval"
    drift = extra.get("drift_floor_pct")
    under = (
        f"; under the measured drift between benches no repeat count detects below {drift['min']:.0f}% to "
        f"{drift['max']:.0f}%"
        if drift
        else "; repeats taken as independent (no between-bench drift estimated: pool baselines or keep a store)"
        if not extra.get("drift_estimated")
        else ""
    )
    return f"verdict: {extra['verdict'].upper()}: {what}; {could}{under}"


def pool(docs: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Several results of one image measured alike, as one baseline: each level's repeats side by side; a level
    failed or missing in any of them fails."""
    first_name, first = docs[0]
    for name, doc in docs[1:]:
        image = ((first.get("identity") or {}).get("image") or {}).get("id")
        other = ((doc.get("identity") or {}).get("image") or {}).get("id")
        differs = refusing_differences(first, doc)
        if doc.get("model") != first.get("model") or doc["suite"]["name"] != first["suite"]["name"]:
            differs["model or suite"] = {"old": first.get("model"), "new": doc.get("model")}
        if image != other:
            differs["image"] = {"old": image, "new": other}
        if differs:
            raise RunError(
                f"{first_name} and {name} are pooled as one baseline but were not measured alike "
                f"({', '.join(differs)}); fix: pool results of one image measured with the same settings "
                "('invoke bench.history --recipe R' lists them), or compare them one at a time"
            )
    merged = copy.deepcopy(first)
    by_doc = [levels(d) for _, d in docs]
    names = sorted(set().union(*by_doc), key=lambda n: (len(n), n))
    merged["checks"] = []
    for name in names:
        found = [(n, lv[name]) for (n, _), lv in zip(docs, by_doc, strict=True) if name in lv]
        check = copy.deepcopy(found[0][1])
        if len(found) < len(docs):
            check.update(
                status="failed",
                reason="missing in "
                + ", ".join(n for (n, _), lv in zip(docs, by_doc, strict=True) if name not in lv),
            )
        elif any(c["status"] != "passed" for _, c in found):
            check.update(
                status="failed",
                reason="; ".join(f"{n}: {c['reason']}" for n, c in found if c["status"] != "passed"),
            )
        else:
            check["details"]["repeats"] = [r for _, c in found for r in c["details"]["repeats"]]
            # the repeats of each pooled bench, in order: the interval's random effect reads them
            check["details"]["bench_sizes"] = [
                n for _, c in found for n in c["details"].get("bench_sizes") or [len(c["details"]["repeats"])]
            ]
        merged["checks"].append(check)
    merged["pooled"] = [n for n, _ in docs]
    return merged


def drift_from_results(docs: list[dict[str, Any]], model: Any, suite: str) -> dict[str, Drift]:
    """Per metric, the between-bench variance of log figures over the stored results of one model and suite:
    for every image with two or more passed results of a level, the method-of-moments estimate (one-way random
    effects), pooled over images and levels by degrees of freedom."""
    by_image: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        if doc.get("model") == model and doc["suite"]["name"] == suite:
            image = str(((doc.get("identity") or {}).get("image") or {}).get("id") or "")
            by_image.setdefault(image, []).append(doc)
    parts: dict[str, list[tuple[float, float]]] = {}
    used: dict[str, int] = {}
    for image, results in by_image.items():
        if not image or len(results) < 2:
            continue
        per_level = [levels(d) for d in results]
        measured: set[str] = set()
        for name in set().union(*per_level):
            checks = [lv[name] for lv in per_level if lv.get(name, {}).get("status") == "passed"]
            values = [_values(c) for c in checks]
            for metric in METRICS:
                benches = [
                    [math.log(x) for x in v[metric]] for v in values if metric in v and min(v[metric]) > 0
                ]
                found = between_variance(benches)
                if found:
                    parts.setdefault(metric, []).append(found)
                    measured.add(metric)
        for metric in measured:
            used[metric] = used.get(metric, 0) + len(results)
    pooled = {m: pool_drift(p, "store", used.get(m, 0)) for m, p in parts.items()}
    return {m: d for m, d in pooled.items() if d is not None}


def compare(
    old_paths: Path | list[Path],
    new_path: Path,
    threshold_pct: float,
    *,
    allow_different: bool = False,
    store: list[dict[str, Any]] | None = None,
) -> Report:
    """Load the files (refusing bad ones) and compare them; several OLD results are pooled (pool); `store`: the
    stored results the between-bench drift is estimated from (drift_from_results)."""
    threshold_pct = check_threshold(threshold_pct)
    olds = [Path(p) for p in (old_paths if isinstance(old_paths, list) else [old_paths])]
    if not olds:
        raise RunError("bench.compare: no OLD result; fix: pass OLD.json (or A1.json,A2.json) and NEW.json")
    old = pool([(str(p), load_result(p)) for p in olds]) if len(olds) > 1 else load_result(olds[0])
    new = load_result(Path(new_path))
    names = ("+".join(str(p) for p in olds), str(new_path))
    drift = drift_from_results(store, new.get("model"), new["suite"]["name"]) if store else None
    return compare_docs(old, new, names, threshold_pct, allow_different=allow_different, drift=drift)
