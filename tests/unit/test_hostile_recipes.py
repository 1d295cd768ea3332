"""Hostile recipes: patches are regular files inside patches/ (a symlink to /etc/shadow is never read or copied),
tags are valid OCI tags after expansion at plan time, and `lock --write` never writes through a symlink that
leaves the project."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.errors import PreflightError, RecipeError
from sparkforge.imagebuild.render import render_context
from sparkforge.preflight.lock import lock_recipe
from sparkforge.preflight.patches import check_patches
from sparkforge.recipe import plan
from sparkforge.recipe.loader import PATCHES_DIR, RECIPES_DIR, REPO_ROOT, Recipe, load_recipe
from sparkforge.report import Check
from tests.recipe_files import write_recipe_file

UNIQUE = f"zz-hostile-{os.getpid()}"


@pytest.fixture
def linked_patch() -> Iterator[str]:
    """patches/vllm/<unique>.patch -> /etc/shadow (or /etc/hostname where there is no shadow)."""
    target = Path("/etc/shadow") if Path("/etc/shadow").exists() else Path("/etc/hostname")
    link = PATCHES_DIR / "vllm" / f"{UNIQUE}.patch"
    link.symlink_to(target)
    yield str(link.relative_to(REPO_ROOT))
    link.unlink()


@pytest.fixture
def linked_folder(tmp_path: Path) -> Iterator[str]:
    """patches/<unique>/ -> a folder outside the project holding a regular patch."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "x.patch").write_text("--- a/x\n+++ b/x\n")
    link = PATCHES_DIR / UNIQUE
    link.symlink_to(tmp_path / "outside", target_is_directory=True)
    yield f"patches/{UNIQUE}/x.patch"
    link.unlink()


def _with_patch(tmp_path: Path, patch: str) -> Path:
    body = {"components": {"vllm": {"patches": [patch]}}}
    return write_recipe_file(tmp_path / "variant.yaml", body, extends=RECIPES_DIR / "vllm-qwen35.yaml")


def test_a_patch_symlinked_to_etc_is_refused_before_it_is_read(tmp_path: Path, linked_patch: str) -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe(_with_patch(tmp_path, linked_patch))
    message = str(info.value)
    assert f"patch {linked_patch} is a symlink" in message and "fix:" in message
    assert str(tmp_path / "variant.yaml") in message  # where: the recipe file (and its line)
    assert not (REPO_ROOT / "build" / "variant").exists()


def test_a_patch_in_a_symlinked_folder_is_refused(tmp_path: Path, linked_folder: str) -> None:
    with pytest.raises(RecipeError, match="outside"):
        load_recipe(_with_patch(tmp_path, linked_folder))


def test_render_never_copies_a_symlinked_patch(tmp_path: Path) -> None:
    recipe = load_recipe(_with_patch(tmp_path, "patches/vllm/0001-cmake-keep-sm121-on-cuda13.patch"))
    link = PATCHES_DIR / "vllm" / f"{UNIQUE}.patch"
    link.symlink_to("/etc/hostname")
    try:
        model = recipe.model
        vllm = model.components.vllm.model_copy(update={"patches": [str(link.relative_to(REPO_ROOT))]})
        swapped = model.model_copy(update={"components": model.components.model_copy(update={"vllm": vllm})})
        # The file was swapped for a link after the recipe was loaded: render refuses, nothing is copied.
        with pytest.raises(RecipeError, match="is a symlink"):
            render_context(dataclasses.replace(recipe, model=swapped), out_root=tmp_path / "build")
        assert not list((tmp_path / "build").rglob(f"{UNIQUE}.patch"))
    finally:
        link.unlink()


def test_preflight_refuses_a_symlinked_patch(tmp_path: Path) -> None:
    link = tmp_path / "evil.patch"
    link.symlink_to("/etc/hostname")
    check = Check("patches", "passed")
    session = Session(echo=print, runner=Runner(stream=False))
    check_patches(session, check, tmp_path, [link], tmp_path / "scratch", subject="x", repo_root=REPO_ROOT)
    assert check.status == "failed" and "not a regular file" in check.reason
    assert not (tmp_path / "scratch").exists()


# ---- tags after expansion --------------------------------------------------------------------------------------


def _with_version(recipe: Recipe, version: str) -> Recipe:
    model = recipe.model
    vllm = model.components.vllm.model_copy(update={"version": version})
    return dataclasses.replace(
        recipe,
        model=model.model_copy(update={"components": model.components.model_copy(update={"vllm": vllm})}),
    )


@pytest.mark.parametrize(
    ("version", "needle"),
    [("1!0.31.0", "'!'"), ("0.31.0+cu130", "'+'"), ("0.31.0+" + "a" * 130, "at most 128")],
)
def test_a_version_that_breaks_a_tag_fails_at_plan_time(tmp_path: Path, version: str, needle: str) -> None:
    recipe = _with_version(load_recipe("vllm-qwen35"), version)
    with pytest.raises(RecipeError) as info:
        render_context(recipe, out_root=tmp_path / "build")  # before any build
    message = str(info.value)
    assert needle in message and "{vllm}" in message and "fix:" in message, message
    assert not (tmp_path / "build").exists() or not list((tmp_path / "build").rglob("Dockerfile"))


def test_a_loadable_recipe_with_a_local_version_is_refused_on_load_and_plan(tmp_path: Path) -> None:
    path = write_recipe_file(
        tmp_path / "local.yaml",
        {"components": {"vllm": {"version": "0.31.0+cu130"}}},
        extends=RECIPES_DIR / "vllm-qwen35.yaml",
    )
    recipe = load_recipe(path)  # a valid PEP 440 version ...
    with pytest.raises(RecipeError, match="not a valid OCI tag"):
        plan.template_values(recipe)  # ... that no tag can carry


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    version=st.text(max_size=140),
    template=st.sampled_from(["{vllm}", "{vllm}-cu{cuda}-{date}", "v{vllm}-{hash}"]),
)
def test_any_expanded_tag_is_valid_or_refused(version: str, template: str) -> None:
    recipe = _with_version(BASE_RECIPE, version)
    try:
        tag = plan.expand_tag(recipe, template, dt.date(2026, 12, 1))
    except RecipeError as exc:
        assert "fix:" in str(exc)
        return
    assert plan.OCI_TAG.fullmatch(tag) and len(tag) <= 128


BASE_RECIPE = load_recipe("vllm-qwen35")


# ---- lock --write ------------------------------------------------------------------------------------------------


def test_lock_write_refuses_a_recipe_symlinked_out_of_the_project(tmp_path: Path) -> None:
    outside = tmp_path / "victim.yaml"
    original = (RECIPES_DIR / "vllm-qwen35.yaml").read_text()
    outside.write_text(original)
    link = RECIPES_DIR / f"{UNIQUE}.yaml"
    link.symlink_to(outside)
    try:
        recipe = load_recipe(UNIQUE)
        with pytest.raises(PreflightError) as info:
            lock_recipe(Session(echo=print, runner=Runner(dry=True, stream=False)), recipe, write=True)
        assert f"{link} is a symlink to {outside}" in str(info.value) and "fix:" in str(info.value)
        assert outside.read_text() == original
    finally:
        link.unlink()
