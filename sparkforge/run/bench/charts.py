"""`bench.report`: charts of results (one line per image, the repeats' min..max as a band) and a static HTML page.

Charts (matplotlib, Agg: no display): output tok/s and TTFT against concurrency (one panel per context depth),
and against context depth (one panel per concurrency) when more than one depth was measured. The page embeds
them as PNG data, the identity of each result, and with two results the comparison table (compare.py): per metric
its verdict, the ratio new/old, its confidence interval and the smallest slowdown it could have detected.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparkforge.errors import RunError
from sparkforge.report import Report

PLOTTED = (("output_tok_s", "output tokens/s"), ("ttft_ms", "TTFT (ms)"))


def _label(doc: dict[str, Any], path: Path) -> str:
    ident = doc["identity"]
    image = (ident.get("image") or {}).get("ref") or "?"
    short = ((ident.get("image") or {}).get("id") or "").split(":")[-1][:12]
    return f"{image} ({short}, vLLM {ident.get('vllm')}, {path.name})"


def _series(doc: dict[str, Any], metric: str, by: str, fixed: str, value: int) -> list[tuple[int, dict]]:
    points = []
    for check in doc["checks"]:
        d = check["details"]
        s = (d.get("summary") or {}).get(metric)
        if check["status"] == "passed" and s and d[fixed] == value:
            points.append((d[by], s))
    return sorted(points, key=lambda p: p[0])


def _figure(docs: Sequence[tuple[Path, dict[str, Any]]], by: str, fixed: str) -> tuple[str, bytes] | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({c["details"][fixed] for _, d in docs for c in d["checks"]})
    if len({c["details"][by] for _, d in docs for c in d["checks"]}) < 2:
        return None  # a single x value draws no line
    fig, axes = plt.subplots(len(PLOTTED), len(panels), figsize=(4.2 * len(panels) + 1, 6.5), squeeze=False)
    for col, value in enumerate(panels):
        for row, (metric, label) in enumerate(PLOTTED):
            ax = axes[row][col]
            for path, doc in docs:
                points = _series(doc, metric, by, fixed, value)
                if not points:
                    continue
                xs = [p[0] for p in points]
                line = ax.plot(xs, [p[1]["median"] for p in points], marker="o", label=_label(doc, path))[0]
                ax.fill_between(
                    xs,
                    [p[1]["min"] for p in points],
                    [p[1]["max"] for p in points],
                    color=line.get_color(),
                    alpha=0.2,
                    linewidth=0,
                )
            ax.set_xticks(sorted({c["details"][by] for _, d in docs for c in d["checks"]}))
            ax.set_title(f"{fixed} {value}", fontsize=9)
            ax.set_xlabel(by)
            ax.set_ylabel(label)
            ax.grid(True, alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", fontsize=8, ncol=1)
    fig.tight_layout(rect=(0, 0.06 + 0.03 * len(docs), 1, 1))
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return f"by-{by}", buffer.getvalue()


def charts(docs: Sequence[tuple[Path, dict[str, Any]]]) -> dict[str, bytes]:
    """{name: PNG bytes}: against concurrency (per depth), and against depth (per concurrency) when several."""
    if not docs:
        raise RunError("bench.report: no result given; fix: pass one or more files written by 'invoke bench'")
    suites = {d["suite"]["name"] for _, d in docs}
    models = {d["model"] for _, d in docs}
    if len(suites) > 1 or len(models) > 1:
        raise RunError(
            f"bench.report: the results measure different suites {sorted(suites)} or models {sorted(models)}; "
            "fix: chart results of one suite and one model together"
        )
    out = {}
    for by, fixed in (("concurrency", "depth"), ("depth", "concurrency")):
        made = _figure(docs, by, fixed)
        if made:
            out[made[0]] = made[1]
    if not out:
        raise RunError(
            "bench.report: every result measured one level only, nothing to draw; fix: bench at two or more "
            "concurrencies or depths (e.g. --concurrency 1,2)"
        )
    return out


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _interval_cells(details: dict[str, Any]) -> list[str]:
    """verdict, ratio, interval, smallest detectable slowdown, n: a metric check's statistics as table cells."""
    if "verdict" not in details:  # a failed or missing level: no statistics
        return ["", "", "", "", ""]
    ratio, low, high, mde = (details.get(k) for k in ("ratio", "low", "high", "mde_pct"))
    return [
        details["verdict"],
        f"{ratio:.3f}" if ratio is not None else "-",
        f"{low:.3f}..{high:.3f} ({details.get('confidence', 0):.0%})" if low is not None else "none",
        f">= {mde:.0f}%" if mde is not None else "nothing",
        f"{details.get('n_old')}/{details.get('n_new')}",
    ]


def page(
    docs: Sequence[tuple[Path, dict[str, Any]]], pngs: dict[str, bytes], comparison: Report | None
) -> str:
    """The static HTML page: charts, each result's identity, the comparison table."""
    suite = docs[0][1]["suite"]
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>sparkforge bench report</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}.failed{color:#b00}</style></head><body>",
        f"<h1>sparkforge bench: {html.escape(docs[0][1]['model'])}, suite {html.escape(suite['name'])}</h1>",
        f"<p>Lines: median of the repeats; bands: their min..max. Suite parameters: {html.escape(str(suite['params']))}</p>",
    ]
    for name, data in pngs.items():
        parts.append(
            f"<h2>{html.escape(name)}</h2><img alt='{html.escape(name)}' src='data:image/png;base64,"
            f"{base64.b64encode(data).decode()}'>"
        )
    rows = []
    for path, doc in docs:
        ident = doc["identity"]
        hw = ident.get("hardware") or {}
        gpus = ", ".join(g.get("name", "?") for g in hw.get("gpus") or []) or "none"
        rows.append(
            [
                path.name,
                (ident.get("image") or {}).get("id", "")[:19],
                ident.get("vllm"),
                (ident.get("recipe_hash") or "")[:12],
                hw.get("cpu"),
                gpus,
                ident.get("date"),
            ]
        )
    parts.append(
        "<h2>Results</h2>" + _table(["file", "image", "vLLM", "recipe hash", "CPU", "GPUs", "date"], rows)
    )
    if comparison is not None:
        data = comparison.to_dict()
        verdict = data.get("verdict", data["status"])
        parts.append(f"<h2>Comparison: {html.escape(str(verdict))}</h2>")
        parts.append(
            f"<p>{html.escape(str(data.get('rule', '')))}; threshold {data.get('threshold_pct')}%</p>"
        )
        for key, sides in {**data.get("allowed_differences", {}), **data.get("differences", {})}.items():
            parts.append(
                f"<p>differs: {html.escape(key)}: {html.escape(str(sides['old']))[:300]} -&gt; "
                f"{html.escape(str(sides['new']))[:300]}</p>"
            )
        parts.append(
            _table(
                [
                    "check",
                    "status",
                    "verdict",
                    "ratio new/old",
                    "interval",
                    "could detect",
                    "n old/new",
                    "reason",
                ],
                [
                    [c["name"], c["status"], *_interval_cells(c["details"]), c["reason"]]
                    for c in data["checks"]
                ],
            )
        )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
