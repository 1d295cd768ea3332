"""Benchmark: the kernels check of a whole image, before and after a change, cold and warm (median of N).

Three commands, each the real command line in a fresh process, in the checkout given by --code (e.g. an export
of main for "before"), with $SPARKFORGE_CACHE pointed at a folder of its own: emptied before every cold run,
kept for the warm runs that follow.
  audit:   python -m invoke audit IMAGE --recipe R            (every library listed)
  verify:  verify's kernels check (suite.check_kernels: the recipe's required libraries), as `invoke verify` runs it
  kernels: python -m invoke kernels --recipe R --image IMAGE  (the kernel report, audit-only without --profile)

    python benchmarks/bench_image_check.py --image REF --code DIR [--code DIR2] [--runs 3] [--recipe R] \
        [--only verify --only kernels] [--bytecode] --out results/x.json

The runs alternate between the checkouts (cold 1 of each, then cold 2 of each...), so that a change of the shared
machine's load falls on all of them; each run's load average is kept beside its time. `--bytecode` lets Python
write and use its compiled modules (as an installed package does) even where PYTHONDONTWRITEBYTECODE is set.
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


def commands(image: str, out: Path, recipe: str = RECIPE) -> dict[str, list[str]]:
    return {
        "audit": [sys.executable, "-m", "invoke", "audit", image, "--recipe", recipe],
        "verify": [sys.executable, "-c", VERIFY, recipe, image],
        "kernels": [
            sys.executable,
            "-m",
            "invoke",
            "kernels",
            "--recipe",
            recipe,
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
    parser.add_argument(
        "--recipe", default=RECIPE, help="a name, or a path inside each checkout (run from its root)"
    )
    parser.add_argument("--only", action="append", choices=["audit", "verify", "kernels"])
    parser.add_argument("--bytecode", action="store_true")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench-image-check-"))
    results: dict[str, dict[str, dict[str, object]]] = {}
    for name, argv in commands(args.image, out, args.recipe).items():
        if args.only and name not in args.only:
            continue
        envs = {}
        for code in args.code:
            env = {
                **os.environ,
                "SPARKFORGE_CACHE": str(out / code.name / "cache"),
                "PYTHONPATH": str(code.resolve()),
            }
            if args.bytecode:
                env.pop("PYTHONDONTWRITEBYTECODE", None)
                timed(argv, code, env)  # writes the compiled modules, once
            envs[code] = env
        runs: dict[Path, dict[str, list[tuple[float, float]]]] = {
            c: {"cold": [], "warm": []} for c in args.code
        }
        for kind in ("cold", "warm"):
            for _ in range(args.runs):
                for code, env in envs.items():
                    if kind == "cold":
                        shutil.rmtree(env["SPARKFORGE_CACHE"], ignore_errors=True)
                    runs[code][kind].append((timed(argv, code, env), os.getloadavg()[0]))
        for code in args.code:
            found = {}
            for kind in ("cold", "warm"):
                times = [t for t, _ in runs[code][kind]]
                found[f"{kind}_s"] = [round(t, 2) for t in times]
                found[f"{kind}_median_s"] = round(statistics.median(times), 2)
                found[f"{kind}_load"] = [round(load, 2) for _, load in runs[code][kind]]
            results.setdefault(str(code), {})[name] = found
            print(code, name, found, flush=True)
    shutil.rmtree(out, ignore_errors=True)
    data = {"image": args.image, "results": results, "loadavg_after": os.getloadavg(), "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
