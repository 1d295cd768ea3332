"""The writing side of sparkforge's TUF repository: create and rotate the root, move a tag, revoke, re-sign.

Every write starts from what this machine trusts after `tufclient.refresh` (so a writer whose cache saw a later
version refuses a rolled-back registry), bumps targets, snapshot and timestamp by one, names the replaced
targets' hash in the new one (a fork is then visible to every client that trusted the old one), signs with the
online key URI in SPARKFORGE_TUF_SIGNER (securesystemslib: `file2:PATH` of an ed25519 key in tests,
`sigstore:?ambient=true` keyless in CI), writes targets, then snapshot, then the timestamp last, and reads back.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from securesystemslib.signer import Key, Signer
from tuf.api.metadata import (
    Metadata,
    MetaFile,
    Role,
    Root,
    Snapshot,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.api.serialization.json import JSONSerializer

from sparkforge import console
from sparkforge.boundary import write_output
from sparkforge.errors import PublishError
from sparkforge.registry import tufclient, tufstore
from sparkforge.registry.ocidist import Registry
from sparkforge.registry.tufclient import PREVIOUS, REMOVED, REVOKED, TAGS, TagTarget, TrustedState

SIGNER_ENV = "SPARKFORGE_TUF_SIGNER"  # private key URI of the online roles (targets, snapshot, timestamp)
TTL = {  # how long each role's metadata is valid; the timestamp is re-signed daily (images.yml schedule)
    "root": dt.timedelta(days=365),
    "targets": dt.timedelta(days=90),
    "snapshot": dt.timedelta(days=30),
    "timestamp": dt.timedelta(days=2),
}
ONLINE = ("targets", "snapshot", "timestamp")
ATTEMPTS = 5  # compare-and-swap retries when another writer lands between read and write


def _expires(role: str, now: dt.datetime | None = None) -> dt.datetime:
    return ((now or dt.datetime.now(dt.UTC)) + TTL[role]).replace(microsecond=0)


def _bytes(md: Metadata) -> bytes:
    return md.to_bytes(JSONSerializer(compact=False))


def _meta(data: bytes, version: int) -> MetaFile:
    return MetaFile(version, len(data), {"sha256": hashlib.sha256(data).hexdigest()})


# ---- root: created and rotated by the maintainers (offline keys) -------------------------------------------


def new_root(
    root_keys: Sequence[Key], online_keys: Sequence[Key], threshold: int = 1, version: int = 1
) -> Metadata[Root]:
    """An unsigned root: `root_keys` (offline, `threshold` of them sign) and the online roles' keys."""
    root = Root(version=version, expires=_expires("root"), consistent_snapshot=True)
    for key in root_keys:
        root.add_key(key, "root")
    for role in ONLINE:
        for key in online_keys:
            root.add_key(key, role)
    root.roles["root"] = Role([k.keyid for k in root_keys], threshold)
    return Metadata(root)


def publish_root(registry: Registry, root: Metadata[Root], signers: Sequence[Signer]) -> bytes:
    """Sign `root` with every signer given (old and new root keys when rotating) and write it; its bytes."""
    root.signatures.clear()
    for signer in signers:
        root.sign(signer, append=True)
    data = _bytes(root)
    tufstore.upload(registry, f"{root.signed.version}.root.json", data)
    return data


def rotate_root(
    registry: Registry, current: Metadata[Root], change: Callable[[Root], None], signers: Sequence[Signer]
) -> bytes:
    """Root N+1: `change` applied to a copy of root N; signed by `signers` (a threshold of N's and N+1's)."""
    nxt = Metadata[Root].from_bytes(_bytes(current))
    nxt.signed.version += 1
    nxt.signed.expires = _expires("root")
    change(nxt.signed)
    return publish_root(registry, nxt, signers)


def init_repository(
    registry: Registry, root: Metadata[Root], root_signers: Sequence[Signer], online: Signer
) -> None:
    """A new repository: root v1, empty targets, snapshot and timestamp v1 (maintainers, once; tests)."""
    publish_root(registry, root, root_signers)
    targets = Metadata(Targets(version=1, expires=_expires("targets")))
    _write(registry, targets, 1, 1, dict.fromkeys(ONLINE, online))


# ---- the online roles: move, revoke, re-sign ----------------------------------------------------------


def online_signer(root: Root, role: str, uri: str | None = None) -> Signer:
    """The signer of `role` from SPARKFORGE_TUF_SIGNER (a securesystemslib private key URI)."""
    uri = uri or os.environ.get(SIGNER_ENV, "")
    if not uri:
        raise PublishError(
            f"no TUF signing key: {SIGNER_ENV} is not set; fix: in CI the signing job sets "
            f"{SIGNER_ENV}=sigstore:?ambient=true (keyless); with a key, {SIGNER_ENV}=file2:/secure/online.pem"
        )
    from securesystemslib.signer import SIGNER_FOR_URI_SCHEME, SigstoreSigner

    SIGNER_FOR_URI_SCHEME.setdefault(
        SigstoreSigner.SCHEME, SigstoreSigner
    )  # keyless: "sigstore:?ambient=true"
    problems = []
    for keyid in root.roles[role].keyids:
        try:
            return Signer.from_priv_key_uri(uri, root.keys[keyid])
        except Exception as exc:  # a key of another kind or another key: try the role's next key
            problems.append(f"{keyid[:12]}: {exc}")
    raise PublishError(
        f"{SIGNER_ENV} names no key of the TUF role {role} ({'; '.join(problems) or 'the role has no keys'}); "
        "fix: use the online key the root names (docs/trust.md)"
    )


def _write(
    registry: Registry,
    targets: Metadata[Targets],
    snapshot_v: int,
    timestamp_v: int,
    signers: Mapping[str, Signer],
) -> None:
    """Sign and write targets, snapshot and timestamp (in that order: readers see a whole version or none)."""
    targets.sign(signers["targets"])
    t_bytes = _bytes(targets)
    snapshot = Metadata(Snapshot(version=snapshot_v, expires=_expires("snapshot")))
    snapshot.signed.meta["targets.json"] = _meta(t_bytes, targets.signed.version)
    snapshot.sign(signers["snapshot"])
    s_bytes = _bytes(snapshot)
    timestamp = Metadata(Timestamp(version=timestamp_v, expires=_expires("timestamp")))
    timestamp.signed.snapshot_meta = _meta(s_bytes, snapshot_v)
    timestamp.sign(signers["timestamp"])
    tufstore.upload(registry, f"{targets.signed.version}.targets.json", t_bytes)
    tufstore.upload(registry, f"{snapshot_v}.snapshot.json", s_bytes)
    tufstore.upload(registry, "timestamp.json", _bytes(timestamp))


def change_targets(
    repository: str,
    change: Callable[[Targets, TrustedState], None],
    registry: Registry | None = None,
    warn: console.Echo = console.warn,
    expired_ok: bool = False,
) -> TrustedState:
    """Refresh, apply `change` to the next targets version, sign and write; compare-and-swap with retry.

    `expired_ok` (the re-sign only): metadata that is valid but for its expiry is taken as the base, so that a
    timestamp the daily job let expire can be renewed; rollback, deletion and forks are still refused.
    """
    registry = registry or Registry(repository)
    folder = tufclient.metadata_dir(repository)
    for _ in range(ATTEMPTS):
        try:
            state = tufclient.refresh(repository, registry, warn)
        except PublishError as exc:
            if not (expired_ok and "a freeze" in str(exc)):
                raise
            state = _expired_base(repository, registry, folder)
        served = registry.manifest(tufstore.tag_for("timestamp.json"))
        root = Metadata[Root].from_file(str(folder / "root.json")).signed
        current = state.metadata(folder)
        nxt = Metadata[Targets].from_bytes(_bytes(current))
        nxt.signatures.clear()
        nxt.signed.version += 1
        nxt.signed.expires = _expires("targets")
        nxt.signed.unrecognized_fields[PREVIOUS] = {"version": state.version, "sha256": state.sha256}
        change(nxt.signed, state)
        snapshot_v = Metadata[Snapshot].from_file(str(folder / "snapshot.json")).signed.version + 1
        timestamp_v = Metadata[Timestamp].from_file(str(folder / "timestamp.json")).signed.version + 1
        signers = {role: online_signer(root, role) for role in ONLINE}
        if registry.manifest(tufstore.tag_for("timestamp.json")) != served:
            continue  # another writer landed since the refresh
        _write(registry, nxt, snapshot_v, timestamp_v, signers)
        return tufclient.refresh(repository, registry, warn)
    raise PublishError(
        f"could not write the TUF targets of {repository}: they changed under each of {ATTEMPTS} attempts; fix: "
        "wait for the other move to finish and re-run"
    )


def move_tag(repository: str, target: TagTarget, registry: Registry | None = None) -> TrustedState:
    """The tag names `target.index` from the next targets version on (its earlier moves kept in history)."""

    def change(targets: Targets, state: TrustedState) -> None:
        why = state.revoked_of(target.index, *target.platforms.values())
        if why:
            raise PublishError(f"refusing to move {target.tag}: {why}; fix: publish and verify a new build")
        before = state.moves_of(target.tag)
        earlier = (*before.history, _summary(before)) if before else ()
        moved = TagTarget(**{**target.__dict__, "history": earlier[-200:]})
        targets.targets.pop(REMOVED + target.tag, None)
        targets.targets[TAGS + target.tag] = _target_file(TAGS + target.tag, moved.index, moved.custom())

    return change_targets(repository, change, registry)


def revoke(repository: str, digests: Mapping[str, str], registry: Registry | None = None) -> TrustedState:
    """Revoke each digest (digest -> reason): listed under revoked/, and every tag naming it moves from tags/
    to removed/ (no longer pullable; its moves kept for rollback)."""

    def change(targets: Targets, state: TrustedState) -> None:
        for digest, reason in digests.items():
            targets.targets[REVOKED + digest] = _target_file(
                REVOKED + digest, digest, {"reason": reason[:300]}
            )
        for tag, target in state.tags.items():
            if {target.index, *target.platforms.values()} & set(digests):
                del targets.targets[TAGS + tag]
                targets.targets[REMOVED + tag] = _target_file(REMOVED + tag, target.index, target.custom())

    return change_targets(repository, change, registry)


def resign_timestamp(repository: str, registry: Registry | None = None) -> None:
    """A new timestamp (and snapshot) over the same targets (daily job); also renews one that expired."""
    change_targets(repository, lambda targets, state: None, registry, expired_ok=True)


def _expired_base(repository: str, registry: Registry, folder: Path) -> TrustedState:
    """The registry's timestamp, snapshot and targets verified like the client does (signatures by the keys of
    the root chain refresh already followed, hashes, versions not below this machine's) except for expiry;
    written to this machine's trusted metadata as the base of the re-sign."""
    root = Metadata[Root].from_file(str(folder / "root.json"))
    if root.signed.is_expired():
        raise PublishError(
            f"the TUF root of {repository} has expired: only the maintainers can renew it (a new root version, "
            "docs/trust.md: Rotating); fix: ask them"
        )

    def load(name: str, role: str, meta: MetaFile | None) -> bytes:
        data = registry.artifact(tufstore.tag_for(name), tufstore.MAX_BYTES)
        if data is None:
            raise PublishError(f"{repository}: {name} is missing from the registry; fix: ask the maintainers")
        if meta is not None:
            meta.verify_length_and_hashes(data)
        md = Metadata.from_bytes(data)
        root.verify_delegate(role, md)
        cached = folder / f"{role}.json"
        if cached.is_file() and Metadata.from_file(str(cached)).signed.version > md.signed.version:
            raise PublishError(f"{repository}: the registry serves an older {role} than this machine trusts")
        return data

    ts = load("timestamp.json", "timestamp", None)
    snapshot_meta = Metadata[Timestamp].from_bytes(ts).signed.snapshot_meta
    snap = load(f"{snapshot_meta.version}.snapshot.json", "snapshot", snapshot_meta)
    targets_meta = Metadata[Snapshot].from_bytes(snap).signed.meta["targets.json"]
    targets = load(f"{targets_meta.version}.targets.json", "targets", targets_meta)
    for role, data in (("timestamp", ts), ("snapshot", snap), ("targets", targets)):
        write_output(folder / f"{role}.json", data, f"TUF {role} metadata")
    return tufclient.state_of_targets(repository, targets)


def _summary(target: TagTarget) -> dict[str, object]:
    return {k: v for k, v in target.custom().items() if k in ("index", "platforms", "date", "action")}


def _target_file(path: str, digest: str, custom: dict[str, object]) -> TargetFile:
    """A target that records an OCI digest: its sha256 is the digest (length 0: it is never downloaded)."""
    return TargetFile(0, {"sha256": digest.removeprefix("sha256:")}, path, {"custom": custom})


def load_root(path: Path) -> Metadata[Root]:
    return Metadata[Root].from_file(str(path))
