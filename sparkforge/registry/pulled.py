"""The pull -> run seam: what `invoke pull` verified, per recipe and platform, and the one resolver of the image
that serve, cluster.up, conform, verify and kernels run.

`record` keeps the digest pull verified ($SPARKFORGE_CACHE/pulled/<recipe>.json, platform -> PulledRecord).
`resolve` picks the image, in this order, and says which and why (docs/run.md: Which image runs):
  1. `--image` naming the recipe's published repository: the digest pull verified for that tag or digest;
     anything else is refused unless `--allow-unverified` (a loud warning);
  2. `--image` naming a local-only image (no registry host): used as named (a build or a load on this machine);
  3. no `--image`: the recipe's local build if it exists, else the digest pull verified for this platform.
Containers run with `--pull never` (run/nodes.run_argv): the engine never fetches a tag nobody checked.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from sparkforge import console, oci
from sparkforge.boundary import parse_json, read_bytes
from sparkforge.context import cache_path, write_atomic
from sparkforge.errors import InputError, PublishError
from sparkforge.recipe import plan
from sparkforge.recipe.loader import Recipe, recipe_ref

MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class PulledRecord:
    """One platform image `invoke pull` verified and pulled for a recipe."""

    recipe: str
    recipe_hash: str
    platform: str
    repository: str
    digest: str  # the platform image: what runs (repository@digest)
    index: str  # what the reference named (an index, or the image itself)
    reference: str  # what pull was asked for (repository:tag or repository@digest)
    gpu_verified: bool  # a signed GPU-verified claim was checked (False: pulled with --allow-unverified)
    date: str

    @property
    def image(self) -> str:
        return f"{self.repository}@{self.digest}"


@dataclass(frozen=True)
class Resolved:
    image: str
    why: str


def _path(recipe: Recipe) -> Path:
    return cache_path("pulled", f"{recipe.name}.json")


def _all(recipe: Recipe) -> dict[str, PulledRecord]:
    path = _path(recipe)
    if not path.is_file():
        return {}
    try:
        text = read_bytes(path, "pull record", MAX_BYTES, named=False, within=(path.parent,)).decode()
        data = parse_json(text, str(path))
        return {platform: PulledRecord(**fields) for platform, fields in data.items()}
    except (InputError, ValueError, TypeError, AttributeError) as exc:
        raise PublishError(f"{path}: not a pull record ({exc}); fix: delete it and pull again") from None


def record(
    recipe: Recipe, reference: str, platform: str, digest: str, index: str, gpu_verified: bool
) -> None:
    """Remember what pull verified (replacing the platform's earlier record)."""
    when = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
    found = _all(recipe)
    repository = recipe.model.publish.repository
    found[platform] = PulledRecord(
        recipe.name, recipe.hash, platform, repository, digest, index, reference, gpu_verified, when
    )
    write_atomic(_path(recipe), json.dumps({p: asdict(r) for p, r in found.items()}, indent=1).encode())


def recorded(recipe: Recipe, platform: str) -> PulledRecord | None:
    return _all(recipe).get(platform)


def _registry_name(ref: str) -> bool:
    """The reference names a registry host (its first component has a '.' or ':' or is localhost)."""
    first = ref.split("/", 1)[0] if "/" in ref else ""
    return "." in first or ":" in first or first == "localhost"


def resolve(
    recipe: Recipe,
    image: str = "",
    *,
    allow_unverified: bool = False,
    subject: bool = False,
    dry: bool = False,
    exists: Callable[[str], bool] | None = None,
    platform: str | None = None,
    warn: console.Echo = console.warn,
) -> Resolved:
    """The image to run for `recipe` (see the module doc). `subject`: the image is what the task examines
    (verify, kernels): an explicit `--image` is taken as named, never refused. `dry`: with nothing built or
    pulled, the local build's tag (the plan shows it; nothing runs)."""
    if exists is None:
        from sparkforge import engine

        exists = engine.image_exists
    platform = platform or recipe.model.platforms[0]
    repo = recipe.model.publish.repository
    mine = _all(recipe)
    if image:
        oci.check_reference("--image", image)
        name = image.split("@", 1)[0]
        if "@" not in image and ":" in image.rsplit("/", 1)[-1]:
            name = image.rsplit(":", 1)[0]
        if name == repo:
            for r in mine.values():
                if image in (r.image, r.reference, f"{repo}@{r.index}") and r.gpu_verified:
                    return Resolved(r.image, f"{image}: the digest 'invoke pull' verified on {r.date[:10]}")
        if subject or (name != repo and not _registry_name(image)):
            return Resolved(image, "--image as named" + (" (the image under examination)" if subject else ""))
        what = (
            f"--image {image} names no digest 'invoke pull' verified for {recipe.name}"
            if name == repo
            else f"--image {image} is a registry image that sparkforge never verified"
        )
        if not allow_unverified:
            raise PublishError(
                f"{what}; refusing to run it (the engine would fetch whatever the registry serves). fix: "
                f"'invoke pull --recipe {recipe_ref(recipe)}' (it verifies and records the digest), or pass "
                "--allow-unverified to run it anyway, loudly"
            )
        warn(f"sparkforge: WARNING (--allow-unverified): {what}; running it UNVERIFIED, as the engine has it")
        return Resolved(image, "--allow-unverified: NOT VERIFIED")
    build = plan.candidate_tag(recipe, platform)
    if exists(build):
        return Resolved(build, f"the local build of recipe {recipe.name} (hash {recipe.hash[:12]})")
    pulled = mine.get(platform)
    if pulled and pulled.recipe_hash == recipe.hash and (pulled.gpu_verified or allow_unverified):
        how = "verified" if pulled.gpu_verified else "pulled UNVERIFIED (--allow-unverified)"
        return Resolved(pulled.image, f"no local build; the digest 'invoke pull' {how} on {pulled.date[:10]}")
    why = (
        f"no local build; the pulled {pulled.image} is of recipe hash {pulled.recipe_hash[:12]}, not "
        f"{recipe.hash[:12]} (pull again)"
        if pulled and pulled.recipe_hash != recipe.hash
        else f"no local build; the pulled {pulled.image} has no GPU-verified claim (pass --allow-unverified)"
        if pulled
        else "neither built nor pulled here yet"
    )
    if dry:
        return Resolved(build, f"{why}; a dry run shows the local build's tag")
    raise PublishError(
        f"no image to run for recipe {recipe.name} ({platform}): {why}. fix: 'invoke pull --recipe "
        f"{recipe_ref(recipe)}' (the published image, verified) or 'invoke build --recipe {recipe_ref(recipe)}'"
    )
