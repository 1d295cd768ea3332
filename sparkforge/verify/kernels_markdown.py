"""The kernel report (its JSON form) as Markdown: what vLLM selects per layer type, then libraries and JITs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparkforge.console import md_cell, md_code


def _needs(needs: list[Mapping[str, Any]]) -> str:
    return ", ".join(f"`{n['need']}`: {n['verdict']}" for n in needs) or "unknown origin"


def _rejected(row: Mapping[str, Any]) -> str:
    parts = []
    for cand in row.get("rejected") or []:
        why = "; ".join(str(r) for r in cand.get("reasons") or []) or (
            f"code {cand['verdict']}" if not cand.get("runs") else "accepted"
        )
        parts.append(f"{cand['name']} ({md_cell(why[:120])})")
    return "<br>".join(parts) or "-"


def _b12x(layers: list[Mapping[str, Any]]) -> list[str]:
    out = []
    for row in layers:
        for cand in row.get("candidates") or []:
            if "b12x" not in str(cand["name"]).lower():
                continue
            if cand["name"] == row["selected"]:
                state = "selected"
            elif cand.get("usable"):
                state = f"accepted by vLLM, after {row['selected']} (code: {cand['verdict']})"
            else:
                state = f"refused: {'; '.join(cand.get('reasons') or [])[:140]}"
            out.append(f"- {row['layer']}: {cand['name']}: {state}")
    return out or ["- none of vLLM's candidates here is a B12X kernel"]


def render(data: Mapping[str, Any]) -> str:
    target = data.get("target")
    facts = data.get("facts") or {}
    selection = data.get("selection") or {}
    started = data.get("started")
    lines = [f"# Kernel report: {md_cell(data.get('subject'))}", ""]  # untrusted text: escaped
    lines.append(
        f"Recipe {md_code(data.get('recipe'))}, GPU {md_code(target)}, status **{data.get('status')}**."
    )
    if facts:
        lines += ["", "| fact | value |", "|---|---|"]
        lines += [f"| {md_cell(k)} | {md_code(v)} |" for k, v in sorted(facts.items())]
    lines += ["", f"## What vLLM selects on {target}", ""]
    if not data.get("layers"):
        lines.append("Not run (no model config or no image to run vLLM's selection in).")
    else:
        lines.append(
            f"vLLM {selection.get('vllm')} (torch {selection.get('torch')}), capability "
            f"{'.'.join(str(x) for x in selection.get('capability') or [])} injected at "
            f"`{selection.get('injected_at')}`; checkpoint `{selection.get('architecture')}`, quantization "
            f"`{selection.get('quantization')}` ({selection.get('checkpoint_kind')}). Rows marked * are the "
            "checkpoint's own; the others show what vLLM would pick for the other quantizations."
        )
        if selection.get("ran_in"):
            lines.append(f"Ran in `{selection['ran_in']}`. {selection.get('sources', '')}".rstrip())
        head = "| layer | vLLM selects | code from | verdict | falls back to | rejected above it |"
        sep = "|---|---|---|---|---|---|"
        if started is not None:
            head, sep = head + " selected at start |", sep + "---|"
        lines += ["", head, sep]
        for row in data["layers"]:
            name = f"{row['selected']}{' ' + row['detail'] if row.get('detail') else ''}"
            cells = [
                f"{row['layer']}{' *' if row.get('checkpoint') else ''}",
                name if not row.get("error") else f"error: {md_cell(str(row['error'])[:120])}",
                _needs(row["needs"]),
                row["verdict"],
                row.get("fallback") or "-",
                _rejected(row),
            ]
            if started is not None:
                cells.append(str((started.get(row["layer"]) or {}).get("selected", "-")))
            lines.append("| " + " | ".join(cells) + " |")
        for warning in data.get("warnings") or []:
            lines += ["", f"WARNING: {warning}"]
        lines += ["", "B12X (vLLM's b12x extra, or FlashInfer's embedded copy), per layer:", ""]
        lines += _b12x(data["layers"])
    by = (data.get("summary") or {}).get("by_verdict") or {}
    lines += ["", f"## Libraries ({', '.join(f'{k} {v}' for k, v in by.items())})", ""]
    lines += ["| library | verdict | units native/family/jit/none |", "|---|---|---|"]
    for lib in data.get("libraries") or []:
        units = lib.get("units") or {}
        counts = "/".join(str(units.get(v, 0)) for v in ("native", "family", "jit", "none"))
        lines.append(f"| {md_code(lib['path'])} | {lib['verdict']} | {counts} |")
    scope = (data.get("summary") or {}).get("scope")
    if scope is not None:
        lines += ["", f"Only the libraries the verdicts depend on were opened ({', '.join(md_code(g) for g in scope)}); "
                  f"{(data.get('summary') or {}).get('not_opened', 0)} other files were not "
                  "(`invoke kernels --all-libraries` opens every one)."]  # fmt: skip
    lines += ["", "## JIT toolchain", ""]
    jit = data.get("jit")
    if jit is None:
        lines.append("Not checked (no verify report given).")
    else:
        lines += ["| check | status | reason |", "|---|---|---|"]
        lines += [
            f"| {md_cell(k)} | {md_cell(v['status'])} | {md_cell(v['reason'])} |"
            for k, v in sorted(jit.items())
        ]
    lines += ["", f"Rule: {data.get('rule')}", ""]
    return "\n".join(lines)
