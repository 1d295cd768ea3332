"""What `pull` proves before it tags anything: signatures, provenance, recipe hash, and a GPU verify claim.

Two steps around the download: `verify_remote` reads only the registry (signatures of the index and of the
platform image, the provenance and verify attestations), so nothing unverified is downloaded; `check_labels`
then compares the pulled image's labels with the signed provenance before the tag is written locally.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkforge import console, engine
from sparkforge.commands import Runner
from sparkforge.console import Echo
from sparkforge.recipe import plan
from sparkforge.recipe.loader import Recipe
from sparkforge.registry.cosign import PROVENANCE, VERIFY_CLAIM, Cosign, Policy, SigningError, Statement
from sparkforge.registry.manifests import DIGEST, Manifests, index_platforms
from sparkforge.report import Check

REVISION_LABEL = "org.opencontainers.image.revision"


@dataclass(frozen=True)
class Trusted:
    """What the signatures established about one pulled platform image."""

    reference: str
    platform: str
    digest: str  # the platform image
    top: str  # what the reference names: an index (or the image itself)
    signer: str
    repository: str = ""  # the source repository the provenance names
    revision: str = ""  # ... and its commit
    verified: dict[str, Any] = field(default_factory=dict)  # the GPU verify claim, if any
    unsigned: bool = False  # accepted with --allow-unsigned

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def moving_tags(recipe: Recipe, when: dt.date | None = None) -> list[re.Pattern[str]]:
    """The recipe's moving tags as patterns ({date} matches any YYYYMMDD)."""
    values = plan.tag_values(recipe, when or dt.date.today())
    out = []
    for template in recipe.model.publish.moving_tags:
        parts = re.split(r"(\{[a-z]+\})", template)
        regex = "".join(
            r"\d{8}"
            if p == "{date}"
            else re.escape(p.format(**values))
            if p.startswith("{")
            else re.escape(p)
            for p in parts
        )
        out.append(re.compile(regex))
    return out


def is_moving(recipe: Recipe, tag: str) -> bool:
    return any(p.fullmatch(tag) for p in moving_tags(recipe))


def _refuse(ref: str, platform: str, what: str, fix: str) -> SigningError:
    return SigningError(f"refusing {ref} ({platform}): {what}. Nothing was tagged. Fix: {fix}")


def verify_remote(
    recipe: Recipe,
    ref: str,
    image: str,
    platform: str,
    tools: Manifests,
    *,
    allow_unsigned: bool = False,
    warn: Echo = console.warn,
) -> Trusted:
    """Check what `ref` names in the registry before anything is pulled; raise SigningError on a mismatch.

    `image` is the platform image (repository@sha256:...) that will be pulled. A moving tag also needs a
    signed GPU verify claim for this platform; `allow_unsigned` never applies to moving tags.
    """
    repo = recipe.model.publish.repository
    tag = ref.rsplit("@", 1)[1] if "@" in ref else ref.rsplit(":", 1)[1]
    moving = is_moving(recipe, tag)
    top = tag if DIGEST.fullmatch(tag) else tools.digest_of(ref)
    digest = image.rsplit("@", 1)[1] if "@" in image else top  # a single image pulled by tag: itself
    _same_content(recipe, ref, top, digest, platform, tools)
    policy = Policy.of(recipe)
    cosign = Cosign(tools.runner)
    problem = _signature_problem(policy, cosign, repo, top, digest)
    if problem:
        what, fix = problem
        if moving:
            raise _refuse(
                ref, platform, what + f"; {tag} is a moving tag: --allow-unsigned never applies", fix
            )
        if not allow_unsigned:
            raise _refuse(ref, platform, what, fix + "; or pass --allow-unsigned to accept it unverified")
        warn(
            f"sparkforge: WARNING (--allow-unsigned): {ref} ({platform}) is NOT VERIFIED: {what}. Nobody vouches "
            "for what this image contains."
        )
        return Trusted(ref, platform, digest, top, "nobody", unsigned=True)
    assert policy is not None
    source = _provenance(recipe, ref, platform, cosign, policy, f"{repo}@{digest}", digest)
    if policy.identity:  # keyless: the certificate itself names the workflow's repository and commit
        found = cosign.verify(
            f"{repo}@{digest}",
            policy,
            ("--certificate-github-workflow-sha", source["revision"]),
        )
        if not found.ok:
            raise _refuse(
                ref,
                platform,
                f"the signing certificate was not issued to commit {source['revision']} ({found.reason})",
                "pull an image built by this repository's images workflow",
            )
    claim = _gpu_claim(recipe, platform, cosign, policy, f"{repo}@{digest}", digest)
    if moving and not claim:
        raise _refuse(
            ref,
            platform,
            f"{tag} is a moving tag, and {repo}@{digest} carries no signed GPU verify attestation for {platform} "
            f"and recipe hash {recipe.hash[:12]} (moving tags name only GPU-verified images)",
            "pull an immutable tag or a digest, or wait for the images workflow's verify job to attest it",
        )
    return Trusted(
        ref, platform, digest, top, policy.describe(), source["repository"], source["revision"], claim
    )


def _same_content(recipe: Recipe, ref: str, top: str, digest: str, platform: str, tools: Manifests) -> None:
    """`ref` still names `top`, and `top` is (or contains) the platform image about to be pulled."""
    manifest = tools.fetch(f"{recipe.model.publish.repository}@{top}") or {}
    images = dict(index_platforms(manifest)) if "manifests" in manifest else {platform: top}
    if images.get(platform) != digest:
        raise _refuse(
            ref,
            platform,
            f"{ref} changed while it was read (it now names {top}, whose {platform} image is "
            f"{images.get(platform)}, not {digest})",
            "pull again; if it keeps changing, someone is re-pushing the tag",
        )


def _signature_problem(
    policy: Policy | None, cosign: Cosign, repo: str, top: str, digest: str
) -> tuple[str, str] | None:
    if policy is None:
        return (
            "its recipe declares no publish.signing, so no signature can be checked",
            "add publish.signing (a cosign public key path, or the keyless identity of the images workflow)",
        )
    for what, target in (("index", top), ("image", digest)):
        if what == "index" and top == digest:
            continue
        found = cosign.verify(f"{repo}@{target}", policy)
        if not found.ok:
            return (
                f"the {what} {repo}@{target} has no valid signature by {policy.describe()} (cosign: "
                f"{found.reason})",
                "pull a tag or digest that the recipe's signer published; if this tag was signed before, "
                "it was re-pushed since",
            )
    return None


def _provenance(
    recipe: Recipe, ref: str, platform: str, cosign: Cosign, policy: Policy, image: str, digest: str
) -> dict[str, str]:
    found = cosign.attestations(image, policy, PROVENANCE)
    mine = [s for s in found.statements if digest in s.subjects]
    if not mine:
        raise _refuse(
            ref,
            platform,
            f"{image} has no provenance attestation signed by {policy.describe()}"
            + (f" (cosign: {found.reason})" if found.reason else ""),
            "pull an image published by 'invoke sign' (the images workflow's publish job)",
        )
    params = [s.predicate.get("buildDefinition", {}).get("externalParameters", {}) for s in mine]
    match = [p for p in params if p.get("recipeHash") == recipe.hash and p.get("platform") == platform]
    if not match:
        seen = ", ".join(
            f"{p.get('recipe')} {str(p.get('recipeHash'))[:12]} {p.get('platform')}" for p in params
        )
        raise _refuse(
            ref,
            platform,
            f"its signed provenance is for another recipe or platform ({seen}), not {recipe.name} "
            f"{recipe.hash[:12]} {platform}",
            "check out the sparkforge revision whose recipe built this image, or pull the tag of this recipe",
        )
    source = match[0].get("source") or {}
    if source.get("repository") != plan.PROJECT_SOURCE:
        raise _refuse(
            ref,
            platform,
            f"its signed provenance names repository {source.get('repository')}, not {plan.PROJECT_SOURCE}",
            "pull images built from this repository",
        )
    return {"repository": str(source.get("repository")), "revision": str(source.get("revision"))}


def _gpu_claim(
    recipe: Recipe, platform: str, cosign: Cosign, policy: Policy, image: str, digest: str
) -> dict[str, Any]:
    """The newest signed verify claim for this image that passed on a GPU for this platform and recipe."""
    found = cosign.attestations(image, policy, VERIFY_CLAIM)
    for statement in reversed(found.statements):
        if _is_gpu_verified(statement, recipe, platform, digest):
            p = statement.predicate
            return {k: p.get(k) for k in ("status", "platform", "recipeHash", "suiteHash", "gpu", "checks")}
    return {}


def _is_gpu_verified(statement: Statement, recipe: Recipe, platform: str, digest: str) -> bool:
    p = statement.predicate
    return (
        digest in statement.subjects
        and p.get("status") == "passed"
        and p.get("recipeHash") == recipe.hash
        and p.get("platform") == platform
        and bool((p.get("gpu") or {}).get("used"))
    )


def check_labels(trusted: Trusted, labels: Mapping[str, str], on_refuse: Callable[[], None]) -> None:
    """The pulled image's revision label is the commit its signed provenance names (before tagging)."""
    if trusted.unsigned:
        return
    claimed = labels.get(REVISION_LABEL)
    if claimed != trusted.revision:
        on_refuse()
        raise _refuse(
            trusted.reference,
            trusted.platform,
            f"its label {REVISION_LABEL}={claimed} is not the commit its signed provenance names "
            f"({trusted.revision}); the pulled image was removed",
            "report this image: its labels claim a source that its signer does not",
        )


def attestation_check(recipe: Recipe, image: str, runner: Runner | None = None) -> Check:
    """For `verify --image`: the signed attestations a pulled image carries (by its registry digest)."""
    policy = Policy.of(recipe)
    repo = recipe.model.publish.repository
    digests = [
        d.split("@", 1)[1]
        for d in engine.inspect_image(image).get("RepoDigests") or []
        if d.startswith(repo + "@")
    ]
    if policy is None or not digests:
        why = (
            "the recipe declares no publish.signing"
            if policy is None
            else f"{image} was not pulled from {repo}"
        )
        return Check("attestation", "skipped", why)
    cosign = Cosign(runner or Runner(stream=False))
    ref = f"{repo}@{digests[0]}"
    try:
        signed = cosign.verify(ref, policy)
    except SigningError as exc:  # cosign missing, or the recipe's key file: the other checks still run
        return Check("attestation", "skipped", str(exc))
    if not signed.ok:
        return Check(
            "attestation", "failed", f"{ref}: no valid signature by {policy.describe()} ({signed.reason})"
        )
    provenance = cosign.attestations(ref, policy, PROVENANCE).statements
    claims = cosign.attestations(ref, policy, VERIFY_CLAIM).statements
    details = {
        "reference": ref,
        "signer": policy.describe(),
        "provenance": [s.predicate.get("buildDefinition", {}).get("externalParameters") for s in provenance],
        "verify": [
            {k: s.predicate.get(k) for k in ("status", "platform", "recipeHash", "suiteHash", "gpu")}
            for s in claims
        ],
    }
    gpu = [c for c in details["verify"] if c["status"] == "passed" and (c["gpu"] or {}).get("used")]
    reason = (
        f"signed by {policy.describe()}; {len(provenance)} provenance and {len(claims)} verify attestation(s)"
        + (f", GPU-verified on {platform_of(gpu[-1])}" if gpu else ", none GPU-verified")
    )
    return Check("attestation", "passed", reason, details)


def platform_of(claim: Mapping[str, Any]) -> str:
    devices = (claim.get("gpu") or {}).get("devices") or []
    return f"{claim.get('platform')} ({', '.join(devices) or 'GPU'})"
