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
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuf.api import exceptions as tuf_errors
from tuf.api.metadata import Metadata, Root, Targets
from tuf.ngclient import Updater

from sparkforge import console
from sparkforge.boundary import parse_json, read_bytes
from sparkforge.context import cache_path, write_atomic
from sparkforge.errors import InputError, PublishError
from sparkforge.registry import tufstore
from sparkforge.registry.ocidist import Registry

if TYPE_CHECKING:
    from sparkforge.recipe.loader import Recipe

MAX_ROOT_BYTES = (
    32 << 20
)  # one TUF metadata file: root, timestamp, snapshot or targets with every tag's history

ROOTS_DIR = Path(__file__).parent / "tufroots"  # <repository as file name>.root.json, shipped in the package
DEV_ROOT_ENV = "SPARKFORGE_TUF_DEV_ROOT"  # test/dev mode: trust this root file (never for published images)
PREVIOUS = "x-sparkforge-previous"  # targets field: the version and sha256 of the targets it replaces
TAGS, REVOKED, REMOVED = "tags/", "revoked/", "removed/"


def root_file_name(repository: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", repository) + ".root.json"


def trusted_root(repository: str, warn: console.Echo = console.warn, root_file: Path | None = None) -> bytes:
    """The root this machine starts from: the recipe's (`root_file`, publish.signing.trust_root), else the
    packaged one for `repository`, else the dev root (warned on every use)."""
    if root_file is not None:
        return read_bytes(
            root_file,
            "the recipe's TUF root (publish.signing.trust_root)",
            MAX_ROOT_BYTES,
            named=False,
            within=(root_file.parent,),
        )
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


def root_file_of(recipe: Recipe) -> Path | None:
    """The TUF root the recipe names (publish.signing.trust_root; relative to this checkout), else None."""
    from sparkforge.recipe.loader import REPO_ROOT

    signing = recipe.model.publish.signing
    if signing is None or signing.trust_root is None:
        return None
    path = Path(signing.trust_root)
    return path if path.is_absolute() else REPO_ROOT / path


def root_fingerprint(root: bytes) -> str:
    """What a trust cache is keyed by: the sha256 of the root this machine starts from (16 hex digits)."""
    return hashlib.sha256(root).hexdigest()[:16]


def metadata_dir(repository: str, root: bytes) -> Path:
    """The trusted metadata of `repository` started from `root`: one folder per starting root, so a development
    root never speaks for a real one (and a real one never inherits what a dev root made this machine trust)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", repository)
    path = cache_path("tuf", name, root_fingerprint(root), "root.json").parent
    path.mkdir(parents=True, exist_ok=True)
    from sparkforge.registry.tufcache import check_trust_folder

    return check_trust_folder(path)  # before python-tuf opens anything in it (no link, FIFO or stray file)


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


def version_of(data: bytes | None) -> int:
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


TRUSTED_FILES = ("root.json", "timestamp.json", "snapshot.json", "targets.json")
REFUSED_FILE = (
    "refused.json"  # heads (sha256 of timestamp or targets bytes) this machine refused: never trusted
)
REVOKED_FILE = (
    "revoked.json"  # every digest a trusted targets ever revoked: refused whatever the registry serves
)


def refresh(
    repository: str,
    registry: Registry | None = None,
    warn: console.Echo = console.warn,
    root_file: Path | None = None,
) -> TrustedState:
    """Bring this machine's trusted TUF metadata up to date from the registry; refuse what TUF refuses.

    python-tuf updates a scratch copy of the trusted folder; the chain of targets from the trusted version to the
    new one is then checked version by version (each names its predecessor's hash), and the trusted folder is
    replaced only when every check passed. A refused head is remembered and refused on sight from then on.
    """
    registry = registry or Registry(repository)
    start = trusted_root(
        repository, warn, root_file
    )  # required even with a cached root: no configured root, no run
    folder = metadata_dir(repository, start)
    refused = json_list(folder / REFUSED_FILE)
    fetcher = tufstore.RegistryFetcher(registry)
    old_ts, old_targets = _read(folder / "timestamp.json"), _read(folder / "targets.json")
    scratch = Path(tempfile.mkdtemp(prefix=".refresh-", dir=folder.parent))
    try:
        for name in TRUSTED_FILES:
            if (folder / name).is_file():
                shutil.copyfile(folder / name, scratch / name)
        bootstrap = None if (scratch / "root.json").is_file() else start
        try:
            updater = Updater(
                str(scratch), tufstore.base_url(repository), fetcher=fetcher, bootstrap=bootstrap
            )
            updater.refresh()
        except (tuf_errors.RepositoryError, tuf_errors.DownloadError) as exc:
            for kind, what, restore in _REFUSALS:
                if isinstance(exc, kind):
                    why = what.format(exc=exc, kind=type(exc).__name__)
                    raise _refused(repository, why, restore) from None
            raise PublishError(
                f"cannot read the TUF metadata of {repository} ({exc}); fix: check the registry"
            ) from None
        served_ts = fetcher.served.get("timestamp.json") or b""
        new_targets = _read(scratch / "targets.json") or b""
        heads = [_sha(served_ts), _sha(new_targets)]
        if any(h in refused for h in heads if h):
            raise _refused(repository, "the registry serves metadata this machine refused before", _TRUSTED)
        try:
            if old_ts and served_ts and served_ts != old_ts and version_of(served_ts) == version_of(old_ts):
                raise _fork(
                    repository,
                    f"the registry serves another timestamp v{version_of(old_ts)} than the one this machine "
                    "trusts: a fork",
                    _TRUSTED,
                )
            _check_chain(repository, fetcher, _read(folder / "root.json"), scratch, old_targets, new_targets)
        except _Fork:
            _remember(
                folder / REFUSED_FILE, refused, [h for h in heads if h and h != _sha(old_targets or b"")]
            )
            raise
        state = state_of_targets(repository, new_targets)
        seen = json_list(folder / REVOKED_FILE)
        revoked = {
            **dict.fromkeys(seen, "revoked by a targets version this machine trusted"),
            **state.revoked,
        }
        _remember(scratch / REVOKED_FILE, [], sorted(revoked))
        if refused:
            shutil.copyfile(folder / REFUSED_FILE, scratch / REFUSED_FILE)
        _replace(folder, scratch)
        return TrustedState(repository, state.version, state.sha256, state.tags, revoked, state.removed)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


_TRUSTED = "the metadata this machine trusts"


class _Fork(PublishError):
    """Signed metadata that contradicts what this machine trusts: its head is remembered and never trusted."""


def _check_chain(
    repository: str,
    fetcher: tufstore.RegistryFetcher,
    old_root: bytes | None,
    scratch: Path,
    old: bytes | None,
    new: bytes,
) -> None:
    """Every targets version after the trusted one, up to the new one, is signed and names its predecessor's
    hash: one fork anywhere in between (or a missing version) refuses the new head."""
    if not old or old == new:
        return
    old_version, new_version = version_of(old), version_of(new)
    if new_version <= old_version:
        raise _fork(
            repository,
            f"targets v{new_version} does not descend from the targets v{old_version} this machine trusts: a fork",
            _TRUSTED,
        )
    roots = [Metadata[Root].from_bytes(r) for r in (_read(scratch / "root.json"), old_root) if r]
    previous = old
    for version in range(old_version + 1, new_version + 1):
        data = new if version == new_version else _fetch(fetcher, f"{version}.targets.json")
        if data is None:
            raise _refused(
                repository, f"targets v{version} is missing from the registry (deleted?)", _TRUSTED
            )
        md = Metadata[Targets].from_bytes(data)
        if md.signed.version != version or not _signed_by_any(roots, md):
            raise _fork(
                repository, f"targets v{version} does not verify: not signed by the root's keys", _TRUSTED
            )
        named = md.signed.unrecognized_fields.get(PREVIOUS) or {}
        if named.get("sha256") != _sha(previous) or named.get("version") != version - 1:
            raise _fork(
                repository,
                f"targets v{version} does not descend from the targets v{version - 1} "
                + ("this machine trusts" if version - 1 == old_version else "before it")
                + ": a fork",
                _TRUSTED,
            )
        previous = data


def _signed_by_any(roots: list[Metadata[Root]], md: Metadata[Targets]) -> bool:
    for root in roots:
        try:
            root.verify_delegate("targets", md)
            return True
        except tuf_errors.UnsignedMetadataError:
            continue
    return False


def _fetch(fetcher: tufstore.RegistryFetcher, name: str) -> bytes | None:
    try:
        return b"".join(fetcher.fetch(tufstore.base_url(fetcher.registry.repository) + name))
    except tuf_errors.DownloadError:
        return None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest() if data else ""


def json_list(path: Path) -> list[str]:
    data = _read(path)
    try:
        found = parse_json(data.decode(), str(path)) if data else []
    except (InputError, UnicodeDecodeError):
        return []
    return [str(x) for x in found] if isinstance(found, list) else []


def _remember(path: Path, known: list[str], new: list[str]) -> None:
    merged = sorted(set(known) | set(new))
    if merged != sorted(known) or not path.is_file():
        write_atomic(path, json.dumps(merged, indent=0).encode())


def _replace(folder: Path, scratch: Path) -> None:
    """The trusted folder becomes `scratch` in one rename (the old one is kept aside until then)."""
    aside = folder.with_name(folder.name + ".old")
    shutil.rmtree(aside, ignore_errors=True)
    folder.rename(aside)
    scratch.rename(folder)
    shutil.rmtree(aside, ignore_errors=True)


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


def _fork(repository: str, what: str, restore: str) -> _Fork:
    return _Fork(str(_refused(repository, what, restore)))


def _refused(repository: str, what: str, restore: str) -> PublishError:
    return PublishError(
        f"refusing the tags of {repository}: {what}; nothing was trusted or changed. fix: ask the maintainers to "
        f"restore {restore} in the registry (or re-sign it: 'invoke sign.tuf-timestamp'); a registry writer may be "
        "hiding a later move or revocation"
    )
