"""Build and verify timings for the CI test image (real vLLM 0.33.0 + torch 2.14.0, linux/amd64).

Usage: python benchmarks/bench_build.py [--runs 3] [--no-cache-run] > benchmarks/results/build.json
Measures (medians of --runs): fully cached rebuild, rebuild after changing only the image tests, verify
duration; once each: a --no-cache build (layers cold, pip's download cache warm) and the image size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from sparkforge import engine
from sparkforge.commands import Runner
from sparkforge.imagebuild.buildkit import BuildRequest, build_command
from sparkforge.imagebuild.hostsetup import base_image_name
from sparkforge.imagebuild.render import render_context
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.verify.suite import verify_image

RECIPE = REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml"


def timed_build(eng: engine.Engine, context: Path, tag: str, *, no_cache: bool = False) -> float:
    ca = os.environ.get("SPARKFORGE_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    request = BuildRequest(
        context=context,
        platform="linux/amd64",
        target="runtime",
        tags=(tag,),
        build_args={
            "BUILDER_IMAGE": base_image_name("linux/amd64"),
            "RUNTIME_IMAGE": base_image_name("linux/amd64"),
        },
        secrets=(f"id=ca,src={ca}",),
        no_cache=no_cache,
    )
    start = time.monotonic()
    Runner(stream=False).run(build_command(eng, request), "bench-build")
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-cache-run", action="store_true")
    args = parser.parse_args()
    eng = engine.detect_engine()
    recipe = load_recipe(str(RECIPE))
    context = render_context(recipe).path
    tag = plan.candidate_tag(recipe, "linux/amd64")
    results: dict[str, object] = {
        "recipe": recipe.name,
        "engine": f"{eng.docker} ({eng.mode}) {eng.server_version}",
    }
    timed_build(eng, context, tag)  # warm: make sure every layer is cached
    cached = [timed_build(eng, context, tag) for _ in range(args.runs)]
    suite = context / "image-tests" / "run_checks.py"
    original = suite.read_text()
    changed = []
    for run in range(args.runs):
        suite.write_text(original + f"\n# benchmark edit {time.time_ns()} {run}\n")
        changed.append(timed_build(eng, context, tag))
    suite.write_text(original)
    timed_build(eng, context, tag)
    verify = []
    for _ in range(args.runs):
        start = time.monotonic()
        report = verify_image(recipe, tag, gpus="none")
        verify.append(time.monotonic() - start)
        assert report.status == "passed", report.to_dict()
    size = engine.inspect_image(tag)["Size"]
    results.update(
        {
            "cached_rebuild_s": {"runs": cached, "median": statistics.median(cached)},
            "image_tests_changed_rebuild_s": {"runs": changed, "median": statistics.median(changed)},
            "verify_s": {"runs": verify, "median": statistics.median(verify)},
            "image_size_bytes": size,
        }
    )
    if args.no_cache_run:
        results["no_cache_build_s"] = timed_build(eng, context, tag, no_cache=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
