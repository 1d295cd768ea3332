"""The CI build matrix: one entry per recipe and platform, with its runner and registry cache."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sparkforge import oci
from sparkforge.recipe.loader import Recipe, recipe_ref


def ci_matrix(recipes: Sequence[Recipe]) -> list[dict[str, Any]]:
    """One GitHub Actions matrix entry per recipe and platform.

    arm64 builds on a native arm64 runner, amd64 on x86; a recipe with `publish.qemu: true` builds arm64 on
    the x86 runner under QEMU instead (for repositories without arm64 runners).
    """
    entries = []
    for recipe in recipes:
        repo = recipe.model.publish.repository
        for platform in recipe.model.platforms:
            arch = oci.arch(platform)
            qemu = recipe.model.publish.qemu and platform != "linux/amd64"
            cache = f"{repo}:buildcache-{recipe.name}-{arch}"
            entries.append(
                {
                    "recipe": recipe.name,
                    "path": recipe_ref(recipe),
                    "platform": platform,
                    "arch": arch,
                    "runner": oci.get("linux/amd64").runner if qemu else oci.get(platform).runner,
                    "qemu": qemu,
                    "repository": repo,
                    "cache_from": f"type=registry,ref={cache}",
                    "cache_to": f"type=registry,ref={cache},mode=max,image-manifest=true,oci-mediatypes=true",
                }
            )
    return entries
