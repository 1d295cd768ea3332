"""The one URL fetcher against a real HTTP server on 127.0.0.1: redirects, deadline, caps."""

from __future__ import annotations

import gzip
import http.server
import threading
import time
from collections.abc import Iterator

import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st

from sparkforge.urlfetch import FetchError, Unreachable, check_url, fetch_url, redirect_allowed


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        port = self.server.server_address[1]
        if self.path == "/other-host":
            self._redirect(f"http://localhost:{port}/plain")
        elif self.path == "/same-host":
            self._redirect("/plain")
        elif self.path == "/loop":
            self._redirect("/loop")
        elif self.path == "/plain":
            self._send(b"hello")
        elif self.path == "/drip":
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            for _ in range(1000):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.2)
        elif self.path == "/big-undeclared":
            self.send_response(200)
            self.end_headers()  # no length: read until close
            for _ in range(64):
                self.wfile.write(b"y" * 65536)
        elif self.path == "/big-declared":
            self.send_response(200)
            self.send_header("Content-Length", str(1 << 30))
            self.end_headers()
            self.wfile.write(b"z" * 1024)
        elif self.path == "/gzip-bomb":
            body = gzip.compress(b"\0" * (8 << 20))
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/gzip-ok":
            body = gzip.compress(b'{"a": 1}')
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/silent":
            time.sleep(30)
        else:
            self.send_error(404)

    def _redirect(self, where: str) -> None:
        self.send_response(302)
        self.send_header("Location", where)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _get(url: str, **kw: object) -> bytes:
    kw.setdefault("max_bytes", 1 << 20)
    kw.setdefault("deadline", 5.0)
    return fetch_url(requests.Session(), url, what="the test file", **kw).content  # type: ignore[arg-type]


def test_redirects_stay_on_the_host_unless_allowed(base: str) -> None:
    assert _get(f"{base}/same-host") == b"hello"
    with pytest.raises(FetchError, match=r"redirects to another host \(localhost\)"):
        _get(f"{base}/other-host")
    assert _get(f"{base}/other-host", allow_hosts=("localhost",)) == b"hello"
    with pytest.raises(FetchError, match="more than 5 times"):
        _get(f"{base}/loop")
    assert redirect_allowed("https://pypi.org/x", "http://pypi.org/x") == "from https to http"
    assert redirect_allowed("https://github.com/a", "https://codeload.github.com/b") == ""
    assert redirect_allowed("https://github.com/a", "https://objects.githubusercontent.com/b") == ""
    assert redirect_allowed("https://github.com/a", "https://evil.example/b").startswith("to another host")


def test_a_dripping_body_is_cut_at_the_total_deadline(base: str) -> None:
    start = time.monotonic()
    with pytest.raises(Unreachable, match=r"within 1\.5 s"):
        _get(f"{base}/drip", deadline=1.5)
    assert time.monotonic() - start < 6.0


def test_a_server_that_never_answers_is_refused_within_the_deadline(base: str) -> None:
    start = time.monotonic()
    with pytest.raises(Unreachable):
        _get(f"{base}/silent", deadline=1.0)
    assert time.monotonic() - start < 6.0


def test_byte_caps_apply_while_reading_and_to_the_declared_length(base: str) -> None:
    with pytest.raises(FetchError, match="more than 100000 bytes"):
        _get(f"{base}/big-undeclared", max_bytes=100_000)
    start = time.monotonic()
    with pytest.raises(FetchError, match="declares 1073741824 bytes"):
        _get(f"{base}/big-declared")
    assert time.monotonic() - start < 10.0


def test_a_gzip_bomb_stops_at_the_decoded_cap(base: str) -> None:
    assert _get(f"{base}/gzip-ok") == b'{"a": 1}'
    with pytest.raises(FetchError, match=r"decodes to more than 1048576 bytes"):
        _get(f"{base}/gzip-bomb")


@pytest.mark.parametrize(
    "url",
    ["ftp://x/y", "file:///etc/passwd", "http://127.0.0.1:99999/", "https://u:p@h/", "https://h/a b", "https:///x",
     "http://[::zz]/", "https://h/\r\nX: y"],
)  # fmt: skip
def test_urls_outside_the_policy_are_refused_before_contact(url: str) -> None:
    with pytest.raises(FetchError, match="fix:"):
        check_url(url, "--url")


@given(st.text(max_size=60))
def test_check_url_never_raises_anything_but_its_refusal(text: str) -> None:
    try:
        scheme, host, port = check_url(text, "--url")
    except FetchError:
        return
    assert scheme in ("http", "https") and host and 1 <= port <= 65535
    assert all(c > " " for c in text)
