"""PyPI through the Simple API (PEP 691 JSON): pick a release's sdist or a platform's wheel, get its files.

The per-release JSON API is not used on purpose: some proxies answer it with 404 while the Simple API
works. A resolved file (name, URL, sha256) is recorded in the cache, so a warm run needs no network.
"""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from packaging.tags import Tag
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from sparkforge import oci
from sparkforge.boundary import write_output
from sparkforge.errors import PreflightError
from sparkforge.preflight.fetch import (
    Fetcher,
    extract_wheel_members,
    preflight_cache,
    publish_dir,
    read_record,
    scratch_dir,
    write_record,
)

PYPI_SIMPLE = "https://pypi.org/simple"
SIMPLE_ACCEPT = "application/vnd.pypi.simple.v1+json"
WHEEL_FILE_LIST = ".sparkforge-wheel-files"  # the wheel's member names, kept beside the extracted members


@dataclass(frozen=True)
class DistFile:
    """One file of a release on an index."""

    filename: str
    url: str
    sha256: str
    size: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class WheelTarget:
    """Which wheels fit: a CPU architecture and a CPython minor (e.g. aarch64, 3.12)."""

    machine: str
    python: str

    @classmethod
    def of(cls, platform: str, python: str) -> WheelTarget:
        machine = oci.PLATFORMS[platform].machine if platform in oci.PLATFORMS else platform
        return cls(machine, python)

    def accepts(self, tag: Tag) -> bool:
        cp = "cp" + self.python.replace(".", "")
        platform_ok = tag.platform == "any" or (
            tag.platform.endswith("_" + self.machine)
            and tag.platform.startswith(("manylinux", "linux", "musllinux"))
        )
        if tag.interpreter == cp:
            return platform_ok
        if tag.abi == "abi3" and tag.interpreter.startswith("cp"):
            return platform_ok and int(tag.interpreter[3:] or 0) <= int(cp[3:])
        return platform_ok and tag.interpreter in ("py3", "py" + cp[2:]) and tag.abi == "none"


def project_files(fetcher: Fetcher, project: str, index: str = PYPI_SIMPLE) -> list[DistFile]:
    """Every file of `project` on a PEP 691 index."""
    url = f"{index.rstrip('/')}/{canonicalize_name(project)}/"
    data = fetcher.get_json(url, what=f"the {project} file list", headers={"Accept": SIMPLE_ACCEPT})
    files = []
    for item in data.get("files", []):
        sha = item.get("hashes", {}).get("sha256")
        if not sha or item.get("yanked"):
            continue
        files.append(DistFile(item["filename"], item["url"], sha, int(item.get("size") or 0)))
    return files


def _version_of(filename: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        return parse_sdist_filename(filename)[1]
    except (ValueError, InvalidVersion):
        return None


def select_sdist(files: Sequence[DistFile], project: str, version: str) -> DistFile:
    wanted = Version(version)
    for item in files:
        if item.filename.endswith((".tar.gz", ".zip")) and _version_of(item.filename) == wanted:
            return item
    raise PreflightError(
        f"PyPI has no sdist of {project}=={version}; fix: check components version, or use --source github"
    )


def select_wheel(files: Sequence[DistFile], project: str, version: str, target: WheelTarget) -> DistFile:
    wanted = Version(version)
    for item in files:
        if not item.filename.endswith(".whl") or _version_of(item.filename) != wanted:
            continue
        if any(target.accepts(tag) for tag in parse_wheel_filename(item.filename)[3]):
            return item
    raise PreflightError(
        f"PyPI has no {project}=={version} wheel for {target.machine} / Python {target.python}; "
        "fix: pick a version with such a wheel, or build from source (source: git)"
    )


def resolve_file(
    fetcher: Fetcher, project: str, version: str, *, wheel: WheelTarget | None, index: str = PYPI_SIMPLE
) -> DistFile:
    """The sdist (wheel=None) or fitting wheel of project==version; answered from the cache when known."""
    kind = f"wheel:{wheel.machine}:{wheel.python}" if wheel else "sdist"
    key = f"pypi|{index}|{canonicalize_name(project)}|{version}|{kind}"
    cached = read_record(key)
    if cached is not None:
        return DistFile(cached["filename"], cached["url"], cached["sha256"], int(cached["size"]))
    files = project_files(fetcher, project, index)
    found = select_wheel(files, project, version, wheel) if wheel else select_sdist(files, project, version)
    write_record(key, found.to_dict())
    return found


def wheel_members(
    fetcher: Fetcher, dist: DistFile, members: Sequence[str], *, suffixes: Sequence[str] = ()
) -> Path:
    """A directory holding the named members of a wheel (and names ending in `suffixes`), fetched once.

    Reads only those members through HTTP range requests when the server allows it (a 300 MB wheel costs
    a few hundred kB); otherwise downloads the whole wheel into the cache.
    """
    selection = hashlib.sha256("\0".join([*members, "|", *suffixes]).encode()).hexdigest()[:12]

    def open_archive() -> zipfile.ZipFile:
        what = dist.filename
        archive = fetcher.open_remote_zip(dist.url, dist.size, what=what) if dist.size else None
        return archive or zipfile.ZipFile(fetcher.download(dist.url, what=what, sha256=dist.sha256))

    return cached_members(f"{dist.sha256}-{selection}", open_archive, members, suffixes)


def cached_members(
    key: str,
    open_archive: Callable[[], zipfile.ZipFile],
    members: Sequence[str],
    suffixes: Sequence[str] = (),
) -> Path:
    """The one wheel-member cache: members (and names ending in `suffixes`) extracted once under `key`."""
    final = preflight_cache("wheels", key)
    if (final / WHEEL_FILE_LIST).is_file():
        return final
    with open_archive() as archive:
        names = archive.namelist()
        wanted = [*members, *(n for n in names if suffixes and n.endswith(tuple(suffixes)))]
        tmp = scratch_dir("wheels")
        extract_wheel_members(archive, wanted, tmp)  # the one guarded copy (no absolute or '..' members)
    write_output(tmp / WHEEL_FILE_LIST, "\n".join(names) + "\n", "a wheel's file list")
    return publish_dir(tmp, final)
