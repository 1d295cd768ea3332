"""Real upstream data for the preflight tests: vLLM sdists and wheels from PyPI, cached between runs,
a GitHub-layout archive mirror and a registry API on 127.0.0.1 (real HTTP through requests)."""

from __future__ import annotations

import gzip
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sparkforge.commands import Runner
from sparkforge.context import Session, cache_path
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.preflight.pypi import resolve_file
from sparkforge.preflight.sources import extract_archive
from sparkforge.recipe.loader import RECIPES_DIR, REPO_ROOT, Recipe, load_recipe
from tests.recipe_files import write_recipe_file

# The session a preflight task builds (cli.session): quiet runner; OFFLINE: cache only.
SESSION = Session(echo=print, runner=Runner(stream=False))
OFFLINE = Session(echo=print, runner=Runner(stream=False), offline=True)

# vLLM releases: the commit each was built from (shared/facts/gb10.md; checked against _version.py).
COMMITS = {
    "0.16.0": "89a77b10846fd96273cce78d86d2556ea582d26e",
    "0.17.0": "b31e9326a7d9394aab8c767f8ebe225c65594b60",
    "0.19.1": "b1388b1fbf5aaef47937fabe98931211684666a6",
    "0.31.0": "db9527a46873454610df6dbedf79a36d6bf1a7f6",
}
CMAKE_PATCH = REPO_ROOT / "patches/vllm/0001-cmake-keep-sm121-on-cuda13.patch"


@dataclass(frozen=True)
class Sdist:
    version: str
    archive: Path
    sha256: str

    def tree(self) -> Path:
        """The extracted source (cached by the archive's sha256)."""
        return extract_archive(self.archive, self.sha256)


def vllm_sdist(version: str) -> Sdist:
    """vLLM's sdist of `version` from PyPI (Simple API), downloaded once into the sparkforge cache."""
    fetcher = make_fetcher()
    dist = resolve_file(fetcher, "vllm", version, wheel=None)
    archive = fetcher.download(dist.url, what=dist.filename, sha256=dist.sha256)
    return Sdist(version, archive, dist.sha256)


def github_layout_archive(sdist: Sdist, commit: str) -> Path:
    """The sdist repacked as GitHub's archive of `commit` (top directory vllm-<sha>/), cached."""
    out = cache_path("test-fixtures", f"github-vllm-{commit}-{sdist.sha256[:16]}.tar.gz")
    if out.is_file():
        return out
    tmp = out.with_suffix(f".{threading.get_ident()}.part")
    with (
        tarfile.open(sdist.archive) as src,
        gzip.open(tmp, "wb", compresslevel=1) as gz,
        tarfile.open(fileobj=gz, mode="w") as dst,
    ):
        for member in src:
            member.pax_headers = {
                k: v for k, v in member.pax_headers.items() if k not in ("path", "linkpath")
            }
            member.name = _retop(member.name, commit)
            if member.islnk():
                member.linkname = _retop(member.linkname, commit)
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    tmp.replace(out)
    return out


def _retop(name: str, commit: str) -> str:
    _, _, rest = name.partition("/")
    return f"vllm-{commit}/{rest}" if rest else f"vllm-{commit}"


def write_recipe(
    directory: Path, body: dict[str, Any], *, extends: str = "vllm-qwen35", name: str = "test"
) -> Recipe:
    """A recipe file extending a shipped recipe by absolute path, loaded."""
    return load_recipe(
        write_recipe_file(directory / f"{name}.yaml", body, extends=RECIPES_DIR / f"{extends}.yaml")
    )


def vllm_pin(version: str, commit: str, *, patches: list[str] | None = None) -> dict[str, Any]:
    pin: dict[str, Any] = {"version": version, "commit": commit}
    if patches is not None:
        pin["patches"] = patches
    return {"components": {"vllm": pin}}


# ---- HTTP servers on 127.0.0.1 ------------------------------------------------------------------------


@dataclass
class Served:
    """What a local server answers: path -> (status, headers, body); requests seen, in order."""

    routes: dict[str, tuple[int, dict[str, str], bytes | Path]] = field(default_factory=dict)
    seen: list[str] = field(default_factory=list)
    base: str = ""

    def add_file(self, path: str, file: Path, content_type: str = "application/octet-stream") -> None:
        self.routes[path] = (200, {"Content-Type": content_type}, file)

    def add_tree(self, prefix: str, root: Path) -> None:
        """Serve every file under `root` at `prefix/<relative path>` (e.g. a git repo over dumb HTTP)."""
        for file in root.rglob("*"):
            if file.is_file():
                self.add_file(f"{prefix}/{file.relative_to(root).as_posix()}", file)


def _handler(served: Served) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.seen.append(self.path)
            path = self.path if self.path in served.routes else self.path.split("?", 1)[0]
            status, headers, body = served.routes.get(path, (404, {}, b"not found"))
            data = body.read_bytes() if isinstance(body, Path) else body
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextmanager
def local_server() -> Iterator[Served]:
    """An HTTP server on 127.0.0.1 (ephemeral port) answering from `Served.routes`."""
    served = Served()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(served))
    served.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture(scope="session", name="sdist_0310")
def fixture_sdist_0310() -> Sdist:
    return vllm_sdist("0.31.0")


@pytest.fixture(scope="session", name="sdist_0160")
def fixture_sdist_0160() -> Sdist:
    return vllm_sdist("0.16.0")


@pytest.fixture(scope="session", name="github_archive_0310")
def fixture_github_archive_0310(sdist_0310: Sdist) -> Path:
    """0.31.0 in GitHub's archive layout (session scope: made before any test swaps the cache)."""
    return github_layout_archive(sdist_0310, COMMITS["0.31.0"])


@pytest.fixture(name="fresh_cache")
def fixture_fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty sparkforge cache for this test only (downloads elsewhere stay cached)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SPARKFORGE_CACHE", str(root))
    return root


@pytest.fixture(name="server")
def fixture_server() -> Iterator[Served]:
    with local_server() as served:
        yield served


def check_named(report: Any, name: str) -> Any:
    return next(c for c in report.checks if c.name == name)
