"""A publisher's own TUF root: `trust.init` (the root ceremony), `trust.rotate`, `trust.recover` (an online-key
leak) and `trust.status` (what this machine trusts). docs/trust.md: Publishers own their roots.

Offline root keys and the online key are private key files (PEM, PKCS#8: ed25519, ECDSA or RSA) read here and
never written; a keyless online role is a Sigstore identity (the workflow file's URL at a ref, which names the
repository, the workflow and the ref) that CI signs with. The root file goes where the recipe says
(publish.signing.trust_root); the metadata goes to the committed folder (git: the truth) and the registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from securesystemslib.signer import CryptoSigner, Key, SigstoreKey
from tuf.api.metadata import Metadata, Root

from sparkforge import console
from sparkforge.boundary import read_bytes, write_output
from sparkforge.errors import PublishError
from sparkforge.recipe.loader import Recipe
from sparkforge.registry import tufclient, tufrepo, tufstore
from sparkforge.registry.ocidist import Registry

MAX_KEY_BYTES = 64 << 10
GITHUB_ISSUER = "https://token.actions.githubusercontent.com"


def key_signer(path: Path, what: str) -> CryptoSigner:
    """A signer over a private key file (the key never leaves this process)."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    data = read_bytes(path, what, MAX_KEY_BYTES)
    try:
        return CryptoSigner(load_pem_private_key(data, None))  # type: ignore[arg-type]
    except (ValueError, TypeError) as exc:
        raise PublishError(
            f"{what} {path}: not an unencrypted PEM private key ({exc}); fix: an ed25519 key in PKCS#8 PEM, e.g. "
            "'openssl genpkey -algorithm ed25519 -out root1.pem'"
        ) from None


@dataclass(frozen=True)
class Online:
    """The online roles' key: a key file (forks, private registries) or a keyless CI identity."""

    key_file: Path | None = None
    identity: str = ""  # https://github.com/OWNER/REPO/.github/workflows/FILE.yml@refs/heads/main
    issuer: str = GITHUB_ISSUER

    def public(self) -> Key:
        if self.key_file is not None:
            return key_signer(self.key_file, "--online-key").public_key
        if not self.identity.startswith("https://github.com/") or "/.github/workflows/" not in self.identity:
            raise PublishError(
                f"--online-identity {self.identity!r}: fix: the workflow's URL at its ref, e.g. "
                "https://github.com/me/sparkforge/.github/workflows/gpu-attest.yml@refs/heads/main"
            )
        return SigstoreKey(
            "online", "sigstore-oidc", "Fulcio", {"identity": self.identity, "issuer": self.issuer}
        )

    def uri(self) -> str:
        return f"file2:{self.key_file}" if self.key_file else "sigstore:?ambient=true"


def _root_file(recipe: Recipe) -> Path:
    found = tufclient.root_file_of(recipe)
    if found is None:
        raise PublishError(
            f"recipe {recipe.name} names no TUF root file; fix: add publish.signing.trust_root: "
            f"trust/{tufclient.root_file_name(recipe.model.publish.repository)} (and publish.signing.source: your "
            "repository's URL) to the recipe, then run this again"
        )
    return found


def init(recipe: Recipe, root_keys: Sequence[Path], threshold: int, online: Online) -> str:
    """Root v1 (the root keys, `threshold` of them to sign a root; the online key); with a key file, the first
    targets, snapshot and timestamp too (keyless: CI's first 'sign.tuf-timestamp' writes them). The root goes
    to the recipe's trust_root file; its fingerprint is returned."""
    repository = recipe.model.publish.repository
    target = _root_file(recipe)
    if tufrepo.newest(tufrepo.committed_dir(repository), "root")[0]:
        raise PublishError(
            f"{repository} already has committed TUF metadata ({tufrepo.committed_dir(repository)}); fix: "
            "'invoke trust.rotate' changes its keys ('trust.recover' after an online-key leak)"
        )
    if not 1 <= threshold <= len(root_keys):
        raise PublishError(
            f"--threshold {threshold}: fix: between 1 and the {len(root_keys)} --root-key given"
        )
    signers = [key_signer(p, "--root-key") for p in root_keys]
    root = tufrepo.new_root([s.public_key for s in signers], [online.public()], threshold)
    registry = Registry(repository)
    if online.key_file is not None:
        tufrepo.init_repository(registry, root, signers, key_signer(online.key_file, "--online-key"))
    else:
        tufrepo.publish_root(registry, root, signers)
    data = registry.artifact("tuf-root-1", tufstore.MAX_BYTES)
    assert data is not None
    write_output(target, data, "the recipe's TUF root")
    return tufclient.root_fingerprint(data)


def _current(repository: str) -> Metadata[Root]:
    version, data = tufrepo.newest(tufrepo.committed_dir(repository), "root")
    if not version:
        raise PublishError(f"{repository} has no committed TUF root; fix: 'invoke trust.init' first")
    return Metadata[Root].from_bytes(data)


def rotate(
    recipe: Recipe,
    sign_keys: Sequence[Path],
    root_keys: Sequence[Path] = (),
    threshold: int = 0,
    online: Online | None = None,
) -> int:
    """Root N+1: new root keys (and threshold) and/or a new online key, signed by `sign_keys` (a threshold of
    root N's keys and of N+1's). Clients follow the chain; the recipe's root file stays the chain's start."""
    repository = recipe.model.publish.repository
    current = _current(repository)
    signers = [key_signer(p, "--sign-key") for p in sign_keys]
    new_root = [key_signer(p, "--root-key") for p in root_keys]
    online_key = online.public() if online else None

    def change(root: Root) -> None:
        if new_root:
            for keyid in list(root.roles["root"].keyids):
                root.revoke_key(keyid, "root")
            for signer in new_root:
                root.add_key(signer.public_key, "root")
        if threshold:
            root.roles["root"].threshold = threshold
        if online_key is not None:
            for role in tufrepo.ONLINE:
                for keyid in list(root.roles[role].keyids):
                    root.revoke_key(keyid, role)
                root.add_key(online_key, role)

    data = tufrepo.rotate_root(Registry(repository), current, change, [*signers, *new_root])
    return tufclient.version_of(data)


def recover(
    recipe: Recipe, sign_keys: Sequence[Path], online: Online, warn: console.Echo = console.warn
) -> int:
    """After an online-key leak: root N+1 names the new online key (signed by the root keys), then targets,
    snapshot and timestamp are signed again with it at version+1; what the leaked key signed no longer verifies."""
    version = rotate(recipe, sign_keys, online=online)
    if online.key_file is not None:
        tufrepo.change_targets(
            recipe.model.publish.repository,
            lambda targets, state: None,
            warn=warn,
            root_file=tufclient.root_file_of(recipe),
            signer_uri=online.uri(),
        )
    return version


def status(recipe: Recipe, warn: console.Echo = console.warn) -> dict[str, Any]:
    """What this machine trusts for the recipe's repository, and what the committed metadata holds."""
    repository = recipe.model.publish.repository
    root_file = tufclient.root_file_of(recipe)
    start = tufclient.trusted_root(repository, warn, root_file)
    folder = tufclient.metadata_dir(repository, start)
    shipped = tufclient.ROOTS_DIR / tufclient.root_file_name(repository)
    source = (
        str(root_file)
        if root_file
        else str(shipped)
        if shipped.is_file()
        else f"{tufclient.DEV_ROOT_ENV} (DEV)"
    )
    roles = {}
    for role in ("root", "timestamp", "snapshot", "targets"):
        path = folder / f"{role}.json"
        if path.is_file():  # the folder was checked (tufcache): a regular file, read through the boundary
            signed = Metadata.from_bytes(read_bytes(path, "trust cache", 16 << 20, within=(folder,))).signed
            roles[role] = {"version": signed.version, "expires": signed.expires.isoformat()}
    committed = tufrepo.committed_dir(repository)
    return {
        "repository": repository,
        "root": source,
        "fingerprint": tufclient.root_fingerprint(start),
        "trusted": roles,
        "cache": str(folder),
        "refused_heads": len(tufclient.json_list(folder / tufclient.REFUSED_FILE)),
        "revoked_seen": len(tufclient.json_list(folder / tufclient.REVOKED_FILE)),
        "committed": {role: tufrepo.newest(committed, role)[0] for role in ("root", "targets", "snapshot")},
    }
