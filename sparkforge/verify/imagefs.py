"""An image's files read straight from the engine's layer store, without exporting the filesystem.

`docker export` streams every byte of an image (81.5 s for the 10 GB CI image). The overlay2 store already
keeps each layer as a directory; walking those directories bottom to top, with overlayfs' whiteouts and opaque
directories applied, gives the image's file list from metadata alone, and a checker then opens only the files it
needs. When the store cannot be read here (another storage driver, a remote engine, no permission) callers fall
back to the export stream, which gives the same answers slowly.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sparkforge import engine
from sparkforge.boundary import parse_json, read_bytes, read_text, sha256_file
from sparkforge.context import cache_path, write_atomic
from sparkforge.errors import AuditError, InputError
from sparkforge.report import Report

OPAQUE_XATTR = "trusted.overlay.opaque"
CACHE_FORMAT = 1  # part of every cache key here: a change of the listing's or report's shape bumps it
MAX_LISTING_BYTES = 1 << 30  # a cached layer listing: a few hundred bytes a file, up to millions of files
MAX_LISTING_ITEMS = 50_000_000
# Never ELF or fatbin: the kernel audit does not open these (two thirds of a vLLM image's 100k files).
TEXT_SUFFIXES = frozenset(
    [
        ".py",
        ".pyc",
        ".pyi",
        ".pyx",
        ".pxd",
        ".h",
        ".hpp",
        ".hxx",
        ".cuh",
        ".inl",
        ".c",
        ".cc",
        ".cpp",
        ".cu",
        ".txt",
        ".md",
        ".rst",
        ".json",
        ".yaml",
        ".yml",
        ".toml",
        ".cfg",
        ".ini",
        ".html",
        ".js",
        ".css",
        ".csv",
        ".typed",
        ".jinja",
        ".j2",
        ".mo",
        ".po",
        ".pem",
        ".sh",
        ".bc",
        ".ll",
        ".mlir",
        ".td",
        ".cmake",
        ".xml",
        ".svg",
        ".png",
    ]
)


def may_carry_device_code(path: str) -> bool:
    """False for files whose suffix says source or text; the audit opens only the rest."""
    name = path.rsplit("/", 1)[-1]
    return "." not in name or name[name.rindex(".") :] not in TEXT_SUFFIXES


@dataclass(frozen=True, slots=True)
class LayerFile:
    """A regular file visible in the image: its path inside the image and where its bytes lie on this host."""

    path: str  # relative to the image root, no leading "/"
    location: str  # the file in the layer directory (a str: a Path per file costs seconds on 100k files)
    size: int
    layer: int  # index into ImageTree.layers, bottom = 0
    inode: tuple[int, int] = (0, 0)  # (device, inode) on this host
    links: int = 1

    @property
    def source(self) -> Path:
        return Path(self.location)


@dataclass(frozen=True)
class LayerStats:
    """What one layer writes, including files that later layers hide or delete (still pulled by every node)."""

    index: int
    directory: Path
    files: int
    bytes: int
    hidden_bytes: int  # bytes of this layer's files that no one sees in the final image


@dataclass(frozen=True)
class ImageTree:
    """The visible regular files of an image (merged from its layers) and per-layer totals."""

    subject: str
    layers: tuple[LayerStats, ...]
    files: tuple[LayerFile, ...]  # sorted by path; hard links to one inode appear once

    @property
    def visible_bytes(self) -> int:
        return sum(f.size for f in self.files)


def _is_opaque(path: str) -> bool:
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _drop(visible: dict[str, LayerFile], dirs: set[str], path: str) -> None:
    """Remove `path` and, when it was a directory, everything below it (a whiteout or an opaque directory)."""
    visible.pop(path, None)
    if path in dirs:
        prefix = path + "/"
        for key in [k for k in visible if k.startswith(prefix)]:
            del visible[key]
        dirs.difference_update([d for d in dirs if d.startswith(prefix)])
        dirs.discard(path)


# One entry of a layer directory: (path, kind, size, inode, links); kind is one of the constants below.
Entry = tuple[str, str, int, int, int]
DIR, OPAQUE_DIR, WHITEOUT, FILE, OTHER = "d", "o", "w", "f", "x"


@dataclass(frozen=True)
class LayerListing:
    """What one layer directory holds, in walk order (a directory before what it contains)."""

    device: int
    entries: tuple[Entry, ...]


def list_layer(root: Path) -> LayerListing:
    """Every entry of one layer directory, from metadata alone (no file is opened)."""
    out: list[Entry] = []
    stack = [("", str(root))]
    while stack:
        rel_dir, real_dir = stack.pop()
        try:
            entries = list(os.scandir(real_dir))
        except OSError as exc:
            raise AuditError(
                f"{real_dir}: cannot list a layer directory of the engine's store ({exc.strerror}); fix: run "
                "as a user who can read the Docker root directory, or audit through the export stream"
            ) from exc
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            info = entry.stat(follow_symlinks=False)
            mode = info.st_mode
            if stat.S_ISDIR(mode):
                out.append((rel, OPAQUE_DIR if _is_opaque(entry.path) else DIR, 0, 0, 0))
                stack.append((rel, entry.path))
            elif stat.S_ISCHR(mode) and info.st_rdev == 0:
                out.append((rel, WHITEOUT, 0, 0, 0))  # overlayfs whiteout: deleted by this layer
            elif stat.S_ISREG(mode):
                out.append((rel, FILE, info.st_size, info.st_ino, info.st_nlink))
            else:
                out.append((rel, OTHER, 0, 0, 0))  # a link or device: hides a lower file, has no bytes
    return LayerListing(os.stat(root).st_dev, tuple(out))


def _apply_layer(
    index: int, root: Path, listing: LayerListing, visible: dict[str, LayerFile], dirs: set[str]
) -> tuple[int, int]:
    """Apply one layer's listing to the merged view (overlayfs rules); returns (files, bytes) it writes."""
    files = size = 0
    inodes: set[int] = set()  # a hard link's bytes are in the layer once
    base = str(root)
    for rel, kind, length, ino, links in listing.entries:
        if kind in (DIR, OPAQUE_DIR):
            if kind == OPAQUE_DIR and rel in dirs:  # opaque matters only over a lower directory
                _drop(visible, dirs, rel)
            visible.pop(rel, None)  # a directory replacing a lower file
            dirs.add(rel)
            continue
        _drop(visible, dirs, rel)
        if kind == FILE:
            if links == 1 or ino not in inodes:
                inodes.add(ino)
                files += 1
                size += length
            visible[rel] = LayerFile(rel, f"{base}/{rel}", length, index, (listing.device, ino), links)
    return files, size


def _listing(root: Path, digest: str | None) -> LayerListing:
    """A layer's listing, from the cache when its digest (and directory) was listed before."""
    if digest is None:
        return list_layer(root)
    key = hashlib.sha256(json.dumps([CACHE_FORMAT, digest, str(root)]).encode()).hexdigest()[:32]
    cached = cache_path("layers", key + ".json")
    if cached.is_file():
        try:
            text = read_text(cached, "", MAX_LISTING_BYTES, named=False, within=[cached.parent])
            data = parse_json(text, str(cached), max_items=MAX_LISTING_ITEMS)
            return LayerListing(int(data["device"]), tuple(tuple(e) for e in data["entries"]))  # type: ignore[misc]
        except (InputError, ValueError, KeyError, TypeError):
            pass  # a damaged cache file is listed again and rewritten
    listing = list_layer(root)
    write_atomic(cached, json.dumps({"device": listing.device, "entries": listing.entries}).encode())
    return listing


def _once_per_inode(visible: Mapping[str, LayerFile]) -> list[LayerFile]:
    """The visible files sorted by path, a hard-linked file under its first name only (as the export lists it)."""
    seen: set[tuple[int, int]] = set()
    files: list[LayerFile] = []
    for path in sorted(visible):
        item = visible[path]
        if item.links > 1:
            if item.inode in seen:
                continue  # a hard link: the export lists it as a link, not as a second file
            seen.add(item.inode)
        files.append(item)
    return files


def read_layers(layers: Sequence[Path], subject: str, digests: Sequence[str] | None = None) -> ImageTree:
    """Merge layer directories (bottom to top, overlayfs rules) into the image's visible regular files.

    `digests`: the layers' content digests (the image's diff IDs, bottom to top); each layer's listing is then
    kept in the cache under its digest and directory, so an image sharing layers with one read before (or read
    again) walks only the layers not seen yet. Image layers never change once written."""
    if digests is not None and len(digests) != len(layers):
        digests = None  # not one digest per directory: nothing to key a listing by
    visible: dict[str, LayerFile] = {}
    dirs: set[str] = set()
    written: list[tuple[int, int]] = []
    for index, layer in enumerate(layers):
        listing = _listing(layer, digests[index] if digests is not None else None)
        written.append(_apply_layer(index, layer, listing, visible, dirs))
    files = _once_per_inode(visible)
    shown = [0] * len(layers)
    for item in files:
        shown[item.layer] += item.size
    stats = tuple(
        LayerStats(i, layer, written[i][0], written[i][1], written[i][1] - shown[i])
        for i, layer in enumerate(layers)
    )
    return ImageTree(subject=subject, layers=stats, files=tuple(files))


def _scoped_layer(
    root: str,
    keep: Callable[[str], bool],
    name: Callable[[str], bool],
    visible: Mapping[str, LayerFile],
    above: set[str],
) -> tuple[list[tuple[str, str]], list[str], int]:
    """One layer walked by directory entry type alone: (its files `keep` accepts, the paths where it hides lower
    files, how many regular files it holds). `above`: the directories holding the lower layers' kept files.

    Nothing is stat'ed here, only a directory holding a kept lower file has its opaque attribute read, and a
    file's path is built only where it may matter (its directory holds kept lower files, or its name passes)."""
    kept: list[tuple[str, str]] = []
    hides: list[str] = []
    files = 0
    stack = [("", root)]
    while stack:
        rel_dir, real_dir = stack.pop()
        watched = rel_dir in above if rel_dir else bool(visible)  # only here can an entry hide a kept file
        try:
            listing = os.scandir(real_dir)
        except OSError as exc:
            raise AuditError(
                f"{real_dir}: cannot list a layer directory of the engine's store ({exc.strerror}); fix: run "
                "as a user who can read the Docker root directory, or audit through the export stream"
            ) from exc
        with listing:
            for entry in listing:
                if entry.is_dir(follow_symlinks=False):
                    rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                    stack.append((rel, entry.path))
                    if watched and (rel in visible or (rel in above and _is_opaque(entry.path))):
                        hides.append(
                            rel
                        )  # a directory over a lower file; an opaque one over a lower directory
                    continue
                rel = ""
                if watched:
                    rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                    if rel in visible or rel in above:
                        hides.append(rel)  # a whiteout, file or link over a lower file or directory
                if entry.is_file(follow_symlinks=False):
                    files += 1
                    if name(entry.name):
                        rel = rel or (f"{rel_dir}/{entry.name}" if rel_dir else entry.name)
                        if keep(rel):
                            kept.append((rel, entry.path))
    return kept, hides, files


def read_layers_scoped(
    layers: Sequence[Path], keep: Callable[[str], bool], name: Callable[[str], bool] = lambda _: True
) -> tuple[list[LayerFile], int]:
    """The image's visible regular files whose path `keep` accepts, and how many regular files the layers hold.
    `name`: a first test of a file's base name that every kept file passes (e.g. audit.coverage.name_filter).

    The same overlayfs rules as `read_layers` (whiteouts, opaque directories, a directory or a link over a file),
    applied to the kept files only: each layer is walked by its directory entries' types, and only the kept
    files are stat'ed, so an audit of three libraries does not pay a stat and a merge for each of 100k files."""
    visible: dict[str, LayerFile] = {}
    above: set[str] = set()
    total = 0
    for index, layer in enumerate(layers):
        kept, hides, files = _scoped_layer(str(layer), keep, name, visible, above)
        total += files
        for path in hides:
            prefix = path + "/"
            for hidden in [p for p in visible if p == path or p.startswith(prefix)]:
                del visible[hidden]
        for rel, location in kept:
            info = os.stat(location, follow_symlinks=False)
            visible[rel] = LayerFile(
                rel, location, info.st_size, index, (info.st_dev, info.st_ino), info.st_nlink
            )
        above = {path.rsplit("/", i)[0] for path in visible for i in range(1, path.count("/") + 1)}
    return _once_per_inode(visible), total


def read_file(source: Path, max_bytes: int) -> bytes:
    """The bytes of one image file (a LayerFile's `source`), at most `max_bytes` (AuditError beyond)."""
    try:
        return read_bytes(source, "", max_bytes)
    except InputError as exc:  # over max_bytes, or no regular file
        raise AuditError(str(exc)) from None


def file_sha256(source: Path) -> str:
    """The sha256 (hex) of one image file, read in chunks."""
    try:
        return sha256_file(source, "", 1 << 40)
    except InputError as exc:
        raise AuditError(str(exc)) from None


def image_tree(ref: str) -> ImageTree | None:
    """The image's files from the engine's layer store; None when this host cannot read the store."""
    layers = engine.image_layer_dirs(ref)
    if layers is None:
        return None
    digests = ((engine.inspect_image(ref).get("RootFS") or {}).get("Layers")) or None
    return read_layers(layers, ref, [str(d) for d in digests] if digests else None)


def audit_image(
    ref: str, gpu: str, require: Sequence[str], *, reader: str = "auto", only: Sequence[str] | None = None
) -> Report:
    """Kernel coverage of an image: from its layers when readable (`reader` auto/layers), else its export.

    `only`: globs of the libraries to open (None: every file that may carry device code)."""
    from sparkforge.audit.scan import audit_tar_stream
    from sparkforge.errors import InputError
    from sparkforge.report import load_report

    if reader not in ("auto", "layers", "export"):
        raise AuditError(f"reader {reader!r}: use auto, layers or export")
    # An image ID names its bytes: the same audit of the same ID is answered from the cache.
    identity = [
        CACHE_FORMAT,
        str(engine.inspect_image(ref)["Id"]),
        gpu,
        sorted(require),
        sorted(set(only or ())),
        only is None,
    ]
    cached = cache_path(
        "kernels", "image-audit", hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:32]
    )
    if reader == "auto" and cached.is_file():  # a reader named explicitly is asked to read, not remembered
        try:
            report = load_report(cached)
            report.subject = ref
            return report
        except InputError:
            pass  # a damaged cache file: audited again and rewritten
    start = time.monotonic()
    layers = None if reader == "export" else engine.image_layer_dirs(ref)
    if layers is None and reader == "layers":
        raise AuditError(
            f"{ref}: the engine's layer store cannot be read from this host (not overlay2, remote, or no "
            "permission); fix: run as root on the engine's host, or use the export reader"
        )
    if layers is not None:
        digests = [str(d) for d in (engine.inspect_image(ref).get("RootFS") or {}).get("Layers") or []]
        report = audit_layers(ref, layers, digests, gpu, require, only)
    else:
        with engine.ExportedFilesystem(ref) as stream:
            report = audit_tar_stream(stream, subject=ref, gpu=gpu, require=require, only=only)
    report.extra["reader"] = {
        "kind": "layers" if layers is not None else "export",
        "duration_s": round(time.monotonic() - start, 3),
    }
    write_atomic(cached, json.dumps(report.to_dict(), sort_keys=True).encode())
    return report


def audit_layers(
    ref: str,
    layers: Sequence[Path],
    digests: Sequence[str],
    gpu: str,
    require: Sequence[str],
    only: Sequence[str] | None,
) -> Report:
    """The audit from the layer directories: with `only`, a walk that stats and merges just the files in scope;
    each library's fatbin headers kept under its layer's digest and path (verify/auditcache.py)."""
    from sparkforge.audit.compat import parse_target
    from sparkforge.audit.coverage import ScanResult, build_report, name_filter, scope_filter
    from sparkforge.audit.scan import audit_files, scan_one
    from sparkforge.verify import auditcache

    start = time.monotonic()
    keep = scope_filter(only)
    if (
        keep is None
    ):  # every library: the full merge (its listings kept per layer), then every candidate opened
        tree = read_layers(layers, ref, digests or None)
        wanted = [(f.path, f.source) for f in tree.files if may_carry_device_code(f.path)]
        report = audit_files(wanted, ref, gpu=gpu, require=require)
        report.extra["summary"]["files_scanned"] = len(tree.files)  # every file was considered, by name
        return report
    names = name_filter(only) or (lambda _: True)
    files, total = read_layers_scoped(layers, lambda path: keep(path) and may_carry_device_code(path), names)
    if len(digests) == len(layers):
        scanned = auditcache.scan_known(
            [(f.path, f.source, auditcache.layer_file_digest(digests[f.layer], f.path)) for f in files]
        )
    else:  # no digest per layer: nothing names the files' content
        scanned = [s for f in files if (s := scan_one(f.path, f.source)) is not None]
    # files_scanned: the layers' regular files, considered by name (a file an upper layer hides counts too)
    scan = ScanResult(tuple(scanned), total, total - len(files))
    return build_report(ref, parse_target(gpu), scan, require, time.monotonic() - start, only=only)
