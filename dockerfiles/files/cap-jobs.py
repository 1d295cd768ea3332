#!/usr/bin/env python3
"""Compile parallelism that fits the memory this build actually has; prints `export MAX_JOBS=.. NVCC_THREADS=..`.

The recipe's max_jobs/nvcc_threads are the ceiling (sized for a Spark's 128 GB). Each nvcc job of a heavy CUTLASS
translation unit needs the peak memory the compile probe measured (--unit-peak-gb; 0 = not measured: a
conservative default). The memory available is the smaller of MemAvailable and the cgroup limit of this build.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

DEFAULT_UNIT_PEAK_GB = (
    10.0  # heaviest vLLM 0.31.0 SM120 CUTLASS unit measured by the probe: 9.4 GB (benchmarks/probe.md)
)
HEADROOM = 0.85  # leave room for the linker, Python and the page cache


def available_gb(meminfo: Path = Path("/proc/meminfo"), cgroup_root: Path = Path("/sys/fs/cgroup")) -> float:
    """MemAvailable, capped by the cgroup (v2 memory.max or v1 memory.limit_in_bytes) limit when one is set."""
    match = re.search(r"^MemAvailable:\s+(\d+) kB", meminfo.read_text(), re.M)
    available = int(match.group(1)) * 1024 if match else 0
    for limit_file in (cgroup_root / "memory.max", cgroup_root / "memory" / "memory.limit_in_bytes"):
        try:
            text = limit_file.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):
            available = min(available, int(text))
    return available / (1 << 30)


def cap(max_jobs: int, nvcc_threads: int, unit_peak_gb: float, avail_gb: float) -> tuple[int, int, str]:
    """(jobs, threads, why): as many jobs as fit `avail_gb`, never above the recipe's ceiling, at least one."""
    peak = unit_peak_gb if unit_peak_gb > 0 else DEFAULT_UNIT_PEAK_GB
    source = "measured by the probe" if unit_peak_gb > 0 else "default, no probe measurement"
    fit = max(1, math.floor(avail_gb * HEADROOM / peak))
    jobs = min(max_jobs, fit)
    threads = nvcc_threads if jobs > 1 or avail_gb * HEADROOM >= peak * 1.5 else 1
    why = (
        f"MAX_JOBS={jobs} NVCC_THREADS={threads}: {avail_gb:.1f} GB available x {HEADROOM} / {peak:.1f} GB per "
        f"heavy unit ({source}) fits {fit}; recipe ceiling max_jobs={max_jobs} nvcc_threads={nvcc_threads}"
    )
    return jobs, threads, why


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-jobs", type=int, required=True)
    parser.add_argument("--nvcc-threads", type=int, required=True)
    parser.add_argument("--unit-peak-gb", type=float, default=0.0)
    args = parser.parse_args()
    jobs, threads, why = cap(args.max_jobs, args.nvcc_threads, args.unit_peak_gb, available_gb())
    print(f"sparkforge: {why}", file=sys.stderr)
    print(f"export MAX_JOBS={jobs} NVCC_THREADS={threads}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
