"""NVIDIA's performance file (beside each recipe of its catalog): written from a bench result, read as a baseline.

The file records what the figures belong to: the recipe (id and hash), the image digest, the model revision,
the harness and its version, the dataset (token lengths), and per concurrency the figures (output tokens/s, median
time to first token and inter-token latency). Its keys are sparkforge's stated reading of NVIDIA's format
(docs/formats.md, "performance file"). A comparison says first whether the two runs are comparable at all (same
harness, same dataset); figures are matched by concurrency and context depth.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError

from sparkforge.boundary import write_output
from sparkforge.errors import RecipeError, RunError
from sparkforge.recipe.yamlfile import read_yaml
from sparkforge.report import Check, Report

SCHEMA = 1
# Our figure -> the performance file's key (medians of the repeats).
FIGURES = {
    "output_tok_s": "output_token_throughput_tok_s",
    "ttft_ms": "time_to_first_token_ms_p50",
    "itl_ms": "inter_token_latency_ms_p50",
}
HIGHER_IS_BETTER = {"output_tok_s": True, "ttft_ms": False, "itl_ms": False}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PerfRecipe(_Strict):
    id: StrictStr
    sha256: StrictStr | None = None


class PerfImage(_Strict):
    ref: StrictStr | None = None
    digest: StrictStr


class PerfModel(_Strict):
    id: StrictStr
    revision: StrictStr | None = None


class PerfDataset(_Strict):
    name: StrictStr = "synthetic"
    input_tokens: StrictInt = Field(ge=1)
    output_tokens: StrictInt = Field(ge=1)


class PerfBenchmark(_Strict):
    harness: StrictStr
    harness_version: StrictStr
    dataset: PerfDataset
    date: StrictStr | None = None


class PerfResult(_Strict):
    concurrency: StrictInt = Field(ge=1)
    context_depth: StrictInt = Field(0, ge=0)
    output_token_throughput_tok_s: StrictFloat | StrictInt = Field(ge=0)
    time_to_first_token_ms_p50: StrictFloat | StrictInt | None = Field(None, ge=0)
    inter_token_latency_ms_p50: StrictFloat | StrictInt | None = Field(None, ge=0)


class Performance(_Strict):
    schema_version: Literal[1]
    recipe: PerfRecipe
    image: PerfImage
    model: PerfModel
    benchmark: PerfBenchmark
    hardware: dict[StrictStr, StrictStr | StrictInt] = Field(default_factory=dict)
    results: list[PerfResult] = Field(min_length=1)


def _median(level: dict[str, Any], figure: str) -> float | None:
    summary = (level.get("details") or {}).get("summary") or {}
    value = (summary.get(figure) or {}).get("median")
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def harness_of(result: dict[str, Any]) -> tuple[str, str]:
    """(harness, version) of a bench result: the client the suite ran and its recorded version."""
    suite = result["suite"]
    client = str(suite.get("client") or suite["name"])
    version = str(suite["params"].get("client_version") or result["identity"].get("vllm") or "unknown")
    return client, version


def performance_document(result: dict[str, Any], recipe_id: str) -> dict[str, Any]:
    """The performance file of a (loaded, schema 2) bench result."""
    ident = result["identity"]
    params = result["suite"]["params"]
    digests = ident["image"].get("digests") or []
    harness, version = harness_of(result)
    rows = []
    for level in result["checks"]:
        if level.get("status") != "passed":
            continue
        details = level["details"]
        row: dict[str, Any] = {
            "concurrency": int(details["concurrency"]),
            "context_depth": int(details["depth"]),
        }
        for ours, theirs in FIGURES.items():
            value = _median(level, ours)
            if value is not None:
                row[theirs] = round(value, 3)
        if FIGURES["output_tok_s"] in row:
            rows.append(row)
    if not rows:
        raise RunError("the bench result has no passed level with output tokens/s; nothing to write")
    hardware = ident.get("hardware") or {}
    return {
        "schema_version": SCHEMA,
        "recipe": {"id": recipe_id, "sha256": ident.get("recipe_hash") or None},
        "image": {
            "ref": ident["image"].get("ref"),
            "digest": (digests[0].rsplit("@", 1)[-1] if digests else ident["image"]["id"]),
        },
        "model": {"id": str(result["model"]), "revision": (ident.get("model") or {}).get("revision")},
        "benchmark": {
            "harness": harness,
            "harness_version": version,
            "dataset": {
                "name": str(params.get("dataset") or "random"),
                "input_tokens": int(params.get("input_len") or 1),
                "output_tokens": int(params.get("output_len") or 1),
            },
            "date": ident.get("date"),
        },
        "hardware": {
            k: v
            for k, v in {
                "machine": hardware.get("machine"),
                "gpus": len(hardware.get("gpus") or []),
                "cpus": hardware.get("cpus"),
            }.items()
            if v is not None
        },
        "results": rows,
    }


def write_performance(result: dict[str, Any], path: Path, recipe_id: str) -> Path:
    """Write the performance file (YAML) of a bench result; it is read back and validated before it is kept."""
    document = performance_document(result, recipe_id)
    Performance.model_validate(document)
    return write_output(path, yaml.safe_dump(document, sort_keys=False), "--performance")


def read_performance(path: Path) -> Performance:
    """A performance file, strictly (unknown keys are errors naming file and line)."""
    doc = read_yaml(path)
    try:
        return Performance.model_validate(doc.data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors()[:4]:
            key = tuple(str(p) for p in error["loc"])
            line = doc.lines.get(key, doc.lines.get(key[:1], 1))
            problems.append(f"{path}:{line}: {'.'.join(key)}: {error['msg']}")
        raise RecipeError(
            "not a performance file: "
            + "; ".join(problems)
            + "; fix: pass the performance file beside the recipe"
        ) from None


def compare_with_baseline(
    result: dict[str, Any],
    baseline: Performance,
    *,
    threshold_pct: float = 10.0,
    allow_different: bool = False,
) -> Report:
    """This run against a published performance file: per level and figure, ours vs theirs (a regression past
    `threshold_pct` fails); runs with another harness or dataset are refused unless `allow_different`."""
    report = Report(
        command="bench.baseline", subject=f"{result['identity']['image']['id'][:19]} vs {baseline.recipe.id}"
    )
    harness, version = harness_of(result)
    params = result["suite"]["params"]
    ours_dataset = (int(params.get("input_len") or 0), int(params.get("output_len") or 0))
    theirs = baseline.benchmark
    differences = []
    if harness != theirs.harness:
        differences.append(f"harness {harness} {version} vs {theirs.harness} {theirs.harness_version}")
    if ours_dataset != (theirs.dataset.input_tokens, theirs.dataset.output_tokens):
        differences.append(
            f"dataset {ours_dataset[0]}/{ours_dataset[1]} tokens vs {theirs.dataset.input_tokens}/{theirs.dataset.output_tokens}"
        )
    report.extra.update(
        {
            "baseline": baseline.model_dump(mode="json"),
            "harness": {"ours": [harness, version], "theirs": [theirs.harness, theirs.harness_version]},
            "differences": differences,
        }
    )
    if differences and not allow_different:
        report.add(
            Check(
                "comparable",
                "failed",
                "not the same measurement: "
                + "; ".join(differences)
                + "; fix: run invoke bench with the same harness "
                "and token lengths (--harness, --input-len, --output-len), or pass --allow-different",
            )
        )
        return report
    report.add(
        Check("comparable", "passed", "; ".join(differences) or f"same harness ({harness}) and dataset")
    )
    levels = {(int(c["details"]["concurrency"]), int(c["details"]["depth"])): c for c in result["checks"]}
    for row in baseline.results:
        name = f"c{row.concurrency}-d{row.context_depth}"
        level = levels.get((row.concurrency, row.context_depth))
        if level is None or level.get("status") != "passed":
            report.add(Check(name, "skipped", "this run did not measure that level"))
            continue
        figures, worst = {}, []
        for ours_key, key in FIGURES.items():
            published, measured = getattr(row, key), _median(level, ours_key)
            if published is None or measured is None or published == 0:
                continue
            change = (measured - published) / published * 100
            figures[ours_key] = {"ours": measured, "theirs": float(published), "change_pct": round(change, 2)}
            worse = -change if HIGHER_IS_BETTER[ours_key] else change
            if worse > threshold_pct:
                worst.append(f"{ours_key} {change:+.1f}%")
        text = ", ".join(
            f"{k} {v['ours']:.1f} vs {v['theirs']:.1f} ({v['change_pct']:+.1f}%)" for k, v in figures.items()
        )
        status = "failed" if worst else "passed"
        report.add(
            Check(
                name,
                status,
                text
                + (f"; worse than the baseline past {threshold_pct:g}%: {', '.join(worst)}" if worst else ""),
                figures,
            )
        )
    return report
