"""Benchmark: the doctor on two namespaced nodes, before and after a change (the cluster set up once).

Two real Docker engines in their own network namespaces (tests/engine/cluster.py), the image streamed into node a
and cloned to node b. With the offline base image (python3, no vLLM: the default) the doctor stops at
`addresses`, so what is timed is the part every run pays first; with `--image` the CI wheels image (real vLLM)
every stage runs. Each run is the real command line (`python -m invoke cluster.doctor ...`) in a fresh process
against the checkout given by --code; the runs alternate between the checkouts and the modes, so that a change in
the machine's load falls on all of them. Modes: `full` (--interface fabric0: every stage), `quick` (the same with
--quick), `lan` (--interface lan0: the reach stage names the LAN address).

    python benchmarks/bench_doctor_nodes.py --code DIR [--code DIR2] [--runs 5] [--image REF] \
        [--mode full --mode quick --mode lan] --out results/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "engine"), str(ROOT / "benchmarks")]
IMAGE = "sparkforge-base/debian-bookworm:amd64"


MODES = {
    "full": ("--interface", "fabric0"),
    "quick": ("--interface", "fabric0", "--quick"),
    "lan": ("--interface", "lan0"),
}


def _summary(report: dict[str, object]) -> dict[str, object]:
    """Status, each stage's seconds, the first failure, and per node: the probe's and the sanity rank's seconds."""
    checks = {c["name"]: c for c in report["checks"]}  # type: ignore[union-attr]
    per_node: dict[str, dict[str, object]] = {}
    for label, rank in checks.get("sanity", {}).get("details", {}).get("ranks", {}).items():
        done = {s["stage"]: s for s in rank.get("stages", []) if s.get("event") == "done"}
        stages = {name: event.get("seconds") for name, event in done.items()}
        imports = {  # reported by the ranks since issue 48 (absent before)
            "torch_import_s": done.get("rendezvous", {}).get("torch_import_s"),
            "queue_import_s": done.get("message-queue", {}).get("import_s"),
            "vllm_init_run": done.get("message-queue", {}).get("vllm_init_run"),
            "remote_subscribe_addr": done.get("message-queue", {}).get("remote_subscribe_addr"),
        }
        per_node.setdefault(label, {})["sanity"] = {"seconds": rank.get("seconds"), **stages, **imports}
    for label, found in (checks.get("nccl-library", {}).get("details") or {}).items():
        if isinstance(found, dict) and "seconds" in found:
            per_node.setdefault(label, {})["nccl_library_s"] = found["seconds"]
    failed = next((c for c in checks.values() if c["status"] == "failed"), None)
    return {
        "status": report["status"],
        "stages_s": {n: c["duration_s"] for n, c in checks.items() if c["status"] != "skipped"},
        "failed": f"{failed['name']}: {failed['reason'][:160]}" if failed else None,
        "per_node": per_node,
    }


def main() -> int:
    from bench_doctor_jobs import write_results
    from cluster import DOCKER, TestCluster

    from sparkforge.commands import Command
    from sparkforge.run.nodes import NodeEngine, distribute_image, parse_node

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--code", type=Path, action="append", required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--image", default=IMAGE, help="the image the nodes hold and the doctor checks")
    parser.add_argument("--mode", action="append", choices=sorted(MODES), help="default: full")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--ssh", action="store_true", help="node b over ssh:// (sparkforge in node a's network)"
    )
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench-doctor-"))
    results: dict[str, object] = {}
    cluster = TestCluster.create(2)
    try:
        a, b = cluster.nodes
        cluster.start_engine(a)
        distribute_image(Command((DOCKER,)), args.image, [NodeEngine(parse_node(a.url))])
        cluster.stop_engine(a)
        cluster.clone_store(a, b)
        cluster.start_engine(a)
        cluster.start_engine(b)
        nodes, prefix, extra = f"{a.url},{b.url}", [], {}
        if (
            args.ssh
        ):  # as tests/engine/test_cluster.py::test_one_node_over_ssh: each call to b pays an ssh session
            client = cluster.start_sshd(b, out / "ssh")
            nodes, prefix = (
                f"{a.url},ssh://root@{b.fabric_ip}:2222",
                ["nsenter", f"--net=/run/netns/{a.netns}"],
            )
            extra = {"PATH": f"{client}:{os.environ['PATH']}"}
        runs: dict[tuple[str, str], list[dict[str, object]]] = {}
        for i in range(args.runs):
            for mode in args.mode or ["full"]:
                for code in args.code:
                    env = {**os.environ, **extra, "PYTHONPATH": str(code.resolve())}
                    report = out / f"{code.name}-{mode}-{i}.json"
                    argv = [*prefix, sys.executable, "-m", "invoke", "cluster.doctor", "--image", args.image,
                            "--nodes", nodes, *MODES[mode], "--json", str(report)]  # fmt: skip
                    start = time.monotonic()
                    proc = subprocess.run(
                        argv, cwd=code, env=env, capture_output=True, text=True, check=False, timeout=300
                    )
                    run = {"wall_s": round(time.monotonic() - start, 2), "load": os.getloadavg()[0]}
                    if report.exists():
                        run.update(_summary(json.loads(report.read_text())))
                    else:  # the doctor did not get to write its report: keep its words
                        run["error"] = (proc.stdout + proc.stderr)[-600:]
                    runs.setdefault((str(code), mode), []).append(run)
                    print(code.name, mode, i, run, flush=True)
        for (code, mode), found in runs.items():
            walls = [r["wall_s"] for r in found]
            results[f"{code} {mode}"] = {"wall_median_s": statistics.median(walls), "runs": found}
    finally:
        cluster.close()
    write_results(args.out, args.image, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
