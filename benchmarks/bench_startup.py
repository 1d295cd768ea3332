"""How long `invoke --list` and `invoke --help` take on a warm machine (the venv as .ci/install leaves it).

Usage: python3 benchmarks/bench_startup.py [--runs 5] > benchmarks/results/startup.json
Each command runs once to warm the page cache, then --runs times; the median and the range are reported, with
the load average before and after (the machine is shared: a loaded CPU shows in the figures). Also reported:
which sparkforge modules loading tasks.py imports (the CLI modules only, the library when a task runs).
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

REPO = Path(__file__).resolve().parents[1]
INVOKE = Path(sys.executable).with_name("invoke")


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=REPO, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    load_before = os.getloadavg()
    results = {}
    for name, argv in {
        "invoke --list": [str(INVOKE), "--list"],
        "invoke --help": [str(INVOKE), "--help"],
    }.items():
        timed(argv)  # warm-up
        times = [timed(argv) for _ in range(runs)]
        results[name] = {
            "median_s": round(statistics.median(times), 3),
            "runs_s": [round(t, 3) for t in times],
        }
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, tasks; print(sorted(m for m in sys.modules if m.startswith('sparkforge')))"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    print(json.dumps({
        "results": results,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "tasks_imports": loaded,
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
