"""Pull a recipe's published image for one platform and check its labels against the recipe (drift report)."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkforge import engine, oci
from sparkforge.context import Session
from sparkforge.errors import EngineError, PublishError
from sparkforge.recipe import plan
from sparkforge.recipe.loader import Recipe, recipe_ref
from sparkforge.registry.manifests import DIGEST, index_platforms
from sparkforge.registry.publish import session_tools
from sparkforge.verify import verified as records

# ---- tags and references ------------------------------------------------------------------------


def default_tag(recipe: Recipe) -> str:
    """The tag `pull` uses without --tag: the first immutable tag that names no date (it names the recipe)."""
    publish = recipe.model.publish
    for template in [*publish.tags, *publish.moving_tags]:
        if "{date}" not in template:
            return plan.expand_tag(recipe, template, dt.date.today())
    raise PublishError(
        f"recipe {recipe.name}: every tag carries {{date}}, so there is no tag to pull without one; fix: pass "
        "--tag TAG (or --tag sha256:DIGEST), or add a tag like '{vllm}-{hash}' to publish.tags"
    )


def reference_for(recipe: Recipe, tag: str | None = None) -> str:
    """repository:tag, or repository@digest when `tag` is a digest."""
    repo = recipe.model.publish.repository
    tag = tag or default_tag(recipe)
    if DIGEST.fullmatch(tag):
        return f"{repo}@{tag}"
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag):
        raise PublishError(
            f"--tag {tag!r} is neither a tag nor a sha256:<64 hex> digest; fix: e.g. --tag latest"
        )
    return f"{repo}:{tag}"


# ---- pull ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pulled:
    reference: str  # what was asked for
    platform: str
    image: str  # the local reference of the pulled platform image (repository@digest)
    drift: dict[str, tuple[str | None, str]]
    trust: dict[str, Any] = field(default_factory=dict)  # what the signatures proved (signing_check.Trusted)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "drift": {k: {"image": a, "recipe": b} for k, (a, b) in self.drift.items()}}


@dataclass(frozen=True)
class PullOptions:
    """What one pull was told (`invoke pull`): the tag or digest, the platform, the owner's overrides."""

    tag: str | None = None  # a tag or sha256:DIGEST (None: the recipe's first tag without {date})
    platform: str | None = None  # None: this machine's
    allow_drift: bool = False  # labels that differ from the recipe only warn
    allow_unsigned: bool = False
    allow_unverified: bool = False


def pull_image(session: Session, recipe: Recipe, options: PullOptions) -> Pulled:
    """Pull the recipe's published image for one platform and check its labels against the recipe's pins.

    A label that differs raises PublishError naming each one, or only warns with `allow_drift`. The platform's
    image is pulled by its digest from the index, so the image checked is exactly the one the tag names.
    Every path (default tag, --tag, a digest) needs a signed GPU-verified claim unless `allow_unverified`.
    """
    echo, warn = session.echo, session.warn
    platform = options.platform or oci.host_platform()
    ref = reference_for(recipe, options.tag)
    repo = recipe.model.publish.repository
    tools = session_tools(session, recipe, f"pull-{oci.arch(platform)}")
    manifest = tools.fetch(ref)
    if manifest is None:
        raise PublishError(
            f"{ref} does not exist; fix: check --tag (the recipe publishes "
            f"{', '.join(plan.final_tags(recipe, dt.date.today()).all)}), log in to the registry, or publish it"
        )
    if "manifests" in manifest:
        images = dict(index_platforms(manifest))
        if platform not in images:
            raise PublishError(
                f"{ref} has no {platform} image (it has {', '.join(images) or 'none'}); fix: pass --platform, "
                "or publish every platform of the recipe"
            )
        local = f"{repo}@{images[platform]}"
    else:
        local = ref
    from sparkforge.registry import (
        trust as signing_check,  # signatures are verified in the registry before anything is pulled
    )

    trusted = signing_check.verify_remote(
        recipe,
        ref,
        local,
        platform,
        tools,
        signing_check.Overrides(options.allow_unsigned, options.allow_unverified),
        warn,
    )
    local = f"{repo}@{trusted.digest}"  # pull exactly the digest that was verified
    echo(f"sparkforge: pulling {ref} for {platform}")
    try:
        engine.run_cli(tools.runner, tools.engine, "pull", "pull", "--platform", platform, local)
    except EngineError as exc:
        raise PublishError(f"pull of {ref} failed; log in to the registry if it is private.\n{exc}") from None
    # the labels must claim the commit the signed provenance names, before any tag is written
    signing_check.check_labels(trusted, engine.image_labels(local), lambda: engine.remove_image(local))
    # the signed SBOM and BuildKit's signed provenance agree with the labels, the lock and the image itself
    from sparkforge.registry import buildprov, sbomtrust

    sbomtrust.check_pulled(session, recipe, trusted.unsigned, local, options.allow_unverified)
    pulled_image = buildprov.PulledImage(trusted.digest, trusted.top, trusted.unsigned)
    buildprov.check_pulled(session, recipe, pulled_image, options.allow_unverified)
    if local != ref and "@" not in ref:
        engine.tag_image(local, ref)  # `docker run REPO:TAG` then means the image that was checked
    found = engine.image_platform(local)
    if "@" in local:  # `invoke verify` of this image then counts for this registry digest (publish --promote)
        records.link_digest(local.rsplit("@", 1)[1], str(engine.inspect_image(local)["Id"]), repo)
    if found != platform:
        raise PublishError(f"{ref} gave a {found} image where {platform} was asked for")
    drift = plan.label_drift(recipe, engine.image_labels(local))
    if drift:
        message = (
            f"{ref} ({platform}) was not built from recipe {recipe.name} as it is here: {plan.drift_text(drift)}. "
            f"Fix: pull the tag built from this recipe ('invoke pull --recipe {recipe_ref(recipe)}' pulls "
            f"{reference_for(recipe)}), check out the sparkforge revision the image names (label "
            f"org.opencontainers.image.revision={engine.image_labels(local).get('org.opencontainers.image.revision')}"
            f"), or rebuild ('invoke build --recipe {recipe_ref(recipe)}')"
        )
        if not options.allow_drift:
            raise PublishError(message + "; --allow-drift accepts the image with a warning")
        warn(f"sparkforge: WARNING (--allow-drift): {message}")
    else:
        echo(
            f"sparkforge: {local} ({platform}) matches recipe {recipe.name} (hash {recipe.hash[:12]}, all pins)"
        )
    from sparkforge.registry import pulled  # serve, cluster.up, verify, conform, kernels then run this digest

    verified = bool(trusted.verified) and not trusted.unsigned
    pulled.record(recipe, ref, platform, trusted.digest, trusted.top, verified)
    return Pulled(ref, platform, local, drift, trusted.to_json())
