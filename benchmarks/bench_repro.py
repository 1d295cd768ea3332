"""Reproducible builds: one normal build, then two reproducible builds of the same stage, each with no cache.

Usage: python benchmarks/bench_repro.py --recipe tests/recipes/ci-wheels-amd64.yaml --network host \
         --base-image sparkforge-base/debian-bookworm:amd64 > benchmarks/results/repro_ci-wheels-amd64.json
Runs against the buildx engine ('invoke engine.up --buildx'; BuildKit 0.13 through Docker 26's docker driver).
The argv is `invoke build`'s own (sparkforge.imagebuild.buildkit.build_command): 'normal' is the same request without
the timestamp rewrite (the engine's exporter, --load), 'reproducible' is what `invoke build` runs (a tarball
with rewrite-timestamp=true, then `docker load`). Every build has --no-cache (BuildKit's cache mounts, e.g. pip's
download cache, stay: they never reach a layer). Digests of the two reproducible builds are compared; where they
differ, both images are saved and compared file by file (sparkforge.imagebuild.layerdiff). Images are removed after.
--prune clears BuildKit's whole cache (cache mounts included) before each build; --no-load keeps each reproducible
build's tarball (the `docker save` format the exporter writes) instead of loading it, and reads digests and files
from the tarballs: half the disk for a ~10 GB image (no loaded copy, no second save).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

from sparkforge.commands import Runner  # noqa: E402
from sparkforge.context import Session  # noqa: E402
from sparkforge.engine import Engine  # noqa: E402
from sparkforge.imagebuild import epoch, hostsetup, layerdiff  # noqa: E402
from sparkforge.imagebuild.buildkit import BuildRequest, build_command, load_command  # noqa: E402
from sparkforge.imagebuild.render import render_context  # noqa: E402
from sparkforge.imagebuild.stage import parse_base_image  # noqa: E402
from sparkforge.recipe import plan  # noqa: E402
from sparkforge.recipe.loader import load_recipe  # noqa: E402

ENV = {**os.environ, **hostsetup.buildx_env()}


def run(argv: tuple[str, ...] | list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(list(argv), env=ENV, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return time.perf_counter() - start, done.stdout + done.stderr


def inspect(tag: str) -> dict[str, object]:
    out = subprocess.run(
        ["/usr/bin/docker", "image", "inspect", tag], env=ENV, capture_output=True, text=True
    )
    attrs = json.loads(out.stdout)[0]
    return {
        "id": attrs["Id"],
        "created": attrs["Created"],
        "diff_ids": attrs["RootFS"]["Layers"],
        "size": attrs["Size"],
    }


def from_tarball(archive: Path) -> dict[str, object]:
    saved = layerdiff.read_saved(archive)
    return {
        "id": saved.config_digest,
        "created": saved.config.get("created"),
        "diff_ids": list(saved.diff_ids),
        "tarball": archive.name,
    }


def prune() -> dict[str, object]:
    """Clears BuildKit's whole cache; how long it took and what the engine says it reclaimed."""
    seconds, out = run(["/usr/bin/docker", "builder", "prune", "--all", "--force"])
    reclaimed = [line.split(":", 1)[1].strip() for line in out.splitlines() if "reclaimed space" in line]
    return {"prune_s": round(seconds, 1), "prune_reclaimed": reclaimed[-1] if reclaimed else None}


def build(request: BuildRequest, engine: Engine, keep_in: Path | None = None) -> dict[str, object]:
    seconds, _ = run(build_command(engine, request).argv)
    result: dict[str, object] = {"build_s": round(seconds, 1)}
    load = load_command(engine, request)
    if load is not None and keep_in is not None:
        kept = keep_in / f"{request.tags[0].rsplit(':', 1)[1]}.tar"
        request.image_tar.rename(kept)
        out = {**result, "tarball_bytes": kept.stat().st_size, **from_tarball(kept)}
        print(json.dumps({request.tags[0]: out}), file=sys.stderr, flush=True)
        return out
    if load is not None:
        result["tarball_bytes"] = request.image_tar.stat().st_size
        load_s, _ = run(load.argv)
        request.image_tar.unlink()
        result["load_s"] = round(load_s, 1)
    result["total_s"] = round(seconds + float(result.get("load_s", 0.0)), 1)
    out = {**result, **inspect(request.tags[0])}
    print(json.dumps({request.tags[0]: out}), file=sys.stderr, flush=True)  # progress: survives a timeout
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", required=True)
    parser.add_argument("--platform", default="linux/amd64")
    parser.add_argument("--target", default="runtime")
    parser.add_argument("--base-image", required=True)
    parser.add_argument("--network", default=None)
    parser.add_argument("--skip-normal", action="store_true")
    parser.add_argument("--prune", action="store_true", help="clear BuildKit's whole cache before each build")
    parser.add_argument("--no-load", action="store_true", help="compare the exported tarballs, load nothing")
    args = parser.parse_args()
    recipe = load_recipe(args.recipe)
    bases = plan.bases(recipe, parse_base_image(args.base_image))
    context = render_context(recipe, bases=bases)
    stamp = epoch.for_build(Session(echo=print, runner=Runner(stream=False)), recipe, bases)
    ca = os.environ.get("SPARKFORGE_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    engine = Engine("/usr/bin/docker", "buildx", "26.1.5", "docker")
    base = BuildRequest(
        context=context.path,
        platform=args.platform,
        target=args.target,
        build_args={
            "SOURCE_DATE_EPOCH": str(stamp.seconds),
            "SPARKFORGE_CREATED": stamp.iso,
            "SPARKFORGE_REVISION": "bench",
        },
        secrets=(f"id=ca,src={ca}",),
        no_cache=True,
        network=args.network,
    )
    name = f"sparkforge-test/repro-bench-{recipe.name}"
    results: dict[str, object] = {
        "recipe": recipe.name,
        "target": args.target,
        "platform": args.platform,
        "base_image": args.base_image,
        "source_date_epoch": stamp.seconds,
        "epoch_source": stamp.source,
        "engine": "Docker 26.1.5 (containerd image store) + buildx 0.13.1, docker driver",
    }
    if not args.skip_normal:
        normal = dataclasses.replace(base, tags=(f"{name}:normal",), rewrite_timestamps=False)
        results["normal"] = build(normal, engine)
        run(["/usr/bin/docker", "image", "rm", "--force", f"{name}:normal"])
    keep_in = Path(tempfile.mkdtemp(prefix="repro-bench-", dir=REPO / "build")) if args.no_load else None
    runs = []
    for tag in ("a", "b"):
        pruned = prune() if args.prune else {}
        runs.append({**pruned, **build(dataclasses.replace(base, tags=(f"{name}:{tag}",)), engine, keep_in)})
    first, second = runs
    results["reproducible"] = runs
    results["identical"] = first["id"] == second["id"] and first["diff_ids"] == second["diff_ids"]
    if keep_in is not None:
        if not results["identical"]:
            a, b = (layerdiff.read_saved(keep_in / f"{t}.tar") for t in ("a", "b"))
            results["config_differs"] = layerdiff.config_differences(a.config, b.config)
            results["layers"] = [layer.to_dict() for layer in layerdiff.compare_images(a, b)]
        for tar in keep_in.glob("*.tar"):
            tar.unlink()
        keep_in.rmdir()
    elif not results["identical"]:
        with tempfile.TemporaryDirectory(prefix="repro-bench-", dir=REPO / "build") as tmp:
            run(["/usr/bin/docker", "save", "--output", f"{tmp}/a.tar", f"{name}:a"])
            run(["/usr/bin/docker", "save", "--output", f"{tmp}/b.tar", f"{name}:b"])
            a, b = layerdiff.read_saved(Path(tmp, "a.tar")), layerdiff.read_saved(Path(tmp, "b.tar"))
            results["config_differs"] = layerdiff.config_differences(a.config, b.config)
            results["layers"] = [layer.to_dict() for layer in layerdiff.compare_images(a, b)]
    if keep_in is None:
        run(["/usr/bin/docker", "image", "rm", "--force", f"{name}:a", f"{name}:b"])
    json.dump(results, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
