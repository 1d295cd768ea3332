"""The TUF client and writer against a real registry process: every attack of issue 47 refused or handled.

Real python-tuf metadata signed with ed25519 keys made in the test, stored as OCI artifacts in Debian's
docker-registry on 127.0.0.1; the registry writer (push rights, no keys) acts through the HTTP API.
"""

from __future__ import annotations

import datetime as dt

import pytest
from tuf.api.metadata import Metadata, Root

from sparkforge.errors import PublishError
from sparkforge.registry import tufclient, tufrepo
from tests.unit.tuf_fixtures import TufWorld, digest
from tests.unit.tuf_fixtures import tuf_world as tuf_world

X, X_IMAGE, Y, Y_IMAGE = digest(1), digest(2), digest(3), digest(4)


def _promote_then_revoke(world: TufWorld) -> None:
    tufrepo.move_tag(world.repository, world.target("latest", Y, Y_IMAGE))  # targets v2
    world.keep_timestamp()
    tufrepo.move_tag(world.repository, world.target("latest", X, X_IMAGE))  # v3: latest -> X
    world.keep_timestamp()
    tufrepo.revoke(world.repository, {X_IMAGE: "verify failed: fp8.cutlass_block"})  # v4
    world.keep_timestamp()


def test_move_and_revoke_are_seen_by_a_fresh_machine(tuf_world: TufWorld) -> None:
    _promote_then_revoke(tuf_world)
    tuf_world.machine("fresh")
    state = tufclient.refresh(tuf_world.repository)
    assert state.version == 4
    assert "latest" not in state.tags  # revocation = a targets version without the image
    assert [h["index"] for h in state.removed["latest"].history] == [Y]  # its moves kept for rollback
    assert "verify failed" in state.revoked_of(X, X_IMAGE)
    assert set(tuf_world.tags()) >= {"tuf-root-1", "tuf-timestamp", "tuf-targets-4", "tuf-snapshot-4"}


def test_history_of_a_tag_is_kept_in_the_signed_targets(tuf_world: TufWorld) -> None:
    tufrepo.move_tag(tuf_world.repository, tuf_world.target("latest", Y, Y_IMAGE))
    state = tufrepo.move_tag(tuf_world.repository, tuf_world.target("latest", X, X_IMAGE))
    latest = state.tags["latest"]
    assert (latest.index, latest.platforms, [h["index"] for h in latest.history]) == (
        X,
        {"linux/arm64": X_IMAGE},
        [Y],
    )


def test_rollback_of_the_metadata_is_refused_by_a_machine_that_saw_the_revocation(
    tuf_world: TufWorld,
) -> None:
    _promote_then_revoke(tuf_world)
    tuf_world.machine("seen")
    tufclient.refresh(tuf_world.repository)
    # the registry writer puts back the timestamp of v3 (latest -> X, not yet revoked)
    tuf_world.put_old_timestamp(3)
    tuf_world.machine("seen")
    with pytest.raises(PublishError, match=r"older TUF version than this machine trusts.*a rollback"):
        tufclient.refresh(tuf_world.repository)


def test_deleted_metadata_is_refused(tuf_world: TufWorld) -> None:
    _promote_then_revoke(tuf_world)
    tuf_world.machine("seen")
    tufclient.refresh(tuf_world.repository)
    tuf_world.delete_tag("tuf-timestamp")
    with pytest.raises(PublishError, match=r"missing from the registry.*deleted"):
        tufclient.refresh(tuf_world.repository)
    tuf_world.machine("fresh")  # a fresh machine cannot be told "nothing was ever revoked" either
    with pytest.raises(PublishError, match="missing from the registry"):
        tufclient.refresh(tuf_world.repository)


def test_freeze_an_expired_timestamp_is_refused(tuf_world: TufWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(tufrepo.TTL, "timestamp", dt.timedelta(seconds=-1))  # signed already expired
    with pytest.raises(PublishError, match=r"expired.*a freeze"):  # the writer's own read-back refuses it
        tufrepo.move_tag(tuf_world.repository, tuf_world.target("latest", Y, Y_IMAGE))
    tuf_world.machine("fresh")
    with pytest.raises(PublishError, match=r"expired.*a freeze"):
        tufclient.refresh(tuf_world.repository)
    # the daily re-sign (sign.tuf-timestamp) starts from the committed metadata, from any machine; the expired
    # timestamp in the registry is reported as an incident, never taken as a base
    monkeypatch.setitem(tufrepo.TTL, "timestamp", dt.timedelta(days=2))
    tuf_world.machine("ci-runner")
    said: list[str] = []
    tufrepo.change_targets(tuf_world.repository, lambda targets, state: None, warn=said.append)
    assert any("INCIDENT" in line and "not a base" in line for line in said)
    tuf_world.machine("fresh2")
    state = tufclient.refresh(tuf_world.repository)
    assert (state.version, state.tags["latest"].index) == (3, Y)


def test_fork_at_equal_version_is_refused(tuf_world: TufWorld) -> None:
    """A publisher with a stale checkout (v3) on a rolled-back registry writes v4 again with other content."""
    tufrepo.move_tag(tuf_world.repository, tuf_world.target("latest", Y, Y_IMAGE))  # v2
    tufrepo.move_tag(tuf_world.repository, tuf_world.target("latest", X, X_IMAGE))  # v3
    stale = tuf_world.stale_checkout("stale")
    tuf_world.keep_timestamp()
    tufrepo.revoke(tuf_world.repository, {X_IMAGE: "verify failed"})  # v4 revokes X
    tuf_world.machine("seen")
    tufclient.refresh(tuf_world.repository)
    for tag in ("tuf-timestamp", "tuf-targets-4", "tuf-snapshot-4"):
        tuf_world.delete_tag(tag)
    tuf_world.put_old_timestamp(3)
    tuf_world.use_checkout(stale)
    tuf_world.machine(
        "fresh-publisher"
    )  # never saw v4: TUF alone cannot tell it (docs/trust.md: freeze window)
    tufrepo.move_tag(tuf_world.repository, tuf_world.target("latest", X, X_IMAGE))  # the forked v4
    tuf_world.machine("seen")
    with pytest.raises(PublishError, match="a fork"):
        tufclient.refresh(tuf_world.repository)
    tuf_world.machine("fresh-publisher")
    tufrepo.move_tag(tuf_world.repository, tuf_world.target("latest", X, X_IMAGE))  # fork v5 on top
    tuf_world.machine("seen")
    with pytest.raises(
        PublishError, match=r"refused before|does not descend from the targets v4 this machine"
    ):
        tufclient.refresh(tuf_world.repository)


def test_a_writer_on_a_rolled_back_registry_writes_on_the_committed_metadata(
    tuf_world: TufWorld,
) -> None:
    """The registry writer puts back the pre-revocation timestamp; a writer on a fresh runner starts from git
    (v4, with the revocation), writes v5 on top of it, and repairs the mirror: the revocation stays."""
    _promote_then_revoke(tuf_world)
    tuf_world.delete_tag("tuf-timestamp")
    tuf_world.put_old_timestamp(3)
    tuf_world.machine("fresh-ci-runner")
    with pytest.raises(PublishError, match="revoked by the signed TUF targets"):
        tufrepo.move_tag(tuf_world.repository, tuf_world.target("latest", X, X_IMAGE))
    state = tufrepo.move_tag(tuf_world.repository, tuf_world.target("latest", Y, Y_IMAGE))
    assert state.version == 5 and "verify failed" in state.revoked_of(X_IMAGE)


def test_a_write_refuses_a_later_version_it_did_not_write(tuf_world: TufWorld) -> None:
    """A checkout that fell behind (another job wrote since) refuses to sign on top of its stale base."""
    stale = tuf_world.stale_checkout("behind")
    tufrepo.move_tag(
        tuf_world.repository, tuf_world.target("latest", Y, Y_IMAGE)
    )  # v2, from the main checkout
    tuf_world.use_checkout(stale)
    with pytest.raises(PublishError, match=r"registry holds timestamp v2.*did not write; nothing was signed"):
        tufrepo.move_tag(tuf_world.repository, tuf_world.target("latest", X, X_IMAGE))
    assert not (tufrepo.committed_dir(tuf_world.repository) / "2.targets.json").exists()


def test_revoked_image_cannot_be_promoted_again(tuf_world: TufWorld) -> None:
    _promote_then_revoke(tuf_world)
    with pytest.raises(PublishError, match="revoked by the signed TUF targets"):
        tufrepo.move_tag(tuf_world.repository, tuf_world.target("latest", X, X_IMAGE))


def test_no_trusted_root_refuses_to_run(tuf_world: TufWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tufclient.DEV_ROOT_ENV)
    tuf_world.machine("fresh")
    with pytest.raises(PublishError, match="no trusted TUF root"):
        tufclient.refresh(tuf_world.repository)
    tuf_world.machine("publisher")  # a cached root alone is not enough either
    with pytest.raises(PublishError, match="no trusted TUF root"):
        tufclient.refresh(tuf_world.repository)


def test_a_shipped_root_is_trusted_without_dev_mode(
    tuf_world: TufWorld, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shipped = tuf_world.tmp / "shipped"
    shipped.mkdir()
    (shipped / tufclient.root_file_name(tuf_world.repository)).write_bytes(tuf_world.root_path.read_bytes())
    monkeypatch.setattr(tufclient, "ROOTS_DIR", shipped)
    monkeypatch.delenv(tufclient.DEV_ROOT_ENV)
    tuf_world.machine("fresh")
    assert tufclient.refresh(tuf_world.repository).version == 1
    assert "DEV MODE" not in capsys.readouterr().err


def test_root_rotation_through_the_chain(tuf_world: TufWorld) -> None:
    """Maintainers rotate the root key; a fresh machine starting from the shipped v1 follows the chain, and a
    root v3 signed only by the retired key is refused."""
    from securesystemslib.signer import CryptoSigner

    new_root_key = CryptoSigner.generate_ed25519()
    current = Metadata[Root].from_bytes(tuf_world.root_path.read_bytes())

    def change(root: Root) -> None:
        root.revoke_key(tuf_world.root_signer.public_key.keyid, "root")
        root.add_key(new_root_key.public_key, "root")

    v2 = tufrepo.rotate_root(tuf_world.registry, current, change, [tuf_world.root_signer, new_root_key])
    tuf_world.machine("fresh")
    tufclient.refresh(tuf_world.repository)
    trusted = Metadata[Root].from_file(str(tuf_world.trusted_dir() / "root.json"))
    assert (trusted.signed.version, list(trusted.signed.roles["root"].keyids)) == (
        2,
        [new_root_key.public_key.keyid],
    )
    tufrepo.rotate_root(
        tuf_world.registry, Metadata[Root].from_bytes(v2), lambda root: None, [tuf_world.root_signer]
    )
    tuf_world.machine("fresh2")
    with pytest.raises(PublishError, match="does not verify"):
        tufclient.refresh(tuf_world.repository)


def test_the_keyless_online_key_of_ci(tuf_world: TufWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    """The online roles of the real root are gpu-attest.yml's keyless identity: the URI CI sets finds that key,
    and here (no OIDC token) it is a clear refusal, never a silent fallback to another key."""
    from securesystemslib.signer import SigstoreKey

    identity = "https://github.com/sparkforge/sparkforge/.github/workflows/gpu-attest.yml@refs/heads/main"
    key = SigstoreKey(
        "ci",
        "sigstore-oidc",
        "Fulcio",
        {"identity": identity, "issuer": "https://token.actions.githubusercontent.com"},
    )
    root = tufrepo.new_root([tuf_world.root_signer.public_key], [key]).signed
    for name in ("ACTIONS_ID_TOKEN_REQUEST_URL", "ACTIONS_ID_TOKEN_REQUEST_TOKEN", "SIGSTORE_ID_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(PublishError, match=r"names no key of the TUF role targets.*Sigstore credentials"):
        tufrepo.online_signer(root, "targets", "sigstore:?ambient=true")
    with pytest.raises(PublishError, match="names no key"):  # an ed25519 file is not the keyless key
        tufrepo.online_signer(root, "targets", tuf_world.online_uri)


def test_images_lists_every_signed_move_with_its_verdict(tuf_world: TufWorld) -> None:
    """`invoke images`: what the signed targets say was published, a revoked index named as such."""
    from sparkforge.registry import tagtrust

    _promote_then_revoke(tuf_world)
    tuf_world.machine("owner")
    rows = tagtrust.published(tufclient.refresh(tuf_world.repository))
    assert [(r["index"], r["names_now"], r["verdict"].split(":")[0]) for r in rows] == [
        (X, False, "REVOKED"),
        (Y, False, "GPU-verified when it moved (signed claim)"),
    ]
    assert rows[0]["claims"] == {"linux/arm64": ["f" * 64]}


def test_a_root_alone_is_completed_by_the_first_online_write(tuf_world: TufWorld) -> None:
    """trust.init with a keyless online identity commits the root only; the first online write (CI's
    sign.tuf-timestamp) signs targets, snapshot and timestamp v1 on it, and a machine starting from that root
    file (a recipe's trust_root) trusts them."""
    from sparkforge.registry.ocidist import Registry

    repository = tuf_world.repository + "-keyless"
    root = tufrepo.new_root([tuf_world.root_signer.public_key], [tuf_world.online.public_key])
    data = tufrepo.publish_root(Registry(repository), root, [tuf_world.root_signer])
    root_file = tuf_world.tmp / "keyless.root.json"
    root_file.write_bytes(data)
    tuf_world.machine("ci-first-run")
    state = tufrepo.move_tag(repository, tuf_world.target("latest", Y, Y_IMAGE), root_file=root_file)
    assert (state.version, state.tags["latest"].index) == (1, Y)
    tuf_world.machine("owner")
    assert tufclient.refresh(repository, root_file=root_file).tags["latest"].index == Y
