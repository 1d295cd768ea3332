"""`bench.compare OLD NEW`: per level and metric, a regression only beyond both the threshold and the noise.

OLD may be several results of one image measured alike (`A1.json,A2.json,A3.json`): pooled into one baseline,
each level's repeats side by side (the union of their ranges). The repeats of one bench sample the noise within
a bench; several benches also sample the noise between benches (the machine's state from one to the next),
which is what an unchanged rerun differs by (Kalibera & Jones, "Rigorous benchmarking in reasonable time", 2013:
repeat at the level where the variation is).

Refused outright: results of different models or suites (their figures measure different things). Refused
unless `--allow-different`: different suite settings, model revision, hardware, serve command or corpus (then
listed first in the report). Always shown: what the comparison is for (image, recipe hash, vLLM, backends,
GPU readings). Every level of either file is judged: a level failed or missing in either file fails the
comparison; in a level both passed, each metric both measured follows noise.judge.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

from sparkforge.errors import RunError
from sparkforge.report import Check, Report
from sparkforge.run.bench.noise import METRICS, Spread, judge
from sparkforge.run.bench.provenance import describe, refusing_differences, shown_differences
from sparkforge.run.bench.results import levels, load_result

RULE = (
    "regressed = even the best new repeat is worse than the worst old repeat by more than the threshold: the "
    "change exceeds the measured noise and, beyond it, the threshold (noise.py)"
)


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


def _spreads(check: dict[str, Any]) -> dict[str, Spread]:
    repeats = check["details"]["repeats"]
    return {
        m: Spread.of([r[m] for r in repeats]) for m in METRICS if repeats and all(m in r for r in repeats)
    }


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
) -> Report:
    """The comparison of two loaded results (results.load_result)."""
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
        old_s, new_s = _spreads(before[name]), _spreads(after[name])
        load = {"old": _outside(before[name]), "new": _outside(after[name])}
        for metric in (m for m in METRICS if m in old_s and m in new_s):
            verdict = judge(old_s[metric], new_s[metric], METRICS[metric], threshold_pct)
            report.add(
                Check(
                    f"{name}:{metric}",
                    "failed" if verdict.regressed else "passed",
                    verdict.reason(old_s[metric], new_s[metric], threshold_pct),
                    {
                        "old": vars(old_s[metric]),
                        "new": vars(new_s[metric]),
                        "change_pct": verdict.change_pct,
                        "best_change_pct": verdict.best_change_pct,
                        "gap_pct": verdict.gap_pct,
                        "outside_cpu_pct": load,  # what each side's repeats ran beside (not judged)
                        "beyond_threshold": verdict.beyond_threshold,
                        "beyond_noise": verdict.beyond_noise,
                    },
                )
            )
    return report


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
            check.update(status="failed", reason="missing in " + ", ".join(n for (n, _), lv in zip(docs, by_doc,
                         strict=True) if name not in lv))  # fmt: skip
        elif any(c["status"] != "passed" for _, c in found):
            check.update(
                status="failed",
                reason="; ".join(f"{n}: {c['reason']}" for n, c in found if c["status"] != "passed"),
            )
        else:
            check["details"]["repeats"] = [r for _, c in found for r in c["details"]["repeats"]]
        merged["checks"].append(check)
    merged["pooled"] = [n for n, _ in docs]
    return merged


def compare(
    old_paths: Path | list[Path], new_path: Path, threshold_pct: float, *, allow_different: bool = False
) -> Report:
    """Load the files (refusing bad ones) and compare them; several OLD results are pooled (pool)."""
    threshold_pct = check_threshold(threshold_pct)
    olds = [Path(p) for p in (old_paths if isinstance(old_paths, list) else [old_paths])]
    if not olds:
        raise RunError("bench.compare: no OLD result; fix: pass OLD.json (or A1.json,A2.json) and NEW.json")
    old = pool([(str(p), load_result(p)) for p in olds]) if len(olds) > 1 else load_result(olds[0])
    new = load_result(Path(new_path))
    names = ("+".join(str(p) for p in olds), str(new_path))
    return compare_docs(old, new, names, threshold_pct, allow_different=allow_different)
