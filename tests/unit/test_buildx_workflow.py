"""The workflow's invoke lines and sparkforge's buildx argv: a change on one side that the other lacks fails here.

tests/engine/test_buildx_*.py run these very lines (parsed from images.yml) against a real engine and registry.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sparkforge.engine import Engine
from sparkforge.imagebuild.buildkit import BuildRequest, build_command
from sparkforge.recipe.loader import REPO_ROOT
from tests.engine.workflow import IMAGES_YML, invoke_lines, line

DOCKER_DRIVER = Engine("docker", "buildx", "26.1.5", driver="docker")
CONTAINER_DRIVER = Engine("docker", "buildx", "28.2.2", driver="docker-container")
PUSH = BuildRequest(
    context=Path("/ctx"), platform="linux/arm64", target="runtime", push_by_digest="ghcr.io/o/r",
    staging_tag="0123456789ab-arm64", metadata_file=Path("/tmp/m.json"), attestations=True,
)  # fmt: skip


def _options(task: str) -> set[str]:
    """The long options `invoke TASK` accepts, from its own help (the CLI, not the library)."""
    done = subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(REPO_ROOT), "--help", task],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {word.split("=")[0].rstrip(",") for word in done.stdout.split() if word.startswith("--")}


def test_the_workflow_lines_the_engine_test_runs_exist_with_their_options() -> None:
    build = line("build", "build").argv
    for option in (
        "--push-by-digest",
        "--metadata-file",
        "--cache-from",
        "--cache-to",
        "--platform",
        "--recipe",
    ):
        assert option in build, option
    push = line("build", "push").argv
    assert "--metadata-file" in push and "--digests" in push
    assert "--unverified" not in push  # the workflow records only verified builds
    publish = line("merge", "publish").argv
    assert "--digests" in publish and "--json" in publish
    pull = line("verify", "pull").argv
    assert pull[pull.index("--platform") + 1] == "linux/arm64"
    # The metadata file the build writes is the one push reads; the digests dir push writes is the one merged.
    assert build[build.index("--metadata-file") + 1] == push[push.index("--metadata-file") + 1]
    assert push[push.index("--digests") + 1] == publish[publish.index("--digests") + 1]


@pytest.mark.parametrize("wl", invoke_lines(), ids=lambda w: f"{w.job}-{w.task}")
def test_every_workflow_invoke_line_uses_only_options_the_task_has(wl) -> None:
    used = {a.split("=")[0] for a in wl.argv[4:] if a.startswith("--")}
    assert used <= _options(wl.task), f"{IMAGES_YML.name} job {wl.job}: {sorted(used - _options(wl.task))}"


def test_workflow_variables_are_all_filled_or_refused() -> None:
    with pytest.raises(KeyError):
        line("build", "build").filled({"RECIPE": "r"})


def test_container_driver_pushes_by_digest_with_provenance_and_sbom() -> None:
    argv = build_command(CONTAINER_DRIVER, PUSH).argv
    assert "type=image,name=ghcr.io/o/r,push-by-digest=true,name-canonical=true,push=true" in argv
    assert argv[argv.index("--sbom") : argv.index("--sbom") + 2] == ("--sbom", "true")


def test_docker_driver_pushes_under_the_staging_tag_only() -> None:
    argv = build_command(DOCKER_DRIVER, PUSH).argv
    assert argv[argv.index("--output") + 1] == "type=image,name=ghcr.io/o/r:0123456789ab-arm64,push=true"
    assert not any("push-by-digest" in a for a in argv)


@pytest.mark.parametrize(
    ("sbom", "expected"), [("false", None), ("generator=mirror/syft:1", "generator=mirror/syft:1")]
)
def test_sbom_can_be_off_or_from_a_mirrored_scanner(sbom: str, expected: str | None) -> None:
    from dataclasses import replace

    argv = build_command(CONTAINER_DRIVER, replace(PUSH, sbom=sbom)).argv
    assert "--provenance" in argv
    if expected is None:
        assert "--sbom" not in argv
    else:
        assert argv[argv.index("--sbom") + 1] == expected
