"""Two `docker save` archives of one image compared layer by layer and file by file (rebuild --check).

Pure reading of files on disk: the archive's manifest.json (both Docker's legacy layout and the OCI layout
Docker 25+ writes), the image config, and each layer tar (plain or compressed). Differing files are named with
their owner: the Python distribution whose RECORD lists them, or the Debian package whose dpkg list does.
"""

from __future__ import annotations

import difflib
import hashlib
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkforge.boundary import parse_json

SMALL_TEXT = 16 << 10  # a content diff is shown for text files up to this size
DIFF_LINES = 40


@dataclass(frozen=True)
class Entry:
    """One tar member of a layer, reduced to what makes two layers differ."""

    kind: str  # file, dir, symlink, hardlink, other
    mode: int
    owner: str  # uid:gid
    mtime: int
    size: int
    digest: str  # sha256 of a file's bytes; link target of a link

    def differences(self, other: Entry) -> list[str]:
        what = [
            name
            for name, a, b in (
                ("type", self.kind, other.kind),
                ("content", self.digest, other.digest),
                ("mode", self.mode, other.mode),
                ("owner", self.owner, other.owner),
                ("mtime", self.mtime, other.mtime),
            )
            if a != b
        ]
        return what


@dataclass(frozen=True)
class SavedImage:
    """One image of a `docker save` archive: its config, layer diff IDs and the members holding the layers."""

    archive: Path
    config: dict[str, Any]
    config_digest: str
    layers: tuple[str, ...]

    @property
    def diff_ids(self) -> tuple[str, ...]:
        return tuple((self.config.get("rootfs") or {}).get("diff_ids") or ())

    @property
    def steps(self) -> tuple[str, ...]:
        """The Dockerfile step that made each layer (history entries that are not empty layers)."""
        history = [h for h in self.config.get("history") or [] if not h.get("empty_layer")]
        return tuple(str(h.get("created_by") or "") for h in history)


@dataclass(frozen=True)
class FileDiff:
    path: str
    differs: tuple[str, ...]  # content, mode, owner, mtime, type, "only in original", "only in rebuild"
    package: str | None = None
    diff: str = ""  # unified diff of a small text file's content

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "differs": list(self.differs), "package": self.package, "diff": self.diff}


@dataclass(frozen=True)
class LayerDiff:
    index: int
    step: str
    original: str | None
    rebuilt: str | None
    files: tuple[FileDiff, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "step": self.step,
            "original": self.original,
            "rebuilt": self.rebuilt,
            "files": [f.to_dict() for f in self.files],
        }


def read_saved(archive: Path) -> SavedImage:
    """The (first) image of a `docker save` archive."""
    with tarfile.open(archive) as tar:
        manifest = parse_json(_read(tar, "manifest.json").decode("utf-8"), f"{archive}: manifest.json")[0]
        raw = _read(tar, manifest["Config"])
    return SavedImage(
        archive,
        parse_json(raw.decode("utf-8"), f"{archive}: {manifest['Config']}"),
        "sha256:" + hashlib.sha256(raw).hexdigest(),
        tuple(manifest["Layers"]),
    )


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    handle = tar.extractfile(name)
    if handle is None:
        raise ValueError(f"{tar.name}: {name} is not a file")
    return handle.read()


def _layer(archive: Path, member: str) -> Iterator[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    with tarfile.open(archive) as outer:
        handle = outer.extractfile(member)
        if handle is None:
            return
        with tarfile.open(fileobj=handle, mode="r|*") as layer:
            for info in layer:
                yield layer, info


def layer_entries(archive: Path, member: str) -> dict[str, Entry]:
    """path -> Entry for every member of one layer (file contents hashed, never kept)."""
    out: dict[str, Entry] = {}
    for layer, info in _layer(archive, member):
        path = info.name.removeprefix("./").rstrip("/")
        if info.isreg():
            handle = layer.extractfile(info)
            digest = hashlib.sha256(handle.read() if handle else b"").hexdigest()
            kind = "file"
        elif info.issym() or info.islnk():
            digest, kind = info.linkname, "symlink" if info.issym() else "hardlink"
        else:
            digest, kind = "", "dir" if info.isdir() else "other"
        out[path] = Entry(kind, info.mode, f"{info.uid}:{info.gid}", int(info.mtime), info.size, digest)
    return out


def small_texts(archive: Path, member: str, paths: set[str]) -> dict[str, str]:
    """The text of those `paths` in one layer that are small UTF-8 files (for content diffs)."""
    out: dict[str, str] = {}
    for layer, info in _layer(archive, member):
        path = info.name.removeprefix("./").rstrip("/")
        if path in paths and info.isreg() and info.size <= SMALL_TEXT:
            handle = layer.extractfile(info)
            try:
                out[path] = (handle.read() if handle else b"").decode()
            except UnicodeDecodeError:
                continue
    return out


def package_owners(image: SavedImage) -> dict[str, str]:
    """path -> 'python:<dist>' or 'debian:<package>' from every RECORD and dpkg list in the image."""
    owners: dict[str, str] = {}
    for member in image.layers:
        for layer, info in _layer(image.archive, member):
            name = info.name.removeprefix("./")
            if not info.isreg():
                continue
            if name.endswith(".dist-info/RECORD"):
                site = name.rsplit("/", 2)[0]
                dist = name.rsplit("/", 2)[1].removesuffix(".dist-info").split("-")[0]
                handle = layer.extractfile(info)
                for line in (handle.read() if handle else b"").decode(errors="replace").splitlines():
                    rel = line.split(",", 1)[0]
                    if rel:
                        owners[str(Path(site, rel)).replace("\\", "/")] = f"python:{dist}"
            elif name.startswith("var/lib/dpkg/info/") and name.endswith(".list"):
                package = name.rsplit("/", 1)[1].removesuffix(".list").split(":")[0]
                handle = layer.extractfile(info)
                for line in (handle.read() if handle else b"").decode(errors="replace").splitlines():
                    owners.setdefault(line.lstrip("/"), f"debian:{package}")
    return owners


def owner_of(path: str, owners: Mapping[str, str]) -> str | None:
    """The package owning `path`; a __pycache__ file belongs to its source's package."""
    if path in owners:
        return owners[path]
    if "/__pycache__/" in path:
        parent, _, name = path.rpartition("/__pycache__/")
        return owners.get(f"{parent}/{name.split('.')[0]}.py")
    return None


def _text_diff(path: str, a: str | None, b: str | None) -> str:
    if a is None or b is None:
        return ""
    lines = difflib.unified_diff(
        a.splitlines(), b.splitlines(), f"original/{path}", f"rebuild/{path}", lineterm="", n=1
    )
    return "\n".join(list(lines)[:DIFF_LINES])


def compare_layer(
    original: SavedImage, rebuilt: SavedImage, left: int, right: int, owners: Mapping[str, str]
) -> tuple[FileDiff, ...]:
    """Every file that differs between the original's layer `left` and the rebuild's layer `right`, with its
    package and a small diff."""
    a = layer_entries(original.archive, original.layers[left])
    b = layer_entries(rebuilt.archive, rebuilt.layers[right])
    found: dict[str, tuple[str, ...]] = {}
    for path in sorted(a.keys() | b.keys()):
        if path not in b:
            found[path] = ("only in original",)
        elif path not in a:
            found[path] = ("only in rebuild",)
        elif what := a[path].differences(b[path]):
            found[path] = tuple(what)
    texts = {p for p, what in found.items() if "content" in what}
    old = small_texts(original.archive, original.layers[left], texts) if texts else {}
    new = small_texts(rebuilt.archive, rebuilt.layers[right], texts) if texts else {}
    dirs = {p for p, e in (*a.items(), *b.items()) if e.kind == "dir"}  # many packages list a directory
    return tuple(
        FileDiff(
            path,
            what,
            None if path in dirs else owner_of(path, owners),
            _text_diff(path, old.get(path), new.get(path)),
        )
        for path, what in found.items()
    )


def one_sided(image: SavedImage, index: int, side: str) -> tuple[FileDiff, ...]:
    """Every member of a layer only `image` has (side: "only in original" / "only in rebuild"), by name."""
    return tuple(
        FileDiff(path, (side,)) for path in sorted(layer_entries(image.archive, image.layers[index]))
    )


def pair_layers(a: tuple[str, ...], b: tuple[str, ...]) -> list[tuple[int | None, int | None]]:
    """The differing layers of two diff-ID lists, paired: equal runs are aligned (an extra layer in one image
    does not make every later layer differ), a replaced run pairs index by index, the rest stands alone."""
    pairs: list[tuple[int | None, int | None]] = []
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        common = min(i2 - i1, j2 - j1)
        pairs += [(i1 + k, j1 + k) for k in range(common)]
        pairs += [(i, None) for i in range(i1 + common, i2)]
        pairs += [(None, j) for j in range(j1 + common, j2)]
    return pairs


def _step(image: SavedImage, index: int) -> str:
    steps = image.steps
    return steps[index] if len(steps) == len(image.diff_ids) else ""


def compare_images(original: SavedImage, rebuilt: SavedImage) -> list[LayerDiff]:
    """One LayerDiff per layer whose diff ID differs or that only one image has, every such file named."""
    out: list[LayerDiff] = []
    a, b = original.diff_ids, rebuilt.diff_ids
    owners: dict[str, str] | None = None
    for left, right in pair_layers(a, b):
        if left is None and right is not None:
            files = one_sided(rebuilt, right, "only in rebuild")
            out.append(LayerDiff(right, _step(rebuilt, right), None, b[right], files))
        elif right is None and left is not None:
            files = one_sided(original, left, "only in original")
            out.append(LayerDiff(left, _step(original, left), a[left], None, files))
        elif left is not None and right is not None:
            owners = owners if owners is not None else package_owners(rebuilt)
            files = compare_layer(original, rebuilt, left, right, owners)
            step = _step(rebuilt, right) or _step(original, left)
            out.append(LayerDiff(right, step, a[left], b[right], files))
    return out


def config_differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two image configs (rootfs left out: the layers say that)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(a.keys() | b.keys()):
            if not prefix and key == "rootfs":
                continue
            out += config_differences(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in config_differences(x, y, f"{prefix}{i}.")
        ]
    return [] if a == b else [prefix.rstrip(".")]
