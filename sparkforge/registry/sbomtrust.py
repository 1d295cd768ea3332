"""The signed SBOM of a published image: attested at publish (cosign, the same identity as the image), and
required by `pull`, which regenerates the SBOM from the pulled image and compares.

Pull refuses an image whose SBOM attestation is missing or not signed by the recipe's signer (an SBOM edited
after signing no longer verifies, so it counts as missing), or whose signed SBOM disagrees with the image's
labels, its lock, or the packages read from the image itself. `--allow-unverified` takes it anyway, loudly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from sparkforge import engine
from sparkforge.context import Session
from sparkforge.errors import AuditError
from sparkforge.recipe.loader import Recipe
from sparkforge.registry.cosign import Cosign, Policy, Signed, Signer, SigningError, plan_digest
from sparkforge.registry.manifests import Manifests
from sparkforge.verify import sbom as sboms
from sparkforge.verify.sbom import SPDX_PREDICATE, Sbom


def _local(ref: str, platform: str, tools: Manifests) -> None:
    """The platform image `ref` (repository@sha256:...) is in the local engine, pulled by digest if not."""
    if not engine.image_exists(ref):
        engine.run_cli(tools.runner, tools.engine, "pull-for-sbom", "pull", "--platform", platform, ref)


def attest_image(
    recipe: Recipe, ref: str, platform: str, cosign: Cosign, signer: Signer, tools: Manifests
) -> Sbom:
    """Attest the SBOM of one published platform image (read from its layers) on its digest; refuses when the
    local image is not the one the registry holds under that digest."""
    repo = recipe.model.publish.repository
    name, _, digest = ref.partition("@")
    if name != repo or not plan_digest(digest):
        raise SigningError(
            f"{ref!r}: attest an SBOM on a platform image of {repo} by digest ({repo}@sha256:...)"
        )
    _local(ref, platform, tools)
    config = tools.config_digest(ref)
    found = as_config(sboms.image_sbom(ref), ref, config)
    if found.image_id != config:
        raise SigningError(
            f"refusing to attest an SBOM on {ref}: the local image is {found.image_id[:19]}, the registry's "
            f"config is {config[:19]}; fix: remove the local image and sign again (it is pulled by digest)"
        )
    cosign.attest(ref, SPDX_PREDICATE, found.to_spdx(), signer)
    return found


def as_config(found: Sbom, ref: str, config: str) -> Sbom:
    """The SBOM naming the image by its config digest: the containerd image store's image ID is the manifest
    digest (`ref`'s), the overlay2 store's is the config digest."""
    if found.image_id == ref.rsplit("@", 1)[-1]:
        return replace(found, image_id=config)
    return found


def attest_published(
    recipe: Recipe, platforms: Mapping[str, str], cosign: Cosign, signer: Signer, tools: Manifests
) -> list[Signed]:
    """The publish job's SBOM step: one signed SPDX attestation per platform image of the published index."""
    repo = recipe.model.publish.repository
    done = []
    for platform, digest in sorted(platforms.items()):
        attest_image(recipe, f"{repo}@{digest}", platform, cosign, signer, tools)
        done.append(Signed(f"{repo}@{digest}", SPDX_PREDICATE))
    return done


def signed_sboms(recipe: Recipe, ref: str, cosign: Cosign) -> tuple[list[Sbom], str]:
    """The SBOMs attested on `ref` (repository@sha256:...) that the recipe's signer signed, and cosign's reason
    when there are none."""
    policy = Policy.of(recipe)
    if policy is None:
        raise SigningError(f"recipe {recipe.name} declares no publish.signing: no signed SBOM can be checked")
    digest = ref.rsplit("@", 1)[1]
    found = cosign.attestations(ref, policy, SPDX_PREDICATE)
    out = []
    for statement in found.statements:
        if digest in statement.subjects:
            try:
                out.append(sboms.from_spdx(statement.predicate))
            except AuditError as exc:
                raise SigningError(f"{ref}: its signed SBOM is not one sparkforge can read ({exc})") from None
    return out, found.reason


def signed_sbom(session: Session, recipe: Recipe, ref: str) -> Sbom:
    """The newest signed SBOM of `ref` (for `invoke sbom --signed`), or SigningError."""
    found, reason = signed_sboms(recipe, ref, Cosign(session.runner))
    if not found:
        raise SigningError(
            f"{ref} has no SBOM attestation signed by {Policy.of(recipe).describe()}"  # type: ignore[union-attr]
            + (f" (cosign: {reason})" if reason else "")
            + "; fix: sign it with 'invoke sign' (it attests the SBOM)"
        )
    return found[-1]


def sbom_problems(signed: list[Sbom], actual: Sbom, labels: Mapping[str, str]) -> list[str]:
    """Why the signed SBOMs of an image do not vouch for it: none, or one that disagrees with the image's
    labels, its lock, or what the image itself holds."""
    if not signed:
        return ["it carries no signed SBOM"]
    problems = []
    for one in signed:
        problems += [f"its signed SBOM: {p}" for p in sboms.label_problems(one, labels)]
        problems += [f"its signed SBOM: {p}" for p in sboms.lock_problems(one, actual.lock)]
        problems += [
            f"its signed SBOM and the image differ: {p}" for p in sboms.content_problems(one, actual)
        ]
    return problems


def check_pulled(
    session: Session, recipe: Recipe, trusted_unsigned: bool, local: str, allow_unverified: bool
) -> None:
    """After the download, before any tag: the image's signed SBOM agrees with its labels, lock and contents.

    A refusal removes the pulled image (nothing of it stays, nothing is tagged); `allow_unverified` warns.
    An image accepted unsigned (--allow-unsigned) has no signer to ask: it was warned about already.
    """
    if trusted_unsigned:
        return
    from sparkforge.registry.publish import session_tools

    platform = engine.image_platform(local)
    config = session_tools(session, recipe, "pull-sbom").config_digest(local)
    actual = as_config(sboms.image_sbom(local), local, config)
    cosign = Cosign(session.runner)
    policy = Policy.of(recipe)
    assert policy is not None  # signed images only (trusted_unsigned is False)
    signed, reason = signed_sboms(recipe, local, cosign)
    problems = sbom_problems(signed, actual, engine.image_labels(local))
    if not problems:
        session.echo(
            f"sparkforge: {local}: its SBOM signed by {policy.describe()} matches the image "
            f"({len(actual.packages)} packages, {len(actual.cuda)} CUDA libraries, lock and labels)"
        )
        return
    what = "; ".join(problems) + (f" (cosign: {reason})" if not signed and reason else "")
    if allow_unverified:
        session.warn(
            f"sparkforge: WARNING (--allow-unverified): {local} ({platform}) has NO VERIFIED SBOM: {what}. Nobody "
            "vouches for the list of what it contains."
        )
        return
    engine.remove_image(local)
    raise SigningError(
        f"refusing {local} ({platform}): {what}; the pulled image was removed. Nothing was tagged. Fix: pull an "
        "image whose publish job attested its SBOM ('invoke sign'), or pass --allow-unverified to take it "
        "anyway, loudly"
    )
