"""The overlay recipe: a verified image pinned by digest, plus a series of reviewed, hashed Python-only patches.

An overlay file (`kind: overlay`) names its base image and the recipe that image was built from (verify judges
the overlay by that recipe's pins); each patch names the installed package it changes and its sha256. The name
is the file's stem, as for recipes; the hash covers the resolved file and every patch's bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator

from sparkforge.boundary import read_bytes
from sparkforge.errors import RecipeError
from sparkforge.recipe.loader import (
    REPO_ROOT,
    Recipe,
    load_recipe,
    patch_file,
    resolve_named_file,
    resolve_recipe_path,
)
from sparkforge.recipe.schema import Description, PatchPath, PathGlob, PinnedImage, Sha256Hex, StrictModel
from sparkforge.recipe.yamlfile import read_yaml

OVERLAYS_DIR = REPO_ROOT / "recipes" / "overlays"
MAX_PATCH_BYTES = 4 << 20  # a pull request's diff; far more is not a small fix


@dataclass(frozen=True)
class PackageLayout:
    """Where an installed package's files lie, and how its upstream repository names them."""

    import_dir: str  # the folder under site-packages
    repo_prefix: str  # what upstream's diffs put before it (transformers keeps its code under src/)


# The packages an overlay may patch: pure-Python files of these installed packages only (allow-list).
PACKAGES: dict[str, PackageLayout] = {
    "vllm": PackageLayout("vllm", ""),
    "transformers": PackageLayout("transformers", "src/"),
    "flashinfer": PackageLayout("flashinfer", ""),
}


class OverlayBase(StrictModel):
    image: PinnedImage = Field(
        description="the verified image, NAME@sha256:<digest> (the registry digest, or the local image ID of "
        "an image never pushed)"
    )
    recipe: PathGlob = Field(description="the recipe the base image was built from (name or path)")


class OverlayPatch(StrictModel):
    file: PatchPath = Field(description="the patch, e.g. patches/overlay-vllm/0001-fix.patch")
    package: Literal["vllm", "transformers", "flashinfer"]
    sha256: Sha256Hex = Field(description="the patch file's sha256 (reviewed bytes, pinned)")
    origin: Description | None = Field(
        None, description="where it came from, e.g. 'vllm-project/vllm#12345 merge commit <sha>'"
    )


class OverlayModel(StrictModel):
    kind: Literal["overlay"]
    description: Description
    base: OverlayBase
    patches: list[OverlayPatch] = Field(min_length=1)

    @field_validator("patches")
    @classmethod
    def _unique(cls, value: list[OverlayPatch]) -> list[OverlayPatch]:
        files = [p.file for p in value]
        if len(set(files)) != len(files):
            raise ValueError("a patch is listed twice; fix: list each patch file once")
        return value


@dataclass(frozen=True)
class Overlay:
    """A validated overlay recipe, its file and the recipe its base was built from."""

    name: str
    path: Path
    model: OverlayModel
    base_recipe: Recipe

    @property
    def hash(self) -> str:
        """sha256 over the resolved overlay, the base recipe's hash and every patch's bytes."""
        digest = hashlib.sha256(json.dumps(self.model.model_dump(mode="json"), sort_keys=True).encode())
        digest.update(self.base_recipe.hash.encode())
        for patch in self.model.patches:
            digest.update(_patch_bytes(patch.file))
        return digest.hexdigest()

    @property
    def base_digest(self) -> str:
        return self.model.base.image.rsplit("@", 1)[1]

    def patch_bytes(self) -> list[tuple[OverlayPatch, bytes]]:
        """Each patch's bytes, checked against its pinned sha256 (a changed file is refused, not re-hashed)."""
        out = []
        for patch in self.model.patches:
            data = _patch_bytes(patch.file)
            found = hashlib.sha256(data).hexdigest()
            if found != patch.sha256:
                raise RecipeError(
                    f"{self.path}: patch {patch.file} has sha256 {found}, the overlay pins {patch.sha256}; the file "
                    "changed since it was reviewed; fix: review the new bytes, then write the new sha256 (or "
                    "rerun 'invoke overlay')"
                )
            out.append((patch, data))
        return out


def _patch_bytes(patch: str) -> bytes:
    """A patch file's bytes (a regular file inside patches/, never a link: loader.patch_file)."""
    return read_bytes(patch_file(patch), "patch", MAX_PATCH_BYTES, named=False)


def load_overlay(ref: str | Path) -> Overlay:
    """Load and validate an overlay recipe (a path, or a name in recipes/overlays/); errors name file and key."""
    known = sorted(p.stem for p in OVERLAYS_DIR.glob("*.yaml")) if OVERLAYS_DIR.is_dir() else []
    path = resolve_named_file(ref, OVERLAYS_DIR, "overlay", known, RecipeError)
    doc = read_yaml(path)
    try:
        model = OverlayModel.model_validate(doc.data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc = tuple(str(p) for p in error["loc"])
            line = doc.lines.get(loc, doc.lines.get(loc[:1], 1))
            problems.append(f"{path}:{line}: {'.'.join(loc) or '(top)'}: {error['msg']}")
        raise RecipeError(f"overlay {path.stem} is invalid:\n  " + "\n  ".join(problems)) from None
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", path.stem):
        raise RecipeError(
            f"{path}: the file name {path.stem!r} is the overlay's name and becomes image tags; fix: rename it to "
            "lowercase letters, digits, '.', '_' and '-'"
        )
    for index, patch in enumerate(model.patches):
        try:
            patch_file(patch.file)
        except RecipeError as exc:
            raise RecipeError(f"{path}:{doc.lines.get(('patches', str(index)), 1)}: {exc}") from None
    base = load_recipe(resolve_recipe_path(model.base.recipe, relative_to=path))
    return Overlay(path.stem, path, model, base)
