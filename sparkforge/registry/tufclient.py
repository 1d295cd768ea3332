"""The one TUF client of sparkforge: what the signed targets say each moving tag names, and what is revoked.

pull, promote, rollback and the GPU job's revocation all read through `refresh`: python-tuf's ngclient Updater
with a fetcher over the registry (tufstore), starting from a trusted root that ships in the package (or a
dev root, loudly), keeping the metadata it trusts under the cache dir. python-tuf refuses lower versions
(rollback), expired metadata (freeze), and anything not signed by the keys the root chain names; this module
adds the refusal of a fork (the registry serving other bytes for a version this machine trusts, or a next
version that does not name this machine's targets as its predecessor) and turns each refusal into one message.

Targets layout: `tags/<tag>` (custom: index, platforms, claims, history), `revoked/<digest>` (custom: reason),
`removed/<tag>`: a tag a revocation took out of the targets (its last move and history, for rollback).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuf.api import exceptions as tuf_errors
from tuf.api.metadata import Metadata, Targets, Timestamp
from tuf.ngclient import Updater

from sparkforge import console
from sparkforge.boundary import read_bytes
from sparkforge.context import cache_path
from sparkforge.errors import InputError, PublishError
from sparkforge.registry import tufstore
from sparkforge.registry.ocidist import Registry

MAX_ROOT_BYTES = (
    32 << 20
)  # one TUF metadata file: root, timestamp, snapshot or targets with every tag's history

ROOTS_DIR = Path(__file__).parent / "tufroots"  # <repository as file name>.root.json, shipped in the package
DEV_ROOT_ENV = "SPARKFORGE_TUF_DEV_ROOT"  # test/dev mode: trust this root file (never for published images)
PREVIOUS = "x-sparkforge-previous"  # targets field: the version and sha256 of the targets it replaces
TAGS, REVOKED, REMOVED = "tags/", "revoked/", "removed/"


def root_file_name(repository: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", repository) + ".root.json"


def trusted_root(repository: str, warn: console.Echo = console.warn) -> bytes:
    """The root this machine starts from: the packaged one for `repository`, else the dev root (warned)."""
    shipped = ROOTS_DIR / root_file_name(repository)
    if shipped.is_file():
        return read_bytes(shipped, "the shipped TUF root", MAX_ROOT_BYTES, named=False, within=(ROOTS_DIR,))
    dev = os.environ.get(DEV_ROOT_ENV)
    if dev:
        warn(
            f"sparkforge: WARNING (TEST/DEV MODE, {DEV_ROOT_ENV}): trusting the TUF root {dev} for {repository}; "
            "it does not ship with sparkforge, so nothing here is trusted beyond this machine"
        )
        return read_bytes(dev, DEV_ROOT_ENV, MAX_ROOT_BYTES)
    raise PublishError(
        f"no trusted TUF root for {repository}: sparkforge ships none for it "
        f"({ROOTS_DIR.name}/{root_file_name(repository)}), so no tag or revocation can be trusted. fix: use a "
        "sparkforge release that ships the root of this repository (docs/trust.md: how maintainers create it), "
        f"or, for tests and development only, {DEV_ROOT_ENV}=PATH of a root you made"
    )


def metadata_dir(repository: str) -> Path:
    path = cache_path("tuf", re.sub(r"[^A-Za-z0-9._-]", "_", repository), "root.json").parent
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True)
class TagTarget:
    """What the signed targets say one moving tag names."""

    tag: str
    index: str
    platforms: dict[str, str]  # platform -> image digest
    claims: dict[str, list[str]]  # platform -> sha256 of the GPU claims (in-toto statements) it moved on
    recipe: str = ""
    recipe_hash: str = ""
    date: str = ""
    action: str = ""
    history: tuple[dict[str, Any], ...] = ()  # earlier moves, oldest first: {index, platforms, date, action}

    def custom(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "platforms": self.platforms,
            "claims": self.claims,
            "recipe": self.recipe,
            "recipeHash": self.recipe_hash,
            "date": self.date,
            "action": self.action,
            "history": list(self.history),
        }

    @classmethod
    def from_custom(cls, tag: str, data: dict[str, Any]) -> TagTarget:
        return cls(
            tag,
            str(data["index"]),
            dict(data.get("platforms") or {}),
            {k: list(v) for k, v in (data.get("claims") or {}).items()},
            str(data.get("recipe") or ""),
            str(data.get("recipeHash") or ""),
            str(data.get("date") or ""),
            str(data.get("action") or ""),
            tuple(data.get("history") or ()),
        )


@dataclass(frozen=True)
class TrustedState:
    """The newest targets this machine trusts for one repository."""

    repository: str
    version: int
    sha256: str  # of the targets file's bytes (the next version names it as its predecessor)
    tags: dict[str, TagTarget] = field(default_factory=dict)
    revoked: dict[str, str] = field(default_factory=dict)  # digest -> reason
    removed: dict[str, TagTarget] = field(default_factory=dict)  # tags a revocation removed (not pullable)

    def moves_of(self, tag: str) -> TagTarget | None:
        """The tag's last signed move, whether it still names it or a revocation removed it."""
        return self.tags.get(tag) or self.removed.get(tag)

    def revoked_of(self, *digests: str) -> str:
        """Why one of `digests` is revoked ('' when none is)."""
        for digest in digests:
            if digest in self.revoked:
                return f"{digest[:19]} is revoked by the signed TUF targets v{self.version}: {self.revoked[digest]}"
        return ""

    def pullable(
        self, tag: str, platform: str, registry_top: str, warn: console.Echo
    ) -> tuple[str, str, list[str]]:
        """(index, platform image, pinned claim digests) the signed targets name for a moving tag; warns when
        the registry's tag names something else (moved by hand), refuses a tag they do not name."""
        target = self.tags.get(tag)
        if target is None:
            gone = self.removed.get(tag)
            why = (
                f"the signed TUF targets v{self.version} no longer name it: "
                + (self.revoked_of(gone.index, *gone.platforms.values()) or "removed")
                if gone
                else f"the signed TUF targets v{self.version} name no {tag}: it was never promoted"
            )
            raise PublishError(
                f"{tag} is a moving tag and {why}; fix: pull an immutable tag or digest that passed"
            )
        if platform not in target.platforms:
            raise PublishError(f"the signed target of {tag} has no {platform} image; fix: pass --platform")
        if registry_top != target.index:
            warn(
                f"sparkforge: WARNING: the registry's {tag} names {registry_top[:19]}, but the signed TUF targets "
                f"name {target.index[:19]} (moved by hand?); pulling what the targets name"
            )
        return target.index, target.platforms[platform], target.claims.get(platform, [])

    def metadata(self, folder: Path) -> Metadata[Targets]:
        return Metadata[Targets].from_file(str(folder / "targets.json"))


def _version_of(data: bytes | None) -> int:
    if not data:
        return 0
    return int(Metadata.from_bytes(data).signed.version)


# What python-tuf refused, in the words of the attack it means (first match wins: subclasses first).
_REFUSALS = (
    (tuf_errors.ExpiredMetadataError, "its TUF metadata has expired ({exc}): a freeze", "the timestamp"),
    (
        tuf_errors.BadVersionNumberError,
        "the registry serves an older TUF version than this machine trusts ({exc}): a rollback",
        "the newest metadata",
    ),
    (
        tuf_errors.DownloadHTTPError,
        "TUF metadata is missing from the registry ({exc}): deleted?",
        "the metadata",
    ),
    (tuf_errors.RepositoryError, "its TUF metadata does not verify ({kind}: {exc})", "the metadata"),
)


def refresh(
    repository: str, registry: Registry | None = None, warn: console.Echo = console.warn
) -> TrustedState:
    """Bring this machine's trusted TUF metadata up to date from the registry; refuse what TUF refuses."""
    registry = registry or Registry(repository)
    folder = metadata_dir(repository)
    fetcher = tufstore.RegistryFetcher(registry)
    shipped = trusted_root(repository, warn)  # required even with a cached root: no configured root, no run
    bootstrap = None if (folder / "root.json").is_file() else shipped
    old_ts = _read(folder / "timestamp.json")
    old_targets = _read(folder / "targets.json")
    try:
        updater = Updater(str(folder), tufstore.base_url(repository), fetcher=fetcher, bootstrap=bootstrap)
        updater.refresh()
    except (tuf_errors.RepositoryError, tuf_errors.DownloadError) as exc:
        for kind, what, restore in _REFUSALS:
            if isinstance(exc, kind):
                why = what.format(exc=exc, kind=type(exc).__name__)
                raise _refused(repository, why, restore) from None
        raise PublishError(
            f"cannot read the TUF metadata of {repository} ({exc}); fix: check the registry"
        ) from None
    served_ts = fetcher.served.get("timestamp.json")
    if served_ts and old_ts and served_ts != old_ts and _version_of(served_ts) == _version_of(old_ts):
        raise _refused(
            repository,
            f"the registry serves another timestamp v{_version_of(old_ts)} than the one this machine trusts: a fork",
            "the metadata this machine trusts",
        )
    new_targets = _read(folder / "targets.json") or b""
    state = state_of_targets(repository, new_targets)
    _check_chain(repository, old_targets, new_targets, state)
    return state


def _check_chain(repository: str, old: bytes | None, new: bytes, state: TrustedState) -> None:
    """A next targets version must name the one this machine trusted as its predecessor (no fork)."""
    if not old or old == new:
        return
    old_version = _version_of(old)
    previous = Metadata[Targets].from_bytes(new).signed.unrecognized_fields.get(PREVIOUS) or {}
    if state.version == old_version or (
        state.version == old_version + 1 and previous.get("sha256") != hashlib.sha256(old).hexdigest()
    ):
        raise _refused(
            repository,
            f"targets v{state.version} does not descend from the targets v{old_version} this machine trusts: a fork",
            "the metadata this machine trusts",
        )


def state_of_targets(repository: str, data: bytes) -> TrustedState:
    """The trusted state a verified targets file says (tags, revocations, removed tags)."""
    targets = Metadata[Targets].from_bytes(data).signed
    tags, removed = (
        {
            path.removeprefix(prefix): TagTarget.from_custom(path.removeprefix(prefix), dict(t.custom))
            for path, t in targets.targets.items()
            if path.startswith(prefix)
        }
        for prefix in (TAGS, REMOVED)
    )
    revoked = {
        path.removeprefix(REVOKED): str(dict(t.custom).get("reason") or "revoked")
        for path, t in targets.targets.items()
        if path.startswith(REVOKED)
    }
    digest = hashlib.sha256(data).hexdigest()
    return TrustedState(repository, targets.version, digest, tags, revoked, removed)


def _read(path: Path) -> bytes | None:
    try:
        return read_bytes(path, "trusted TUF metadata", MAX_ROOT_BYTES, within=(path.parent,))
    except (InputError, OSError):
        return None


def _refused(repository: str, what: str, restore: str) -> PublishError:
    return PublishError(
        f"refusing the tags of {repository}: {what}; nothing was trusted or changed. fix: ask the maintainers to "
        f"restore {restore} in the registry (or re-sign it: 'invoke sign.tuf-timestamp'); a registry writer may be "
        "hiding a later move or revocation"
    )


def timestamp_expiry(repository: str) -> str:
    """When the timestamp this machine trusts expires (for messages); '' when none is trusted."""
    data = _read(metadata_dir(repository) / "timestamp.json")
    if not data:
        return ""
    return Metadata[Timestamp].from_bytes(data).signed.expires.isoformat()
