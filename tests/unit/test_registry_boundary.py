"""The registry client and the trust cache at the boundary: a 401 that names a token service on another host
gets no credentials; a huge or endless error body is never read whole; the TUF cache folder is checked (no
FIFO, no link out, no stray file) before python-tuf opens anything in it."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sparkforge.errors import PublishError
from sparkforge.registry.ocidist import Registry
from sparkforge.registry.tufcache import check_trust_folder

DIGEST = "sha256:" + "a" * 64


@contextmanager
def serve(handler: type[BaseHTTPRequestHandler], host: str = "127.0.0.1") -> Iterator[str]:
    server = ThreadingHTTPServer((host, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class Quiet(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def _token_service(seen: list[str | None]) -> type[BaseHTTPRequestHandler]:
    class Token(Quiet):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            body = b'{"token": "t0ken"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Token


def _registry(realm: list[str], got: list[str | None]) -> type[BaseHTTPRequestHandler]:
    class Challenging(Quiet):
        def do_GET(self) -> None:
            got.append(self.headers.get("Authorization"))
            if self.headers.get("Authorization") != "Bearer t0ken":
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Bearer realm="{realm[0]}",service="reg"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Challenging


@pytest.mark.parametrize("same_host", [True, False])
def test_credentials_go_only_to_a_token_service_on_the_registrys_host(
    monkeypatch: pytest.MonkeyPatch, same_host: bool
) -> None:
    monkeypatch.setenv("SPARKFORGE_REGISTRY_USER", "me")
    monkeypatch.setenv("SPARKFORGE_REGISTRY_PASSWORD", "secret")
    seen: list[str | None] = []
    realm: list[str] = []
    got: list[str | None] = []
    with serve(_token_service(seen), "127.0.0.1" if same_host else "127.0.0.2") as token_host:
        realm.append(f"http://{token_host}/token")
        with serve(_registry(realm, got)) as registry_host:
            assert Registry(f"{registry_host}/org/repo").manifest("latest") is None  # 404 after the token
    assert got[-1] == "Bearer t0ken"  # the token was fetched and used either way
    if same_host:
        assert seen == ["Basic bWU6c2VjcmV0"]  # me:secret
    else:
        assert seen == [None]  # anonymous: the credentials never left for another host


def test_an_endless_error_body_is_not_read_whole() -> None:
    class Endless(Quiet):
        def do_GET(self) -> None:
            self.send_response(500)
            self.send_header("Content-Length", str(1 << 30))  # says 1 GiB
            self.end_headers()
            self.wfile.write(b"E" * 4096)
            self.wfile.flush()
            time.sleep(20)  # and then drips nothing: reading it whole would wait for the timeout

    start = time.monotonic()
    with serve(Endless) as host, pytest.raises(PublishError) as info:
        Registry(f"{host}/org/repo").blob(DIGEST, 1024)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "HTTP 500" in message and "E" * 200 in message and "E" * 201 not in message


# The trust cache folder.
def _good(folder: Path) -> Path:
    (folder / "root_history").mkdir(parents=True)
    (folder / "root_history" / "1.root.json").write_text("{}")
    (folder / "root.json").symlink_to("root_history/1.root.json")
    (folder / "timestamp.json").write_text("{}")
    return folder


def test_a_trust_folder_as_python_tuf_keeps_it_passes(tmp_path: Path) -> None:
    assert check_trust_folder(_good(tmp_path / "t")) == tmp_path / "t"


@pytest.mark.parametrize(
    "plant", ["fifo", "link-out", "root-link-out", "stray", "device-link", "history-link", "folder"]
)
def test_a_planted_trust_folder_is_refused_before_python_tuf(tmp_path: Path, plant: str) -> None:
    folder = _good(tmp_path / "t")
    if plant == "fifo":
        os.mkfifo(folder / "snapshot.json")
    elif plant == "link-out":
        (folder / "targets.json").symlink_to("/etc/passwd")
    elif plant == "root-link-out":
        (folder / "root.json").unlink()
        (folder / "root.json").symlink_to("/etc/passwd")
    elif plant == "stray":
        (folder / "notes.txt").write_text("x")
    elif plant == "device-link":
        (folder / "targets.json").symlink_to("/dev/zero")
    elif plant == "history-link":
        (folder / "root_history" / "2.root.json").symlink_to("/etc/passwd")
    elif plant == "folder":
        (folder / "targets.json").mkdir()
    start = time.monotonic()
    with pytest.raises(PublishError) as info:
        check_trust_folder(folder)
    assert time.monotonic() - start < 1
    assert f"trust cache {folder}" in str(info.value) and "fix: remove" in str(info.value)


def test_the_cache_folder_is_checked_where_it_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparkforge.registry import tufclient

    monkeypatch.setenv("SPARKFORGE_CACHE", str(tmp_path / "cache"))
    folder = tufclient.metadata_dir("ghcr.io/org/repo", b"root")
    os.mkfifo(folder / "timestamp.json")
    with pytest.raises(PublishError, match=r"timestamp\.json is a folder, device or pipe"):
        tufclient.metadata_dir("ghcr.io/org/repo", b"root")
