"""Signed images for real: `pull` verifies each platform image's signature and provenance, and `verify`
reports the GPU attestation the pulled image carried (the workflow's `invoke sign.attest` step, run here).

The signed smoke images, keys and registry are shared with test_signing_refusals.py (signing_fixtures.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from signing_fixtures import PLATFORMS, Signed, pull_signed, verify_report

from sparkforge import engine
from sparkforge.imagebuild.hostsetup import base_image_name
from sparkforge.recipe import plan
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.registry.trust import attestation_check
from sparkforge.verify.suite import verify_image
from tests.unit.test_evidence import GB10

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("platform", PLATFORMS)
def test_pull_verifies_signature_and_provenance_for_each_platform(signed: Signed, platform: str) -> None:
    pulled = pull_signed(signed, platform=platform)
    assert pulled.image == f"{signed.recipe.model.publish.repository}@{signed.published.platforms[platform]}"
    assert pulled.trust["unsigned"] is False and str(signed.keys / "cosign.pub") in pulled.trust["signer"]
    assert pulled.trust["top"] == signed.published.index
    assert pulled.trust["repository"] == plan.PROJECT_SOURCE
    assert pulled.trust["revision"] == engine.image_labels(pulled.image)["org.opencontainers.image.revision"]
    assert engine.image_platform(pulled.image) == platform


def test_verify_reports_the_attestation_the_pulled_image_carried(signed: Signed, tmp_path: Path) -> None:
    pulled = pull_signed(signed, platform="linux/arm64")
    report = verify_report(
        signed, pulled.image, "linux/arm64", GB10, REPO_ROOT / "reports" / f"{signed.name}-verify.json"
    )
    try:
        # The sign job derives the image from the merge job's record (build/published/NAME.json, the signed
        # fixture's), the arm64 image of its index: the image pulled here.
        record = REPO_ROOT / "build" / "published" / f"{signed.name}.json"
        result = signed.run_step("Check the evidence against the digest and attest it", PUBLISHED=str(record))
        assert result.returncode == 0, result.stdout + result.stderr
    finally:
        report.unlink()
    found = verify_image(signed.recipe, pulled.image, gpus="none", kernels=False, carried=attestation_check)
    check = next(c for c in found.checks if c.name == "attestation")
    assert check.status == "passed", check.reason
    assert "every vLLM FP8 kernel check passed on sm_121 (NVIDIA GB10): GPU-verified" in check.reason
    assert check.details["verify"]["gpu"]["name"] == "NVIDIA GB10"
    assert check.details["provenance"][0]["recipeHash"] == signed.recipe.hash
    other = attestation_check(signed.recipe, base_image_name("linux/amd64"))  # never in the registry
    assert other.status == "skipped"
