"""What the workflow's buildx path refuses, for real: an unverified digest is not recorded; a merge with a
missing or an extra platform, or with a digest built from another recipe, writes nothing; immutable tags never
move; a buildx builder that is not usable stops the build (buildx_fixtures.py).
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path

import pytest
from buildx_fixtures import TEST_IMAGES, Published, Workspace, build_base_stage, docker
from workflow import line

from sparkforge.imagebuild import hostsetup
from sparkforge.recipe import plan
from sparkforge.recipe.loader import load_recipe
from tests.recipe_files import smoke_recipe_file

pytestmark = [pytest.mark.engine]


def test_unverified_digest_is_not_recorded(buildx_published: Published) -> None:
    refused = buildx_published.refused_push
    assert refused.returncode != 0
    assert "refusing to record" in refused.stdout + refused.stderr
    assert "Traceback" not in refused.stderr


def _publish(ws: Workspace, *extra: str) -> subprocess.CompletedProcess[str]:
    return ws.run(line("merge", "publish"), ws.values("linux/amd64"), *TEST_IMAGES, *extra)


def _snapshot(ws: Workspace) -> dict[str, str]:
    return {tag: ws.registry.manifest(ws.name, tag)[0] for tag in ws.registry.tags(ws.name)}


def test_missing_platform_is_refused_before_writing(buildx_published: Published, tmp_path: Path) -> None:
    ws = buildx_published.ws
    before = _snapshot(ws)
    # A merge job whose artifacts hold only the amd64 digest (the arm64 build failed).
    only_amd64 = tmp_path / "build" / "digests"
    only_amd64.mkdir(parents=True)
    (only_amd64 / "one.json").write_text(json.dumps(buildx_published.records["linux/amd64"]))
    done = _publish(dataclasses.replace(ws, work=tmp_path))
    assert done.returncode != 0
    assert "no image for linux/arm64" in done.stdout + done.stderr
    assert _snapshot(ws) == before


def test_extra_platform_is_refused_before_writing(buildx_published: Published) -> None:
    ws = buildx_published.ws
    before = _snapshot(ws)
    extra = f"linux/riscv64={buildx_published.records['linux/amd64']['digest']}"
    done = _publish(ws, "--digest", extra)
    assert done.returncode != 0
    # Refused while parsing the option, before the registry is read (the hostile-input rule for --digest).
    assert "--digest 'linux/riscv64' is not a platform sparkforge builds" in done.stdout + done.stderr
    assert _snapshot(ws) == before


def test_digest_with_other_labels_is_refused_and_immutable_tags_never_move(
    buildx_published: Published, tmp_path: Path
) -> None:
    ws = buildx_published.ws
    # The same platform built from a recipe with another pin: pushed by digest, then offered as amd64.
    other = load_recipe(smoke_recipe_file(tmp_path / "other", ws.registry.host, transformers="4.99.0"))
    other_ws = Workspace(other, ws.registry, tmp_path / "work", tmp_path / "runner")
    other_ws.work.mkdir()
    other_ws.runner_temp.mkdir()
    try:
        assert build_base_stage(other_ws, "linux/amd64").returncode == 0
        metadata = json.loads((other_ws.runner_temp / "metadata.json").read_text())
        drifted = metadata["containerimage.digest"]
        before = _snapshot(ws)
        done = _publish(ws, "--digest", f"linux/amd64={drifted}")
        assert done.returncode != 0
        assert "was not built from this recipe" in done.stdout + done.stderr
        assert "dev.sparkforge.pin.transformers" in done.stdout + done.stderr
        assert _snapshot(ws) == before
        # A rebuild of this recipe (new created date, new digest) cannot move the date tag already published.
        assert (
            build_base_stage(ws, "linux/amd64", metadata=tmp_path / "again" / "metadata.json").returncode == 0
        )
        rebuilt = json.loads((tmp_path / "again" / "metadata.json").read_text())["containerimage.digest"]
        assert rebuilt != buildx_published.records["linux/amd64"]["digest"]
        before = _snapshot(ws)  # the rebuild moved only its per-platform staging tag
        done = _publish(
            ws, "--digest", f"linux/amd64={rebuilt}", "--date", str(buildx_published.result["date"])
        )
        assert done.returncode != 0
        assert "refusing to move immutable tag" in done.stdout + done.stderr
        assert _snapshot(ws) == before
    finally:
        docker("image", "rm", "--force", f"{plan.candidate_tag(other, 'linux/amd64')}-base", check=False)


def test_builder_option_selects_the_buildx_builder(buildx_published: Published, tmp_path: Path) -> None:
    ws = dataclasses.replace(buildx_published.ws, work=tmp_path)
    values = {**ws.values("linux/amd64"), "RUNNER_TEMP": str(tmp_path)}
    extra = ["--target", "base", "--base-image", hostsetup.base_image_name("linux/amd64"), "--no-verify"]
    done = ws.run(line("build", "build"), values, *extra, "--no-preflight", "--builder", "default")
    assert done.returncode == 0, done.stdout + done.stderr
    log_dir = Path(re.search(r"log: (\S+?);?\n", done.stdout).group(1))  # type: ignore[union-attr]
    for script in ("build", "push-by-digest"):
        assert "buildx build --builder default " in next(log_dir.glob(f"*-{script}.sh")).read_text()
    assert json.loads((tmp_path / "metadata.json").read_text())["containerimage.digest"].startswith("sha256:")
    missing = ws.run(
        line("build", "build"), values, *extra, "--no-preflight", "--builder", "sparkforge-no-such"
    )
    assert missing.returncode != 0
    assert "buildx builder sparkforge-no-such is not usable" in missing.stdout + missing.stderr
    assert "Traceback" not in missing.stderr
