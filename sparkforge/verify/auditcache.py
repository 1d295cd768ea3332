"""The kernel audit's per-file cache: what the fatbin reader found in one file, under the file's content digest.

A file of an image layer is named by the layer's diff ID (the sha256 of the layer's uncompressed content, which
the engine checks when it unpacks the layer) and its path in the layer: the same two give the same bytes, so an
image that shares its torch layer with one audited before (the next build of a recipe) reads libtorch_cuda.so's
2,500 fatbin headers from here instead of mapping the 500 MB file again, and verify's kernels check after a build
answers from what `invoke kernels` (or the previous build) read. The key also holds the reader's version
(`fatbin.READER_VERSION`): a reader that parses the same bytes differently never sees an older answer. Entries are
written atomically (a temporary file renamed into place); an entry that does not parse as one is ignored and
read again from the file (never trusted as a verdict).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparkforge.audit.coverage import ScannedFile
from sparkforge.audit.fatbin import READER_VERSION, Container, Entry, FatbinFile
from sparkforge.audit.scan import scan_one
from sparkforge.boundary import read_json
from sparkforge.context import cache_path, cache_root, write_atomic
from sparkforge.errors import InputError

_FORMATS = ("elf", "fatbin")
_VARIANTS = ("", "a", "f")
_COMPRESSIONS = ("none", "zstd", "lz4")
MAX_ENTRY_BYTES = 64 << 20  # torch 2.14's libtorch_cuda.so (2,558 entries) keeps ~200 kB
MISS = object()  # load()'s answer when nothing usable is kept (None is a kept "no device code")


def layer_file_digest(layer_digest: str, path: str) -> str:
    """The content identity of a file in an image layer: the layer's diff ID and the path inside it."""
    return hashlib.sha256(json.dumps(["layer-file", layer_digest, path]).encode()).hexdigest()


def _entry_path(digest: str) -> Path:
    key = hashlib.sha256(json.dumps([READER_VERSION, digest]).encode()).hexdigest()
    return cache_path("kernels", "files", key[:2], key[2:34] + ".json")


def _to_json(fatbin: FatbinFile | None) -> dict[str, Any]:
    if fatbin is None:
        return {"version": READER_VERSION, "device_code": False}
    return {
        "version": READER_VERSION,
        "device_code": True,
        "format": fatbin.format,
        "machine": fatbin.machine,
        "embedded": fatbin.embedded,
        "containers": [
            [c.offset, c.size, c.section, [list(e) for e in c.entries]] for c in fatbin.containers
        ],
    }


def _entry(raw: Sequence[Any]) -> Entry:
    kind, arch, variant, compression, offset, header, payload, size, flags, name = raw
    ints = (arch, offset, header, payload, size, flags)
    if not (
        isinstance(kind, str)
        and variant in _VARIANTS
        and compression in _COMPRESSIONS
        and isinstance(name, str)
        and all(type(v) is int and v >= 0 for v in ints)
    ):
        raise ValueError("not a fatbin entry")
    return Entry(kind, arch, variant, compression, offset, header, payload, size, flags, name)


def _from_json(data: Any) -> FatbinFile | None:
    """The kept answer; ValueError (or TypeError, KeyError) when it is not one this reader wrote."""
    if not isinstance(data, dict) or data.get("version") != READER_VERSION:
        raise ValueError("another reader's entry")
    if data["device_code"] is False:
        return None
    if (
        data["format"] not in _FORMATS
        or type(data["machine"]) is not int
        or type(data["embedded"]) is not bool
    ):
        raise ValueError("not a fatbin file")
    containers = []
    for offset, size, section, entries in data["containers"]:
        if type(offset) is not int or type(size) is not int or not isinstance(section, str):
            raise ValueError("not a container")
        containers.append(Container(offset, size, section, tuple(_entry(e) for e in entries)))
    return FatbinFile(data["format"], data["machine"], tuple(containers), data["embedded"])


def load(digest: str) -> object:
    """The kept answer for the file of this content digest (a FatbinFile or None), else MISS."""
    path = _entry_path(digest)
    if not path.is_file():
        return MISS
    try:
        return _from_json(
            read_json(
                path,
                "a kept kernel audit entry",
                max_bytes=MAX_ENTRY_BYTES,
                named=False,
                within=(cache_root(),),
            )
        )
    except (InputError, ValueError, TypeError, KeyError):
        return MISS  # unreadable or damaged: the file is read again and the entry rewritten


def store(digest: str, fatbin: FatbinFile | None) -> None:
    write_atomic(_entry_path(digest), json.dumps(_to_json(fatbin), separators=(",", ":")).encode())


def scan_known(files: Sequence[tuple[str, Path, str]]) -> list[ScannedFile]:
    """(reported path, path on disk, content digest) triples read through the cache: a file is read only when
    its digest has no usable entry. A file that cannot be read is reported as unreadable and not kept."""
    found = []
    for where, source, digest in files:
        kept = load(digest)
        if kept is MISS:
            item = scan_one(where, source)
            if item is None or item.fatbin is not None:
                store(digest, None if item is None else item.fatbin)
        else:
            item = None if kept is None else ScannedFile(where, kept)  # type: ignore[arg-type]
        if item is not None:
            found.append(item)
    return found
