"""The bench noise rule measured on the CPU twin: how often an unchanged rerun is flagged, and planted slowdowns.

Usage (heavy: serves vLLM; run under the shared lock):
  flock /tmp/sparkforge-heavy.lock python3 benchmarks/bench_noise.py --image sparkforge-candidate/ci-cpu-twin:TAG \
      --model-dir DIR --reruns 10 > benchmarks/results/bench_noise.json
The image is pinned first: its ID gets a tag only this script writes (removed at the end), and every result's
identity must name that ID (another session rebuilding the twin's tag cannot change what is measured).
1. serve the twin (tests/profiles/cpu-tiny-qwen35moe-bench.yaml) and bench it once (the baseline, default
   `--repeats 3`), then `--reruns` more times unchanged; each rerun is compared with the baseline by
   `invoke bench.compare` (the documented rule) and, for contrast, by the threshold alone; every pair of the
   unchanged results is compared too (a larger sample of the false-alarm rate);
2. once with the field's suite (llama-benchy) for the committed result;
3. planted slowdowns on the same served container: its CPU quota cut live (`docker update --cpus`), then
   restored; each planted result is compared with every unchanged result (how reliably it is caught);
4. serve again with `--max-num-seqs 1` (concurrency 2 is served one request at a time), compared likewise
   (`--allow-different`: the serve command differs, and is listed).
The results, the raw client files and a chart are copied to benchmarks/results/ (see bench-noise.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from sparkforge.run.bench.compare import compare_docs  # noqa: E402
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
]
PINNED = "sparkforge-bench-noise/cpu-twin:pinned"  # this script's own tag: nobody else rebuilds it
CONTAINER = "sparkforge-serve-cpu-tiny-qwen35moe-bench-0"
DOCKER = "/usr/bin/docker"
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
    extra = (
        extra if "--suite" in extra else ("--num-prompts", "4", *extra)
    )  # vLLM's client: 4 prompts per run
    code, text, seconds = invoke(
        "bench", "--recipe", RECIPE, "--profile", str(profile), *SIZES, "--store", str(store), "--json", str(out),
        *extra,
    )  # fmt: skip
    if code:
        sys.exit(f"bench failed:\n{text[-3000:]}")
    return json.loads(out.read_text()), seconds


def threshold_only_flags(old: dict, new: dict, threshold: float, ranges_apart: bool = False) -> list[str]:
    """Earlier rules, for contrast: the median alone beyond the threshold; with ranges_apart, also every new repeat
    worse than every old one (the rule before the best repeat was read)."""
    flags = []
    for a, b in zip(old["checks"], new["checks"], strict=True):
        for metric, higher in METRICS.items():
            if metric in a["details"]["summary"] and metric in b["details"]["summary"]:
                x = Spread.of([r[metric] for r in a["details"]["repeats"]])
                y = Spread.of([r[metric] for r in b["details"]["repeats"]])
                worse = (
                    (x.median - y.median) / x.median * 100
                    if higher
                    else (y.median - x.median) / x.median * 100
                )
                apart = y.high < x.low if higher else y.low > x.high
                if worse > threshold and (apart or not ranges_apart):
                    flags.append(f"{a['name']}:{metric}")
    return flags


def outside(doc: dict) -> float:
    """The mean outside CPU load (percent of the machine) over every repeat of a result."""
    loads = [
        r["outside_cpu_pct"] for c in doc["checks"] for r in c["details"]["repeats"] if "outside_cpu_pct" in r
    ]
    return round(sum(loads) / len(loads), 1) if loads else -1.0


def flags(old: dict, new: dict, threshold: float, allow: bool = False) -> list[str]:
    report = compare_docs(old, new, ("old", "new"), threshold, allow_different=allow)
    return [c.name for c in report.checks if c.status == "failed"]


def medians(doc: dict, metric: str = "output_tok_s") -> dict[str, float]:
    return {c["name"]: round(c["details"]["summary"][metric]["median"], 1) for c in doc["checks"]}


def docker(*argv: str) -> None:
    subprocess.run([DOCKER, *argv], check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--image", required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--reruns", type=int, default=10)
    parser.add_argument("--threshold", default="10")
    parser.add_argument(
        "--cpus", default="1.8,1.6,1.4", help="planted CPU quotas (docker update --cpus), in order"
    )
    parser.add_argument(
        "--keep-tag", action="store_true", help=f"keep {PINNED} (e.g. for invoke diff on the store)"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-noise-"))
    threshold = float(args.threshold)
    image_id = subprocess.run([DOCKER, "image", "inspect", "--format", "{{.Id}}", args.image], check=True,
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
    docker("tag", image_id, PINNED)
    store, results = work / "store", {"image": image_id, "threshold_pct": threshold, "reruns": []}
    unchanged: list[dict] = []
    try:
        results["serve_s"] = serve(PROFILE, PINNED, args.model_dir, work / "cache")
        try:
            base, results["bench_s"] = bench(PROFILE, work / "base.json", store)
            unchanged.append(base)
            _, results["arena_bench_s"] = bench(PROFILE, work / "arena.json", store, "--suite", "spark-arena-v2",
                                                "--corpus", str(REPO / "README.md"))  # fmt: skip
            for i in range(args.reruns):
                doc, seconds = bench(PROFILE, work / f"rerun-{i}.json", store)
                unchanged.append(doc)
                code, _out, _ = invoke("bench.compare", str(work / "base.json"), str(work / f"rerun-{i}.json"),
                                       "--threshold", args.threshold, "--json", str(work / f"compare-{i}.json"))  # fmt: skip
                report = json.loads((work / f"compare-{i}.json").read_text())
                results["reruns"].append({
                    "flagged": code != 0, "failed_checks": [c["name"] for c in report["checks"] if c["status"] == "failed"],
                    "threshold_only_flags": threshold_only_flags(base, doc, threshold),
                    "median_rule_flags": threshold_only_flags(base, doc, threshold, ranges_apart=True), "bench_s": round(seconds, 1),
                    "outside_cpu_pct": outside(doc), "output_tok_s": medians(doc),
                })  # fmt: skip
                print(json.dumps(results["reruns"][-1]), file=sys.stderr, flush=True)
            docker(
                "cp",
                f"{CONTAINER}:/tmp/sparkforge-bench/c2-d512-r1.json",
                str(OUT / "real" / "bench-raw-vllm-c2-d512.json"),
            )
            docker(
                "cp",
                f"{CONTAINER}:/tmp/sparkforge-bench/llama-benchy-r1.json",
                str(OUT / "real" / "bench-raw-llama-benchy.json"),
            )
            planted = {}
            for cpus in [c for c in args.cpus.split(",") if c]:
                docker("update", "--cpus", cpus, CONTAINER)
                try:
                    doc, _ = bench(PROFILE, work / f"cpus-{cpus}.json", store)
                finally:
                    docker(
                        "update", "--cpus", str(os.cpu_count()), CONTAINER
                    )  # every CPU again (0 does not reset)
                planted[f"--cpus {cpus}"] = doc
        finally:
            invoke("serve.down", "--profile", PROFILE.stem)
        seqs = work / "cpu-tiny-qwen35moe-bench.yaml"  # same profile name: the same container and store key
        seqs.write_text(PROFILE.read_text().replace("max-num-seqs: 8", "max-num-seqs: 1"))
        serve(seqs, PINNED, args.model_dir, work / "cache")
        try:
            planted["--max-num-seqs 1"], _ = bench(seqs, work / "planted.json", store)
        finally:
            invoke("serve.down", "--profile", seqs.stem)
    finally:
        if not args.keep_tag:
            subprocess.run([DOCKER, "rmi", PINNED], check=False, capture_output=True)  # the tag only
    for doc in [*unchanged, *planted.values()]:
        assert doc["identity"]["image"]["id"] == image_id, "the image changed under the study"
    code, _text, _ = invoke("bench.compare", str(work / "base.json"), str(work / "planted.json"), "--threshold",
                           args.threshold, "--allow-different", "--json", str(work / "compare-planted.json"))  # fmt: skip
    pairs = [(i, j) for i in range(len(unchanged)) for j in range(len(unchanged)) if i != j]
    flagged_pairs = [(i, j, f) for i, j in pairs if (f := flags(unchanged[i], unchanged[j], threshold))]
    results["flap_rate"] = f"{sum(r['flagged'] for r in results['reruns'])} of {len(results['reruns'])}"
    results["threshold_only_flap_rate"] = (
        f"{sum(bool(r['threshold_only_flags']) for r in results['reruns'])} of {len(results['reruns'])}"
    )
    results["median_rule_flap_rate"] = (
        f"{sum(bool(r['median_rule_flags']) for r in results['reruns'])} of {len(results['reruns'])}"
    )
    median_pairs = [
        (i, j) for i, j in pairs if threshold_only_flags(unchanged[i], unchanged[j], threshold, True)
    ]
    results["all_ordered_pairs_median_rule"] = f"{len(median_pairs)} of {len(pairs)}"
    results["all_ordered_pairs"] = {"flagged": f"{len(flagged_pairs)} of {len(pairs)}",
                                    "which": [f"{i}->{j}: {f}" for i, j, f in flagged_pairs]}  # fmt: skip
    results["unchanged_output_tok_s"] = [medians(d) for d in unchanged]
    results["unchanged_outside_cpu_pct"] = [outside(d) for d in unchanged]
    results["planted"] = {}
    for name, doc in planted.items():
        allow = name.startswith("--max-num-seqs")
        caught = [flags(old, doc, threshold, allow) for old in unchanged]
        results["planted"][name] = {
            "caught": f"{sum(bool(f) for f in caught)} of {len(unchanged)} unchanged results",
            "vs_baseline": caught[0], "output_tok_s": medians(doc), "outside_cpu_pct": outside(doc),
            "itl_ms": medians(doc, "itl_ms"), "ttft_ms": medians(doc, "ttft_ms"),
        }  # fmt: skip
    results["baseline"] = {"output_tok_s": medians(base), "itl_ms": medians(base, "itl_ms"),
                           "ttft_ms": medians(base, "ttft_ms")}  # fmt: skip
    for name, target in (("base", "bench-cpu-twin-default"), ("arena", "bench-cpu-twin-spark-arena-v2"),
                         ("planted", "bench-cpu-twin-planted-maxseqs1"), ("compare-planted", "bench-compare-planted")):  # fmt: skip
        shutil.copy(work / f"{name}.json", OUT / "real" / f"{target}.json")
    invoke("bench.report", f"{work / 'base.json'},{work / 'planted.json'}", "--allow-different",
           "--html", str(work / "report.html"), "--png", str(work / "png"))  # fmt: skip
    for png in (work / "png").glob("*.png"):
        shutil.copy(png, OUT / "real" / f"bench-twin-{png.name}")
    results["work"] = str(work)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
