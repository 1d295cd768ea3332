"""`bench.compare OLD NEW`: a regression beyond the threshold fails, naming the metric and what differs.

Compared per concurrency present in both files: output tok/s (aggregate and per-request p50) must not drop,
TTFT and ITL (p50, p90) must not rise, by more than the threshold (percent). What differs between the two runs
(vLLM version, recipe hash, image, backends, hardware, settings) is reported with every verdict, because a
figure is only comparable with those known. Files of different models, or not bench results, are refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sparkforge.errors import RunError
from sparkforge.report import Check, Report

# metric path in a concurrency's details -> True when higher is better
METRICS: dict[tuple[str, ...], bool] = {
    ("output_tok_s",): True,
    ("request_output_tok_s", "p50"): True,
    ("ttft_ms", "p50"): False,
    ("ttft_ms", "p90"): False,
    ("itl_ms", "p50"): False,
    ("itl_ms", "p90"): False,
}
CONTEXT_KEYS = ("vllm", "recipe_hash", "image", "backends", "hardware", "settings")


def load_bench(path: Path) -> dict[str, Any]:
    """A bench results file, or a RunError saying what is wrong with it."""
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise RunError(
            f"{path}: cannot read it ({exc.strerror}); fix: pass a file written by 'invoke bench --json'"
        ) from None
    except ValueError as exc:
        raise RunError(
            f"{path}: not JSON ({exc}); fix: pass a file written by 'invoke bench --json'"
        ) from None
    if not isinstance(doc, dict) or doc.get("command") != "bench" or not isinstance(doc.get("checks"), list):
        raise RunError(
            f"{path}: not a bench result (no 'command': 'bench' with checks); fix: pass files written by 'invoke bench --json'"
        )
    for check in doc["checks"]:
        details = check.get("details") if isinstance(check, dict) else None
        if details and not all(_value(details, m) is not None for m in METRICS):
            raise RunError(
                f"{path}: check {check.get('name')} lacks bench figures; fix: re-run 'invoke bench --json'"
            )
    return doc


def _value(details: dict[str, Any], path: tuple[str, ...]) -> float | None:
    node: Any = details
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return float(node) if isinstance(node, int | float) else None


def differences(old: dict[str, Any], new: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What differs between the two runs besides the figures."""
    return {
        key: {"old": old.get(key), "new": new.get(key)}
        for key in CONTEXT_KEYS
        if old.get(key) != new.get(key)
    }


def _by_concurrency(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {
        int(c["details"]["concurrency"]): c["details"]
        for c in doc["checks"]
        if c.get("status") == "passed" and c.get("details", {}).get("concurrency") is not None
    }


def compare(old_path: Path, new_path: Path, threshold_pct: float) -> Report:
    old, new = load_bench(old_path), load_bench(new_path)
    if old.get("model") != new.get("model"):
        raise RunError(
            f"{old_path} measured model {old.get('model')!r} but {new_path} measured {new.get('model')!r}; "
            "fix: compare results of the same model (and profile)"
        )
    differ = differences(old, new)
    report = Report(command="bench.compare", subject=f"{old_path} -> {new_path}", recipe=new.get("recipe"))
    report.extra.update({"threshold_pct": threshold_pct, "model": new.get("model"), "differences": differ})
    before, after = _by_concurrency(old), _by_concurrency(new)
    common = sorted(set(before) & set(after))
    if not common:
        report.add(
            Check(
                "concurrencies",
                "failed",
                f"no concurrency measured in both (old {sorted(before)}, new {sorted(after)})",
            )
        )
        return report
    context = "; differs: " + ", ".join(differ) if differ else "; same versions, backends and hardware"
    for conc in common:
        for metric, higher_better in METRICS.items():
            a, b = _value(before[conc], metric), _value(after[conc], metric)
            name = f"c{conc}:{'.'.join(metric)}"
            if a is None or b is None or a == 0:
                report.add(Check(name, "skipped", "not measured in both runs"))
                continue
            change = (b - a) / a * 100
            worse = -change if higher_better else change
            status = "failed" if worse > threshold_pct else "passed"
            verdict = "regressed" if status == "failed" else "within threshold"
            reason = f"{a:.2f} -> {b:.2f} ({change:+.1f}%, {verdict} {threshold_pct:g}%)"
            report.add(
                Check(
                    name,
                    status,
                    reason + (context if status == "failed" else ""),
                    {"old": a, "new": b, "change_pct": change},
                )
            )
    return report
