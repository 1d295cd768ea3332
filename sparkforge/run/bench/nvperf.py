"""NVIDIA's performance file (`performance.yaml` beside each `recipe.yaml` of its catalog, schema_version 1, as
read on 2026-12-05; docs/formats.md): written from a bench result, read as a baseline.

The file records what the figures belong to (the recipe file's sha256, the image digest, the model revision, the
harness and its version, the system) and one profile per measured workload (tokens, dataset, concurrency) with
three means: prefill tokens/s, decode tokens/s, end-to-end latency. A comparison says first whether the two runs
are comparable at all (same harness, same token lengths); figures are matched by concurrency and context tokens.
"""

from __future__ import annotations

import datetime
import hashlib
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, ValidationError

from sparkforge.boundary import read_bytes, write_output
from sparkforge.errors import RecipeError, RunError
from sparkforge.recipe.yamlfile import read_yaml
from sparkforge.report import Check, Report

SCHEMA = 1
# The performance file's figures (means over the repeats) and which way is better.
HIGHER_IS_BETTER = {
    "prefill_tokens_per_second_mean": True,
    "decode_tokens_per_second_mean": True,
    "e2e_latency_ms_mean": False,
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Number = StrictFloat | StrictInt


class Harness(_Strict):
    name: StrictStr
    version: StrictStr


class PerfSystem(_Strict):
    label: StrictStr
    accelerator: StrictStr
    accelerator_count: StrictInt = Field(ge=0)
    operating_system: StrictStr
    os_version: StrictStr
    driver_version: StrictStr
    cuda_version: StrictStr


class PerfSoftware(_Strict):
    backend_version: StrictStr
    model_revision: StrictStr | None = None  # a 40-hex Hugging Face commit in the catalog
    runtime_revision: StrictStr  # the image digest, sha256:...


class Workload(_Strict):
    input_tokens: StrictInt = Field(ge=1)
    context_tokens: StrictInt = Field(ge=0)
    dataset: StrictStr
    profile: StrictStr
    input_tokens_min: StrictInt = Field(ge=0)
    input_tokens_max: StrictInt = Field(ge=0)
    input_tokens_total: StrictInt = Field(ge=0)
    output_tokens: StrictInt = Field(ge=1)
    concurrency: StrictInt = Field(ge=1)
    requests: StrictInt = Field(ge=1)
    warmup_requests: StrictInt = Field(ge=0)


class Results(_Strict):
    prefill_tokens_per_second_mean: Number | None = Field(None, ge=0)
    decode_tokens_per_second_mean: Number | None = Field(None, ge=0)
    e2e_latency_ms_mean: Number | None = Field(None, ge=0)


class PerfProfile(_Strict):
    id: StrictStr = Field(min_length=1)
    workload: Workload
    results: Results


class Performance(_Strict):
    schema_version: Literal[1]
    status: StrictStr
    recipe_sha256: StrictStr = Field(pattern=r"^[0-9a-f]{64}$")
    launch_id: StrictStr = "default"
    measured_at: datetime.date
    harness: Harness
    system: PerfSystem
    software: PerfSoftware
    profiles: list[PerfProfile] = Field(min_length=1)


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return round(sum(kept) / len(kept), 3) if kept and len(kept) == len(values) else None


def level_means(level: dict[str, Any], input_tokens: int, output_tokens: int) -> dict[str, float | None]:
    """A bench level's figures as the performance file's three means (over the level's repeats): decode =
    output tokens/s; prefill = the client's prefill tokens/s where it records one, else the prompt's tokens
    (input + context) over TTFT; end-to-end latency = TTFT + (output tokens - 1) x ITL (where ITL was measured)."""
    runs = level["details"].get("repeats") or []
    prompt = input_tokens + int(level["details"].get("depth") or 0)

    def prefill(run: dict[str, Any]) -> float | None:
        if isinstance(run.get("prefill_tok_s"), int | float):
            return float(run["prefill_tok_s"])
        ttft = run.get("ttft_ms")
        return prompt / (ttft / 1000) if isinstance(ttft, int | float) and ttft > 0 else None

    def e2e(run: dict[str, Any]) -> float | None:
        ttft, itl = run.get("ttft_ms"), run.get("itl_ms")
        ok = isinstance(ttft, int | float) and isinstance(itl, int | float)
        return ttft + (output_tokens - 1) * itl if ok else None  # type: ignore[operator]

    return {
        "prefill_tokens_per_second_mean": _mean([prefill(r) for r in runs]) if runs else None,
        "decode_tokens_per_second_mean": _mean([r.get("output_tok_s") for r in runs]) if runs else None,
        "e2e_latency_ms_mean": _mean([e2e(r) for r in runs]) if runs else None,
    }


def harness_of(result: dict[str, Any]) -> tuple[str, str]:
    """(harness, version) of a bench result: the client the suite ran and its recorded version."""
    suite = result["suite"]
    client = str(suite.get("client") or suite["name"])
    version = str(suite["params"].get("client_version") or result["identity"].get("vllm") or "unknown")
    return client, version


def _dataset(result: dict[str, Any]) -> str:
    corpus = result["suite"].get("corpus") or {}
    return str(corpus.get("url") or result["suite"]["params"].get("dataset") or "random")


def recipe_sha256(result: dict[str, Any], recipe_file: Path | None) -> str:
    """The catalog's recipe_sha256: the sha256 of the recipe file (NVIDIA's, as `invoke export` writes it) when
    there is one, else sparkforge's recipe hash of the image that ran."""
    if recipe_file is not None and recipe_file.is_file():
        # The recipe beside the file the user named (--performance): inside that folder, at most 1 MiB.
        raw = read_bytes(
            recipe_file, "--performance's recipe.yaml", 1 << 20, named=False, within=[recipe_file.parent]
        )
        return hashlib.sha256(raw).hexdigest()
    return str(result["identity"].get("recipe_hash") or "")


def performance_document(result: dict[str, Any], recipe_file: Path | None = None) -> dict[str, Any]:
    """The performance file of a (loaded, schema 2) bench result: one profile per passed level."""
    ident = result["identity"]
    params = result["suite"]["params"]
    digests = ident["image"].get("digests") or []
    harness, version = harness_of(result)
    input_tokens, output_tokens = int(params.get("input_len") or 1), int(params.get("output_len") or 1)
    profiles = []
    for level in result["checks"]:
        if level.get("status") != "passed":
            continue
        details = level["details"]
        concurrency, depth = int(details["concurrency"]), int(details["depth"])
        means = level_means(level, input_tokens, output_tokens)
        if means["decode_tokens_per_second_mean"] is None:
            continue
        requests = int(params.get("num_prompts") or 0) or concurrency
        prompt = input_tokens + depth
        profiles.append(
            {
                "id": f"{result['suite']['name']}-c{concurrency}-d{depth}",
                "workload": {
                    "input_tokens": input_tokens,
                    "context_tokens": depth,
                    "dataset": _dataset(result),
                    "profile": str(result["suite"]["name"]),
                    "input_tokens_min": prompt,
                    "input_tokens_max": prompt,
                    "input_tokens_total": prompt * requests,
                    "output_tokens": output_tokens,
                    "concurrency": concurrency,
                    "requests": requests,
                    "warmup_requests": 1 if params.get("warmup") else 0,
                },
                "results": means,
            }
        )
    if not profiles:
        raise RunError("the bench result has no passed level with output tokens/s; nothing to write")
    hardware = ident.get("hardware") or {}
    gpus = hardware.get("gpus") or []
    first = gpus[0] if gpus and isinstance(gpus[0], dict) else {}
    return {
        "schema_version": SCHEMA,
        "status": "experimental",
        "recipe_sha256": recipe_sha256(result, recipe_file),
        "launch_id": "default",
        "measured_at": datetime.date.fromisoformat(str(ident.get("date") or "")[:10]),
        "harness": {"name": harness, "version": version},
        "system": {
            "label": "DGX Spark"
            if "GB10" in str(first.get("name", ""))
            else str(hardware.get("machine") or "unknown"),
            "accelerator": str(first.get("name") or "none"),
            "accelerator_count": len(gpus),
            "operating_system": "linux",
            "os_version": str(hardware.get("os") or "unknown"),
            "driver_version": str(first.get("driver") or "unknown"),
            "cuda_version": str(hardware.get("cuda") or "unknown"),
        },
        "software": {
            "backend_version": str(ident.get("vllm") or "unknown"),
            "model_revision": (ident.get("model") or {}).get("revision"),
            "runtime_revision": digests[0].rsplit("@", 1)[-1] if digests else ident["image"]["id"],
        },
        "profiles": profiles,
    }


def write_performance(result: dict[str, Any], path: Path) -> Path:
    """Write the performance file (YAML) of a bench result; validated before it is kept. recipe_sha256 is the
    sha256 of the `recipe.yaml` beside `path` when there is one (the catalog's layout), else the recipe hash."""
    document = performance_document(result, path.parent / "recipe.yaml")
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
            + "; fix: pass the performance.yaml beside the catalog's recipe.yaml"
        ) from None


def compare_with_baseline(
    result: dict[str, Any],
    baseline: Performance,
    *,
    threshold_pct: float = 10.0,
    allow_different: bool = False,
) -> Report:
    """This run against a published performance file: per profile (concurrency, context tokens) and figure, ours
    vs theirs (a regression past `threshold_pct` fails); another harness or token lengths are refused unless
    `allow_different`."""
    report = Report(
        command="bench.baseline",
        subject=f"{result['identity']['image']['id'][:19]} vs recipe {baseline.recipe_sha256[:12]}",
    )
    harness, version = harness_of(result)
    params = result["suite"]["params"]
    ours_tokens = (int(params.get("input_len") or 1), int(params.get("output_len") or 1))
    differences = []
    if harness != baseline.harness.name:
        differences.append(
            f"harness {harness} {version} vs {baseline.harness.name} {baseline.harness.version}"
        )
    theirs_tokens = sorted({(p.workload.input_tokens, p.workload.output_tokens) for p in baseline.profiles})
    if ours_tokens not in theirs_tokens:
        differences.append(
            f"tokens {ours_tokens[0]}/{ours_tokens[1]} in/out vs "
            + ", ".join(f"{i}/{o}" for i, o in theirs_tokens)
        )
    report.extra.update(
        {
            "baseline": baseline.model_dump(mode="json"),
            "harness": {
                "ours": [harness, version],
                "theirs": [baseline.harness.name, baseline.harness.version],
            },
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
                + "; fix: run invoke bench with the same harness and token lengths (--harness, --input-len, "
                "--output-len), or pass --allow-different",
            )
        )
        return report
    report.add(
        Check("comparable", "passed", "; ".join(differences) or f"same harness ({harness}) and token lengths")
    )
    levels = {(int(c["details"]["concurrency"]), int(c["details"]["depth"])): c for c in result["checks"]}
    for profile in baseline.profiles:
        work = profile.workload
        name = f"{profile.id} (c{work.concurrency}, context {work.context_tokens})"
        if (work.input_tokens, work.output_tokens) != ours_tokens:
            why = f"published at {work.input_tokens}/{work.output_tokens} tokens in/out, this run at "
            report.add(Check(name, "skipped", why + f"{ours_tokens[0]}/{ours_tokens[1]}"))
            continue
        level = levels.get((work.concurrency, work.context_tokens))
        if level is None or level.get("status") != "passed":
            report.add(Check(name, "skipped", "this run did not measure that concurrency and context"))
            continue
        ours = level_means(level, ours_tokens[0], ours_tokens[1])
        figures, worst = {}, []
        for key, higher in HIGHER_IS_BETTER.items():
            published, measured = getattr(profile.results, key), ours[key]
            if published is None or measured is None or published == 0:
                continue
            change = (measured - published) / published * 100
            figures[key] = {"ours": measured, "theirs": float(published), "change_pct": round(change, 2)}
            if (-change if higher else change) > threshold_pct:
                worst.append(f"{key} {change:+.1f}%")
        text = ", ".join(
            f"{k} {v['ours']:.1f} vs {v['theirs']:.1f} ({v['change_pct']:+.1f}%)" for k, v in figures.items()
        )
        status = "failed" if worst else "passed"
        tail = f"; worse than the baseline past {threshold_pct:g}%: {', '.join(worst)}" if worst else ""
        report.add(Check(name, status, (text or "no figure in common") + tail, figures))
    return report
