"""What changed between two images (local, or pulled from their registry) or two recipes: one report.

`sides.side_of` reads each subject; `compare` lists every difference as a row (section, item, A, B, change),
one check per section. Different recipes or GPUs are compared, but said first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sparkforge.console import cell
from sparkforge.context import Session
from sparkforge.errors import EngineError, PublishError
from sparkforge.registry.sides import Side, flatten, side_of
from sparkforge.report import Check, Report
from sparkforge.verify import kernels_report

PIN_PREFIX = "dev.sparkforge.pin."
SECTIONS = (
    "versions",
    "cuda",
    "packages",
    "sbom",
    "kernels",
    "selection",
    "backends",
    "jit",
    "labels",
    "lock",
    "size",
    "verify",
    "bench",
)
MB = 1 << 20


def _changes(section: str, a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    if a is None or b is None:
        return []
    rows = []
    for key in sorted(set(a) | set(b)):
        old, new = a.get(key), b.get(key)
        if old != new:
            change = "added" if old is None else "removed" if new is None else "changed"
            rows.append({"section": section, "item": key, "a": old, "b": new, "change": change})
    return rows


def _kernel_rows(a: Side, b: Side) -> list[dict[str, Any]]:
    rows = _changes("kernels", a.kernels, b.kernels)
    order = kernels_report.ORDER
    for row in rows:
        old, new = row["a"] or "missing", row["b"] or "missing"
        if old == "native" and new != "native":
            row["change"] = f"lost native {b.gpu}"
        elif new == "native" and old != "native":
            row["change"] = f"gained native {b.gpu}"
        elif old in order and new in order:
            row["change"] = "worse" if order.index(new) > order.index(old) else "better"
    return rows


def _size_rows(a: Side, b: Side) -> list[dict[str, Any]]:
    if a.size is None or b.size is None:
        return []
    rows = []
    total_a, total_b = a.size["image_bytes"], b.size["image_bytes"]
    if total_a != total_b:
        rows.append(
            {
                "section": "size",
                "item": "image",
                "a": total_a,
                "b": total_b,
                "change": _delta(total_b - total_a),
            }
        )
    la, lb = a.size["layers"], b.size["layers"]
    for i in range(max(len(la), len(lb))):
        old = la[i]["bytes"] if i < len(la) else None
        new = lb[i]["bytes"] if i < len(lb) else None
        if old != new:
            rows.append(
                {
                    "section": "size",
                    "item": f"layer {i}",
                    "a": old,
                    "b": new,
                    "change": _delta((new or 0) - (old or 0)),
                }
            )
    pa, pb = a.size["packages"], b.size["packages"]
    for name in sorted(set(pa) | set(pb), key=lambda n: -abs(pb.get(n, 0) - pa.get(n, 0))):
        diff = pb.get(name, 0) - pa.get(name, 0)
        if diff:
            rows.append(
                {
                    "section": "size",
                    "item": f"package {name}",
                    "a": pa.get(name),
                    "b": pb.get(name),
                    "change": _delta(diff),
                }
            )
    return rows


def _delta(n: int) -> str:
    return f"{'+' if n >= 0 else '-'}{abs(n) / MB:.1f} MiB" if abs(n) >= MB // 10 else f"{n:+d} B"


def _split_packages(side: Side) -> tuple[dict[str, str] | None, dict[str, str] | None]:
    if side.packages is None:
        return None, None
    cuda = {k: v for k, v in side.packages.items() if k.lower().startswith(("nvidia", "cuda"))}
    return cuda, {k: v for k, v in side.packages.items() if k not in cuda}


def sbom_rows(a: Any, b: Any) -> list[dict[str, Any]]:
    """The packages (Debian, Python per environment) whose version or hash differs between two SBOMs."""
    if a is None or b is None:
        return []
    from sparkforge.verify.sbom import package_changes

    return [
        {
            "section": "sbom",
            "item": f"{c.kind} {c.name}",
            "a": c.before or None,
            "b": c.after or None,
            "change": c.what,
        }
        for c in package_changes(a, b)
    ]


def compare(a: Side, b: Side) -> Report:
    """Every difference between two sides, as a `diff` report: one check per section, rows in `changes`."""
    warnings = []
    if a.recipe != b.recipe:
        warnings.append(f"different recipes: {a.recipe} vs {b.recipe}")
    if a.gpu != b.gpu:
        warnings.append(f"different GPUs: {a.gpu} vs {b.gpu}; kernel verdicts are each for its own GPU")
    pins = (
        {k: v for k, v in a.labels.items() if k.startswith(PIN_PREFIX)},
        {k: v for k, v in b.labels.items() if k.startswith(PIN_PREFIX)},
    )
    cuda_a, other_a = _split_packages(a)
    cuda_b, other_b = _split_packages(b)
    rows = {
        "versions": _changes(
            "versions",
            {k.removeprefix(PIN_PREFIX): v for k, v in pins[0].items()},
            {k.removeprefix(PIN_PREFIX): v for k, v in pins[1].items()},
        ),
        "cuda": _changes("cuda", cuda_a, cuda_b),
        "packages": _changes("packages", other_a, other_b),
        "sbom": sbom_rows(a.sbom, b.sbom),
        "kernels": _kernel_rows(a, b),
        "selection": [
            {**r, "change": f"{r['item']}: {r['a'] or '-'} -> {r['b'] or '-'}"}
            for r in _changes("selection", a.selection, b.selection)
        ],
        "backends": _changes("backends", a.backends, b.backends),
        "jit": _changes("jit", a.jit, b.jit),
        "labels": _changes(
            "labels",
            {k: v for k, v in a.labels.items() if not k.startswith(PIN_PREFIX)},
            {k: v for k, v in b.labels.items() if not k.startswith(PIN_PREFIX)},
        ),
        "lock": _changes("lock", flatten(a.lock) if a.lock else None, flatten(b.lock) if b.lock else None),
        "size": _size_rows(a, b),
        "verify": _changes("verify", a.verify, b.verify),
        "bench": _changes("bench", a.bench, b.bench),
    }
    missing = {
        "packages": a.packages is None or b.packages is None,
        "sbom": a.sbom is None or b.sbom is None,
        "kernels": a.kernels is None or b.kernels is None,
        "selection": a.selection is None or b.selection is None,
        "size": a.size is None or b.size is None,
        "jit": a.jit is None or b.jit is None,
        "bench": a.bench is None or b.bench is None,
        "verify": a.verify is None or b.verify is None,
    }
    report = Report(command="diff", subject=f"{a.subject} -> {b.subject}", recipe=b.recipe)
    for section in SECTIONS:
        found = rows[section]
        if missing.get(section) and not found:
            why = "only images have it" if section != "bench" else "pass --bench for both sides"
            if section == "selection":
                why = "vLLM's selection did not run on both sides (see the notes)"
            if section == "jit":
                why = "no verify record of both images on this machine"
            report.add(Check(section, "skipped", why))
            continue
        report.add(
            Check(section, "passed", f"{len(found)} difference(s)" if found else "same", {"changes": found})
        )
    report.extra.update(
        {
            "warnings": warnings,
            "notes": [*a.notes, *b.notes],
            "a": {
                "subject": a.subject,
                "kind": a.kind,
                "recipe": a.recipe,
                "recipe_hash": a.recipe_hash,
                "gpu": a.gpu,
            },
            "b": {
                "subject": b.subject,
                "kind": b.kind,
                "recipe": b.recipe,
                "recipe_hash": b.recipe_hash,
                "gpu": b.gpu,
            },
            "changes": [r for s in SECTIONS for r in rows[s]],
        }
    )
    return report


def diff(session: Session, a: str, b: str, bench: Sequence[Path] = ()) -> Report:
    """Read both subjects (an image is pulled through the session's runner) and compare them."""
    if len(bench) not in (0, 2):
        raise PublishError(
            f"--bench given {len(bench)} time(s); fix: give it twice (A's results, then B's) or not at all"
        )
    try:
        sides = [side_of(session, s, bench[i] if bench else None) for i, s in enumerate((a, b))]
    except EngineError as exc:
        raise PublishError(str(exc)) from None
    return compare(*sides)


def format_table(report: Report) -> str:
    """Warnings first, then one table: section, item, A, B, change."""
    data = report.to_dict()
    lines = [f"WARNING: {w}" for w in data.get("warnings") or []]
    lines += [f"note: {n}" for n in data.get("notes") or []]
    rows = [("section", "item", "A", "B", "change")]
    for r in data.get("changes") or []:
        rows.append((r["section"], cell(r["item"])[:60], _cell(r["a"]), _cell(r["b"]), cell(r["change"])))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines += [
        f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]:<{widths[3]}}  {r[4]}".rstrip()
        for r in rows
    ]
    same = [c["name"] for c in data["checks"] if c["reason"] == "same"]
    skipped = [f"{c['name']} ({c['reason']})" for c in data["checks"] if c["status"] == "skipped"]
    lines.append(
        f"same: {', '.join(same) or 'nothing'}" + (f"; not compared: {', '.join(skipped)}" if skipped else "")
    )
    return "\n".join(lines)


def _cell(value: Any) -> str:
    text = "-" if value is None else cell(value)  # registry and image strings: escaped
    return text if len(text) <= 48 else text[:45] + "..."
