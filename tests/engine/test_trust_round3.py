"""Trust, round 3, for real (cosign, the local registry, key pairs made here): a registry writer who erases a
failed claim's layer from the `.att` manifest, forges or rolls back a tag's history, or re-points a moving tag
cannot make pull say "verified"; CI attests a verify that crashed; `pull --digest` needs a GPU-verified claim;
claims are read from the verify signer only, and a kernel report is attested only for the image it read.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from registry import ACCEPT
from signing_fixtures import Signed, pull_signed, signed_recipe_file
from test_trust_signed_claims import _attest, _signed_image

from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.registry import releases
from sparkforge.registry.attest import attest_kernels
from sparkforge.registry.cosign import VERIFY_CLAIM, Policy, Signer, SigningError
from sparkforge.registry.trust import judge_claims
from tests import registry_calls as calls
from tests.recipe_files import write_recipe_file
from tests.unit.test_evidence import GB10

pytestmark = pytest.mark.engine


def _claims(signed: Signed, image: str) -> list[dict]:  # the verify signer's claims
    policy = Policy.for_verify(signed.recipe)
    assert policy is not None
    return [s.predicate for s in signed.cosign().attestations(image, policy, VERIFY_CLAIM).statements]


def _erase_failed_claims(signed: Signed, image: str) -> int:
    """What anyone with registry push can do: drop the failed claims' layers from the image's .att manifest."""
    name = signed.recipe.model.publish.repository.split("/", 1)[1]
    tag = image.rsplit("@", 1)[1].replace(":", "-") + ".att"
    found = signed.registry.manifest(name, tag)
    assert found is not None
    _, manifest = found
    kept = []
    for layer in manifest["layers"]:
        envelope = signed.registry.blob(name, layer["digest"])
        statement = json.loads(base64.b64decode(envelope["payload"]))
        if statement["predicate"].get("status") != "failed":
            kept.append(layer)
    manifest["layers"] = kept
    response = requests.put(
        f"{signed.registry.url}/v2/{name}/manifests/{tag}",
        data=json.dumps(manifest),
        headers={"Content-Type": manifest.get("mediaType", "application/vnd.oci.image.manifest.v1+json")},
        timeout=10,
    )
    response.raise_for_status()
    return len(kept)


def _retag(signed: Signed, digest: str, tag: str) -> None:
    """Point `tag` at the manifest `digest`, byte for byte, as anyone with registry push can."""
    name = signed.recipe.model.publish.repository.split("/", 1)[1]
    url = f"{signed.registry.url}/v2/{name}/manifests"
    got = requests.get(f"{url}/{digest}", headers={"Accept": ACCEPT}, timeout=10)
    got.raise_for_status()
    put = requests.put(
        f"{url}/{tag}", data=got.content, headers={"Content-Type": got.headers["Content-Type"]}, timeout=10
    )
    put.raise_for_status()


def _attest_step(signed: Signed, image: str, report: Path | None) -> subprocess.CompletedProcess[str]:
    """The GPU job's attest step, run verbatim: with the verify report, or (verify crashed) without one."""
    target = REPO_ROOT / "reports" / f"{signed.name}-verify.json"
    target.parent.mkdir(exist_ok=True)
    try:
        if report is not None:
            target.write_text(report.read_text())
        # The step derives the image from the merge job's record (--published: test_signing_pull and
        # test_trust_round5 run it so); these single images were never in a published index, so the same command
        # names the image itself.
        swap = ('--published "${PUBLISHED}"', '--image "${IMAGE}"')
        return signed.run_step("Check the evidence against the digest and attest it", swap, IMAGE=image)
    finally:
        target.unlink(missing_ok=True)


def test_a_revocation_survives_erasing_the_failed_claim(signed: Signed, tmp_path: Path) -> None:
    # Revocation was erasable: deleting the failed claim's layer from the .att manifest made pull say verified.
    image = _signed_image(signed, tmp_path, "latest", "erased")
    _attest(signed, image, tmp_path, GB10)
    assert pull_signed(signed, "latest").trust["verified"]["status"] == "passed"
    crashed = _attest_step(signed, image, None)  # verify crashed: CI attests a failed report with the error
    assert crashed.returncode == 0, crashed.stdout + crashed.stderr
    assert (
        "revoked" in crashed.stdout
        and "in the signed TUF targets; latest no longer names it" in crashed.stdout
    )
    assert any("verify did not finish" in str(c.get("report")) for c in _claims(signed, image))
    with pytest.raises(SigningError, match=r"no longer name it: .* is revoked by the signed TUF targets"):
        pull_signed(signed, "latest")
    assert _erase_failed_claims(signed, image) >= 1
    policy = Policy.for_verify(signed.recipe)
    assert policy is not None
    statements = signed.cosign().attestations(image, policy, VERIFY_CLAIM).statements
    assert statements and all(s.predicate["status"] == "passed" for s in statements)  # passes only, now
    config = signed.manifests().config_digest(image)
    judged = judge_claims(signed.recipe, "linux/amd64", image.rsplit("@", 1)[1], config, statements)
    assert (
        judged.verdict.verified and not judged.revoked
    )  # the claims alone (all pull read before) say verified
    with pytest.raises(SigningError, match=r"no longer name it|revoked by the signed TUF targets"):
        pull_signed(signed, "latest")
    with pytest.raises(SigningError, match=r"revoked by the signed TUF targets"):
        pull_signed(signed, image.rsplit("@", 1)[1])  # the digest, not only the moving tag


def test_pull_by_digest_needs_a_gpu_verified_claim(signed: Signed, tmp_path: Path) -> None:
    # pull --digest accepted a digest with no claim (or a CPU or sm_90 one).
    image = _signed_image(signed, tmp_path, "digest-unverified", "digest")
    digest = image.rsplit("@", 1)[1]
    assert pull_signed(signed, digest).image == image  # without the rule (as before): no claim at all
    with pytest.raises(
        SigningError, match=r"every pull needs a signed GPU-verified claim.*--allow-unverified"
    ):
        pull_signed(signed, digest, require_verified=True)
    warned: list[str] = []
    pulled = calls.pull(
        signed.recipe, digest, platform="linux/amd64", runner=signed.runner, eng=signed.eng,
        echo=lambda _: None, warn=warned.append, allow_unverified=True,
    )  # fmt: skip
    assert pulled.image == image and "NOT GPU-VERIFIED" in warned[0]
    cli = subprocess.run(
        [sys.executable, "-m", "invoke", "pull", "--recipe", str(signed.recipe.path), "--digest", digest],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert cli.returncode != 0 and "GPU-verified" in cli.stderr and "Traceback" not in cli.stderr
    _attest(signed, image, tmp_path, GB10)
    shown = releases.pulled(calls.session(signed.runner), signed.recipe, image, digest)
    assert any(line.startswith("release: the signed TUF targets say:") for line in shown["lines"])


def test_claims_are_read_and_shown_from_the_verify_signer_only(signed: Signed, tmp_path: Path) -> None:
    # A verify claim signed by the merge key was shown as passed; a kernel report of another image was attested.
    image = _signed_image(signed, tmp_path, "shown-claims", "shown")
    separate = load_recipe(
        write_recipe_file(
            tmp_path / "separate" / "smoke-signed.yaml",
            f"publish:\n  signing:\n    key: {signed.keys / 'cosign.pub'}\n"
            f"    verify_key: {signed.other_keys / 'cosign.pub'}\n",
            extends=signed_recipe_file(
                tmp_path / "separate" / "base", signed.registry, signed.keys / "cosign.pub"
            ),
        )
    )
    _attest(signed, image, tmp_path, GB10)  # by the publishing key, not separate's verify key
    merge = Policy.of(separate)  # what history and pull --digest read claims with before
    assert merge is not None and signed.cosign().attestations(image, merge, VERIFY_CLAIM).statements
    assert releases.signed_claims(signed.recipe, image, signed.cosign())["verify"]["status"] == "passed"
    assert "verify" not in releases.signed_claims(separate, image, signed.cosign())
    kernels = {"command": "kernels", "facts": {"image_id": "sha256:" + "0" * 64}, "libraries": []}
    with pytest.raises(SigningError, match=r"the kernel report read image sha256:0{64}, but that digest"):
        attest_kernels(
            signed.recipe, image, kernels, signed.cosign(), Signer(str(signed.keys / "cosign.key")),
            signed.manifests(),
        )  # fmt: skip
