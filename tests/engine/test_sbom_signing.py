"""The signed SBOM, for real: the workflow's `invoke sign` step attests each platform image's SBOM, `pull`
regenerates the SBOM from the pulled image and compares, and refuses a missing SBOM, an SBOM edited in the
registry after signing, and a signed SBOM of other contents (unless --allow-unverified, loudly).

Shares the signed smoke images, keys and registry of signing_fixtures.py (~60 s warm for the session); each
test here adds one rebuilt image and a few cosign calls (~10 s).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from attestation_edits import rewrite_attestations
from signing_fixtures import PASSWORD, Signed, docker_build, verify_report

from sparkforge import engine
from sparkforge.context import Session
from sparkforge.errors import EngineError
from sparkforge.registry import pull as pulling
from sparkforge.registry.attest import attest_report
from sparkforge.registry.cosign import PROVENANCE, Signer, SigningError, Source, provenance
from sparkforge.registry.sbomtrust import attest_image, signed_sbom
from sparkforge.verify.sbom import SPDX_PREDICATE, image_sbom
from tests.unit.test_evidence import GB10

pytestmark = pytest.mark.engine


def _signer() -> Signer:
    os.environ["COSIGN_PASSWORD"] = PASSWORD
    return Signer(str(SIGNED_KEY[0]))


SIGNED_KEY: list[Path] = []


def _published_rebuild(signed: Signed, tmp_path: Path, tag: str, sbom: bool) -> str:
    """The amd64 smoke image with other bytes, pushed under `tag` and signed as the publish and GPU jobs would
    (signature, provenance, a GPU-verified claim) and, if `sbom`, its SBOM; returns repository@digest."""
    SIGNED_KEY[:] = [signed.keys / "cosign.key"]
    repo = signed.recipe.model.publish.repository
    ref = f"{repo}:{tag}"
    docker_build(
        f"FROM {repo}@{signed.published.platforms['linux/amd64']}\nLABEL rebuilt={tag}\n",
        "linux/amd64",
        ref,
        tmp_path / tag,
    )
    output = subprocess.run(
        ["/usr/bin/docker", "push", ref], check=True, capture_output=True, text=True
    ).stdout
    image = f"{repo}@{re.findall(r'digest: (sha256:[0-9a-f]{64})', output)[-1]}"
    signer, cosign = _signer(), signed.cosign()
    cosign.sign(image, signer)
    cosign.attest(
        image, PROVENANCE, provenance(signed.recipe, "linux/amd64", Source.detect(signed.runner)), signer
    )
    report = verify_report(signed, image, "linux/amd64", GB10, tmp_path / f"{tag}-gpu.json")
    attest_report(signed.recipe, image, json.loads(report.read_text()), cosign, signer)
    if sbom:
        attest_image(signed.recipe, image, "linux/amd64", cosign, signer, signed.manifests())
    engine.remove_image(ref)
    engine.remove_image(image)
    return image


def _pull(signed: Signed, tag: str, **kw) -> tuple[pulling.Pulled, list[str]]:
    lines: list[str] = []
    session = Session(echo=lines.append, runner=signed.runner, engine=signed.eng, warn=lines.append)
    pulled = pulling.pull_image(session, signed.recipe, pulling.PullOptions(tag, "linux/amd64", **kw))
    return pulled, lines


def test_sign_step_attests_each_sbom_and_pull_checks_it(signed: Signed) -> None:
    repo = signed.recipe.model.publish.repository
    pulled, lines = _pull(signed, None, allow_unverified=True)  # the smoke images carry no GPU claim
    assert any(
        re.search(r"its SBOM signed by key .* matches the image \(\d+ packages", ln) for ln in lines
    ), "\n".join(lines)
    assert not any("NO VERIFIED SBOM" in ln for ln in lines)
    session = Session(echo=lambda _: None, runner=signed.runner)
    for platform, digest in signed.published.platforms.items():
        attested = signed_sbom(session, signed.recipe, f"{repo}@{digest}")
        local = image_sbom(f"{repo}@{digest}")
        assert attested.image_id == local.image_id == signed.manifests().config_digest(f"{repo}@{digest}")
        assert attested.packages == local.packages and len(local.packages) > 50, platform  # Debian's minbase
    # the task prints the signed document from the registry
    cli = subprocess.run(
        [sys.executable, "-m", "invoke", "sbom", "--image", pulled.image, "--signed", "--recipe",
         str(signed.recipe.path), "--json", "-"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    doc = json.loads(cli.stdout)
    assert (
        doc["spdxVersion"] == "SPDX-2.3"
        and doc["packages"][0]["versionInfo"] == image_sbom(pulled.image).image_id
    )


def test_refuses_an_image_without_a_signed_sbom_unless_allowed_loudly(signed: Signed, tmp_path: Path) -> None:
    image = _published_rebuild(signed, tmp_path, "no-sbom", sbom=False)
    with pytest.raises(SigningError, match=r"refusing .*no-sbom|carries no signed SBOM") as caught:
        _pull(signed, "no-sbom")
    assert "carries no signed SBOM" in str(caught.value) and "the pulled image was removed" in str(
        caught.value
    )
    with pytest.raises(
        EngineError, match="is not in the local engine"
    ):  # nothing of it stays, nothing tagged
        engine.inspect_image(image)
    _, lines = _pull(signed, "no-sbom", allow_unverified=True)
    assert any("WARNING (--allow-unverified)" in ln and "NO VERIFIED SBOM" in ln for ln in lines), lines


def _edit_sbom(statement: dict) -> dict:
    if statement["predicateType"] == SPDX_PREDICATE:
        package = statement["predicate"]["packages"][1]
        package["versionInfo"] += "-edited"  # one package's version, after signing
    return statement


def test_refuses_an_sbom_edited_after_signing(signed: Signed, tmp_path: Path) -> None:
    image = _published_rebuild(signed, tmp_path, "edited-sbom", sbom=True)
    _pull(signed, "edited-sbom")  # signed as published: accepted
    engine.remove_image(image)
    engine.remove_image(f"{signed.recipe.model.publish.repository}:edited-sbom")
    assert rewrite_attestations(signed.registry, image, _edit_sbom, tmp_path / "edited") == 1
    with pytest.raises(SigningError, match=r"carries no signed SBOM \(cosign: .*\)"):
        _pull(signed, "edited-sbom")


def test_refuses_a_signed_sbom_of_other_contents(signed: Signed, tmp_path: Path) -> None:
    image = _published_rebuild(signed, tmp_path, "other-sbom", sbom=False)
    other = image_sbom(
        f"{signed.recipe.model.publish.repository}@{signed.published.platforms['linux/amd64']}"
    )
    signed.cosign().attest(image, SPDX_PREDICATE, other.to_spdx(), _signer())  # signed, but of another image
    with pytest.raises(SigningError, match=r"its signed SBOM and the image differ: it is of image sha256:"):
        _pull(signed, "other-sbom")
