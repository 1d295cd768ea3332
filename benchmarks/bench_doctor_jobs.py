"""Benchmark: what the doctor's container orchestration costs per stage, before and after a change (median of N).

On the local engine, with the offline base image (python3, no vLLM), two "nodes" that are the same engine:
  stage:  run_jobs of one `connect` job per node (start, poll, logs, remove): the shape of every doctor stage
  dial:   the reach stage's dials, as a container per node (before) or exec'd into each node's listening probe
          container (after: exec_jobs), the listeners started once beforehand and not timed
Each measurement runs in a fresh process against the checkout given by --code (e.g. an export of main).

    python benchmarks/bench_doctor_jobs.py --code DIR [--code DIR2] [--runs 5] --out results/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

IMAGE = "sparkforge-base/debian-bookworm:amd64"
PROGRAM = r"""
import json, sys, time
from sparkforge.run import jobs
from sparkforge.run.nodes import LOCAL, NodeEngine
image, runs, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
nodes = [NodeEngine(LOCAL), NodeEngine(LOCAL)]
dial = ("connect", "--timeout", "2", f"127.0.0.1:{port}")
out = {"stage": [], "dial": [], "dial_kind": None}
for _ in range(runs):
    start = time.monotonic()
    jobs.run_jobs([jobs.Job(e, dial) for e in nodes], image, "bench", 60)
    out["stage"].append(round(time.monotonic() - start, 3))
listening = lambda found: all(jobs.first_event(o, "listening") or o.exit_code is not None for o in found)
probes = jobs.run_jobs([jobs.Job(nodes[0], ("listen", f"127.0.0.1:{port}"))], image, "probe", 60, until=listening, keep=True)
try:
    for _ in range(runs):
        start = time.monotonic()
        if hasattr(jobs, "exec_jobs"):
            found = jobs.exec_jobs([jobs.Job(e, dial) for e in nodes], probes * 2, 30)
            out["dial_kind"] = "exec in the probe container"
        else:
            found = jobs.run_jobs([jobs.Job(e, dial) for e in nodes], image, "dial", 60)
            out["dial_kind"] = "a dial container per node"
        out["dial"].append(round(time.monotonic() - start, 3))
        assert all(any(ev["event"] == "reached" for ev in o.events) for o in found), [o.lines for o in found]
finally:
    jobs.remove_jobs(probes)
print(json.dumps(out))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--code", type=Path, action="append", required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--port", type=int, default=29591)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results = {}
    for code in args.code:
        env = {**os.environ, "PYTHONPATH": str(code.resolve())}
        proc = subprocess.run([sys.executable, "-c", PROGRAM, IMAGE, str(args.runs), str(args.port)], cwd=code,
                              env=env, capture_output=True, text=True, check=True)  # fmt: skip
        data = json.loads(proc.stdout.strip().splitlines()[-1])
        data["stage_median_s"] = statistics.median(data["stage"])
        data["dial_median_s"] = statistics.median(data["dial"])
        results[str(code)] = data
        print(code, data, flush=True)
    write_results(args.out, IMAGE, results)
    return 0


def write_results(path: Path, image: str, results: dict[str, object]) -> None:
    """The results with the machine's load and the time, as JSON (shared by bench_doctor_nodes.py)."""
    out = {"image": image, "results": results, "loadavg_after": os.getloadavg(), "cpus": os.cpu_count(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    path.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
