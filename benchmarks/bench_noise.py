"""The bench noise rule measured on the CPU twin: how often an unchanged rerun is flagged, and planted slowdowns.

Usage (heavy: serves vLLM; run under the shared lock):
  flock /tmp/sparkforge-heavy.lock python3 benchmarks/bench_noise.py --image sparkforge-candidate/ci-cpu-twin:TAG \
      --model-dir DIR --reruns 10 > benchmarks/results/bench_noise.json
The image is pinned first: its ID gets a tag only this script writes (removed at the end), and every result's
identity must name that ID (another session rebuilding the twin's tag cannot change what is measured).
1. serve the twin (tests/profiles/cpu-tiny-qwen35moe-bench.yaml) and bench it `--baselines` times (default 3,
   each at the default `--repeats 3`): the baseline, pooled; then `--reruns` more times unchanged; each rerun is
   compared with the pooled baseline by `invoke bench.compare B0,B1,B2 RERUN` (the documented rule) and, for
   contrast, with the first baseline alone by the same rule, by the median rule and by the threshold alone;
   every ordered pair of unchanged results is compared too (a larger sample of the one-baseline false alarms);
2. once with the field's suite (llama-benchy) for the committed result;
3. planted slowdowns on the same served container: its CPU quota cut live (`docker update --cpus`), then
   restored; each planted result is compared with the pooled baseline and with every unchanged result;
4. serve again with `--max-num-seqs 1` (concurrency 2 is served one request at a time), compared likewise
   (`--allow-different`: the serve command differs, and is listed);
5. a control: the unchanged profile served afresh and benched once more, compared with the pooled baseline.
The results, the raw client files and a chart are copied to benchmarks/results/ (see bench-noise.md).
"""

from __future__ import annotations

import argparse
import itertools
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

from sparkforge.run.bench.compare import compare_docs, pool  # noqa: E402
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


def pooled_flags(olds: list[Path], new: Path, threshold: str, *extra: str) -> tuple[bool, list[str]]:
    """`invoke bench.compare OLD1,OLD2,... NEW` (the documented rule, the baseline pooled): (flagged, failed checks)."""
    out = new.with_name(f"compare-{new.stem}.json")
    code, _out, _ = invoke("bench.compare", ",".join(map(str, olds)), str(new), "--threshold", threshold,
                           "--json", str(out), *extra)  # fmt: skip
    report = json.loads(out.read_text())
    return code != 0, [c["name"] for c in report["checks"] if c["status"] == "failed"]


def analyze(
    work: Path, baselines: list[Path], reruns: list[Path], planted: dict[str, Path], threshold: str
) -> dict:
    """Every verdict of the study from its files: the documented rule (pooled baseline), and for contrast the
    same rule against one baseline, the median rule and the threshold alone; planted slowdowns likewise."""
    t = float(threshold)
    load = {p: json.loads(p.read_text()) for p in [*baselines, *reruns, *planted.values()]}
    base = load[baselines[0]]
    out: dict = {"baselines": [p.name for p in baselines], "reruns": []}
    for path in reruns:
        doc = load[path]
        flagged, failed = pooled_flags(baselines, path, threshold)
        out["reruns"].append({
            "file": path.name, "flagged": flagged, "failed_checks": failed,
            "one_baseline_flags": flags(base, doc, t), "median_rule_flags": threshold_only_flags(base, doc, t, True),
            "threshold_only_flags": threshold_only_flags(base, doc, t),
            "outside_cpu_pct": outside(doc), "output_tok_s": medians(doc), "itl_ms": medians(doc, "itl_ms"),
        })  # fmt: skip
    n = len(reruns)
    for key, name in (("flagged", "flap_rate"), ("one_baseline_flags", "one_baseline_flap_rate"),
                      ("median_rule_flags", "median_rule_flap_rate"), ("threshold_only_flags", "threshold_only_flap_rate")):  # fmt: skip
        out[name] = f"{sum(bool(r[key]) for r in out['reruns'])} of {n}"
    unchanged = [load[p] for p in [*baselines, *reruns]]
    pairs = [(i, j) for i in range(len(unchanged)) for j in range(len(unchanged)) if i != j]
    out["all_ordered_pairs_one_baseline"] = (
        f"{sum(bool(flags(unchanged[i], unchanged[j], t)) for i, j in pairs)} of {len(pairs)}"
    )
    # the false-alarm rate over every baseline of len(baselines) unchanged results against every other one
    k, trials, flagged = len(baselines), 0, 0
    for trio in itertools.combinations(range(len(unchanged)), k):
        pooled = pool([(str(i), unchanged[i]) for i in trio])
        for j in (j for j in range(len(unchanged)) if j not in trio):
            trials, flagged = trials + 1, flagged + bool(flags(pooled, unchanged[j], t))
    out[f"every_pooled_baseline_of_{k}_vs_every_other_unchanged"] = f"{flagged} of {trials}"
    out["planted"] = {}
    for name, path in planted.items():
        extra = ("--allow-different",) if name.startswith("--max-num-seqs") else ()
        flagged, failed = pooled_flags(baselines, path, threshold, *extra)
        doc = load[path]
        one = [bool(flags(u, doc, t, bool(extra))) for u in unchanged]
        out["planted"][name] = {
            "flagged_vs_pooled_baseline": flagged, "failed_checks": failed,
            "caught_vs_each_unchanged_result": f"{sum(one)} of {len(one)}",
            "output_tok_s": medians(doc), "itl_ms": medians(doc, "itl_ms"), "ttft_ms": medians(doc, "ttft_ms"),
            "outside_cpu_pct": outside(doc),
        }  # fmt: skip
    out["baseline"] = {"output_tok_s": medians(base), "itl_ms": medians(base, "itl_ms"), "ttft_ms": medians(base, "ttft_ms"),
                       "outside_cpu_pct": [outside(load[p]) for p in baselines]}  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--image", required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--reruns", type=int, default=10)
    parser.add_argument(
        "--baselines", type=int, default=3, help="benches pooled as the baseline (bench.compare A,B,C)"
    )
    parser.add_argument("--threshold", default="10")
    parser.add_argument(
        "--cpus", default="1.8,1.6,1.4", help="planted CPU quotas (docker update --cpus), in order"
    )
    parser.add_argument(
        "--keep-tag", action="store_true", help=f"keep {PINNED} (e.g. for invoke diff on the store)"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-noise-"))
    image_id = subprocess.run([DOCKER, "image", "inspect", "--format", "{{.Id}}", args.image], check=True,
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
    docker("tag", image_id, PINNED)
    store, times = work / "store", {}
    baselines = [work / f"base-{i}.json" for i in range(args.baselines)]
    reruns = [work / f"rerun-{i}.json" for i in range(args.reruns)]
    planted: dict[str, Path] = {}
    try:
        times["serve_s"] = serve(PROFILE, PINNED, args.model_dir, work / "cache")
        try:
            for path in [*baselines, *reruns, work / "arena.json"]:  # the unchanged series uninterrupted
                extra = (
                    ("--suite", "spark-arena-v2", "--corpus", str(REPO / "README.md"))
                    if path.stem == "arena"
                    else ()
                )
                times[path.stem] = round(bench(PROFILE, path, store, *extra)[1], 1)
                print(
                    f"{path.stem}: {json.dumps(medians(json.loads(path.read_text())))}",
                    file=sys.stderr,
                    flush=True,
                )
            for raw, target in (("c2-d512-r1.json", "bench-raw-vllm-c2-d512.json"),
                                ("llama-benchy-r1.json", "bench-raw-llama-benchy.json")):  # fmt: skip
                docker("cp", f"{CONTAINER}:/tmp/sparkforge-bench/{raw}", str(OUT / "real" / target))
            for cpus in [c for c in args.cpus.split(",") if c]:
                docker("update", "--cpus", cpus, CONTAINER)
                try:
                    planted[f"--cpus {cpus}"] = work / f"cpus-{cpus}.json"
                    bench(PROFILE, planted[f"--cpus {cpus}"], store)
                finally:
                    docker(
                        "update", "--cpus", str(os.cpu_count()), CONTAINER
                    )  # every CPU again (0 does not reset)
        finally:
            invoke("serve.down", "--profile", PROFILE.stem)
        seqs = work / "cpu-tiny-qwen35moe-bench.yaml"  # same profile name: the same container and store key
        seqs.write_text(PROFILE.read_text().replace("max-num-seqs: 8", "max-num-seqs: 1"))
        serve(seqs, PINNED, args.model_dir, work / "cache")
        try:
            planted["--max-num-seqs 1"] = work / "planted.json"
            bench(seqs, planted["--max-num-seqs 1"], store)
        finally:
            invoke("serve.down", "--profile", seqs.stem)
        serve(
            PROFILE, PINNED, args.model_dir, work / "cache"
        )  # a control: unchanged again, on a fresh server
        try:
            bench(PROFILE, work / "restarted.json", store)
        finally:
            invoke("serve.down", "--profile", PROFILE.stem)
    finally:
        if not args.keep_tag:
            subprocess.run([DOCKER, "rmi", PINNED], check=False, capture_output=True)  # the tag only
    for path in [*baselines, *reruns, *planted.values()]:
        assert json.loads(path.read_text())["identity"]["image"]["id"] == image_id, (
            "the image changed under the study"
        )
    results = {"image": image_id, "threshold_pct": float(args.threshold), "seconds": times, "work": str(work),
               **analyze(work, baselines, reruns, planted, args.threshold)}  # fmt: skip
    restarted = json.loads((work / "restarted.json").read_text())
    flagged, failed = pooled_flags(baselines, work / "restarted.json", args.threshold)
    results["restarted_server"] = {"flagged": flagged, "failed_checks": failed, "output_tok_s": medians(restarted),
                                   "itl_ms": medians(restarted, "itl_ms"), "outside_cpu_pct": outside(restarted)}  # fmt: skip
    pooled_flags(baselines, planted["--max-num-seqs 1"], args.threshold, "--allow-different")
    for path, target in ((baselines[0], "bench-cpu-twin-default"), (work / "arena.json", "bench-cpu-twin-spark-arena-v2"),
                         (planted["--max-num-seqs 1"], "bench-cpu-twin-planted-maxseqs1"),
                         (work / "compare-planted.json", "bench-compare-planted")):  # fmt: skip
        shutil.copy(path, OUT / "real" / f"{target}.json")
    invoke("bench.report", f"{baselines[0]},{planted['--max-num-seqs 1']}", "--allow-different",
           "--html", str(work / "report.html"), "--png", str(work / "png"))  # fmt: skip
    for png in (work / "png").glob("*.png"):
        shutil.copy(png, OUT / "real" / f"bench-twin-{png.name}")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
