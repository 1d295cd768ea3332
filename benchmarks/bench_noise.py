"""The bench noise rule measured on the CPU twin: how often an unchanged rerun is flagged, and a planted slowdown.

Usage (heavy: serves vLLM; run under the shared lock):
  flock /tmp/sparkforge-heavy.lock python3 benchmarks/bench_noise.py --image sparkforge-run-test/cpu-twin:vllm \
      --model-dir DIR --reruns 10 > benchmarks/results/bench_noise.json
1. serve the twin (tests/profiles/cpu-tiny-qwen35moe-bench.yaml) and bench it once (the baseline), then
   `--reruns` more times unchanged; each rerun is compared with the baseline by `invoke bench.compare` (the rule:
   beyond the threshold AND outside the repeats' range) and, for contrast, by the threshold alone;
2. once with the field's suite (llama-benchy) for the committed result;
3. serve again with a planted slowdown (--max-num-seqs 1: concurrency 2 is served one request at a time) and
   compare with the baseline (`--allow-different`: the serve command differs, and is listed).
The results, the raw client files and a chart are copied to benchmarks/results/ (see bench-noise.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from sparkforge.run.bench.noise import METRICS, Spread  # noqa: E402

RECIPE = "tests/recipes/ci-cpu-twin.yaml"
PROFILE = REPO / "tests" / "profiles" / "cpu-tiny-qwen35moe-bench.yaml"
PORT = "18491"
SIZES = [
    "--concurrency",
    "1,2",
    "--depth",
    "0,512",
    "--input-len",
    "128",
    "--output-len",
    "32",
    "--repeats",
    "2",
]
OUT = REPO / "benchmarks" / "results"


def invoke(*args: str) -> tuple[int, str, float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True)
    print(
        f"$ invoke {' '.join(args)}  ({time.monotonic() - start:.0f} s, exit {proc.returncode})",
        file=sys.stderr,
    )
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def serve(profile: Path, image: str, model_dir: str, cache: Path) -> float:
    code, out, seconds = invoke(
        "serve", "--recipe", RECIPE, "--profile", str(profile), "--image", image, "--gpus", "none",
        "--model-dir", model_dir, "--cache-dir", str(cache), "--port", PORT, "--ulimit", "nofile=16384",
    )  # fmt: skip
    if code:
        sys.exit(f"serve failed:\n{out[-3000:]}")
    return seconds


def bench(profile: Path, out: Path, store: Path, *extra: str) -> tuple[dict, float]:
    code, text, seconds = invoke(
        "bench", "--recipe", RECIPE, "--profile", str(profile), *SIZES, "--store", str(store), "--json", str(out),
        *extra,
    )  # fmt: skip
    if code:
        sys.exit(f"bench failed:\n{text[-3000:]}")
    return json.loads(out.read_text()), seconds


def threshold_only_flags(old: dict, new: dict, threshold: float) -> list[str]:
    """The old rule, for contrast: the median alone beyond the threshold."""
    flags = []
    for a, b in zip(old["checks"], new["checks"], strict=True):
        for metric, higher in METRICS.items():
            if metric in a["details"]["summary"] and metric in b["details"]["summary"]:
                x = Spread.of([r[metric] for r in a["details"]["repeats"]]).median
                y = Spread.of([r[metric] for r in b["details"]["repeats"]]).median
                worse = (x - y) / x * 100 if higher else (y - x) / x * 100
                if worse > threshold:
                    flags.append(f"{a['name']}:{metric}")
    return flags


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--image", required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--reruns", type=int, default=10)
    parser.add_argument("--threshold", default="10")
    parser.add_argument(
        "--stop-reruns-at", default="", help="UTC HH:MM: start no rerun after it (the planted run follows)"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-noise-"))
    store, results = work / "store", {"reruns": [], "threshold_pct": float(args.threshold)}
    results["serve_s"] = serve(PROFILE, args.image, args.model_dir, work / "cache")
    try:
        base, results["bench_s"] = bench(PROFILE, work / "base.json", store, "--num-prompts", "4")
        _, results["arena_bench_s"] = bench(PROFILE, work / "arena.json", store, "--suite", "spark-arena-v2",
                                                "--corpus", str(REPO / "README.md"))  # fmt: skip
        for i in range(args.reruns):
            if args.stop_reruns_at and time.strftime("%H:%M", time.gmtime()) >= args.stop_reruns_at:
                results["stopped_early"] = f"after {i} reruns: --stop-reruns-at {args.stop_reruns_at}"
                break
            doc, seconds = bench(PROFILE, work / f"rerun-{i}.json", store, "--num-prompts", "4")
            code, _out, _ = invoke("bench.compare", str(work / "base.json"), str(work / f"rerun-{i}.json"),
                                   "--threshold", args.threshold, "--json", str(work / f"compare-{i}.json"))  # fmt: skip
            report = json.loads((work / f"compare-{i}.json").read_text())
            results["reruns"].append({
                "flagged": code != 0, "failed_checks": [c["name"] for c in report["checks"] if c["status"] == "failed"],
                "threshold_only_flags": threshold_only_flags(base, doc, float(args.threshold)), "bench_s": round(seconds, 1),
            })  # fmt: skip
            print(json.dumps(results), file=sys.stderr, flush=True)  # progress, in case the run is cut short
        subprocess.run(["/usr/bin/docker", "cp", "sparkforge-serve-cpu-tiny-qwen35moe-bench-0:/tmp/sparkforge-bench/c2-d512-r1.json",
                        str(OUT / "real" / "bench-raw-vllm-c2-d512.json")], check=True)  # fmt: skip
        subprocess.run(["/usr/bin/docker", "cp", "sparkforge-serve-cpu-tiny-qwen35moe-bench-0:/tmp/sparkforge-bench/llama-benchy.json",
                        str(OUT / "real" / "bench-raw-llama-benchy.json")], check=True)  # fmt: skip
    finally:
        invoke("serve.down", "--profile", PROFILE.stem)
    planted = work / "cpu-tiny-qwen35moe-bench.yaml"  # same profile name: the same container and store key
    planted.write_text(PROFILE.read_text().replace("max-num-seqs: 8", "max-num-seqs: 1"))
    serve(planted, args.image, args.model_dir, work / "cache")
    try:
        bench(planted, work / "planted.json", store, "--num-prompts", "4")
    finally:
        invoke("serve.down", "--profile", planted.stem)
    code, _text, _ = invoke("bench.compare", str(work / "base.json"), str(work / "planted.json"), "--threshold",
                           args.threshold, "--allow-different", "--json", str(work / "compare-planted.json"))  # fmt: skip
    planted_report = json.loads((work / "compare-planted.json").read_text())
    results["planted"] = {
        "change": "--max-num-seqs 8 -> 1", "flagged": code != 0,
        "failed_checks": [c["name"] for c in planted_report["checks"] if c["status"] == "failed"],
        "checks": {c["name"]: c["reason"] for c in planted_report["checks"]},
    }  # fmt: skip
    results["flap_rate"] = f"{sum(r['flagged'] for r in results['reruns'])} of {len(results['reruns'])}"
    results["threshold_only_flap_rate"] = (
        f"{sum(bool(r['threshold_only_flags']) for r in results['reruns'])} of {len(results['reruns'])}"
    )
    for name, target in (("base", "bench-cpu-twin-default"), ("arena", "bench-cpu-twin-spark-arena-v2"),
                         ("planted", "bench-cpu-twin-planted-maxseqs1"), ("compare-planted", "bench-compare-planted")):  # fmt: skip
        shutil.copy(work / f"{name}.json", OUT / "real" / f"{target}.json")
    invoke("bench.report", f"{work / 'base.json'},{work / 'planted.json'}", "--allow-different",
           "--html", str(work / "report.html"), "--png", str(work / "png"))  # fmt: skip
    for png in (work / "png").glob("*.png"):
        shutil.copy(png, OUT / "real" / f"bench-twin-{png.name}")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
