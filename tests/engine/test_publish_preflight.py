"""Preflight's image check and lock against a real registry: the published smoke index and its platform
images (tests/engine/publish_fixtures.py) pinned in a recipe's images.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from publish_fixtures import DAY, Smoke, tag_of

from sparkforge.errors import PreflightError
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.preflight.images import check_images
from sparkforge.preflight.lock import lock_recipe
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT, Recipe, load_recipe
from sparkforge.registry import publish as pub
from sparkforge.report import Check
from tests.engine.sessions import build_session
from tests.recipe_files import write_recipe_file

SESSION = build_session(quiet=True)

pytestmark = pytest.mark.engine


def _pinned_recipe(smoke: Smoke, tmp_path: Path, image: str, platforms: str) -> Recipe:
    body = f"platforms: {platforms}\nimages:\n  builder: {image}\n  runtime: {image}\n"
    wheels = REPO_ROOT / "recipes" / "vllm-qwen35-wheels.yaml"
    return load_recipe(write_recipe_file(tmp_path / "pinned.yaml", body, extends=wheels))


def _images_check(recipe: Recipe) -> Check:
    check = Check("images", "passed")
    check_images(check, recipe.model, make_fetcher())
    return check


def test_preflight_resolves_a_multi_arch_digest_for_every_platform(
    smoke: Smoke, published: pub.Published, tmp_path: Path
) -> None:
    tag = tag_of(plan.final_tags(smoke.recipe, DAY).immutable[0])
    image = f"{smoke.registry.host}/{smoke.name}:{tag}@{published.index}"
    check = _images_check(_pinned_recipe(smoke, tmp_path, image, "[linux/amd64, linux/arm64]"))
    assert check.status == "passed", check.reason
    # The engine records arm64 images with their variant; preflight matches linux/arm64 to linux/arm64/v8.
    assert sorted(check.details["builder"]["platforms"]) == ["linux/amd64", "linux/arm64/v8"]


def test_preflight_fails_an_image_without_the_recipe_platform(smoke: Smoke, tmp_path: Path) -> None:
    amd64_only = f"{smoke.registry.host}/{smoke.name}@{smoke.pushed['linux/amd64'].digest}"
    check = _images_check(_pinned_recipe(smoke, tmp_path, amd64_only, "[linux/arm64]"))
    assert check.status == "failed" and "has no linux/arm64 image (it has linux/amd64)" in check.reason
    unknown = f"{smoke.registry.host}/{smoke.name}@sha256:{'0' * 64}"
    assert "HTTP 404" in _images_check(_pinned_recipe(smoke, tmp_path, unknown, "[linux/arm64]")).reason


def test_lock_catches_a_moved_tag_and_write_repins(
    smoke: Smoke, published: pub.Published, tmp_path: Path
) -> None:
    # The recipe pins the tag to the amd64 image; in the registry the tag names the multi-arch index.
    tag = tag_of(plan.final_tags(smoke.recipe, DAY).immutable[0])
    stale = f"{smoke.registry.host}/{smoke.name}:{tag}@{smoke.pushed['linux/amd64'].digest}"
    recipe = _pinned_recipe(smoke, tmp_path, stale, "[linux/amd64]")
    with pytest.raises(PreflightError, match=r"images.builder drift .*fix: run 'invoke lock"):
        lock_recipe(SESSION, recipe, check=True)
    lock_recipe(SESSION, recipe, write=True)
    assert load_recipe(recipe.path).model.images.builder.endswith(published.index)
