"""Signed GPU verify claims for real (cosign, a real registry, key pairs made here): pull judges the report inside
the newest claim by the one GPU-verified rule, a failed claim revokes, only the verify signer's claims count,
and a report is attested only for the image it verified.

Each test pushes an image of its own (other bytes, same labels, signed with provenance) so that the claims it
adds never touch the shared signed index of signing_fixtures.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from signing_fixtures import (
    PASSWORD,
    Signed,
    docker_build,
    log_move,
    pull_signed,
    signed_recipe_file,
    verify_report,
)

from sparkforge import engine
from sparkforge.recipe.loader import load_recipe
from sparkforge.registry.attest import attest_report
from sparkforge.registry.cosign import PROVENANCE, Signer, SigningError, Source, provenance
from sparkforge.registry.sbomtrust import attest_image
from tests import registry_calls as calls
from tests.recipe_files import write_recipe_file
from tests.unit.test_evidence import GB10, H200

pytestmark = pytest.mark.engine


def _signed_image(signed: Signed, tmp_path: Path, tag: str, unique: str) -> str:
    """A new amd64 image (bytes of its own: `unique`) pushed as `tag`, signed and with provenance by the recipe's
    key: repository@digest."""
    repo = signed.recipe.model.publish.repository
    # From the registry by digest: a local tag may be gone (other test runs on the machine clean sparkforge-test/ images).
    dockerfile = f"FROM {repo}@{signed.published.platforms['linux/amd64']}\nLABEL trust-test={unique}\n"
    docker_build(dockerfile, "linux/amd64", f"{repo}:{tag}", tmp_path / unique)
    pushed = subprocess.run(
        ["/usr/bin/docker", "push", f"{repo}:{tag}"], check=True, capture_output=True, text=True
    )
    engine.remove_image(f"{repo}:{tag}")
    digest = re.findall(r"digest: (sha256:[0-9a-f]{64})", pushed.stdout)[-1]
    ref = f"{repo}@{digest}"
    os.environ["COSIGN_PASSWORD"] = PASSWORD
    signer = Signer(str(signed.keys / "cosign.key"))
    signed.cosign().sign(ref, signer)
    source = Source.detect(signed.runner)
    signed.cosign().attest(ref, PROVENANCE, provenance(signed.recipe, "linux/amd64", source), signer)
    attest_image(signed.recipe, ref, "linux/amd64", signed.cosign(), signer, signed.manifests())  # its SBOM
    engine.remove_image(ref)
    if tag == "latest":  # a moving tag: promote's signed log says it names this image
        log_move(signed, tag, digest, {"linux/amd64": digest})
    return ref


def _attest(
    signed: Signed, image: str, tmp_path: Path, gpu, key: Path | None = None, fail: str = "", **change
) -> None:
    """The GPU job's sign.attest of a verify report (signed by `key`, default: the recipe's key); `fail` names
    a check that failed."""
    path = tmp_path / f"report-{time.monotonic_ns()}.json"
    report = json.loads(verify_report(signed, image, "linux/amd64", gpu, path, **change).read_text())
    if fail:
        next(c for c in report["checks"] if c["name"] == fail)["status"] = "failed"
        report["status"] = "failed"
    signer = Signer(str(key or signed.keys / "cosign.key"))
    attest_report(signed.recipe, image, report, signed.cosign(), signer, signed.manifests())


def test_pull_of_a_moving_tag_applies_the_one_rule_to_the_signed_report(
    signed: Signed, tmp_path: Path
) -> None:
    # Hole 1: a GPU run whose vLLM FP8 checks were all skipped, or a run on sm_90, moved 'latest' at pull.
    image = _signed_image(signed, tmp_path, "latest", "rule")
    path = verify_report(signed, image, "linux/amd64", GB10, tmp_path / "skipped.json")
    report = json.loads(path.read_text())
    for check in report["checks"]:  # --gpus auto on a GPU host: the runtime was there, no vLLM kernel ran
        if check["name"] in ("fp8.scaled_fp8_quant", "fp8.cutlass_scaled_mm", "fp8.cutlass_block"):
            check["status"] = "skipped"
    signer = Signer(str(signed.keys / "cosign.key"))
    attest_report(signed.recipe, image, report, signed.cosign(), signer, signed.manifests())
    with pytest.raises(SigningError, match=r"latest is a moving tag .*fp8.scaled_fp8_quant is skipped"):
        pull_signed(signed, "latest")
    _attest(signed, image, tmp_path, H200)  # newer: every check passed, on another GPU
    with pytest.raises(SigningError, match=r"ran on sm_90; recipe targets sm_121"):
        pull_signed(signed, "latest")
    _attest(signed, image, tmp_path, GB10)  # newest: the recipe's GPU, every check passed
    pulled = pull_signed(signed, "latest")
    assert pulled.trust["verified"]["gpu"] == {
        **GB10, "used": True, "why": "", "devices": ["NVIDIA GB10"],
    }  # fmt: skip
    assert pulled.trust["verified"]["imageId"] == signed.manifests().config_digest(image)


def test_a_later_failed_claim_revokes_the_pass(signed: Signed, tmp_path: Path) -> None:
    # Hole 4: a later failed verify attestation did not revoke an earlier pass at pull.
    image = _signed_image(signed, tmp_path, "latest", "revoked")
    _attest(signed, image, tmp_path, GB10)
    assert pull_signed(signed, "latest").trust["verified"]["status"] == "passed"
    _attest(signed, image, tmp_path, GB10, fail="fp8.cutlass_block")  # a later run on the same image failed
    with pytest.raises(
        SigningError, match=r"signed verify attestation that FAILED .*a failure revokes every pass"
    ):
        pull_signed(signed, "latest")
    with pytest.raises(SigningError, match="FAILED"):  # the digest itself, not only the moving tag
        pull_signed(signed, image.rsplit("@", 1)[1])


def test_only_the_verify_signers_claims_count(signed: Signed, tmp_path: Path) -> None:
    # Hole 3: the verify attestation was checked with the publishing signer's identity.
    image = _signed_image(signed, tmp_path, "latest", "verify-signer")
    separate = load_recipe(
        write_recipe_file(
            tmp_path / "separate" / "smoke-signed.yaml",
            f"publish:\n  signing:\n    key: {signed.keys / 'cosign.pub'}\n"
            f"    verify_key: {signed.other_keys / 'cosign.pub'}\n",
            # the base beside it: `extends` stays inside the named recipe's folder (or the project)
            extends=signed_recipe_file(
                tmp_path / "separate" / "base", signed.registry, signed.keys / "cosign.pub"
            ),
        )
    )
    assert separate.hash == signed.recipe.hash
    _attest(signed, image, tmp_path, GB10)  # by the publishing key
    pull_signed(signed, "latest")  # the recipe without verify_key: its own key verifies
    kw = {"platform": "linux/amd64", "runner": signed.runner, "eng": signed.eng}

    quiet = {"echo": lambda _: None, "warn": lambda _: None}
    with pytest.raises(
        SigningError, match=r"carries no signed GPU verify attestation .*other-keys/cosign.pub"
    ):
        calls.pull(separate, "latest", **kw, **quiet)
    _attest(signed, image, tmp_path, GB10, key=signed.other_keys / "cosign.key")  # the verify signer
    assert calls.pull(separate, "latest", **kw, **quiet).trust["verified"]["status"] == "passed"


def test_a_report_is_attested_only_for_the_image_it_verified(signed: Signed, tmp_path: Path) -> None:
    # Hole 7: the report's image ID was never compared with the digest it was attested for.
    image = _signed_image(signed, tmp_path, "other-image-report", "image-id")
    with pytest.raises(
        SigningError, match=r"the report verified image sha256:0{64}, but that digest's image is"
    ):
        _attest(signed, image, tmp_path, GB10, image_id="sha256:" + "0" * 64)
    with pytest.raises(SigningError, match=r"the report verified recipe hash 000000000000"):
        _attest(signed, image, tmp_path, GB10, recipe_hash="0" * 64)
