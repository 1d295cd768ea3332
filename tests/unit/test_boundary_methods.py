"""The one HTTP seam for every method (urlfetch.request_url), against a real HTTP server on 127.0.0.1: HEAD,
PUT and PATCH bodies, an upload's Location kept on the host, content types, error heads and the redirect
policies; and the registry client's uploads (one PUT, PATCH chunks) through it."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

from sparkforge.errors import PublishError
from sparkforge.registry import ocidist
from sparkforge.registry.ocidist import Registry
from sparkforge.urlfetch import (
    ANY_STATUS,
    Fetched,
    FetchError,
    Policy,
    direct_session,
    location_of,
    request_url,
)


class _Uploads(BaseHTTPRequestHandler):
    """Enough of the distribution API's upload protocol to exercise every method: blobs by digest, uploads
    by session (POST starts, PATCH appends with Content-Range, PUT ?digest= closes), and a few planted paths."""

    blobs: dict[str, bytes] = {}
    sessions: dict[str, bytearray] = {}
    seen: list[tuple[str, str, str]] = []  # (method, path, Content-Range)
    location_host = ""  # a Location on another host, when set

    def log_message(self, *args: object) -> None:
        pass

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _answer(self, status: int, body: bytes = b"", **headers: str) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key.replace("_", "-"), value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _record(self) -> str:
        path = urlsplit(self.path).path
        self.seen.append((self.command, path, self.headers.get("Content-Range", "")))
        return path

    def do_HEAD(self) -> None:
        path = self._record()
        digest = path.rsplit("/", 1)[-1]
        self._answer(200 if digest in self.blobs else 404)

    def do_GET(self) -> None:
        path = self._record()
        if path.startswith("/v2/org/repo/blobs/"):
            digest = path.rsplit("/", 1)[-1]
            return self._answer(200, self.blobs[digest]) if digest in self.blobs else self._answer(404)
        if path == "/typed":
            return self._answer(200, b"{}", Content_Type="application/vnd.oci.image.manifest.v1+json")
        if path == "/html":
            return self._answer(200, b"<html>", Content_Type="text/html")
        if path == "/error":
            return self._answer(500, b"E" * 5000)
        if path == "/to-http-elsewhere":
            return self._answer(307, Location=f"http://localhost:{self.server.server_address[1]}/typed")
        return self._answer(404)

    def do_POST(self) -> None:
        self._record()
        self._body()
        name = f"u{len(self.sessions)}"
        self.sessions[name] = bytearray()
        host = self.location_host or ""
        self._answer(202, Location=f"{host}/v2/org/repo/blobs/uploads/{name}?state=0")

    def do_PATCH(self) -> None:
        path = self._record()
        name = path.rsplit("/", 1)[-1]
        chunk = self._body()
        first, last = (int(n) for n in self.headers["Content-Range"].split("-"))
        if first != len(self.sessions[name]) or last - first + 1 != len(chunk):
            return self._answer(416)
        self.sessions[name] += chunk
        self._answer(202, Location=f"/v2/org/repo/blobs/uploads/{name}?state={len(self.sessions[name])}")

    def do_PUT(self) -> None:
        parts = urlsplit(self.path)
        self._record()
        body = self._body()
        if parts.path.startswith("/v2/org/repo/blobs/uploads/"):
            data = bytes(self.sessions.pop(parts.path.rsplit("/", 1)[-1])) + body
            digest = parse_qs(parts.query)["digest"][0]
            if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
                return self._answer(400, b"DIGEST_INVALID")
            self.blobs[digest] = data
            return self._answer(201, Location=f"/v2/org/repo/blobs/{digest}")
        self.blobs[parts.path] = body
        return self._answer(201)


@pytest.fixture()
def server() -> Iterator[str]:
    _Uploads.blobs, _Uploads.sessions, _Uploads.seen, _Uploads.location_host = {}, {}, [], ""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Uploads)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _call(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None, **kw: object
) -> Fetched:
    kw.setdefault("ok_status", ANY_STATUS)
    policy = Policy(1 << 20, 5.0, **kw)  # type: ignore[arg-type]
    return request_url(
        direct_session(), method, url, what="the test", policy=policy, body=body, headers=headers
    )


def test_head_reads_no_body_and_put_sends_one(server: str) -> None:
    digest = "sha256:" + hashlib.sha256(b"abc").hexdigest()
    assert _call("HEAD", f"http://{server}/v2/org/repo/blobs/{digest}").status_code == 404
    assert _call("PUT", f"http://{server}/v2/org/repo/manifests/t", body=b"abc").status_code == 201
    assert _Uploads.blobs["/v2/org/repo/manifests/t"] == b"abc"
    with pytest.raises(FetchError, match="HTTP 404"):
        request_url(
            direct_session(),
            "HEAD",
            f"http://{server}/v2/org/repo/blobs/x",
            what="t",
            policy=Policy(0, 5),
        )


def test_patch_and_the_location_chain(server: str) -> None:
    start = _call("POST", f"http://{server}/v2/org/repo/blobs/uploads/", body=b"")
    assert start.status_code == 202
    nxt = location_of(start, "the upload")
    assert nxt == f"http://{server}/v2/org/repo/blobs/uploads/u0?state=0"  # resolved against the answer's URL
    step = _call("PATCH", nxt, body=b"hello", headers={"Content-Range": "0-4"})
    assert step.status_code == 202 and location_of(step, "the upload").endswith("state=5")


def test_a_location_to_another_host_or_to_http_is_refused(server: str) -> None:
    port = server.split(":")[1]
    answer = Fetched(f"http://{server}/v2/x", 202, {"Location": f"http://localhost:{port}/v2/y"})
    with pytest.raises(FetchError, match="another host"):
        location_of(answer, "the upload")
    with pytest.raises(FetchError, match="from https to http"):
        location_of(Fetched("https://reg.example/v2/x", 202, {"Location": "http://reg.example/v2/y"}), "u")
    with pytest.raises(FetchError, match="without a Location"):
        location_of(Fetched(f"http://{server}/v2/x", 202, {}), "the upload")


def test_content_types_are_checked_on_the_answer(server: str) -> None:
    manifest = ("application/vnd.oci.image.manifest.v1+json",)
    assert _call("GET", f"http://{server}/typed", content_types=manifest).content == b"{}"
    with pytest.raises(FetchError, match="content type 'text/html'"):
        _call("GET", f"http://{server}/html", content_types=manifest)


def test_an_error_answer_is_read_to_its_head_only(server: str) -> None:
    answer = _call("GET", f"http://{server}/error", error_head=200)
    assert answer.status_code == 500 and answer.content == b"E" * 200


def test_redirect_policies(server: str) -> None:
    # "none": the redirect is the answer; "site": another host refused; "any": followed (the body is checked
    # by its reader), never from https to http (plain http here, so it is followed).
    assert _call("GET", f"http://{server}/to-http-elsewhere", redirects="none").status_code == 307
    with pytest.raises(FetchError, match="another host"):
        _call("GET", f"http://{server}/to-http-elsewhere", redirects="site")
    assert _call("GET", f"http://{server}/to-http-elsewhere", redirects="any").content == b"{}"
    with pytest.raises(ValueError):
        _call("TRACE", f"http://{server}/typed")


def test_the_registry_uploads_in_one_put_or_in_patch_chunks(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = Registry(f"{server}/org/repo")
    small = b"s" * 10
    assert registry.put_blob(small) == "sha256:" + hashlib.sha256(small).hexdigest()
    assert [m for m, _, _ in _Uploads.seen] == ["HEAD", "POST", "PUT"]
    assert registry.put_blob(small) and _Uploads.seen[-1][0] == "HEAD"  # already there: nothing sent

    _Uploads.seen.clear()
    monkeypatch.setattr(ocidist, "UPLOAD_CHUNK", 4)
    large = bytes(range(10))
    digest = registry.put_blob(large)
    assert _Uploads.blobs[digest] == large
    assert [(m, r) for m, _, r in _Uploads.seen] == [
        ("HEAD", ""),
        ("POST", ""),
        ("PATCH", "0-3"),
        ("PATCH", "4-7"),
        ("PATCH", "8-9"),
        ("PUT", ""),
    ]
    assert registry.blob(digest, 100) == large


def test_the_registry_never_follows_an_upload_to_another_host(server: str) -> None:
    port = server.split(":")[1]
    _Uploads.location_host = f"http://localhost:{port}"
    with pytest.raises(PublishError, match="another host"):
        Registry(f"{server}/org/repo").put_blob(b"x")
    assert [m for m, _, _ in _Uploads.seen] == ["HEAD", "POST"]  # no PUT left for the other host


def test_the_registry_refuses_a_blob_over_its_cap_within_the_deadline(server: str) -> None:
    registry = Registry(f"{server}/org/repo")
    digest = registry.put_blob(b"z" * 5000)
    start = time.monotonic()
    with pytest.raises(PublishError, match=r"declares 5000 bytes"):
        registry.blob(digest, 100)
    assert time.monotonic() - start < 5
