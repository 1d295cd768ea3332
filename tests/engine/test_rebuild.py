"""Reproducible builds on the buildx engine (BuildKit 0.13, timestamps rewritten to SOURCE_DATE_EPOCH) and
`invoke rebuild --check`: the smoke recipe's 'base' stage on the offline Debian base, built and then rebuilt with
no cache, gives the same config and layer digests; a step planted in a copy of the template that writes the time
into a file makes the rebuild differ, and the report names that file, its layer and the content diff."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from buildx_fixtures import buildx_env, docker

from sparkforge.imagebuild import hostsetup
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from tests.prerequisites import skip_or_fail
from tests.recipe_files import SMOKE, write_recipe_file

PLATFORM = "linux/amd64"
PLANTED = "opt/sparkforge/built-at"
HELPER = Path(__file__).with_name("planted_invoke.py")


def _require_buildx_engine() -> None:
    base = hostsetup.base_image_name(PLATFORM)
    if docker("image", "inspect", base, check=False).returncode != 0:
        skip_or_fail(f"the buildx engine or its {base} is missing; run 'invoke engine.up --buildx'")


def _invoke(*args: str, templates: Path | None = None) -> subprocess.CompletedProcess[str]:
    head = [sys.executable, str(HELPER), str(templates)] if templates else [sys.executable, "-m", "invoke"]
    if not templates:
        head += ["--search-root", str(REPO_ROOT)]
    env = {**buildx_env(), "SPARKFORGE_CA_BUNDLE": os.environ.get("SPARKFORGE_CA_BUNDLE", "")}
    env.pop("SOURCE_DATE_EPOCH", None)
    return subprocess.run([*head, *args], env=env, capture_output=True, text=True, timeout=900)


@pytest.fixture
def built(engine_ready: None, tmp_path: Path) -> Iterator[object]:
    """Builds `name`'s base stage (optionally on a planted template); the images are removed afterwards."""
    _require_buildx_engine()
    made: list[str] = []

    def build(name: str, templates: Path | None = None) -> tuple[Path, str]:
        recipe = write_recipe_file(tmp_path / f"{name}.yaml", "platforms: [linux/amd64]\n", extends=SMOKE)
        done = _invoke(
            "build",
            "--recipe",
            str(recipe),
            "--platform",
            PLATFORM,
            "--target",
            "base",
            "--no-cache",
            "--base-image",
            hostsetup.base_image_name(PLATFORM),
            "--no-verify",
            "--no-preflight",
            templates=templates,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        image = plan.candidate_tag(load_recipe(recipe), PLATFORM) + "-base"
        made.append(image)
        return recipe, image

    yield build
    for image in made:
        docker("image", "rm", "--force", image, check=False)


def _report(path: Path) -> dict[str, dict]:
    return {c["name"]: c for c in json.loads(path.read_text())["checks"]}


def test_two_builds_without_cache_are_identical(built, tmp_path):
    recipe, image = built("repro-twice")
    first = json.loads(docker("image", "inspect", image).stdout)[0]
    labels = first["Config"]["Labels"]
    # The time is the pinned base's, never the clock: config and label say the same second.
    base = json.loads(docker("image", "inspect", hostsetup.base_image_name(PLATFORM)).stdout)[0]
    assert first["Created"][:19] == base["Created"][:19]
    assert labels["dev.sparkforge.stage"] == "base" and labels["dev.sparkforge.source-date-epoch"].isdigit()
    report = tmp_path / "rebuild.json"
    done = _invoke("rebuild", "--check", image, "--recipe", str(recipe), "--json", str(report))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    checks = _report(report)
    assert checks["config"]["status"] == "passed" and checks["config"]["details"]["id"] == first["Id"]
    assert checks["layers"]["details"]["diff_ids"] == first["RootFS"]["Layers"]
    # The original is left as it was; the rebuild is gone.
    assert json.loads(docker("image", "inspect", image).stdout)[0]["Id"] == first["Id"]
    assert "sparkforge-rebuild/" not in docker("images", "--format", "{{.Repository}}").stdout


@pytest.mark.slow(cost_s=100, rank=6, reason="two builds, one by build.sh (79 s)")
def test_build_sh_replays_the_same_image(built, tmp_path):
    """The rendered build.sh (what a user replays without sparkforge) gives `invoke build`'s image ID: the same
    SOURCE_DATE_EPOCH from the pinned base, the same argv, the same timestamp rewrite."""
    from sparkforge.imagebuild.render import render_context

    recipe, image = built("replay-sh")
    expected = json.loads(docker("image", "inspect", image).stdout)[0]["Id"]
    base = hostsetup.base_image_name(PLATFORM)
    loaded = load_recipe(recipe)
    context = render_context(
        loaded, tmp_path / "contexts", bases=plan.bases(loaded, {"builder": base, "runtime": base})
    )
    replay = "sparkforge-test/replay-sh:base"
    head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    env = {**buildx_env(), "SPARKFORGE_REVISION": head.stdout.strip() or "unknown"}
    env.pop("SOURCE_DATE_EPOCH", None)
    ca = os.environ.get("SPARKFORGE_CA_BUNDLE")
    extra = ["--secret", f"id=ca,src={ca}"] if ca else []
    argv = ["bash", str(context.path / "build.sh"), "--target", "base", "--no-cache", "--tag", replay, *extra]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert json.loads(docker("image", "inspect", replay).stdout)[0]["Id"] == expected
    finally:
        docker("image", "rm", "--force", replay, plan.candidate_tag(loaded, PLATFORM), check=False)


@pytest.mark.slow(cost_s=120, rank=6, reason="two builds, a planted time file (100 s)")
def test_rebuild_names_a_planted_time_file(built, tmp_path):
    templates = tmp_path / "dockerfiles"
    shutil.copytree(REPO_ROOT / "dockerfiles", templates)
    template = templates / "vllm.Dockerfile.j2"
    text = template.read_text()
    marker = "# Static labels only:"
    assert marker in text
    template.write_text(text.replace(marker, f"RUN date +%s%N > /{PLANTED}\n{marker}", 1))
    recipe, image = built("repro-planted", templates)
    report = tmp_path / "rebuild.json"
    done = _invoke(
        "rebuild", "--check", image, "--recipe", str(recipe), "--json", str(report), templates=templates
    )
    assert done.returncode == 1 and report.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    checks = _report(report)
    assert checks["config"]["status"] == "failed" and checks["layers"]["status"] == "failed"
    layers = checks["layers"]["details"]["layers"]
    assert len(layers) == 1 and "date +%s%N" in layers[0]["step"]
    (planted,) = layers[0]["files"]
    assert planted["path"] == PLANTED and planted["differs"] == ["content"]
    # The two times the step wrote, one per build: the content diff of the small text file.
    removed = [line for line in planted["diff"].splitlines() if line[:1] == "-" and line[1:2].isdigit()]
    added = [line for line in planted["diff"].splitlines() if line[:1] == "+" and line[1:2].isdigit()]
    assert len(removed) == len(added) == 1 and removed[0][1:] != added[0][1:]
    assert f"/{PLANTED}" in done.stdout and "rebuild failed (config, layers)" in done.stderr


def test_rebuild_refuses_an_image_without_labels(engine_ready):
    _require_buildx_engine()
    base = hostsetup.base_image_name(PLATFORM)
    done = _invoke("rebuild", "--check", base)
    assert done.returncode == 1
    message = done.stderr.strip()
    assert "carries no sparkforge labels" in message and "dev.sparkforge.recipe-hash" in message
    assert "fix:" in message and "Traceback" not in done.stderr and len(message.splitlines()) == 1


CCACHE_STEP = (
    "RUN --mount=type=cache,target=/root/.cache/ccache sh -c 'test -s /root/.cache/ccache/unit.o"
    " || date +%s%N > /root/.cache/ccache/unit.o; cp /root/.cache/ccache/unit.o /opt/sparkforge/unit.o'"
)


@pytest.mark.slow(cost_s=280, rank=6, reason="four builds: cache, layer, drift (248 s)")
def test_warm_cache_planted_layer_and_template_drift(built, tmp_path):
    """A step that takes its output from a cache mount when one is warm (what ccache does for a source build)
    is never reported identical: with the cache mounts kept, the rebuild (--no-cache) still runs it on fresh
    mounts here and names its file; by default the mounts are pruned first, and the rebuild of a copy with a
    planted extra layer names the cached file, the planted file and the extra step. Rebuilt from the
    checkout's template instead, the planted step is named as drift."""
    templates = tmp_path / "dockerfiles"
    shutil.copytree(REPO_ROOT / "dockerfiles", templates)
    template = templates / "vllm.Dockerfile.j2"
    marker = "# Static labels only:"
    template.write_text(template.read_text().replace(marker, f"{CCACHE_STEP}\n{marker}", 1))
    recipe, image = built("repro-ccache", templates)
    common = ("--recipe", str(recipe))
    # 1. Cache mounts kept: a pass would take the first build's output from the warm mount; it does not.
    warm = tmp_path / "warm.json"
    done = _invoke(
        "rebuild", "--check", image, *common, "--keep-cache-mounts", "--json", str(warm), templates=templates
    )
    assert done.returncode == 1 and warm.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    checks = _report(warm)
    assert checks["cache-mounts"]["status"] == "skipped"
    assert "base override recorded in the labels" in checks["bases"]["reason"]
    (layer,) = checks["layers"]["details"]["layers"]
    assert [(f["path"], f["differs"]) for f in layer["files"]] == [("opt/sparkforge/unit.o", ["content"])]
    # 2. A copy with a file planted in a layer of its own, rebuilt cold (the default: cache mounts pruned).
    context = tmp_path / "plant"
    context.mkdir()
    (context / "planted.txt").write_text("not from the recipe\n")
    (context / "Dockerfile").write_text(f"FROM {image}\nCOPY planted.txt /opt/sparkforge/planted.txt\n")
    copy = "sparkforge-test/repro-ccache:planted"
    docker("buildx", "build", "--load", "--tag", copy, str(context))
    try:
        cold = tmp_path / "cold.json"
        done = _invoke("rebuild", "--check", copy, *common, "--json", str(cold), templates=templates)
    finally:
        docker("image", "rm", "--force", copy, check=False)
    assert done.returncode == 1 and cold.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    checks = _report(cold)
    assert checks["cache-mounts"]["status"] == "passed"
    assert "/root/.cache/ccache" in checks["cache-mounts"]["reason"]
    layers = {layer["index"]: layer for layer in checks["layers"]["details"]["layers"]}
    cached = next(layer for layer in layers.values() if "unit.o" in layer["step"])
    assert [(f["path"], f["differs"]) for f in cached["files"]] == [("opt/sparkforge/unit.o", ["content"])]
    extra = next(layer for layer in layers.values() if layer["rebuilt"] is None)
    assert "planted.txt" in extra["step"]
    assert ("opt/sparkforge/planted.txt", ["only in original"]) in [
        (f["path"], f["differs"]) for f in extra["files"]
    ]
    assert "/opt/sparkforge/planted.txt" in done.stdout and "/opt/sparkforge/unit.o" in done.stdout
    assert checks["steps"]["status"] == "failed" and "planted.txt" in checks["steps"]["reason"]
    # 3. The planted-template image rebuilt from the checkout's own template: the planted step is drift.
    drifted = tmp_path / "drift.json"
    done = _invoke("rebuild", "--check", image, *common, "--json", str(drifted))
    assert done.returncode == 1 and drifted.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    steps = _report(drifted)["steps"]
    assert steps["status"] == "failed" and "template drift" in steps["reason"]
    assert [s["side"] for s in steps["details"]["steps"]] == ["original"] and "unit.o" in steps["reason"]
