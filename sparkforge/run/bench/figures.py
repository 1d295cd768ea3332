"""The clients' own result files, read by their documented keys, into one repeat's figures (noise.METRICS).

vLLM's `--save-result --save-detailed` file: `completed`, `failed`, `output_throughput`, `median_ttft_ms`,
`median_itl_ms`, per request `output_lens`, `ttfts`, `itls`, and under speculative decoding the acceptance it
read from the server's counters around the run (`spec_decode_acceptance_rate` in percent,
`spec_decode_acceptance_length`).
llama-benchy's `--format json` file: `benchmarks[]` with `concurrency`, `context_size`, `prompt_size`,
`response_size`, `is_context_prefill_phase` and metrics `{mean, std, values}`: `tg_throughput` (one value per
run above concurrency 1, per request at 1), `tg_req_throughput`, `pp_throughput`, `e2e_ttft` (ms, per request).
vLLM's Prometheus counters give the speculative-decoding acceptance: under MTP a client that counts stream
chunks counts decode steps, so tokens/s and decode steps/s are reported apart.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from sparkforge.errors import RunError
from sparkforge.run.promtext import read_counters

SPEC_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
}


def _number(where: str, doc: dict[str, Any], key: str) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise RunError(
            f"{where}: key {key!r} is {value!r}, not a finite number >= 0; fix: re-run the benchmark (the "
            "client's file is incomplete or not from a supported client version)"
        )
    return float(value)


def vllm_repeat(where: str, result: dict[str, Any]) -> tuple[dict[str, float], int, int]:
    """One `vllm bench serve` result -> (figures, completed, failed)."""
    if not isinstance(result, dict):
        raise RunError(f"{where}: not a vllm bench serve result object; fix: re-run the benchmark")
    completed, failed = int(_number(where, result, "completed")), int(_number(where, result, "failed"))
    lens, ttfts, itls = (result.get(k) or [] for k in ("output_lens", "ttfts", "itls"))
    per_request = [
        n / (t + sum(i))
        for n, t, i in zip(lens, ttfts, itls, strict=False)
        if n and isinstance(i, list) and (t + sum(i)) > 0
    ]
    figures = {
        "output_tok_s": _number(where, result, "output_throughput"),
        "ttft_ms": _number(where, result, "median_ttft_ms"),
        "itl_ms": _number(where, result, "median_itl_ms"),
    }
    if result.get("spec_decode_acceptance_length") is not None:
        length = _number(where, result, "spec_decode_acceptance_length")
        if length >= 1:  # tokens per decode step: the verified token plus the accepted drafts
            figures["decode_steps_s"] = figures["output_tok_s"] / length
            figures["acceptance_rate_pct"] = _number(where, result, "spec_decode_acceptance_rate")
    if per_request:
        figures["request_output_tok_s"] = statistics.median(per_request)
    return figures, completed, failed


def _values(where: str, run: dict[str, Any], key: str) -> list[float]:
    metric = run.get(key)
    values = metric.get("values") if isinstance(metric, dict) else None
    if not isinstance(values, list) or not values:
        raise RunError(
            f"{where}: {key} has no values; fix: re-run the benchmark (llama-benchy wrote no runs)"
        )
    return [_number(where, {key: v}, key) for v in values]


def _per_run(values: list[float], runs: int) -> list[float]:
    """Per-request values (runs x concurrency, in run order) -> the median of each run."""
    if len(values) == runs:
        return values
    if runs < 1 or len(values) % runs:
        raise RunError(f"{len(values)} values do not split into {runs} runs; fix: re-run the benchmark")
    size = len(values) // runs
    return [statistics.median(values[i * size : (i + 1) * size]) for i in range(runs)]


def benchy_levels(where: str, doc: Any, runs: int) -> dict[tuple[int, int], list[dict[str, float]]]:
    """llama-benchy's JSON -> {(concurrency, depth): [figures per run]} (its inference-phase rows)."""
    rows = doc.get("benchmarks") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise RunError(f"{where}: no 'benchmarks' list; fix: pass llama-benchy's --format json file")
    out: dict[tuple[int, int], list[dict[str, float]]] = {}
    for row in rows:
        if not isinstance(row, dict) or row.get("is_context_prefill_phase"):
            continue
        level = (int(_number(where, row, "concurrency")), int(_number(where, row, "context_size")))
        per_run = {
            "output_tok_s": _per_run(_values(where, row, "tg_throughput"), runs),
            "ttft_ms": _per_run(_values(where, row, "e2e_ttft"), runs),
        }
        for metric, key in (
            ("request_output_tok_s", "tg_req_throughput"),
            ("prefill_tok_s", "pp_throughput"),
        ):
            try:  # llama-benchy leaves a value out when it could not estimate it (e.g. pp with no latency left)
                per_run[metric] = _per_run(_values(where, row, key), runs)
            except RunError:
                continue
        out[level] = [{k: per_run[k][i] for k in per_run} for i in range(runs)]
    return out


def spec_counters(text: str, where: str) -> dict[str, float]:
    """vLLM's speculative-decoding counters from its /metrics text (summed over label sets, read strictly by
    run/promtext.py: a malformed sample of them is an error naming `where`); {} when absent."""
    fix = "fix: check that the served image is vLLM and its /metrics answers as vLLM's does"
    totals = read_counters(text, SPEC_COUNTERS.values(), where, fix)
    return {key: float(totals[name]) for key, name in SPEC_COUNTERS.items() if name in totals}


def acceptance(before: dict[str, float], after: dict[str, float]) -> dict[str, float] | None:
    """Acceptance over the run from the counters' deltas; None when speculative decoding did not run."""
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in SPEC_COUNTERS}
    if delta["drafts"] <= 0 or delta["draft_tokens"] <= 0:
        return None
    return {
        **delta,
        "acceptance_rate": delta["accepted"] / delta["draft_tokens"],
        # tokens one decode step yields: the verified token plus the accepted draft tokens
        "mean_acceptance_length": 1 + delta["accepted"] / delta["drafts"],
    }
