"""The trust cache folder checked before python-tuf sees it: python-tuf opens its metadata files with plain
open(), so a FIFO there would hang it and a link would make it read (or its writer write) outside the cache.
The folder must be a real folder holding only regular files, by the names sparkforge keeps there, each of a
bounded size."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from sparkforge.errors import PublishError

# What the trusted folder holds (tufclient.TRUSTED_FILES, its refused and revoked lists): an allow-list.
NAMES = ("root.json", "timestamp.json", "snapshot.json", "targets.json", "refused.json", "revoked.json")
HISTORY = "root_history"  # python-tuf's own: every root version it trusted
ROOT_VERSION = re.compile(r"[0-9]{1,9}\.root\.json")
MAX_FILE = 16 << 20  # signed metadata of one repository: kilobytes; the revoked list grows slowly


def check_trust_folder(folder: Path) -> Path:
    """`folder` when python-tuf may read it, else a PublishError naming the entry and the fix. python-tuf keeps
    each root as root_history/<N>.root.json and makes root.json a relative link to the newest: that one link,
    into that folder, is the only link allowed."""
    fix = f"fix: remove {folder} (the next 'invoke pull' rebuilds it from the registry and the root)"
    if not stat.S_ISDIR(os.lstat(folder).st_mode):
        raise PublishError(f"trust cache {folder}: a link or file, not a folder; {fix}")
    for name, entry in _entries(folder):
        if name == HISTORY and stat.S_ISDIR(entry.st_mode):
            for root, inner in _entries(folder / HISTORY):
                if not ROOT_VERSION.fullmatch(root):
                    raise PublishError(
                        f"trust cache {folder}: {HISTORY}/{root!r} is not a root version file; {fix}"
                    )
                _regular(folder, f"{HISTORY}/{root}", inner, fix)
            continue
        if name not in NAMES:
            raise PublishError(f"trust cache {folder}: {name!r} is not a file sparkforge keeps there; {fix}")
        if name == "root.json" and stat.S_ISLNK(entry.st_mode):
            target = os.readlink(folder / name)
            if not re.fullmatch(rf"{HISTORY}/{ROOT_VERSION.pattern}", target):
                raise PublishError(
                    f"trust cache {folder}: root.json links to {target[:120]!r}, out of {HISTORY}/; {fix}"
                )
            continue
        _regular(folder, name, entry, fix)
    return folder


def _entries(folder: Path) -> list[tuple[str, os.stat_result]]:
    with os.scandir(folder) as entries:
        return [(e.name, e.stat(follow_symlinks=False)) for e in entries]


def _regular(folder: Path, name: str, entry: os.stat_result, fix: str) -> None:
    if not stat.S_ISREG(entry.st_mode):
        kind = "a link" if stat.S_ISLNK(entry.st_mode) else "a folder, device or pipe"
        raise PublishError(f"trust cache {folder}: {name} is {kind}, not a regular file; {fix}")
    if entry.st_size > MAX_FILE:
        raise PublishError(
            f"trust cache {folder}: {name} holds {entry.st_size} bytes (at most {MAX_FILE}); {fix}"
        )
