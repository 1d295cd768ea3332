"""Benchmark: `invoke kernels` on the official vLLM 0.33.0 aarch64 wheel, cold and warm (median of N).

The report audits the wheel (333 MB) and, with --runner-image, runs vLLM's own selection for sm_121 and the
Qwen3.5-35B-A3B-FP8 checkpoint in the runner image (the CI image: the same vLLM 0.33.0, its Python files
byte-identical to the wheel's); without it the report is the audit alone. Cold: the sparkforge cache emptied
before each run. Warm: the same command again (audit and selection answered from the cache, keyed by the
wheel's zip directory and the runner image's ID). Each run is the real command line (`python -m invoke kernels
...`) in a fresh process, in the checkout given by --code (default: this one; e.g. an export of main to time
the code before a change), with $SPARKFORGE_CACHE pointed at a folder of its own.

    python benchmarks/bench_kernels.py --wheel PATH [--runner-image IMAGE] [--runs 5] [--cold-runs 5]
        [--code DIR] [--out results/kernels_bench.json]
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
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WHEEL = "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl"


def run(argv: list[str], code: Path, env: dict[str, str]) -> float:
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=code, capture_output=True, text=True, check=False, env=env)
    took = time.monotonic() - start
    if "sparkforge: kernels" not in proc.stdout + proc.stderr and proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--runner-image", default="")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cold-runs", type=int, default=1)
    parser.add_argument("--code", type=Path, default=ROOT)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "kernels_bench.json")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench-kernels-"))
    argv = [sys.executable, "-m", "invoke", "kernels", "--recipe", "vllm-qwen35-wheels", "--image", str(args.wheel),
            "--json", str(out / "report.json"), "--markdown", str(out / "report.md")]  # fmt: skip
    if args.runner_image:
        argv += ["--profile", "qwen35-35b-a3b-fp8", "--runner-image", args.runner_image]
    cache = out / "cache"
    env = {**os.environ, "SPARKFORGE_CACHE": str(cache), "PYTHONPATH": str(args.code.resolve())}
    cold = []
    for _ in range(args.cold_runs):
        shutil.rmtree(cache, ignore_errors=True)
        cold.append(run(argv, args.code, env))
    warm = [run(argv, args.code, env) for _ in range(args.runs)]
    report = json.loads((out / "report.json").read_text())
    result = {
        "command": " ".join(a if a != sys.executable else "python" for a in argv),
        "code": str(args.code),
        "wheel": args.wheel.name,
        "wheel_bytes": args.wheel.stat().st_size,
        "runner_image": args.runner_image or None,
        "libraries_in_report": len(report.get("libraries") or []),
        "scope": (report.get("summary") or {}).get("scope"),
        "cold_s": [round(t, 2) for t in cold],
        "cold_median_s": round(statistics.median(cold), 2),
        "warm_s": [round(t, 2) for t in warm],
        "warm_median_s": round(statistics.median(warm), 2),
        "machine": {
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_after": os.getloadavg(),
        },
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    shutil.rmtree(out, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
