"""Benchmark: the doctor's front stages (engines, image, addresses) on two namespaced nodes, before and after.

Two real Docker engines in their own network namespaces (tests/engine/cluster.py), the offline base image
(python3, no vLLM) streamed into node a and cloned to node b. The doctor stops at `addresses` there (the probe
needs vLLM's get_ip), so what is timed is the part every run pays first: `docker version` and `image inspect` on
each node, then one probe container per node started, polled and read. Each run is the real command line
(`python -m invoke cluster.doctor ...`) in a fresh process against the checkout given by --code.

    python benchmarks/bench_doctor_nodes.py --code DIR [--code DIR2] [--runs 5] --out results/x.json
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


def main() -> int:
    from bench_doctor_jobs import write_results
    from cluster import DOCKER, TestCluster

    from sparkforge.commands import Command
    from sparkforge.run.nodes import NodeEngine, distribute_image, parse_node

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--code", type=Path, action="append", required=True)
    parser.add_argument("--runs", type=int, default=5)
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
        distribute_image(Command((DOCKER,)), IMAGE, [NodeEngine(parse_node(a.url))])
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
        for code in args.code:
            env = {**os.environ, **extra, "PYTHONPATH": str(code.resolve())}
            walls, stages = [], []
            for i in range(args.runs):
                report = out / f"{code.name}-{i}.json"
                argv = [*prefix, sys.executable, "-m", "invoke", "cluster.doctor", "--image", IMAGE, "--nodes", nodes,
                        "--interface", "fabric0", "--json", str(report)]  # fmt: skip
                start = time.monotonic()
                subprocess.run(
                    argv, cwd=code, env=env, capture_output=True, text=True, check=False, timeout=300
                )
                walls.append(round(time.monotonic() - start, 2))
                data = json.loads(report.read_text())
                stages.append(
                    {c["name"]: c["duration_s"] for c in data["checks"] if c["status"] != "skipped"}
                )
            front = [round(sum(s.values()), 2) for s in stages]
            results[str(code)] = {
                "wall_s": walls,
                "wall_median_s": statistics.median(walls),
                "stages_s": stages,
                "stages_total_median_s": statistics.median(front),
                "last_reason": next(c["reason"] for c in data["checks"] if c["status"] == "failed")[:200],
            }
            print(code, results[str(code)], flush=True)
    finally:
        cluster.close()
    write_results(args.out, IMAGE, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
