"""What `pull` refuses, for real, offline: an unsigned image (unless allowed, loudly), another key's
signature, a tag re-pushed with other content, provenance for another recipe hash, a moving tag without a
GPU-verified attestation, and labels that claim another commit than the signed provenance.

The signed smoke images, keys and registry are shared with test_signing_pull.py (signing_fixtures.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from signing_fixtures import (
    PASSWORD,
    PLATFORMS,
    Signed,
    docker_build,
    log_move,
    pull_signed,
    signed_recipe_file,
    verify_report,
)

from sparkforge import engine
from sparkforge.errors import EngineError
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.registry.cosign import PROVENANCE, Signer, SigningError, Source, provenance
from sparkforge.registry.manifests import Manifests
from tests import registry_calls as calls
from tests.unit.test_evidence import GB10

pytestmark = pytest.mark.engine


def _rebuilt(signed: Signed, tmp_path: Path, tag: str, revision: str = "") -> str:
    """The amd64 smoke image with other bytes (same labels), pushed under `tag`; returns its digest."""
    ref = f"{signed.recipe.model.publish.repository}:{tag}"
    extra = f"LABEL org.opencontainers.image.revision={revision}\n" if revision else ""
    # From the registry by digest: a local tag may be gone (other test runs on the machine clean sparkforge-test/ images).
    source = f"{signed.recipe.model.publish.repository}@{signed.published.platforms['linux/amd64']}"
    dockerfile = f"FROM {source}\nLABEL rebuilt={tag}\n{extra}"
    docker_build(dockerfile, "linux/amd64", ref, tmp_path / tag)
    output = subprocess.run(
        ["/usr/bin/docker", "push", ref], check=True, capture_output=True, text=True
    ).stdout
    engine.remove_image(ref)
    return re.findall(r"digest: (sha256:[0-9a-f]{64})", output)[-1]


def test_refuses_an_unsigned_image_unless_allowed_loudly(signed: Signed, tmp_path: Path) -> None:
    digest = _rebuilt(signed, tmp_path, "unsigned")
    with pytest.raises(SigningError, match=rf"@{digest} has no valid signature by key .*no signatures found"):
        pull_signed(signed, "unsigned")
    cli = subprocess.run(  # the task: one paragraph, non-zero, no traceback
        [sys.executable, "-m", "invoke", "pull", "--recipe", str(signed.recipe.path), "--tag", "unsigned"],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 1 and "Traceback" not in cli.stderr
    dev = "sparkforge: WARNING (TEST/DEV MODE"  # the test's own TUF root announces itself; then one paragraph
    stderr = "".join(ln for ln in cli.stderr.splitlines(keepends=True) if not ln.startswith(dev))
    assert stderr.startswith("sparkforge: refusing") and stderr.strip().count("\n") == 0
    assert "--allow-unsigned" in cli.stderr
    warnings: list[str] = []
    pulled = calls.pull(
        signed.recipe,
        "unsigned",
        platform="linux/amd64",
        runner=signed.runner,
        eng=signed.eng,
        echo=lambda _: None,
        warn=warnings.append,
        allow_unsigned=True,
        allow_unverified=True,
    )
    assert pulled.trust["unsigned"] is True and "NOT VERIFIED" in warnings[0]
    engine.remove_image(pulled.image)


def test_refuses_a_signature_by_another_key(signed: Signed, tmp_path: Path) -> None:
    digest = _rebuilt(signed, tmp_path, "other-key")
    ref = f"{signed.recipe.model.publish.repository}@{digest}"
    os.environ["COSIGN_PASSWORD"] = PASSWORD
    signed.cosign().sign(ref, Signer(str(signed.other_keys / "cosign.key")))
    with pytest.raises(SigningError, match=r"no valid signature by key .*(invalid signature|no matching)"):
        pull_signed(signed, "other-key")


def test_refuses_a_tag_re_pushed_with_other_content(signed: Signed, tmp_path: Path) -> None:
    repo = signed.recipe.model.publish.repository
    sources = [f"{repo}@{signed.published.platforms[p]}" for p in PLATFORMS]
    signed.manifests().create([f"{repo}:stable-copy"], sources)
    first = pull_signed(signed, "stable-copy")  # the same signed images under another tag: accepted
    assert first.trust["top"] == signed.published.index
    digest = _rebuilt(signed, tmp_path, "stable-copy")
    with pytest.raises(
        SigningError, match=rf"refusing {re.escape(repo)}:stable-copy .*@{digest} has no valid"
    ):
        pull_signed(signed, "stable-copy")


def test_refuses_provenance_for_another_recipe_hash(signed: Signed, tmp_path: Path) -> None:
    other = load_recipe(
        signed_recipe_file(
            tmp_path / "other", signed.registry, signed.keys / "cosign.pub", transformers="5.20.1"
        )
    )
    assert other.hash != signed.recipe.hash
    digest = _rebuilt(signed, tmp_path, "other-hash")
    ref = f"{signed.recipe.model.publish.repository}@{digest}"
    os.environ["COSIGN_PASSWORD"] = PASSWORD
    signer = Signer(str(signed.keys / "cosign.key"))
    signed.cosign().sign(ref, signer)
    source = Source.detect(signed.runner)
    signed.cosign().attest(ref, PROVENANCE, provenance(other, "linux/amd64", source), signer)
    with pytest.raises(SigningError, match=rf"signed provenance is for another recipe .*{other.hash[:12]}"):
        pull_signed(signed, "other-hash")


def test_moving_tag_needs_a_gpu_verified_attestation_for_the_platform(signed: Signed, tmp_path: Path) -> None:
    # A moving tag that reached the registry without a signed GPU attestation (by any path): pull refuses it.
    tools = Manifests(signed.eng, signed.runner, signed.recipe.model.publish.repository)
    repo = signed.recipe.model.publish.repository
    tools.create([f"{repo}:latest"], [f"{repo}@{d}" for d in signed.published.platforms.values()])
    log_move(
        signed, "latest", signed.published.index, dict(signed.published.platforms)
    )  # promote's signed log
    with pytest.raises(SigningError, match=r"latest is a moving tag.*no signed GPU verify attestation"):
        pull_signed(signed, "latest", allow_unsigned=True)  # --allow-unsigned does not apply to moving tags
    amd64 = f"{signed.recipe.model.publish.repository}@{signed.published.platforms['linux/amd64']}"
    cpu_only = verify_report(signed, amd64, "linux/amd64", None, tmp_path / "cpu.json")
    os.environ["COSIGN_PASSWORD"] = PASSWORD
    from sparkforge.registry.attest import attest_report

    signer = Signer(str(signed.keys / "cosign.key"))
    attest_report(signed.recipe, amd64, json.loads(cpu_only.read_text()), signed.cosign(), signer)
    with pytest.raises(SigningError, match=r"latest is a moving tag .*linux/amd64.*no GPU was used"):
        pull_signed(signed, "latest")
    gpu = verify_report(signed, amd64, "linux/amd64", GB10, tmp_path / "gpu.json")
    attest_report(signed.recipe, amd64, json.loads(gpu.read_text()), signed.cosign(), signer)
    pulled = pull_signed(signed, "latest")
    assert (
        pulled.trust["verified"]["gpu"]["used"] is True
        and pulled.trust["verified"]["gpu"]["capability"] == "12.1"
    )
    assert pulled.trust["verified"]["gpu"]["devices"] == ["NVIDIA GB10"]


def test_refuses_labels_that_claim_another_commit(signed: Signed, tmp_path: Path) -> None:
    digest = _rebuilt(signed, tmp_path, "other-commit", revision="0" * 40)
    ref = f"{signed.recipe.model.publish.repository}@{digest}"
    os.environ["COSIGN_PASSWORD"] = PASSWORD
    signer = Signer(str(signed.keys / "cosign.key"))
    signed.cosign().sign(ref, signer)
    source = Source.detect(signed.runner)  # the signer vouches for this checkout's commit, not the label's
    signed.cosign().attest(ref, PROVENANCE, provenance(signed.recipe, "linux/amd64", source), signer)
    expected = rf"revision=0{{40}} is not the commit its signed provenance names \({source.revision}\)"
    with pytest.raises(SigningError, match=expected):
        pull_signed(signed, "other-commit")
    with pytest.raises(
        EngineError, match="is not in the local engine"
    ):  # removed again: nothing of it stays locally, nothing is tagged
        engine.inspect_image(ref)
