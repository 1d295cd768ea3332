"""Keyless identities against real cosign: certificates like Fulcio's for GitHub Actions (the SAN names the
workflow file and ref; extensions carry the caller's repository, trigger and ref), issued by a CA made here
(Sigstore's Fulcio is not reachable here), checked with the flag sets `Policy.verify_argsets` builds.

Reusable workflow hole: a caller in another repository gets a certificate whose SAN names *our* gpu-attest.yml on
main; only the workflow-repository pin tells it apart.
"""

from __future__ import annotations

import base64
import datetime as dt
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sparkforge.recipe.identity import parse_identity
from sparkforge.registry.cosign import Policy

ISSUER = "https://token.actions.githubusercontent.com"
VERIFY = r"^https://github.com/sparkforge/sparkforge/\.github/workflows/gpu-attest\.yml@refs/heads/main$"
SAN = "https://github.com/sparkforge/sparkforge/.github/workflows/gpu-attest.yml@refs/heads/main"
FULCIO = "1.3.6.1.4.1.57264.1."  # issuer .1, trigger .2, sha .3, workflow name .4, repository .5, ref .6

pytestmark = pytest.mark.skipif(
    not shutil.which("cosign"), reason="cosign is not installed (invoke sign.install)"
)


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _ca(folder: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("test fulcio"))
        .issuer_name(_name("test fulcio"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(key, hashes.SHA256())
    )
    (folder / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert


def _signed_blob(folder: Path, ca, san: str, repository: str, trigger: str, ref: str) -> Path:
    """A blob signed with a short-lived certificate carrying GitHub's claims, as Fulcio issues it."""
    ca_key, ca_cert = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    claims = {"1": ISSUER, "2": trigger, "3": "0" * 40, "4": "images", "5": repository, "6": ref}
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(minutes=10))
        .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(san)]), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
    )
    for suffix, value in claims.items():  # the deprecated raw-string forms cosign's github flags read
        oid = x509.ObjectIdentifier(FULCIO + suffix)
        builder = builder.add_extension(x509.UnrecognizedExtension(oid, value.encode()), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    blob = folder / f"blob-{repository.replace('/', '-')}-{trigger}-{ref.replace('/', '-')}"
    blob.write_bytes(b"a GPU verify claim")
    blob.with_suffix(".pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    signature = key.sign(blob.read_bytes(), ec.ECDSA(hashes.SHA256()))
    blob.with_suffix(".sig").write_text(base64.b64encode(signature).decode())
    return blob


def _accepted(blob: Path, flags: tuple[str, ...], folder: Path) -> bool:
    argv = [
        "cosign", "verify-blob", "--certificate", str(blob.with_suffix(".pem")), "--ca-roots",
        str(folder / "ca.pem"), "--signature", str(blob.with_suffix(".sig")), "--insecure-ignore-tlog=true",
        "--insecure-ignore-sct=true", *flags, str(blob),
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60).returncode == 0


def _policy_accepts(blob: Path, folder: Path) -> bool:
    policy = Policy(identity=VERIFY, issuer=ISSUER, allowed=parse_identity(VERIFY, verify=True))
    return any(_accepted(blob, flags, folder) for flags in policy.verify_argsets())


def test_a_certificate_of_this_repositorys_main_run_is_accepted(tmp_path: Path) -> None:
    ca = _ca(tmp_path)
    ours = _signed_blob(tmp_path, ca, SAN, "sparkforge/sparkforge", "workflow_dispatch", "refs/heads/main")
    assert _policy_accepts(ours, tmp_path)


def test_a_caller_in_another_repository_is_refused(tmp_path: Path) -> None:
    ca = _ca(tmp_path)
    fork = _signed_blob(tmp_path, ca, SAN, "someone/fork", "workflow_dispatch", "refs/heads/main")
    before = ("--certificate-identity-regexp", VERIFY, "--certificate-oidc-issuer", ISSUER)
    assert _accepted(fork, before, tmp_path)  # the identity regexp alone (as pull checked it) accepts it
    assert not _policy_accepts(fork, tmp_path)


@pytest.mark.parametrize(
    ("trigger", "ref"),
    [
        ("pull_request_target", "refs/heads/main"),  # a pull request's event, on main's copy
        ("workflow_run", "refs/heads/main"),
        ("workflow_dispatch", "refs/heads/feature"),  # a branch calling gpu-attest.yml@main
    ],
)
def test_another_trigger_or_caller_ref_is_refused(tmp_path: Path, trigger: str, ref: str) -> None:
    ca = _ca(tmp_path)
    other = _signed_blob(tmp_path, ca, SAN, "sparkforge/sparkforge", trigger, ref)
    assert not _policy_accepts(other, tmp_path)


def test_a_release_tags_own_workflow_copy_is_refused_for_verify_claims(tmp_path: Path) -> None:
    ca = _ca(tmp_path)
    tag = SAN.replace("refs/heads/main", "refs/tags/v9.9.9")
    pushed = _signed_blob(tmp_path, ca, tag, "sparkforge/sparkforge", "push", "refs/tags/v9.9.9")
    old = r"^https://github.com/sparkforge/sparkforge/\.github/workflows/gpu-attest\.yml@refs/(heads/main|tags/v[0-9]+\.[0-9]+\.[0-9]+)$"
    assert _accepted(
        pushed, ("--certificate-identity-regexp", old, "--certificate-oidc-issuer", ISSUER), tmp_path
    )
    assert not _policy_accepts(pushed, tmp_path)
