"""Benchmark: `invoke kernels` on the official vLLM 0.33.0 aarch64 wheel, cold and warm (median of N).

The report audits the wheel (333 MB) and runs vLLM's own selection for sm_121 and the Qwen3.5-35B-A3B-FP8
checkpoint in the runner image (the CI image: the same vLLM 0.33.0, its Python files byte-identical to the
wheel's). Cold: the sparkforge kernels cache emptied first. Warm: the same command again (audit and selection
answered from the cache, keyed by the wheel's zip directory and the runner image's ID). Each run is the real
command line (`python -m invoke kernels ...`) in a fresh process. Writes benchmarks/results/kernels_bench.json.

    python benchmarks/bench_kernels.py --runner-image IMAGE [--runs 5] [--wheel PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from sparkforge.cache import cache_path

ROOT = Path(__file__).resolve().parent.parent
WHEEL = "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl"


def run(argv: list[str]) -> float:
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    took = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runner-image", required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--wheel", type=Path, default=cache_path("audit", "wheels", WHEEL))
    args = parser.parse_args()
    out = ROOT / "build" / "bench-kernels"
    argv = [sys.executable, "-m", "invoke", "kernels", "--recipe", "vllm-qwen35-wheels", "--image", str(args.wheel),
            "--profile", "qwen35-35b-a3b-fp8", "--runner-image", args.runner_image,
            "--json", str(out / "report.json"), "--markdown", str(out / "report.md")]  # fmt: skip
    shutil.rmtree(cache_path("kernels", "x").parent, ignore_errors=True)
    cold = run(argv)
    warm = [run(argv) for _ in range(args.runs)]
    result = {
        "command": " ".join(a if a != sys.executable else "python" for a in argv),
        "wheel": args.wheel.name,
        "wheel_bytes": args.wheel.stat().st_size,
        "runner_image": args.runner_image,
        "cold_s": round(cold, 2),
        "warm_s": [round(t, 2) for t in warm],
        "warm_median_s": round(statistics.median(warm), 2),
        "machine": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_after": os.getloadavg(),
        },
        "date": time.strftime("%Y-%m-%d"),
    }
    target = ROOT / "benchmarks" / "results" / "kernels_bench.json"
    target.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
