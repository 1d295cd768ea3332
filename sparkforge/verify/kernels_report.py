"""The kernel report of one image: per layer type, what vLLM itself selects on the recipe's GPU, where that
kernel's code comes from and whether it can run there, what vLLM falls back to; as JSON and Markdown.

vLLM decides (verify/inimage/vllm_selection.py runs its own selection functions in the image, the capability
injected); sparkforge only judges the chosen code: a compiled library by the audit's verdict for the target,
a serve-time compiler by the in-image JIT check (kernel_origin.py says which is which).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sparkforge.audit.coverage import glob_matches
from sparkforge.report import Check, Report
from sparkforge.verify import started as started_log
from sparkforge.verify.imagechecks import IMAGE_CHECKS
from sparkforge.verify.kernel_origin import origin_of

ORDER = ("native", "family", "jit", "none", "missing", "unchecked", "unknown")  # best first
USABLE = ("native", "family", "jit")
JIT_CHECKS = tuple(
    n for n in IMAGE_CHECKS.names() if n.startswith("jit.")
)  # the in-image JIT checks, in order
RULE = (
    "vLLM selects: its own selection functions run inside the image for the target's capability (injected at "
    "CudaPlatform.get_device_capability) and the checkpoint's config. sparkforge judges the selected kernel's "
    "code: a compiled library by its audit verdict for the target (native, family, jit = PTX only, none; "
    "missing: not in the image), a serve-time compiler by its in-image JIT check ('jit' when it passed, 'none' "
    "when it failed or was skipped, 'unchecked' without a verify report). A kernel's verdict is the worst of its "
    "needs; native, family and jit are usable. 'falls back to' is the next candidate vLLM accepts whose code is "
    "usable."
)


def worst(verdicts: Sequence[str]) -> str:
    return max(verdicts, key=ORDER.index) if verdicts else "unknown"


def _library_verdict(pattern: str, libraries: Sequence[Mapping[str, Any]]) -> tuple[str, list[str]]:
    found = [lib for lib in libraries if glob_matches(pattern, str(lib["path"]))]
    if not found:
        return "missing", []
    best = min((str(lib["verdict"]) for lib in found), key=ORDER.index)
    return best, [str(lib["path"]) for lib in found]


def _compiler_verdict(name: str, jit: Mapping[str, Mapping[str, Any]] | None) -> str:
    if jit is None:
        return "unchecked"
    check = jit.get(name)
    return "jit" if check and check.get("status") == "passed" else "none"


def judge(
    name: str,
    detail: str,
    libraries: Sequence[Mapping[str, Any]],
    jit: Mapping[str, Mapping[str, Any]] | None,
) -> dict[str, Any]:
    """A kernel's origin, the verdict of each need and its own (the worst)."""
    origin = origin_of(name, detail)
    needs = []
    for pattern in origin.libraries:
        verdict, paths = _library_verdict(pattern, libraries)
        needs.append({"need": pattern, "verdict": verdict, "paths": paths})
    for check in origin.compilers:
        needs.append({"need": check, "verdict": _compiler_verdict(check, jit), "paths": []})
    return {
        "origin": origin.kind,
        "note": origin.note,
        "needs": needs,
        "verdict": worst([n["verdict"] for n in needs]),
    }


def layer_rows(
    selection: Mapping[str, Any],
    libraries: Sequence[Mapping[str, Any]],
    jit: Mapping[str, Mapping[str, Any]] | None,
) -> list[dict[str, Any]]:
    """One row per layer type of vLLM's answer: the selected kernel, its verdict, and what it falls back to."""
    rows = []
    for layer in selection.get("layers") or []:
        selected, detail = layer.get("selected"), str(layer.get("detail") or "")
        candidates = []
        for cand in layer.get("candidates") or []:
            judged = judge(str(cand["name"]), detail if cand["name"] == selected else "", libraries, jit)
            runs = bool(cand.get("usable")) and judged["verdict"] in USABLE
            candidates.append({**cand, **judged, "runs": runs})
        mine = next((c for c in candidates if c["name"] == selected), None)
        own = judge(str(selected), detail, libraries, jit) if selected else None
        after = [c for c in candidates if mine is None or c["priority"] > mine["priority"]]
        fallback = next((c["name"] for c in after if c["runs"] and c["name"] != selected), None)
        rows.append(
            {
                "layer": layer["layer"],
                "checkpoint": bool(layer.get("checkpoint", True)),
                "selected": selected,
                "detail": detail,
                "origin": own["origin"] if own else None,
                "needs": own["needs"] if own else [],
                "verdict": own["verdict"] if own else "unknown",
                "usable": bool(own and own["verdict"] in USABLE),
                "fallback": fallback,
                "rejected": [c for c in candidates if mine is not None and c["priority"] < mine["priority"]],
                "candidates": candidates,
                "error": layer.get("error"),
            }
        )
    return rows


def backend_verdicts(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The flat list kept under the report's `backends` key: every candidate of every layer type."""
    out = []
    for row in rows:
        for cand in row["candidates"]:
            out.append(
                {
                    "name": f"{row['layer']}: {cand['name']}",
                    "kind": row["layer"],
                    "verdict": cand["verdict"],
                    "usable": cand["runs"],
                    "selected": cand["name"] == row["selected"],
                    "vllm_accepts": bool(cand.get("usable")),
                    "reasons": list(cand.get("reasons") or []),
                    "needs": cand["needs"],
                }
            )
    return out


def jit_results(checks: Sequence[Mapping[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
    """The JIT toolchain checks of a verify report's checks (None: no verify report to read them from)."""
    if checks is None:
        return None
    return {
        str(c["name"]): {"status": c.get("status"), "reason": c.get("reason", "")}
        for c in checks
        if c.get("name") in JIT_CHECKS
    }


def kernel_report(
    audit: Report,
    *,
    recipe: str | None = None,
    verify_checks: Sequence[Mapping[str, Any]] | None = None,
    facts: Mapping[str, Any] | None = None,
    selection: Mapping[str, Any] | None = None,
    started: Mapping[str, Mapping[str, Any]] | None = None,
) -> Report:
    """The kernel report from the audit, vLLM's selection (None: not run) and optionally the verify checks
    and what vLLM logged at start. `facts` (versions, digests) is copied into the report as it is."""
    audit_data = audit.to_dict()
    libraries = list(audit_data.get("libraries") or [])
    jit = jit_results(verify_checks)
    rows = layer_rows(selection or {}, libraries, jit)
    report = Report(command="kernels", subject=audit.subject, recipe=recipe)
    for check in audit_data.get("checks") or []:
        report.add(Check.from_dict({**check, "name": f"audit.{check['name']}"}))
    for name, result in (jit or {}).items():
        status = str(result["status"]) if result["status"] in ("passed", "failed") else "skipped"
        report.add(Check(name, status, str(result["reason"])))
    target = audit_data.get("target")
    if selection is None:
        report.add(
            Check("selection", "skipped", "vLLM's selection was not run (no model config or runner image)")
        )
    else:
        cannot = [r for r in rows if r["checkpoint"] and r["verdict"] in ("none", "missing")]
        broken = [r for r in rows if r.get("error")]
        report.add(
            Check(
                "selection",
                "failed" if cannot else "passed",
                f"vLLM {selection.get('vllm')} on {target}: "
                + "; ".join(f"{r['layer']} {r['selected']} ({r['verdict']})" for r in rows if r["checkpoint"])
                + (f"; cannot run on {target}: {', '.join(r['layer'] for r in cannot)}" if cannot else ""),
                {"errors": {r["layer"]: r["error"] for r in broken}},
            )
        )
    warnings = started_log.compare(rows, started) if started is not None else []
    if started is not None:
        report.add(
            Check(
                "started",
                "passed",
                f"{len(started)} selection(s) read from the serve log; "
                f"{len(warnings)} differ from the prediction",
                {"warnings": warnings},
            )
        )
    backends = backend_verdicts(rows)
    report.extra.update(
        {
            "target": target,
            "libraries": libraries,
            "summary": audit_data.get("summary"),
            "jit": jit,
            "layers": rows,
            "backends": backends,
            "selection": {
                k: v for k, v in (selection or {}).items() if k not in ("layers", "python_digests")
            },
            "started": dict(started) if started is not None else None,
            "warnings": warnings,
            "rule": RULE,
            "facts": dict(facts or {}),
        }
    )
    return report


def coverage_summary(data: Mapping[str, Any]) -> dict[str, Any]:
    """The short form kept in history entries and shown by pull: verdict counts, usable backends, selection."""
    summary = data.get("summary") or {}
    return {
        "target": data.get("target"),
        "by_verdict": dict(summary.get("by_verdict") or {}),
        "native": sorted(
            str(lib["path"]) for lib in data.get("libraries") or [] if lib["verdict"] == "native"
        ),
        "usable_backends": [
            b["name"] for b in data.get("backends") or [] if b.get("usable") and b.get("selected")
        ],
        "selected": {r["layer"]: r["selected"] for r in data.get("layers") or []},
    }


def selected_by_layer(data: Mapping[str, Any]) -> dict[str, str]:
    """layer -> 'KERNEL (verdict)' of a report's JSON form: what `invoke diff` compares."""
    return {str(r["layer"]): f"{r['selected']} ({r['verdict']})" for r in data.get("layers") or []}


def to_markdown(data: Mapping[str, Any]) -> str:
    """The report (its JSON form) as Markdown for a release page."""
    from sparkforge.verify.kernels_markdown import render

    return render(data)


def versions(labels: Mapping[str, str]) -> dict[str, str]:
    """component -> pin from the image's `dev.sparkforge.pin.<component>` labels (vLLM commit, torch, CUDA...)."""
    prefix = "dev.sparkforge.pin."
    return {k.removeprefix(prefix): v for k, v in sorted(labels.items()) if k.startswith(prefix)}
