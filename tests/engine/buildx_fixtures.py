"""The workflow's buildx path the buildx tests share: the invoke lines of .github/workflows/images.yml run in a
workspace like the CI job's, against the buildx engine and a real local registry (also used by
benchmarks/bench_buildx.py).

`invoke engine.up --buildx` starts that engine (Docker 26 with the containerd image store, buildx 0.13.1, both
from Debian trixie). The images are the smoke recipe's quick 'base' stage on the offline Debian bases, for
linux/amd64 natively and linux/arm64 under QEMU; test-only options are appended after the workflow's own
(never replacing them). The engine conftest registers the fixture; tests import the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from registry import LocalRegistry, local_registry, unavailable_reason
from workflow import WorkflowLine, line

from sparkforge.imagebuild import hostsetup
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT, Recipe, load_recipe
from sparkforge.registry.matrix import ci_matrix
from tests.prerequisites import skip_or_fail
from tests.recipe_files import SMOKE_PLATFORMS as PLATFORMS
from tests.recipe_files import smoke_recipe_file


def buildx_env() -> dict[str, str]:
    env = {**os.environ, **hostsetup.buildx_env(), "PYTHONPATH": str(REPO_ROOT)}
    # BuildKit's SBOM scanner is an image from Docker Hub, unreachable here: provenance only (README says so).
    env["SPARKFORGE_SBOM"] = "false"
    env.pop("CI", None)
    return env


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/usr/bin/docker", *args], env=buildx_env(), capture_output=True, text=True, check=check
    )


@dataclass(frozen=True)
class Workspace:
    recipe: Recipe
    registry: LocalRegistry
    work: Path  # the job's working directory (the workflow's relative paths land here)
    runner_temp: Path

    @property
    def name(self) -> str:  # repository path inside the registry
        return self.recipe.model.publish.repository.split("/", 1)[1]

    def values(self, platform: str) -> dict[str, str]:
        """The variables the workflow's build job sees for this recipe and platform (from ci.matrix)."""
        entry = next(e for e in ci_matrix([self.recipe]) if e["platform"] == platform)
        return {
            "RECIPE": str(self.recipe.path),
            "PLATFORM": platform,
            "NAME": self.recipe.name,
            "RUNNER_TEMP": str(self.runner_temp),
            "CACHE_FROM": entry["cache_from"],
            "CACHE_TO": entry["cache_to"],
        }

    def run(
        self, wl: WorkflowLine, values: Mapping[str, str], *extra: str
    ) -> subprocess.CompletedProcess[str]:
        """The workflow line, variables filled, test-only options after it; run where the job would."""
        argv = wl.filled(values)
        assert argv[:3] == ["python", "-m", "invoke"]
        command = [sys.executable, "-m", "invoke", "--search-root", str(REPO_ROOT), *argv[3:], *extra]
        # A hung build (e.g. a RUN step waiting on a network this engine lacks) fails the test, not CI.
        return subprocess.run(
            command, cwd=self.work, env=buildx_env(), capture_output=True, text=True, timeout=900
        )


def build_base_stage(
    ws: Workspace, platform: str, metadata: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The workflow's build line for one platform, building only the smoke 'base' stage (no verify: nothing to verify)."""
    values = ws.values(platform)
    if metadata is not None:
        metadata.parent.mkdir(parents=True, exist_ok=True)
        values["RUNNER_TEMP"] = str(metadata.parent)
    base = hostsetup.base_image_name(platform)
    return ws.run(
        line("build", "build"),
        values,
        "--target",
        "base",
        "--base-image",
        base,
        "--no-verify",
        "--no-preflight",
    )


def _require_buildx_engine() -> None:
    if not (hostsetup.BUILDX_CONFIG / "cli-plugins" / "docker-buildx").exists():
        skip_or_fail("buildx is not installed; run 'invoke engine.up --buildx' (CI: .ci/run does)")
    if docker("info", check=False).returncode != 0:
        skip_or_fail(
            f"the buildx engine ({hostsetup.BUILDX_HOST}) is not running; run 'invoke engine.up --buildx'"
        )
    for platform in PLATFORMS:
        if docker("image", "inspect", hostsetup.base_image_name(platform), check=False).returncode != 0:
            skip_or_fail(
                f"{hostsetup.base_image_name(platform)} missing in the buildx engine; 'invoke engine.up --buildx'"
            )


@dataclass(frozen=True)
class Published:
    ws: Workspace
    records: dict[str, dict[str, str]]  # platform -> digest record written by 'invoke push'
    result: dict[str, object]  # build/published/NAME.json
    refused_push: subprocess.CompletedProcess[str]


# Test-only options after the workflow's publish line: smoke base stages on offline bases have no verify record.
TEST_IMAGES = ("--unverified", "--allow-base-override")


@pytest.fixture(scope="session")
def buildx_published(engine_ready: None, qemu_arm64: None, tmp_path_factory: pytest.TempPathFactory):
    """Both platforms built and pushed by the workflow's lines, recorded, merged by the workflow's publish."""
    _require_buildx_engine()
    reason = unavailable_reason()
    if reason:
        skip_or_fail(reason)
    tmp = tmp_path_factory.mktemp("buildx")
    with local_registry(tmp / "registry") as registry:
        recipe = load_recipe(smoke_recipe_file(tmp / "recipe", registry.host))
        ws = Workspace(recipe, registry, tmp / "work", tmp / "runner")
        ws.work.mkdir()
        ws.runner_temp.mkdir()
        try:
            records, refused = {}, None
            for platform in PLATFORMS:
                built = build_base_stage(ws, platform)
                assert built.returncode == 0, built.stdout + built.stderr
                push = line("build", "push")
                if refused is None:
                    # The workflow's own line: a stage that never passed verify is not recorded.
                    refused = ws.run(push, ws.values(platform))
                    assert not (ws.work / "build" / "digests").exists()
                recorded = ws.run(push, ws.values(platform), "--unverified")
                assert recorded.returncode == 0, recorded.stdout + recorded.stderr
                arch = platform.split("/")[1]
                records[platform] = json.loads(
                    (ws.work / "build" / "digests" / f"{recipe.name}-{arch}.json").read_text()
                )
            (ws.work / "build" / "published").mkdir(parents=True)
            # The workflow's publish takes only digests with a passed verify record: these smoke base stages
            # have none (nothing to verify), so it refuses before writing; CI's test images then say so explicitly.
            unverified = ws.run(line("merge", "publish"), ws.values("linux/amd64"))
            assert unverified.returncode != 0 and "no verify record" in unverified.stdout + unverified.stderr
            assert not list((ws.work / "build" / "published").iterdir())
            merged = ws.run(line("merge", "publish"), ws.values("linux/amd64"), *TEST_IMAGES)
            assert merged.returncode == 0, merged.stdout + merged.stderr
            result = json.loads((ws.work / "build" / "published" / f"{recipe.name}.json").read_text())
            yield Published(ws, records, result, refused)
        finally:
            for platform in PLATFORMS:
                docker("image", "rm", "--force", f"{plan.candidate_tag(recipe, platform)}-base", check=False)
