"""The pull -> run seam: what pull verified is recorded per recipe; the one resolver picks the image to run.

Real recipe files and real record files under a per-test cache; `exists` is the question "is this image in the
engine?" answered for the case at hand (the engine test in tests/engine/test_trust_round5.py asks a real one).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkforge.errors import PublishError
from sparkforge.recipe import plan
from sparkforge.recipe.loader import Recipe, load_recipe
from sparkforge.registry import pulled
from tests.recipe_files import smoke_recipe_file

DIGEST, INDEX = "sha256:" + "1" * 64, "sha256:" + "2" * 64


@pytest.fixture
def recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Recipe:
    monkeypatch.setenv("SPARKFORGE_CACHE", str(tmp_path / "cache"))
    return load_recipe(smoke_recipe_file(tmp_path / "recipe", "registry.example:5000", name="seam"))


def _nothing(_: str) -> bool:
    return False


def test_without_a_build_the_digest_pull_verified_runs(recipe: Recipe) -> None:
    repo, platform = recipe.model.publish.repository, recipe.model.platforms[0]
    with pytest.raises(PublishError, match=r"neither built nor pulled.*invoke pull --recipe"):
        pulled.resolve(recipe, exists=_nothing)
    pulled.record(recipe, f"{repo}:latest", platform, DIGEST, INDEX, gpu_verified=True)
    found = pulled.resolve(recipe, exists=_nothing)
    assert found.image == f"{repo}@{DIGEST}" and "'invoke pull' verified" in found.why
    # a local build wins, and says so
    build = plan.candidate_tag(recipe, platform)
    assert pulled.resolve(recipe, exists=lambda ref: ref == build).why.startswith("the local build")


def test_a_tag_of_the_repository_runs_only_as_the_digest_pull_verified(recipe: Recipe) -> None:
    repo, platform = recipe.model.publish.repository, recipe.model.platforms[0]
    with pytest.raises(PublishError, match=r"names no digest 'invoke pull' verified.*--allow-unverified"):
        pulled.resolve(recipe, f"{repo}:latest", exists=_nothing)
    said: list[str] = []
    loud = pulled.resolve(recipe, f"{repo}:latest", allow_unverified=True, warn=said.append)
    assert loud.image == f"{repo}:latest" and "WARNING (--allow-unverified)" in said[0]
    pulled.record(recipe, f"{repo}:latest", platform, DIGEST, INDEX, gpu_verified=True)
    assert pulled.resolve(recipe, f"{repo}:latest").image == f"{repo}@{DIGEST}"  # mapped: never the tag
    assert pulled.resolve(recipe, f"{repo}@{INDEX}").image == f"{repo}@{DIGEST}"
    with pytest.raises(PublishError, match="registry image that sparkforge never verified"):
        pulled.resolve(recipe, "ghcr.io/someone/else:latest")
    assert pulled.resolve(recipe, "my-local/vllm:dev").why == "--image as named"  # no registry: built here
    assert pulled.resolve(recipe, f"{repo}:other", subject=True).image == f"{repo}:other"  # verify's subject


def test_an_unverified_or_stale_pull_is_not_run_silently(recipe: Recipe, tmp_path: Path) -> None:
    repo, platform = recipe.model.publish.repository, recipe.model.platforms[0]
    pulled.record(recipe, f"{repo}:x", platform, DIGEST, INDEX, gpu_verified=False)
    with pytest.raises(PublishError, match="has no GPU-verified claim"):
        pulled.resolve(recipe, exists=_nothing)
    assert pulled.resolve(recipe, exists=_nothing, allow_unverified=True).why.endswith(
        "pulled UNVERIFIED (--allow-unverified) on " + pulled.recorded(recipe, platform).date[:10]  # type: ignore[union-attr]
    )
    bumped = load_recipe(
        smoke_recipe_file(tmp_path / "bumped", "registry.example:5000", name="seam", vllm="0.0.1")
    )
    with pytest.raises(PublishError, match="is of recipe hash"):
        pulled.resolve(bumped, exists=_nothing)
    assert pulled.resolve(bumped, exists=_nothing, dry=True).image == plan.candidate_tag(bumped, platform)
