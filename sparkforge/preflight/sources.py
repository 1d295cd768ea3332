"""Where the vLLM source (or wheel) at the recipe's pin comes from, as a directory preflight can read.

Sources: GitHub's archive of the commit (any mirror with GitHub's URL layout), PyPI's sdist or wheel of
the release (its vllm/_version.py must name the pinned commit), an archive URL, or a local checkout,
directory, archive or wheel. Archives are cached by sha256 and extracted once.
"""

from __future__ import annotations

import ast
import re
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from packaging.utils import canonicalize_name

from sparkforge.boundary import read_source, sha256_file
from sparkforge.commands import Command
from sparkforge.context import Session
from sparkforge.errors import CommandError, PreflightError
from sparkforge.preflight.fetch import (
    MAX_DOWNLOAD_BYTES,
    Fetcher,
    preflight_cache,
    publish_dir,
    read_record,
    scratch_dir,
    write_record,
)
from sparkforge.preflight.pypi import (
    PYPI_SIMPLE,
    WHEEL_FILE_LIST,
    WheelTarget,
    cached_members,
    resolve_file,
    wheel_members,
)
from sparkforge.recipe.loader import Recipe
from sparkforge.recipe.schema import Component

GITHUB = "https://github.com"
REGISTRY_PY = "vllm/model_executor/models/registry.py"
VERSION_PY = "vllm/_version.py"


@dataclass(frozen=True)
class UpstreamTree:
    """The vLLM files preflight reads: a full source tree, or the few members of a wheel it needs."""

    root: Path
    kind: Literal["source", "wheel"]
    origin: str
    version: str | None = None
    commit_id: str | None = None  # the commit the tree says it is (full or abbreviated), if it says
    notes: tuple[str, ...] = ()

    def source_text(self, rel: str) -> str | None:
        """The text of the tree's file `rel` (None when it has none), through the boundary's tree reader."""
        return read_source(self.root / rel, self.root)

    def patched_text(self, scratch: Path, rel: str) -> str | None:
        """The file `rel` as the patch series left it in `scratch` (where it changed it), else the tree's own."""
        patched = read_source(scratch / rel, scratch)
        return patched if patched is not None else self.source_text(rel)

    def exists(self, rel: str) -> bool:
        if self.kind == "wheel":
            return rel in self.wheel_files()
        return (self.root / rel).exists()

    def wheel_files(self) -> frozenset[str]:
        listing = self.root / WHEEL_FILE_LIST
        return frozenset((read_source(listing, self.root) or "").split())

    def wheel_metadata(self) -> str | None:
        found = sorted(self.root.glob("*.dist-info/METADATA"))
        return read_source(found[0], self.root) if found else None

    def describe(self) -> dict[str, object]:
        return {
            "origin": self.origin,
            "kind": self.kind,
            "version": self.version,
            "commit_id": self.commit_id,
            "notes": list(self.notes),
        }


def read_version_py(text: str) -> tuple[str | None, str | None]:
    """(version, commit) from a setuptools-scm `_version.py`; the commit without its 'g' prefix."""
    values: dict[str, str] = {}
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None, None
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    values[target.id] = node.value.value
    commit = values.get("commit_id") or values.get("__commit_id__")
    if commit and re.fullmatch(r"g[0-9a-f]{7,40}", commit):
        commit = commit[1:]
    return values.get("version") or values.get("__version__"), commit


def same_commit(a: str, b: str) -> bool:
    """Whether two commit ids (either may be abbreviated, >= 7 hex) name the same commit."""
    a, b = a.lower(), b.lower()
    return min(len(a), len(b)) >= 7 and (a.startswith(b) or b.startswith(a))


def github_archive_url(base: str, repository: str, commit: str) -> str:
    """`{base}/{org}/{repo}/archive/{sha}.tar.gz` for a GitHub-style repository URL."""
    path = urlparse(repository).path.strip("/").removesuffix(".git")
    if path.count("/") != 1:
        raise PreflightError(
            f"repository {repository!r} is not '<host>/<org>/<repo>'; fix: use e.g. https://github.com/vllm-project/vllm"
        )
    return f"{base.rstrip('/')}/{path}/archive/{commit}.tar.gz"


# ---- archives ------------------------------------------------------------------------------------------


MAX_TREE_BYTES = (
    4 << 30
)  # an upstream source tree (vLLM's is ~60 MiB); an archive that unpacks to more is a bomb
MAX_TREE_MEMBERS = 400_000


def _check_extracted(archive: Path, sizes: list[int]) -> None:
    """Refuse, before anything is written, an archive that would unpack past the caps (a zip or tar bomb)."""
    if len(sizes) > MAX_TREE_MEMBERS or sum(sizes) > MAX_TREE_BYTES:
        raise PreflightError(
            f"{archive}: {len(sizes)} members, {sum(sizes)} bytes unpacked, past the caps ({MAX_TREE_MEMBERS} "
            f"members, {MAX_TREE_BYTES} bytes); fix: use the project's own source archive"
        )


def extract_archive(archive: Path, sha256: str) -> Path:
    """The archive's contents (its single top directory stripped) under the cache, extracted once."""
    final = preflight_cache("trees", sha256)
    if final.is_dir():
        return final
    tmp = scratch_dir("trees")
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                for name in zf.namelist():
                    if name.startswith("/") or ".." in Path(name).parts:
                        raise PreflightError(f"{archive}: unsafe member {name!r}; fix: use a trusted archive")
                # zipfile reads a member up to its declared size: the declared sizes bound what lands on disk
                _check_extracted(archive, [i.file_size for i in zf.infolist()])
                zf.extractall(tmp)
        else:
            with tarfile.open(archive) as tf:
                _check_extracted(
                    archive, [m.size for m in tf.getmembers()]
                )  # a tar member is its header's size
                tf.extractall(tmp, filter="data")
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as exc:
        raise PreflightError(f"cannot extract {archive}: {exc}; fix: check the archive is complete") from None
    entries = list(tmp.iterdir())
    top = entries[0] if len(entries) == 1 and entries[0].is_dir() else tmp
    published = publish_dir(top, final)
    if top != tmp:
        tmp.rmdir()
    return published


def _tree_from_archive(archive: Path, sha256: str, origin: str, notes: tuple[str, ...] = ()) -> UpstreamTree:
    root = extract_archive(archive, sha256)
    version, commit = read_version_py(read_source(root / VERSION_PY, root) or "")
    return UpstreamTree(root, "source", origin, version, commit, notes)


def from_url(fetcher: Fetcher, url: str, *, commit_in_url: str | None = None) -> UpstreamTree:
    """An archive at `url` (GitHub archive layout or any tar/zip of the tree); cached by sha256."""
    key = f"url|{url}"
    record = read_record(key)
    blob = None
    if record is not None:
        candidate = preflight_cache("blobs", record["sha256"])
        blob = candidate if candidate.is_file() else None
    if blob is None:
        blob = fetcher.download(url, what=f"the source archive {url}")
        write_record(key, {"sha256": blob.name})
    tree = _tree_from_archive(blob, blob.name, url)
    if tree.commit_id is None and commit_in_url:
        return UpstreamTree(tree.root, "source", url, tree.version, commit_in_url, tree.notes)
    return tree


def from_github(fetcher: Fetcher, component: Component, base: str) -> UpstreamTree:
    if component.repository is None or component.commit is None:
        raise PreflightError("the GitHub source needs components.vllm repository and commit; fix: add both")
    url = github_archive_url(base, component.repository, component.commit)
    return from_url(fetcher, url, commit_in_url=component.commit)


def from_pypi_sdist(fetcher: Fetcher, package: str, version: str) -> UpstreamTree:
    dist = resolve_file(fetcher, package, version, wheel=None)
    blob = fetcher.download(dist.url, what=dist.filename, sha256=dist.sha256)
    return _tree_from_archive(blob, dist.sha256, f"PyPI sdist {dist.filename} (sha256 {dist.sha256[:12]})")


WHEEL_MEMBERS = (VERSION_PY, REGISTRY_PY)


def from_wheel_dir(root: Path, origin: str) -> UpstreamTree:
    version, commit = read_version_py(read_source(root / VERSION_PY, root) or "")
    return UpstreamTree(root, "wheel", origin, version, commit)


def from_pypi_wheel(fetcher: Fetcher, package: str, version: str, target: WheelTarget) -> UpstreamTree:
    dist = resolve_file(fetcher, package, version, wheel=target)
    root = wheel_members(fetcher, dist, WHEEL_MEMBERS, suffixes=(".dist-info/METADATA",))
    return from_wheel_dir(root, f"PyPI wheel {dist.filename} (sha256 {dist.sha256[:12]})")


def from_local_wheel(path: Path) -> UpstreamTree:
    sha = sha256_file(path, "--source", MAX_DOWNLOAD_BYTES)
    root = cached_members(
        f"{sha}-local", lambda: zipfile.ZipFile(path), WHEEL_MEMBERS, suffixes=(".dist-info/METADATA",)
    )
    return from_wheel_dir(root, str(path))


def from_directory(session: Session, path: Path) -> UpstreamTree:
    """A checkout or plain directory, read in place; a git checkout reports its HEAD."""
    if (path / ".git").exists():
        try:
            head = session.runner.capture(
                Command.of("git", "-C", str(path), "rev-parse", "HEAD"), "git-rev-parse"
            )
        except CommandError as exc:
            raise PreflightError(
                f"{path}: cannot read the git HEAD ({exc}); fix: pass a valid checkout"
            ) from None
        return UpstreamTree(path, "source", f"git checkout {path}", None, head.output.strip())
    version, commit = read_version_py(read_source(path / VERSION_PY, path) or "")
    notes = () if commit else ("the directory does not say its commit (no .git, no vllm/_version.py)",)
    return UpstreamTree(path, "source", f"directory {path}", version, commit, notes)


def resolve_upstream(
    session: Session, recipe: Recipe, *, source: str | None, github_base: str, fetcher: Fetcher
) -> UpstreamTree:
    """The vLLM tree the recipe pins, from `source` ('github', 'pypi', a URL, a path; None: the default)."""
    if not source or source in ("github", "pypi") or source.startswith(("http://", "https://")):
        return fetch_upstream(recipe, source=source, github_base=github_base, fetcher=fetcher)
    component = recipe.model.components.vllm
    path = Path(source).expanduser().resolve()
    if path.is_dir():
        tree = from_directory(session, path)  # a git checkout: its HEAD, through the session's runner
    elif path.is_file() and path.name.endswith(".whl"):
        tree = from_local_wheel(path)
    elif path.is_file() and (tarfile.is_tarfile(path) or zipfile.is_zipfile(path)):
        tree = _tree_from_archive(path, sha256_file(path, "--source", MAX_DOWNLOAD_BYTES), f"archive {path}")
    else:
        raise PreflightError(
            f"source {source!r} is neither 'github', 'pypi', a URL, a directory, an archive nor a wheel; "
            "fix: pass one of those"
        )
    check_pin(tree, component.version, component.commit or "")
    return tree


def fetch_upstream(recipe: Recipe, *, source: str | None, github_base: str, fetcher: Fetcher) -> UpstreamTree:
    """The vLLM tree the recipe pins, from the network: an archive URL, 'github', 'pypi' or None (the default:
    the wheel for a wheel recipe, else GitHub then PyPI); no program runs."""
    component = recipe.model.components.vllm
    package = component.package or "vllm"
    target = WheelTarget.of(recipe.model.platforms[0], recipe.model.python)
    if source and source.startswith(("http://", "https://")):
        tree = from_url(fetcher, source)
    elif component.source == "wheel":
        if source == "github":
            raise PreflightError(
                "components.vllm is a wheel; GitHub has no wheels; fix: use --source pypi or a local .whl"
            )
        tree = from_pypi_wheel(fetcher, package, component.version, target)
    elif source == "pypi":
        tree = from_pypi_sdist(fetcher, package, component.version)
    elif source == "github":
        tree = from_github(fetcher, component, github_base)
    else:
        tree = _github_then_pypi(fetcher, component, package, github_base)
    check_pin(tree, component.version, component.commit or "")
    return tree


def _cached(key: str) -> bool:
    record = read_record(key)
    return record is not None and preflight_cache("blobs", str(record.get("sha256"))).is_file()


def _github_then_pypi(fetcher: Fetcher, component: Component, package: str, base: str) -> UpstreamTree:
    """GitHub's archive of the commit, else PyPI's sdist of the release; whichever is cached goes first."""
    github_url = github_archive_url(base, component.repository or "", component.commit or "")
    if _cached(f"url|{github_url}"):
        return from_github(fetcher, component, base)
    if _cached(f"pypi|{PYPI_SIMPLE}|{canonicalize_name(package)}|{component.version}|sdist"):
        return from_pypi_sdist(fetcher, package, component.version)
    try:
        return from_github(fetcher, component, base)
    except PreflightError as exc:
        tree = from_pypi_sdist(fetcher, package, component.version)
        note = f"GitHub archive unavailable ({str(exc).split(': ', 2)[-1].split(';')[0][:160]}); used PyPI's sdist"
        return UpstreamTree(
            tree.root, tree.kind, tree.origin, tree.version, tree.commit_id, (*tree.notes, note)
        )


def check_pin(tree: UpstreamTree, version: str, commit: str) -> None:
    """The tree must be the pinned commit (when it says which it is); a mismatch is an error."""
    if tree.commit_id and commit and not same_commit(tree.commit_id, commit):
        said = "vllm/_version.py" if tree.kind == "wheel" or "PyPI" in tree.origin else "the tree"
        raise PreflightError(
            f"{tree.origin}: {said} says commit {tree.commit_id}, the recipe pins components.vllm.commit "
            f"{commit} (version {version}); fix: pin the commit the release was built from "
            f"({tree.commit_id}) or check out/pass the pinned commit"
        )
