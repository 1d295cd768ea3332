"""Registry build cache on the buildx path: a cold build vs a rebuild from the registry cache alone.

Usage: python benchmarks/bench_buildx.py [--runs 3] > benchmarks/results/buildx.json
Needs the buildx engine ('invoke engine.up --buildx --qemu') and Debian's docker-registry. Each run, per
platform: empty the buildx engine's local build cache, run the workflow's own build line (images.yml, with
--cache-from/--cache-to type=registry from ci.matrix) on a fresh registry cache ref (cold), empty the local
cache again and remove the built image, then run the same line (cached from the registry only).
Subject: the smoke recipe's 'base' stage on the offline Debian bases (ensure-python + venv + labels).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "engine")]

from buildx_fixtures import Workspace, build_base_stage, docker  # noqa: E402
from registry import local_registry  # noqa: E402

from sparkforge.imagebuild import hostsetup  # noqa: E402
from sparkforge.recipe import plan  # noqa: E402
from sparkforge.recipe.loader import load_recipe  # noqa: E402
from tests.recipe_files import smoke_recipe_file  # noqa: E402

PLATFORMS = ("linux/amd64", "linux/arm64")


def empty_local_cache(ws: Workspace, platform: str) -> None:
    docker("builder", "prune", "--all", "--force")  # the buildx engine's own cache, not the host engine's
    docker("image", "rm", "--force", f"{plan.candidate_tag(ws.recipe, platform)}-base", check=False)


def timed(ws: Workspace, platform: str) -> tuple[float, str]:
    start = time.perf_counter()
    done = build_base_stage(ws, platform)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(done.stdout + done.stderr)
    log = next(Path(line.split("log: ", 1)[1]) for line in done.stdout.splitlines() if "log: " in line)
    return elapsed, next(log.glob("*-build.log")).read_text()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    versions = docker("version", "--format", "{{.Server.Version}}").stdout.strip()
    buildx = docker("buildx", "version").stdout.strip()
    results: dict[str, dict[str, list[float]]] = {}
    cached_steps: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="sparkforge-bench-") as tmp_name:
        tmp = Path(tmp_name)
        for run in range(args.runs):
            with local_registry(tmp / f"registry-{run}") as registry:  # a fresh registry: no cache there yet
                recipe = load_recipe(smoke_recipe_file(tmp / f"recipe-{run}", registry.host))
                ws = Workspace(recipe, registry, tmp / f"work-{run}", tmp / f"runner-{run}")
                ws.work.mkdir()
                ws.runner_temp.mkdir()
                for platform in PLATFORMS:
                    empty_local_cache(ws, platform)
                    cold, _ = timed(ws, platform)
                    empty_local_cache(ws, platform)
                    cached, log = timed(ws, platform)
                    empty_local_cache(ws, platform)
                    entry = results.setdefault(platform, {"cold_s": [], "registry_cached_s": []})
                    entry["cold_s"].append(round(cold, 2))
                    entry["registry_cached_s"].append(round(cached, 2))
                    cached_steps[platform] = log.count(" CACHED")
    summary = {
        platform: {
            **values,
            "cold_median_s": statistics.median(values["cold_s"]),
            "registry_cached_median_s": statistics.median(values["registry_cached_s"]),
            "ratio": round(
                statistics.median(values["cold_s"]) / statistics.median(values["registry_cached_s"]), 2
            ),
            "cached_steps_in_last_log": cached_steps[platform],
        }
        for platform, values in results.items()
    }
    print(
        json.dumps(
            {
                "benchmark": "buildx registry cache",
                "engine": f"dockerd {versions} (containerd image store), {buildx}",
                "debs": hostsetup.BUILDX_DEBS,
                "runs": args.runs,
                "subject": "tests/recipes/smoke-multiarch.yaml, target base, offline Debian bookworm bases",
                "timing": "wall time of the whole 'invoke build' line (build + push to the local registry)",
                "platforms": summary,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
