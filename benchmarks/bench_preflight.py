"""Median time to a preflight verdict per failure class, with a warm and a cold download cache.

Usage: python benchmarks/bench_preflight.py [--warm 5] [--cold 3] [--out benchmarks/results/preflight.json]
Each class is a recipe (written to a temp dir, extending the shipped ones) that fails exactly one check.
Cold = an empty SPARKFORGE_CACHE per run (the sdist is downloaded from PyPI and extracted again).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from sparkforge.preflight.checks import run_preflight
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.preflight.pypi import resolve_file
from sparkforge.preflight.sources import extract_archive
from sparkforge.recipe.loader import RECIPES_DIR, REPO_ROOT, Recipe, load_recipe

V0160 = {"version": "0.16.0", "commit": "89a77b10846fd96273cce78d86d2556ea582d26e", "patches": []}
PATCH = REPO_ROOT / "patches/vllm/0001-cmake-keep-sm121-on-cuda13.patch"


@dataclass(frozen=True)
class Case:
    name: str  # the failure class: the check expected to fail
    body: dict
    source: str | None = "pypi"


CASES = [
    Case(
        "models",
        {"components": {"vllm": V0160, "torch": {"version": "2.9.1"}, "transformers": {"version": "4.57.0"}}},
    ),
    Case("requirements", {"components": {"torch": {"version": "2.11.0"}}}),
    Case("patches", {}, source="@applied-tree"),  # 0.31.0 with the series already applied upstream
    Case("arch-plan", {"build": {"torch_cuda_arch_list": ["12.0a"]}}),
]


def _recipe(directory: Path, case: Case) -> Recipe:
    path = directory / f"bench-{case.name}.yaml"
    body = yaml.safe_dump(case.body) if case.body else ""
    path.write_text(f"extends: {RECIPES_DIR / 'vllm-qwen35.yaml'}\n" + body)
    return load_recipe(path)


def _applied_tree(directory: Path) -> Path:
    """A copy of vLLM 0.31.0's sdist tree with the CMake patch already applied (made once, not timed)."""
    fetcher = make_fetcher()
    dist = resolve_file(fetcher, "vllm", "0.31.0", wheel=None)
    tree = extract_archive(fetcher.download(dist.url, what=dist.filename, sha256=dist.sha256), dist.sha256)
    out = directory / "vllm-0.31.0-applied"
    if not out.exists():
        shutil.copytree(tree, out, symlinks=True)
        subprocess.run(
            ["git", "apply", str(PATCH)], cwd=out, check=True, env={"GIT_CEILING_DIRECTORIES": "/"}
        )
    return out


def _time(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def measure(case: Case, directory: Path, warm: int, cold: int) -> dict:
    recipe = _recipe(directory, case)
    source = str(_applied_tree(directory)) if case.source == "@applied-tree" else case.source
    report = run_preflight(recipe, source=source)  # primes the cache, and shows the verdict
    failed = [c.name for c in report.checks if c.status == "failed"]
    assert case.name in failed, f"{case.name}: expected it to fail, got {failed}"
    warm_s = [_time(lambda: run_preflight(recipe, source=source)) for _ in range(warm)]
    cold_s = []
    saved = os.environ.get("SPARKFORGE_CACHE")
    for _ in range(cold):
        with tempfile.TemporaryDirectory(prefix="bench-cache-") as cache:
            os.environ["SPARKFORGE_CACHE"] = cache
            cold_s.append(_time(lambda: run_preflight(recipe, source=source)))
    if saved is None:
        os.environ.pop("SPARKFORGE_CACHE", None)
    else:
        os.environ["SPARKFORGE_CACHE"] = saved
    return {
        "class": case.name,
        "failed_checks": failed,
        "reason": next(c.reason for c in report.checks if c.name == case.name)[:300],
        "warm_median_s": round(statistics.median(warm_s), 3),
        "cold_median_s": round(statistics.median(cold_s), 3) if cold_s else None,
        "warm_s": [round(x, 3) for x in warm_s],
        "cold_s": [round(x, 3) for x in cold_s],
        "check_durations_warm_s": {c.name: round(c.duration_s, 3) for c in report.checks},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=5)
    parser.add_argument("--cold", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results/preflight.json")
    parser.add_argument("--only", default="", help="comma-separated failure classes")
    args = parser.parse_args()
    chosen = [c for c in CASES if not args.only or c.name in args.only.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-preflight-") as tmp:
        results = [measure(case, Path(tmp), args.warm, args.cold) for case in chosen]
    data = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
        "runs": {"warm": args.warm, "cold": args.cold},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    print("| failure class | warm median | cold median | failed checks |")
    print("|---|---|---|---|")
    for r in results:
        cold = f"{r['cold_median_s']:.2f} s" if r["cold_median_s"] is not None else "-"
        print(f"| {r['class']} | {r['warm_median_s']:.2f} s | {cold} | {', '.join(r['failed_checks'])} |")


if __name__ == "__main__":
    main()
