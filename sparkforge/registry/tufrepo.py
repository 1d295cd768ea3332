"""The writing side of sparkforge's TUF repository: create and rotate the root, move a tag, revoke, re-sign.

Git is the source of truth, the registry a mirror (the tuf-on-ci model): the metadata of each repository is
committed under `tuf/<repository as file name>/` (SPARKFORGE_TUF_METADATA names another folder of such folders).
Every write starts from that committed metadata (never from what the registry serves, never from an expired
timestamp), signs targets, snapshot and timestamp at version+1 (the new targets naming the replaced one's hash),
writes them into the folder (CI commits and pushes it) and then to the registry, timestamp last. A write
refuses when the registry holds a later version than the committed one: someone the repository does not know
wrote it. Signs with the online key URI in SPARKFORGE_TUF_SIGNER (securesystemslib: `file2:PATH` of an ed25519
key in tests and forks, `sigstore:?ambient=true` keyless in CI).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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
from sparkforge.boundary import read_bytes, write_output
from sparkforge.errors import PublishError
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.registry import tufclient, tufstore
from sparkforge.registry.ocidist import Registry
from sparkforge.registry.tufclient import PREVIOUS, REMOVED, REVOKED, TAGS, TagTarget, TrustedState

METADATA_ENV = (
    "SPARKFORGE_TUF_METADATA"  # folder of committed metadata folders (default: tuf/ of this checkout)
)
SIGNER_ENV = "SPARKFORGE_TUF_SIGNER"  # private key URI of the online roles (targets, snapshot, timestamp)
TTL = {  # how long each role's metadata is valid; the timestamp is re-signed daily (images.yml schedule)
    "root": dt.timedelta(days=365),
    "targets": dt.timedelta(days=90),
    "snapshot": dt.timedelta(days=30),
    "timestamp": dt.timedelta(days=2),
}
ONLINE = ("targets", "snapshot", "timestamp")


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
    name = f"{root.signed.version}.root.json"
    write_output(committed_dir(registry.repository) / name, data, "TUF root metadata")
    tufstore.upload(registry, name, data)
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
    folder = committed_dir(registry.repository)
    files = {
        f"{targets.signed.version}.targets.json": t_bytes,
        f"{snapshot_v}.snapshot.json": s_bytes,
        "timestamp.json": _bytes(timestamp),
    }
    for name, data in files.items():  # the commit first: git is the truth, the registry its mirror
        write_output(folder / name, data, f"TUF metadata {name}")
    mirror(registry, folder)
    for name, data in files.items():
        tufstore.upload(registry, name, data)


@dataclass(frozen=True)
class Committed:
    """The newest committed metadata of one repository (what every write starts from)."""

    folder: Path
    root: Metadata[Root]
    targets: bytes
    snapshot_version: int
    timestamp: bytes

    @property
    def timestamp_version(self) -> int:
        return tufclient.version_of(self.timestamp)


def committed_dir(repository: str) -> Path:
    """The folder of `repository`'s committed TUF metadata (created empty for a new repository)."""
    base = Path(os.environ.get(METADATA_ENV) or REPO_ROOT / "tuf")
    return base / tufclient.root_file_name(repository).removesuffix(".root.json")


def newest(folder: Path, role: str) -> tuple[int, bytes]:
    found = [
        (int(p.name.split(".", 1)[0]), p)
        for p in folder.glob(f"*.{role}.json")
        if p.name.split(".")[0].isdigit()
    ]
    if not found:
        return 0, b""
    version, path = max(found)
    return version, read_bytes(
        path, f"committed TUF {role}", tufclient.MAX_ROOT_BYTES, named=False, within=(folder,)
    )


def load_committed(repository: str) -> Committed:
    """The committed metadata, checked: signed by the keys its newest root names, versions consistent."""
    folder = committed_dir(repository)
    where = f"the committed TUF metadata of {repository} ({folder})"
    _, root_bytes = newest(folder, "root")
    targets_v, targets = newest(folder, "targets")
    snapshot_v, snapshot = newest(folder, "snapshot")
    stamp = folder / "timestamp.json"
    if root_bytes and not (
        targets or snapshot or stamp.exists()
    ):  # trust.init with a keyless online identity:
        return Committed(folder, Metadata[Root].from_bytes(root_bytes), b"", 0, b"")  # CI signs the first
    if not (root_bytes and targets and snapshot and stamp.is_file()):
        raise PublishError(
            f"{where} is missing or incomplete (it needs N.root.json, N.targets.json, N.snapshot.json and "
            "timestamp.json); fix: check out the branch that holds it (git is the source of truth), or create "
            "the repository with 'invoke trust.init'"
        )
    timestamp = read_bytes(
        stamp, "committed TUF timestamp", tufclient.MAX_ROOT_BYTES, named=False, within=(folder,)
    )
    root = Metadata[Root].from_bytes(root_bytes)
    try:
        for role, data in (("targets", targets), ("snapshot", snapshot), ("timestamp", timestamp)):
            _verify_by_a_committed_root(folder, root, role, data)
        snap = Metadata[Snapshot].from_bytes(snapshot).signed
        if snap.version != snapshot_v or snap.meta["targets.json"].version != targets_v:
            raise ValueError(f"snapshot v{snap.version} does not name targets v{targets_v}")
        if Metadata[Timestamp].from_bytes(timestamp).signed.snapshot_meta.version != snapshot_v:
            raise ValueError(f"the timestamp does not name snapshot v{snapshot_v}")
    except Exception as exc:  # a signature or a version that does not hold: nothing is signed on top of it
        raise PublishError(f"{where} does not verify ({exc}); fix: restore it from git history") from None
    return Committed(folder, root, targets, snapshot_v, timestamp)


def _verify_by_a_committed_root(folder: Path, newest_root: Metadata[Root], role: str, data: bytes) -> None:
    """Signed by the newest root's keys for `role`, or (after a rotation of the online key: trust.recover) by
    an earlier committed root's; the next write signs with the newest root's key either way."""
    md = Metadata.from_bytes(data)
    roots = [newest_root] + [
        Metadata[Root].from_file(str(p))
        for p in sorted(folder.glob("*.root.json"), key=lambda p: -int(p.name.split(".")[0]))[1:]
    ]
    for n, root in enumerate(roots):
        try:
            root.verify_delegate(role, md)
            return
        except Exception:
            if n == len(roots) - 1:
                raise


def _check_registry(registry: Registry, base: Committed, warn: console.Echo) -> None:
    """The registry holds no later version than the committed one (else someone else wrote it: refuse)."""
    served = registry.artifact(tufstore.tag_for("timestamp.json"), tufstore.MAX_BYTES)
    later_targets = f"{tufclient.version_of(base.targets) + 1}.targets.json"
    stranger = ""
    if served and served != base.timestamp and tufclient.version_of(served) >= base.timestamp_version:
        stranger = (
            f"timestamp v{tufclient.version_of(served)} (the committed one is v{base.timestamp_version})"
        )
    elif registry.artifact(tufstore.tag_for(later_targets), tufstore.MAX_BYTES) is not None:
        stranger = f"{later_targets} (the committed targets are v{tufclient.version_of(base.targets)})"
    if stranger:
        raise PublishError(
            f"refusing to write the TUF metadata of {registry.repository}: the registry holds {stranger}, which "
            f"the committed metadata ({base.folder}) did not write; nothing was signed. fix: if another job wrote "
            "it, pull the branch and re-run; otherwise the online key or the registry is compromised: an incident "
            "for the maintainers (docs/trust.md: Recovering)"
        )
    if served:
        ts = Metadata[Timestamp].from_bytes(served).signed
        if ts.is_expired():
            warn(
                f"sparkforge: WARNING (INCIDENT): the registry's TUF timestamp v{ts.version} of {registry.repository} "
                f"expired at {ts.expires.isoformat()}: clients refused its tags until now. It is not a base for "
                "anything: this write starts from the committed metadata; find out why the daily re-sign stopped"
            )


def mirror(registry: Registry, folder: Path) -> None:
    """Upload every committed root, targets and snapshot the registry lacks (the mirror repaired)."""
    for path in sorted(folder.glob("*.json")):
        if path.name != "timestamp.json" and registry.manifest(tufstore.tag_for(path.name)) is None:
            data = read_bytes(
                path, "committed TUF metadata", tufclient.MAX_ROOT_BYTES, named=False, within=(folder,)
            )
            tufstore.upload(registry, path.name, data)


def change_targets(
    repository: str,
    change: Callable[[Targets, TrustedState], None],
    registry: Registry | None = None,
    warn: console.Echo = console.warn,
    root_file: Path | None = None,
    signer_uri: str | None = None,
) -> TrustedState:
    """Apply `change` to the committed targets as version+1, sign, commit to the folder, mirror to the registry."""
    registry = registry or Registry(repository)
    base = load_committed(repository)
    _check_registry(registry, base, warn)
    if base.targets:
        state = tufclient.state_of_targets(repository, base.targets)
        nxt = Metadata[Targets].from_bytes(base.targets)
        nxt.signatures.clear()
        nxt.signed.version += 1
        nxt.signed.expires = _expires("targets")
        nxt.signed.unrecognized_fields[PREVIOUS] = {"version": state.version, "sha256": state.sha256}
    else:  # the first online metadata of a new repository
        state = TrustedState(repository, 0, "")
        nxt = Metadata(Targets(version=1, expires=_expires("targets")))
    change(nxt.signed, state)
    signers = {role: online_signer(base.root.signed, role, signer_uri) for role in ONLINE}
    _write(registry, nxt, base.snapshot_version + 1, base.timestamp_version + 1, signers)
    return tufclient.refresh(repository, registry, warn, root_file)


def move_tag(
    repository: str, target: TagTarget, registry: Registry | None = None, root_file: Path | None = None
) -> TrustedState:
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

    return change_targets(repository, change, registry, root_file=root_file)


def revoke(
    repository: str,
    digests: Mapping[str, str],
    registry: Registry | None = None,
    root_file: Path | None = None,
) -> TrustedState:
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

    return change_targets(repository, change, registry, root_file=root_file)


def resign_timestamp(
    repository: str, registry: Registry | None = None, root_file: Path | None = None
) -> None:
    """The daily re-sign: the committed targets as version+1 with no change, a new snapshot and timestamp."""
    change_targets(repository, lambda targets, state: None, registry, root_file=root_file)


def _summary(target: TagTarget) -> dict[str, object]:
    return {k: v for k, v in target.custom().items() if k in ("index", "platforms", "date", "action")}


def _target_file(path: str, digest: str, custom: dict[str, object]) -> TargetFile:
    """A target that records an OCI digest: its sha256 is the digest (length 0: it is never downloaded)."""
    return TargetFile(0, {"sha256": digest.removeprefix("sha256:")}, path, {"custom": custom})
