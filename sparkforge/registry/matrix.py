"""The CI build matrix: one entry per recipe and platform, with its runner and registry cache."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sparkforge import oci
from sparkforge.recipe.identity import MAIN, RELEASE_TAGS
from sparkforge.recipe.loader import Recipe, recipe_ref

EXPORT = "mode=max,image-manifest=true,oci-mediatypes=true"


def cache_refs(repo: str, name: str, arch: str, ref: str) -> tuple[str, str]:
    """(cache_from, cache_to) for a build of `ref`. Published images (main, release tags) build without a
    registry cache: the registry has no per-ref write rights, so any run with `packages: write` (any branch)
    could write a cache main would read. Other refs, which never publish, read and write a cache of their own."""
    if ref == MAIN or re.fullmatch(RELEASE_TAGS, ref):
        return "", ""
    own = f"{repo}:buildcache-{name}-{arch}-{re.sub(r'[^A-Za-z0-9_.-]', '-', ref.removeprefix('refs/'))[:80]}"
    return f"type=registry,ref={own}", f"type=registry,ref={own},{EXPORT}"


def ci_matrix(recipes: Sequence[Recipe], ref: str = MAIN) -> list[dict[str, Any]]:
    """One GitHub Actions matrix entry per recipe and platform, for a run of `ref` (GITHUB_REF).

    arm64 builds on a native arm64 runner, amd64 on x86; a recipe with `publish.qemu: true` builds arm64 on
    the x86 runner under QEMU instead (for repositories without arm64 runners).
    """
    entries = []
    for recipe in recipes:
        repo = recipe.model.publish.repository
        for platform in recipe.model.platforms:
            arch = oci.arch(platform)
            qemu = recipe.model.publish.qemu and platform != "linux/amd64"
            cache_from, cache_to = cache_refs(repo, recipe.name, arch, ref)
            entries.append(
                {
                    "recipe": recipe.name,
                    "path": recipe_ref(recipe),
                    "platform": platform,
                    "arch": arch,
                    "runner": oci.get("linux/amd64").runner if qemu else oci.get(platform).runner,
                    "qemu": qemu,
                    "repository": repo,
                    "cache_from": cache_from,
                    "cache_to": cache_to,
                }
            )
    return entries
