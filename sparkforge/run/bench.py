"""`bench`: vLLM's own benchmark client (`vllm bench serve`) against a served profile, inside its own image.

The client runs in the head's serve container (the same image, the model's tokenizer mounted there) against
127.0.0.1: random dataset, fixed seed, one run per concurrency. The result is a report (DESIGN.md's shape, one
check per concurrency) whose top-level keys say what was measured on what: TTFT, ITL, TPOT and output tok/s
(p50/p90/p99; tok/s per request, plus vLLM's aggregate), the image reference and ID, the recipe hash and
vLLM version from the image's labels, the hardware, and the attention/MoE/FP8 backends vLLM logged choosing.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from dataclasses import dataclass
from typing import Any

from sparkforge.console import Echo
from sparkforge.errors import RunError
from sparkforge.recipe.profile import Profile
from sparkforge.report import Report
from sparkforge.run.nodes import NodeEngine

PERCENTILES = (50, 90, 99)
RESULT_DIR = "/tmp/sparkforge-bench"
# What vLLM logs when it picks a kernel family (0.3x wording); every distinct choice is kept with its line.
BACKEND_PATTERNS = {
    "attention": r"\bUsing (?:default backend )?(?:AttentionBackendEnum\.)?([A-Za-z0-9_]+)(?: attention)? backend",
    "vision_attention": r"(?:AttentionBackendEnum\.)([A-Za-z0-9_]+) for (?:vit attention|MMEncoderAttention)",
    "linear_attention": r"\bUsing (.+? GDN .*?kernel)",
    "moe": r"\bUsing ([A-Za-z0-9_ ]+?) MoE backend",
    "fp8": r"(?i)\b(?:using|selected)\s+([A-Za-z0-9_]*fp8[A-Za-z0-9_]*)",
}
_NOT_TEXT_ATTENTION = re.compile(r"(?i)vit attention|MMEncoder|MoE|GDN|fp8")
_HARDWARE = """
import json, os, platform, shutil, subprocess
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
mem = next((int(l.split()[1]) // 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal")), 0)
gpus = []
if shutil.which("nvidia-smi"):
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"], capture_output=True, text=True)
    gpus = [g.strip() for g in out.stdout.splitlines() if g.strip()]
print(json.dumps({"machine": platform.machine(), "cpu": cpu, "cpus": os.cpu_count(), "memory_mib": mem, "gpus": gpus}))
"""


@dataclass(frozen=True)
class BenchOptions:
    concurrencies: tuple[int, ...] = (1, 4)
    num_prompts: int = 16  # per concurrency (at least the concurrency)
    input_len: int = 128
    output_len: int = 64
    seed: int = 0
    timeout_s: float = 1800


def head_container(profile: str) -> str:
    return f"sparkforge-serve-{profile}-0"


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {f"p{p}": 0.0 for p in PERCENTILES}
    ordered = sorted(values)
    if len(ordered) == 1:
        return {f"p{p}": ordered[0] for p in PERCENTILES}
    cuts = statistics.quantiles(ordered, n=100, method="inclusive")
    return {f"p{p}": cuts[p - 1] for p in PERCENTILES}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """vLLM's result file (--save-result --save-detailed) -> the figures the report keeps."""
    lens = result.get("output_lens") or []
    ttfts = result.get("ttfts") or []
    itls = result.get("itls") or []
    per_request = [
        n / (t + sum(i)) for n, t, i in zip(lens, ttfts, itls, strict=False) if n and (t + sum(i)) > 0
    ]
    out: dict[str, Any] = {
        "completed": int(result.get("completed", 0)),
        "failed": int(result.get("failed", 0)),
        "duration_s": float(result.get("duration", 0.0)),
        "output_tok_s": float(result.get("output_throughput", 0.0)),
        "request_output_tok_s": _percentiles(per_request),
    }
    for metric in ("ttft", "itl", "tpot"):
        out[f"{metric}_ms"] = {f"p{p}": float(result.get(f"p{p}_{metric}_ms", 0.0)) for p in PERCENTILES}
    return out


def backends(log: str) -> dict[str, dict[str, list[str]]]:
    """The kernel families vLLM logged choosing: {kind: {"names": [...], "lines": [...]}} (absent: not logged)."""
    found: dict[str, dict[str, list[str]]] = {}
    for line in log.splitlines():
        for kind, pattern in BACKEND_PATTERNS.items():
            if kind == "attention" and _NOT_TEXT_ATTENTION.search(line):
                continue
            match = re.search(pattern, line)
            if match:
                entry = found.setdefault(kind, {"names": [], "lines": []})
                if match.group(1) not in entry["names"]:
                    entry["names"].append(match.group(1))
                    entry["lines"].append(line.strip()[-240:])
    return found


def _inspect(engine: NodeEngine, name: str) -> dict[str, Any]:
    try:
        return json.loads(engine.call("inspect", "inspect", "--type", "container", name))[0]
    except (ValueError, IndexError) as exc:
        raise RunError(f"{engine.node.label}: cannot read container {name}: {exc}") from None


def _served(engine: NodeEngine, profile: Profile) -> tuple[str, dict[str, Any]]:
    name = head_container(profile.name)
    state = engine.state(name)
    if state.status != "running":
        raise RunError(
            f"profile {profile.name} is not running on {engine.node.label} (container {name}: {state.status}); "
            f"fix: start it with 'invoke serve --recipe R --profile {profile.name}' (or cluster.up), then bench"
        )
    return name, _inspect(engine, name)


def _flag(args: list[str], flag: str, default: str) -> str:
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else default


def bench_argv(model: str, tokenizer: str, port: str, concurrency: int, options: BenchOptions) -> list[str]:
    """`vllm bench serve` for one concurrency: random dataset, fixed seed, exact output length."""
    prompts = max(options.num_prompts, concurrency)
    return [
        "vllm", "bench", "serve", "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}",
        "--endpoint", "/v1/completions", "--model", model, "--tokenizer", tokenizer,
        "--dataset-name", "random", "--random-input-len", str(options.input_len),
        "--random-output-len", str(options.output_len), "--num-prompts", str(prompts),
        "--max-concurrency", str(concurrency), "--seed", str(options.seed), "--ignore-eos",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
        "--save-result", "--save-detailed", "--result-dir", RESULT_DIR, "--result-filename", f"c{concurrency}.json",
        "--disable-tqdm",
    ]  # fmt: skip


def run_bench(
    engine: NodeEngine, profile: Profile, options: BenchOptions, *, echo: Echo, recipe_hash: str | None = None
) -> Report:
    """Benchmark the running profile on this node; one check per concurrency, provenance in the report."""
    name, info = _served(engine, profile)
    args = [str(a) for a in info.get("Args") or []]
    labels = (info.get("Config") or {}).get("Labels") or {}
    port = _flag(args, "--port", "8000")
    model_path = args[1] if len(args) > 1 and args[0] == "serve" else profile.model.model
    served = _flag(args, "--served-model-name", profile.model.served_model_name or profile.model.model)
    hardware = json.loads(
        engine.call("hardware", "exec", name, "python3", "-c", _HARDWARE).strip().splitlines()[-1]
    )
    report = Report(command="bench", subject=profile.name, recipe=labels.get("dev.sparkforge.recipe"))
    for concurrency in options.concurrencies:
        echo(f"concurrency {concurrency}: {max(options.num_prompts, concurrency)} prompts "
             f"({options.input_len} in / {options.output_len} out tokens, seed {options.seed}) ...")  # fmt: skip
        start = time.monotonic()
        argv = bench_argv(served, model_path, port, concurrency, options)
        with report.timed(f"concurrency-{concurrency}") as check:
            result = engine.runner.capture(
                engine.command("exec", name, *argv),
                f"bench-c{concurrency}",
                check=False,
                timeout=options.timeout_s,
            )
            if result.returncode != 0:
                check.status = "failed"
                check.reason = f"vllm bench serve exited {result.returncode}: {result.output.strip()[-400:]}"
                echo(f"  failed after {time.monotonic() - start:.0f} s")
                continue
            raw = json.loads(
                engine.call("bench-result", "exec", name, "cat", f"{RESULT_DIR}/c{concurrency}.json")
            )
            figures = summarize(raw)
            check.details = {"concurrency": concurrency, **figures}
            if figures["failed"] or not figures["completed"]:
                check.status = "failed"
                check.reason = (
                    f"{figures['failed']} of {figures['completed'] + figures['failed']} requests failed"
                )
            else:
                check.reason = (
                    f"{figures['output_tok_s']:.1f} output tok/s, TTFT p50 {figures['ttft_ms']['p50']:.1f} ms, "
                    f"ITL p50 {figures['itl_ms']['p50']:.1f} ms"
                )
            echo(f"  {check.reason} ({time.monotonic() - start:.0f} s)")
    image_id = str(info.get("Image") or "")
    report.extra.update(
        {
            "profile": profile.name,
            "model": served,
            "image": {"ref": (info.get("Config") or {}).get("Image"), "id": image_id},
            "recipe_hash": labels.get("dev.sparkforge.recipe-hash") or recipe_hash,
            "vllm": labels.get("dev.sparkforge.pin.vllm", "").split("@")[0] or None,
            "hardware": hardware,
            "backends": backends(engine.logs(name)),
            "settings": {
                "dataset": "random",
                "seed": options.seed,
                "input_len": options.input_len,
                "output_len": options.output_len,
                "num_prompts": options.num_prompts,
                "concurrencies": list(options.concurrencies),
            },
        }
    )
    if recipe_hash and labels.get("dev.sparkforge.recipe-hash") not in (None, recipe_hash):
        report.extra["note"] = "the served image was built from another recipe hash than --recipe's"
    return report


def table(report: Report) -> list[str]:
    """Human lines: one row per concurrency."""
    rows = [
        f"{'conc':>5} {'out tok/s':>10} {'TTFT p50/p90/p99 ms':>24} {'ITL p50/p90/p99 ms':>22} {'req tok/s p50':>14}"
    ]
    for check in report.checks:
        d = check.details
        if not d:
            rows.append(f"{check.name}: {check.status} {check.reason}")
            continue
        ttft = "/".join(f"{d['ttft_ms'][f'p{p}']:.0f}" for p in PERCENTILES)
        itl = "/".join(f"{d['itl_ms'][f'p{p}']:.0f}" for p in PERCENTILES)
        rows.append(
            f"{d['concurrency']:>5} {d['output_tok_s']:>10.1f} {ttft:>24} {itl:>22} {d['request_output_tok_s']['p50']:>14.1f}"
        )
    return rows
