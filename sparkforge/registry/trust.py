"""What `pull` proves before it tags anything: signatures, provenance, recipe hash, and a GPU verify claim.

Two steps around the download: `verify_remote` reads only the registry (signatures of the index and of the
platform image, the provenance and verify attestations), so nothing unverified is downloaded; `check_labels`
then compares the pulled image's labels with the signed provenance before the tag is written locally.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkforge import console, engine
from sparkforge.console import Echo
from sparkforge.context import quiet_session
from sparkforge.errors import PublishError
from sparkforge.recipe import plan
from sparkforge.recipe.loader import Recipe
from sparkforge.registry import tlogtime, tufclient
from sparkforge.registry.cosign import (
    PROVENANCE,
    VERIFY_CLAIM,
    Cosign,
    Policy,
    SigningError,
    Statement,
    source_of,
)
from sparkforge.registry.manifests import DIGEST, Manifests, index_platforms
from sparkforge.registry.ocidist import Registry
from sparkforge.report import Check
from sparkforge.verify import evidence
from sparkforge.verify.evidence import GpuVerdict

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


@dataclass(frozen=True)
class Overrides:
    """What the owner lets a pull take without, each said loudly: a valid signature (never for moving tags),
    a signed GPU-verified claim for the platform."""

    allow_unsigned: bool = False
    allow_unverified: bool = False


def verify_remote(
    recipe: Recipe,
    ref: str,
    image: str,
    platform: str,
    tools: Manifests,
    overrides: Overrides = Overrides(),
    warn: Echo = console.warn,
) -> Trusted:
    """Check what `ref` names in the registry before anything is pulled; raise SigningError on a mismatch.

    `image` is the platform image (repository@sha256:...) that will be pulled. Every path (the default tag,
    --tag, a digest, a moving tag) needs a signed GPU-verified claim for this platform unless
    `allow_unverified` (which prints what is missing); a moving tag is resolved through the signed TUF targets,
    whose revoked list refuses any path. `allow_unsigned` never applies to moving tags.
    """
    repo = recipe.model.publish.repository
    tag = ref.rsplit("@", 1)[1] if "@" in ref else ref.rsplit(":", 1)[1]
    moving = is_moving(recipe, tag)
    top = tag if DIGEST.fullmatch(tag) else tools.digest_of(ref)
    digest = image.rsplit("@", 1)[1] if "@" in image else top  # a single image pulled by tag: itself
    policy = Policy.of(recipe)
    state, pinned = None, None
    if policy is not None and Policy.for_verify(recipe) is not None:
        try:
            state = tufclient.refresh(repo, Registry(repo), root_file=tufclient.root_file_of(recipe))
            if moving:  # the signed targets, not the registry tag, say what a moving tag names
                top, digest, pinned = state.pullable(tag, platform, top, warn)
        except PublishError as exc:
            what, _, fix = str(exc).rpartition("fix: ")
            raise _refuse(
                ref, platform, what.rstrip(" .;") or str(exc), fix or "ask the maintainers"
            ) from None
    _same_content(recipe, ref, top, digest, platform, tools)
    if state is not None and (why := state.revoked_of(top, digest)):
        raise _refuse(ref, platform, why, "pull another image: this one failed its verify")
    cosign = Cosign(tools.runner)
    problem = _signature_problem(policy, cosign, repo, top, digest)
    if problem:
        what, fix = problem
        if moving:
            raise _refuse(
                ref, platform, what + f"; {tag} is a moving tag: --allow-unsigned never applies", fix
            )
        if not overrides.allow_unsigned:
            raise _refuse(ref, platform, what, fix + "; or pass --allow-unsigned to accept it unverified")
        if not overrides.allow_unverified:  # no signature, so no GPU claim can be checked either
            why = "; every pull needs a signed GPU-verified claim for the platform, and an unsigned image has none"
            raise _refuse(
                ref, platform, what + why, "pass --allow-unverified as well to take it anyway, loudly"
            )
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
    verifier = Policy.for_verify(recipe)
    assert verifier is not None
    found = cosign.attestations(f"{repo}@{digest}", verifier, VERIFY_CLAIM)
    config = tools.config_digest(f"{repo}@{digest}")
    # the log's time only where cosign verified the bundle (keyless: the tlog entry is required and checked);
    # a key verified with --insecure-ignore-tlog has unverified bundle bytes: the signer's clock, labelled so
    times = tlogtime.integrated_times(Registry(repo), digest) if verifier.identity else {}
    statements = found.statements
    if pinned and not any(s.predicate.get("status") != "passed" for s in statements):
        statements = tuple(s for s in statements if s.digest in pinned)  # the claims the targets moved on
    judged = judge_claims(recipe, platform, digest, config, statements, times)
    if judged.revoked or (moving and not judged.verdict.verified):
        raise _refuse(
            ref,
            platform,
            (f"{tag} is a moving tag (moving tags name only GPU-verified images), and " if moving else "")
            + f"{repo}@{digest} ({platform}, recipe hash {recipe.hash[:12]}): {judged.reason} (verify "
            f"attestations signed by {verifier.describe()})",
            "pull an immutable tag or a digest that passed, or wait for the GPU verify job to attest it"
            if not judged.revoked
            else "pull another image: this one failed its verify",
        )
    if not judged.verdict.verified:
        what = f"{repo}@{digest} ({platform}): {judged.reason} (verify attestations signed by {verifier.describe()})"
        if not overrides.allow_unverified:
            raise _refuse(
                ref,
                platform,
                f"every pull needs a signed GPU-verified claim for the platform, and {what}",
                "pull a tag or digest whose GPU verify passed ('invoke history' shows them), or pass "
                "--allow-unverified to take it anyway, loudly",
            )
        warn(
            f"sparkforge: WARNING (--allow-unverified): {ref} ({platform}) is NOT GPU-VERIFIED. Missing: a "
            f"GPU-verified claim signed by {verifier.describe()} for {platform} of recipe hash "
            f"{recipe.hash[:12]}; found: {judged.reason}. Its signature and provenance were checked; nobody "
            "vouches that its kernels run on the recipe's GPU."
        )
    claim = judged.claim if judged.verdict.verified else {}
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
    expected = source_of(recipe)
    if source.get("repository") != expected:
        raise _refuse(
            ref,
            platform,
            f"its signed provenance names repository {source.get('repository')}, not {expected} (the recipe's "
            "publish.signing.source, default sparkforge's)",
            "pull images built from this repository",
        )
    return {"repository": str(source.get("repository")), "revision": str(source.get("revision"))}


@dataclass(frozen=True)
class Judged:
    """What the signed verify claims of one platform image add up to: the newest decides, a failure revokes."""

    verdict: GpuVerdict
    reason: str
    claim: dict[str, Any] = field(default_factory=dict)  # the newest claim (summary), if any
    revoked: bool = False  # a signed claim for this digest failed
    claim_digest: str = ""  # sha256 of the newest claim's statement (what the TUF targets pin)


def judge_claims(
    recipe: Recipe,
    platform: str,
    digest: str,
    config: str,
    statements: Sequence[Statement],
    times: Mapping[str, str] | None = None,
) -> Judged:
    """THE GPU-verified rule (evidence.gpu_verdict) applied to the report inside the newest signed claim.

    "Newest" by the transparency log's integrated time where the claim's bundle has one (`times`: payload ->
    time), else by the signer's clock (`attestedAt`), labelled as such.
    """
    times = times or {}
    sm = evidence.sm_of(evidence.capability_of(recipe.model.gpu))
    mine = [s for s in statements if digest in s.subjects]
    if not mine:
        none = GpuVerdict(False, "no signed GPU verify attestation", None, sm)
        return Judged(none, "carries no signed GPU verify attestation")
    failed = [s for s in mine if s.predicate.get("status") != "passed"]
    if failed:
        when = tlogtime.when(failed[-1], times)
        revoked = GpuVerdict(False, "a signed verify failed", None, sm)
        return Judged(
            revoked,
            f"has a signed verify attestation that FAILED ({when}); a failure revokes every pass",
            revoked=True,
        )
    newest = max(mine, key=lambda s: tlogtime.sort_key(s, times))
    p = newest.predicate
    summary = {k: p.get(k) for k in ("status", "platform", "recipeHash", "suiteHash", "imageId", "gpu")}
    summary["attestedAt"], summary["attestedAtSource"] = tlogtime.time_and_source(newest, times)
    verdict = claim_verdict(p, recipe, platform, config)
    return Judged(
        verdict,
        f"its newest signed verify claim ({tlogtime.when(newest, times)}): {verdict.reason}",
        summary,
        claim_digest=newest.digest,
    )


def claim_verdict(predicate: Mapping[str, Any], recipe: Recipe, platform: str, config: str) -> GpuVerdict:
    """One claim: about this image, recipe and platform, its report judged by the one rule on the host's GPU."""
    sm = evidence.sm_of(evidence.capability_of(recipe.model.gpu))
    report = predicate.get("report") or {}
    wrong = [
        f"{what} {found!r} is not {want!r}"
        for what, found, want in (
            ("platform", predicate.get("platform"), platform),
            ("recipe hash", predicate.get("recipeHash"), recipe.hash),
            ("report recipe hash", report.get("recipe_hash"), recipe.hash),
            ("image ID", predicate.get("imageId"), config),
            ("report image ID", report.get("image_id"), config),
        )
        if found != want
    ]
    if wrong:
        return GpuVerdict(False, "it is about something else: " + "; ".join(wrong), None, sm)
    gpu = report.get("gpu") if (report.get("gpus") or {}).get("used") is True else None
    return evidence.gpu_verdict(report.get("checks") or [], gpu, recipe.model.gpu)


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


def attestation_check(recipe: Recipe, image: str) -> Check:
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
    cosign = Cosign(quiet_session().runner)  # verify's `carried` callback: it is given no session
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
    verifier = Policy.for_verify(recipe)
    assert verifier is not None
    claims = cosign.attestations(ref, verifier, VERIFY_CLAIM).statements
    config = str(engine.inspect_image(image)["Id"])
    platform = engine.image_platform(image)
    judged = judge_claims(recipe, platform, digests[0], config, claims)
    details = {
        "reference": ref,
        "signer": policy.describe(),
        "verify_signer": verifier.describe(),
        "provenance": [s.predicate.get("buildDefinition", {}).get("externalParameters") for s in provenance],
        "verify": judged.claim,
        "gpu_verified": judged.verdict.to_dict(),
    }
    reason = (
        f"signed by {policy.describe()}; {len(provenance)} provenance and {len(claims)} verify attestation(s); "
        + judged.reason
    )
    return Check("attestation", "failed" if judged.revoked else "passed", reason, details)
