"""A real TUF repository in a real local registry (Debian's docker-registry): ed25519 keys made per test.

A "machine" is a cache dir (SPARKFORGE_CACHE): switching it is a fresh machine with the same shipped root.
The "registry writer" (an attacker with push rights and no keys) works through the registry's HTTP API.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata

from sparkforge.registry import tufclient, tufrepo, tufstore
from sparkforge.registry.ocidist import Registry
from tests.engine.registry import LocalRegistry, local_registry, unavailable_reason
from tests.prerequisites import fail_if_required

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64
DIGEST_C = "sha256:" + "c" * 64


def digest(n: int) -> str:
    return f"sha256:{n:064x}"


@dataclass
class TufWorld:
    local: LocalRegistry
    repository: str
    tmp: Path
    root_signer: CryptoSigner
    online: CryptoSigner
    root_path: Path
    patch: pytest.MonkeyPatch
    online_uri: str = ""

    @property
    def registry(self) -> Registry:
        return Registry(self.repository)

    def machine(self, name: str) -> None:
        """Act as machine `name` from now on (its own cache dir: a new name is a fresh machine)."""
        self.patch.setenv("SPARKFORGE_CACHE", str(self.tmp / "machines" / name))

    def target(self, tag: str, index: str, image: str, claim: str = "") -> tufclient.TagTarget:
        return tufclient.TagTarget(
            tag, index, {"linux/arm64": image}, {"linux/arm64": [claim or "f" * 64]}, "smoke", "0" * 64
        )

    def trusted_dir(self) -> Path:
        """This machine's trusted metadata folder (keyed by the dev root's fingerprint)."""
        return tufclient.metadata_dir(self.repository, self.root_path.read_bytes())

    def stale_checkout(self, name: str) -> Path:
        """A copy of the committed metadata as it is now (a checkout that will fall behind); see `use_checkout`."""
        import shutil

        folder = self.tmp / "checkouts" / name / "tuf"
        shutil.copytree(self.tmp / "git" / "tuf", folder)
        return folder

    def use_checkout(self, folder: Path) -> None:
        """Write from this checkout's committed metadata from now on."""
        self.patch.setenv(tufrepo.METADATA_ENV, str(folder))

    def keep_timestamp(self) -> None:
        """What a registry writer can always do: keep a copy of each timestamp it was served."""
        data = self.registry.artifact("tuf-timestamp", tufstore.MAX_BYTES)
        assert data is not None
        version = Metadata.from_bytes(data).signed.version
        (self.tmp / "timestamps").mkdir(exist_ok=True)
        (self.tmp / "timestamps" / f"{version}.json").write_bytes(data)

    def put_old_timestamp(self, version: int) -> None:
        """The registry writer re-points tuf-timestamp at the kept timestamp of `version`."""
        data = (self.tmp / "timestamps" / f"{version}.json").read_bytes()
        self.registry.put_artifact("tuf-timestamp", tufstore.ARTIFACT_TYPE, tufstore.LAYER_TYPE, data)

    def tags(self) -> list[str]:
        return self.local.tags(self.repository.split("/", 1)[1])

    def delete_tag(self, tag: str) -> None:
        """What a registry writer does: delete the manifest a tag names (distribution deletes by digest)."""
        import requests

        name = self.repository.split("/", 1)[1]
        found = self.local.manifest(name, tag)
        assert found is not None, tag
        requests.delete(f"{self.local.url}/v2/{name}/manifests/{found[0]}", timeout=10).raise_for_status()


def ed25519_key_file(path: Path) -> tuple[CryptoSigner, str]:
    """A new ed25519 key written where `file2:` URIs read keys (PKCS#8 PEM): its signer and that URI."""
    key = Ed25519PrivateKey.generate()
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return CryptoSigner(key), f"file2:{path}"


def start_tuf(local: LocalRegistry, repository: str, tmp: Path, patch: pytest.MonkeyPatch) -> TufWorld:
    """A new TUF repository in `repository`: root v1 (one ed25519 root key) and one online key; this process
    trusts that root in dev mode, signs with the online key, and acts as machine "publisher"."""
    patch.setenv(tufrepo.METADATA_ENV, str(tmp / "git" / "tuf"))  # the publisher's checkout (git: the truth)
    root_signer = CryptoSigner.generate_ed25519()
    online, online_uri = ed25519_key_file(tmp / "online.pem")
    root = tufrepo.new_root([root_signer.public_key], [online.public_key])
    tufrepo.init_repository(Registry(repository), root, [root_signer], online)
    root_path = tmp / "root.json"
    root_path.write_bytes(Registry(repository).artifact("tuf-root-1", tufstore.MAX_BYTES) or b"")
    patch.setenv(tufclient.DEV_ROOT_ENV, str(root_path))
    patch.setenv(tufrepo.SIGNER_ENV, online_uri)
    patch.setattr(tufclient, "ROOTS_DIR", tmp / "no-shipped-roots")
    patch.delenv("SPARKFORGE_REGISTRY_USER", raising=False)
    world = TufWorld(local, repository, tmp, root_signer, online, root_path, patch, online_uri)
    world.machine("publisher")
    world.keep_timestamp()
    return world


@pytest.fixture
def tuf_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TufWorld]:
    why = unavailable_reason()
    if why:
        fail_if_required(why)
        pytest.skip(why)
    with local_registry(tmp_path / "registry") as local:
        yield start_tuf(local, f"{local.host}/sparkforge/tuf-smoke", tmp_path, monkeypatch)
