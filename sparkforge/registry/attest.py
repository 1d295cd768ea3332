"""Signed claims bound to one published platform image: the verify report and the kernel report.

Both go through one binding step: the image is named by digest in the recipe's repository, and the report must be
of that very image (the image ID it read is the config digest of the manifest being attested), else nothing is
signed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sparkforge import engine
from sparkforge.recipe.loader import Recipe
from sparkforge.registry.cosign import (
    KERNELS_CLAIM,
    VERIFY_CLAIM,
    Cosign,
    Signed,
    Signer,
    SigningError,
    plan_digest,
    verify_claim,
)
from sparkforge.registry.manifests import Manifests


def kernels_claim(recipe: Recipe, report: Mapping[str, Any]) -> dict[str, Any]:
    """The kernel-report predicate: the report itself, the recipe hash it was made for, the image it read, and
    the time it is signed (readers take the newest)."""
    if report.get("command") != "kernels":
        raise SigningError(
            f"the report is a {report.get('command')!r} report, not a kernel report; fix: pass the --json that "
            f"'invoke kernels --recipe {recipe.name} --image IMAGE' wrote"
        )
    return {
        "recipe": recipe.name,
        "recipeHash": recipe.hash,
        "imageId": (report.get("facts") or {}).get("image_id"),
        "attestedAt": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "report": dict(report),
    }


@dataclass(frozen=True)
class BoundClaim:
    """A kind of claim about one image ID (a verify or kernel report's), attested only on the digest of that image."""

    predicate_type: str
    # The claim's body from the report; its "imageId" is the image the report read.
    predicate: Callable[[Recipe, Mapping[str, Any]], dict[str, Any]]
    mismatch: str  # the refusal, "{report} ... {config} ...; fix: ... {image}" filled in

    def attest(
        self,
        recipe: Recipe,
        image: str,
        report: Mapping[str, Any],
        cosign: Cosign,
        signer: Signer,
        tools: Manifests | None = None,
    ) -> Signed:
        """Attest `report` on `image` (repository@sha256:...) only if the image ID it read is that digest's config."""
        body = self.predicate(recipe, report)
        repo = recipe.model.publish.repository
        name, _, digest = image.partition("@")
        if name != repo or not plan_digest(digest):
            raise SigningError(
                f"--image {image!r}: attest a platform image of {repo} by digest ({repo}@sha256:...), e.g. the "
                "'image' that 'invoke pull --json' wrote"
            )
        tools = tools or Manifests(engine.detect_engine(), cosign.runner, repo)
        config = tools.config_digest(image)
        if body["imageId"] != config:
            raise SigningError(
                f"refusing to attest {image}: "
                + self.mismatch.format(report=body["imageId"], config=config, image=image)
            )
        cosign.attest(image, self.predicate_type, body, signer)
        return Signed(image, self.predicate_type)


VERIFY_REPORT = BoundClaim(
    VERIFY_CLAIM,
    verify_claim,
    "the report verified image {report}, but that digest's image is {config}; fix: verify the pulled image "
    "('invoke verify --image {image}') and attest that report",
)
KERNEL_REPORT = BoundClaim(
    KERNELS_CLAIM,
    kernels_claim,
    "the kernel report read image {report}, but that digest's image is {config}; fix: 'invoke kernels --image "
    "{image}' of the pulled image, then attest that",
)
# A verify report / the kernel report, attested on one platform image (repository@sha256:...) of the recipe.
attest_report = VERIFY_REPORT.attest
attest_kernels = KERNEL_REPORT.attest
