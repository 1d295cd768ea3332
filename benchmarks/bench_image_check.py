"""Benchmark: the kernels check of a whole image, before and after a change, cold and warm (median of N).

Three commands, each the real command line in a fresh process, in the checkout given by --code (e.g. an export
of main for "before"), with $SPARKFORGE_CACHE pointed at a folder of its own: emptied before every cold run,
kept for the warm runs that follow.
  audit:   python -m invoke audit IMAGE --recipe R            (every library listed)
  verify:  verify's kernels check (suite.check_kernels: the recipe's required libraries), as `invoke verify` runs it
  kernels: python -m invoke kernels --recipe R --image IMAGE  (the kernel report, audit-only without --profile)

    python benchmarks/bench_image_check.py --image REF --code DIR [--code DIR2] [--runs 3] --out results/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECIPE = "vllm-qwen35-wheels"
VERIFY = (
    "import sys; from sparkforge.recipe.loader import load_recipe; from sparkforge.verify.suite import check_kernels; "
    "c = check_kernels(load_recipe(sys.argv[1]), sys.argv[2]); print(c.status, c.reason[:200])"
)


def commands(image: str, out: Path) -> dict[str, list[str]]:
    return {
        "audit": [sys.executable, "-m", "invoke", "audit", image, "--recipe", RECIPE],
        "verify": [sys.executable, "-c", VERIFY, RECIPE, image],
        "kernels": [
            sys.executable,
            "-m",
            "invoke",
            "kernels",
            "--recipe",
            RECIPE,
            "--image",
            image,
            "--json",
            str(out / "kernels.json"),
        ],
    }


def timed(argv: list[str], code: Path, env: dict[str, str]) -> float:
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=code, capture_output=True, text=True, check=False, env=env)
    took = time.monotonic() - start
    if "Traceback" in proc.stdout + proc.stderr:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--image", required=True)
    parser.add_argument("--code", type=Path, action="append", required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench-image-check-"))
    results: dict[str, dict[str, dict[str, object]]] = {}
    for code in args.code:
        for name, argv in commands(args.image, out).items():
            cache = out / "cache"
            env = {**os.environ, "SPARKFORGE_CACHE": str(cache), "PYTHONPATH": str(code.resolve())}
            cold = []
            for _ in range(args.runs):
                shutil.rmtree(cache, ignore_errors=True)
                cold.append(timed(argv, code, env))
            warm = [timed(argv, code, env) for _ in range(args.runs)]
            results.setdefault(str(code), {})[name] = {
                "cold_s": [round(t, 2) for t in cold],
                "cold_median_s": round(statistics.median(cold), 2),
                "warm_s": [round(t, 2) for t in warm],
                "warm_median_s": round(statistics.median(warm), 2),
            }
            print(code, name, results[str(code)][name], flush=True)
    shutil.rmtree(out, ignore_errors=True)
    data = {"image": args.image, "results": results, "loadavg_after": os.getloadavg(), "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
