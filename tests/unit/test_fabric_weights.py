"""`--weights shared`'s two in-image programs, run here as real processes on 127.0.0.x addresses (the engine test
runs them in containers on the namespaced nodes): the happy path (resume, the cache's links, the cached manifest,
1,000 files), the server attacked with raw sockets (no proof, replay, dripping, slot exhaustion), and the puller
attacked by servers that are not the head (a spoofer, a relay to the real head) and by a hostile head (redirect,
dripping, a path-like sha256, duplicates) and a hostile folder."""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkforge.run.weights.weightscripts import AUTH_HEADER, pull_args, serve_args

KEY = "k" * 64
HEAD = "127.0.0.2"  # the real head's address; spoofers and attackers use others of 127.0.0.0/8


def _mac(*parts: str, key: str = KEY) -> str:
    return hmac.new(key.encode(), "|".join(parts).encode(), hashlib.sha256).hexdigest()


def _model(root: Path) -> bytes:
    (root / "blobs").mkdir(parents=True)
    (root / "snapshots" / "r1").mkdir(parents=True)
    data = os.urandom(3 << 20)
    (root / "blobs" / "w0").write_bytes(data)
    (root / "blobs" / "c0").write_text('{"architectures": ["X"]}')
    (root / "blobs" / "w0.lock").write_text("")  # a download's leftovers are not served
    (root / "snapshots" / "r1" / "model.safetensors").symlink_to("../../blobs/w0")
    (root / "snapshots" / "r1" / "config.json").symlink_to("../../blobs/c0")
    return data


def _reply(sock: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except OSError:
        pass
    return out


class Server:
    """The head's weight server as a process on HEAD, its `serving` event read from its first line."""

    def __init__(self, root: Path, cache: Path, env: dict[str, str] | None = None, tls: bool = False) -> None:
        # Plain HTTP by default: the HMAC layer on its own (share_weights always adds TLS, tested below).
        self.proc = subprocess.Popen(
            [sys.executable, *serve_args(str(root), HEAD, 0, KEY, str(cache / "src.json"), tls=tls)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.event = json.loads(self.proc.stdout.readline())  # type: ignore[union-attr]
        self.port = int(self.event["address"].rsplit(":", 1)[1])
        self.base = f"{'https' if tls else 'http'}://{HEAD}:{self.port}"
        self.digest = self.event["manifest_sha256"]

    def raw(self, request: bytes, source: str = "127.0.0.1", timeout: float = 10) -> bytes:
        with socket.create_connection((HEAD, self.port), timeout=timeout, source_address=(source, 0)) as sock:
            sock.sendall(request)
            return _reply(sock)

    def hello(self, source: str = "127.0.0.1") -> str:
        """A session nonce as the head gives it to `source` (after checking the head's proof)."""
        ours = secrets.token_hex(32)
        reply = self.raw(f"GET /hello HTTP/1.0\r\nX-Sparkforge-Nonce: {ours}\r\n\r\n".encode(), source)
        headers = dict(
            line.split(": ", 1) for line in reply.decode("latin-1").split("\r\n\r\n")[0].split("\r\n")[1:]
        )
        session = headers["X-Sparkforge-Nonce"]
        assert headers["X-Sparkforge-Proof"] == _mac("head", ours, session, f"{HEAD}:{self.port}")
        return session

    def authed(self, target: str, session: str, seq: int, rng: str = "", source: str = "127.0.0.1") -> bytes:
        more = f"Range: {rng}\r\n" if rng else ""
        proof = f"{AUTH_HEADER}: {session} {seq} {_mac('peer', session, str(seq), target, rng)}\r\n"
        return self.raw(f"GET {target} HTTP/1.0\r\n{proof}{more}\r\n".encode(), source)

    def status(self, target: str, session: str, seq: int, rng: str = "") -> int:
        return int(self.authed(target, session, seq, rng).split(b" ", 2)[1])

    def manifest(self) -> list[dict]:
        body = self.authed("/manifest", self.hello(), 1).split(b"\r\n\r\n", 1)[1]
        assert hashlib.sha256(body).hexdigest() == self.digest
        return json.loads(body)

    def stop(self) -> str:
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=10)
        return err


def _pull(
    base: str,
    dest: Path,
    digest: str,
    key: str = KEY,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cert: str = "",
) -> tuple[int, list[dict], str]:
    done = subprocess.run(
        [sys.executable, *pull_args(base, str(dest), key, digest, cert)],
        capture_output=True,
        text=True,
        env={**os.environ, "SPARKFORGE_PROGRESS_S": "0", **(env or {})},
        timeout=timeout,
    )
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()], done.stderr


def test_the_pull_verifies_resumes_and_recreates_the_cache_layout(tmp_path: Path) -> None:
    src, dst, cache = tmp_path / "src", tmp_path / "dst", tmp_path / "manifests"
    data = _model(src)
    server = Server(src, cache)
    try:
        files = {e["path"]: e for e in server.manifest() if "sha256" in e}
        assert set(files) == {"blobs/w0", "blobs/c0"}  # the .lock is not served
        assert files["blobs/w0"]["sha256"] == hashlib.sha256(data).hexdigest()
        # An interrupted transfer: the first MiB in the part folder, named by the file's digest.
        (dst / ".sparkforge-part").mkdir(parents=True)
        (dst / ".sparkforge-part" / files["blobs/w0"]["sha256"]).write_bytes(data[: 1 << 20])
        code, events, err = _pull(server.base, dst, server.digest)
        assert code == 0 and events[-1]["event"] == "done", err
        assert events[-1]["moved"] == len(data) - (1 << 20) + files["blobs/c0"]["size"]
        assert events[-1]["resumed"] == 1 and any(e["event"] == "progress" for e in events)
        assert (dst / "blobs" / "w0").read_bytes() == data and not (dst / "blobs" / "w0.lock").exists()
        assert os.readlink(dst / "snapshots" / "r1" / "model.safetensors") == "../../blobs/w0"
        again = _pull(server.base, dst, server.digest)
        assert again[0] == 0 and again[1][-1]["moved"] == 0  # verified in place, nothing moved
        # A manifest sha256 other than the head printed: refused before anything is written.
        code, events, _ = _pull(server.base, tmp_path / "other", "0" * 64)
        assert (
            code == 1 and "is not the" in events[-1]["error"] and not (tmp_path / "other" / "blobs").exists()
        )
    finally:
        assert "Traceback" not in server.stop()
    # The manifest is cached per snapshot folder: a second server reuses the digests (same size and mtime).
    cached = json.loads((cache / "src.json").read_text())
    assert {e["path"] for e in cached if "sha256" in e} == {"blobs/w0", "blobs/c0"}
    for entry in cached:
        if entry["path"] == "blobs/c0":
            entry["sha256"] = "0" * 64  # a planted cache entry is used only while size and mtime match
        if entry["path"] == "blobs/w0":
            entry["sha256"] = "../../outside"  # and only when it is a hex sha256
    (cache / "src.json").write_text(json.dumps(cached))
    second = Server(src, cache)
    try:
        digests = {e["path"]: e.get("sha256") for e in second.manifest()}
        assert digests["blobs/c0"] == "0" * 64 and digests["blobs/w0"] == hashlib.sha256(data).hexdigest()
        os.utime(src / "blobs" / "c0", ns=(1, 1))  # touched: hashed again
    finally:
        second.stop()
    third = Server(src, cache)
    try:
        assert {e["path"]: e.get("sha256") for e in third.manifest()}["blobs/c0"] == hashlib.sha256(
            (src / "blobs" / "c0").read_bytes()
        ).hexdigest()
    finally:
        third.stop()


def test_a_thousand_files_travel_with_a_64_character_argument(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    for i in range(1000):
        folder = src / "blobs" / f"{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"shard-{i:04d}-of-a-long-file-name-{'x' * 60}.safetensors").write_bytes(os.urandom(64 + i))
    server = Server(src, tmp_path / "m")
    try:
        assert server.event["files"] == 1000
        argv = pull_args(server.base, str(dst), KEY, server.digest)
        assert max(len(a) for a in argv[2:]) < 200  # no manifest on the command line (ARG_MAX)
        start = time.monotonic()
        code, events, err = _pull(server.base, dst, server.digest)
        print(f"1,000 files over 127.0.0.x: {time.monotonic() - start:.1f} s")
    finally:
        server.stop()
    assert code == 0, (events[-1:], err)
    assert events[-1]["total"] == sum(64 + i for i in range(1000)) == events[-1]["moved"]
    assert sorted(str(p.relative_to(dst)) for p in dst.rglob("*.safetensors")) == sorted(
        str(p.relative_to(src)) for p in src.rglob("*.safetensors")
    )


def test_the_server_refuses_raw_attacks_with_4xx_and_no_traceback(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _model(src)
    (tmp_path / "outside").write_text("token")
    server = Server(src, tmp_path / "m")
    try:
        session = server.hello()
        assert server.status("/file/blobs/c0", session, 1) == 200
        # Replay: the same proof (a captured request) a second time, or an older sequence number: refused.
        assert server.status("/file/blobs/c0", session, 1) == 403
        assert server.status("/file/blobs/c0", session, 0) == 403
        # A proof for another target, range or key; a nonce the head did not give, or gave to another address.
        proof = f"{session} 5 {_mac('peer', session, '5', '/file/blobs/w0', '')}"
        assert (
            server.raw(f"GET /file/blobs/c0 HTTP/1.0\r\n{AUTH_HEADER}: {proof}\r\n\r\n".encode())[9:12]
            == b"403"
        )
        assert server.status("/file/blobs/c0", session, 6, "bytes=0-") == 200
        forged = f"{session} 7 {_mac('peer', session, '7', '/file/blobs/c0', '', key='x' * 64)}"
        assert (
            server.raw(f"GET /file/blobs/c0 HTTP/1.0\r\n{AUTH_HEADER}: {forged}\r\n\r\n".encode())[9:12]
            == b"403"
        )
        assert server.status("/file/blobs/c0", "ab" * 32, 8) == 403
        assert server.authed("/file/blobs/c0", session, 9, source="127.0.0.4")[9:12] == b"403"
        assert (
            server.raw(b"GET /file/blobs/c0 HTTP/1.0\r\nX-Sparkforge-Secret: " + KEY.encode() + b"\r\n\r\n")[
                9:12
            ]
            == b"403"
        )  # the old shared secret opens nothing
        seq = iter(range(100, 10_000))
        for path in ("/file/../outside", "/file/%2e%2e/outside", "/file//etc/passwd", "/file/blobs/c0%00",
                     "/file/snapshots/r1/config.json", "/file/blobs/w0.lock", "/", f"/file/blobs/c0?key={KEY}"):  # fmt: skip
            assert server.status(path, session, next(seq)) == 404, path
        assert server.status("/file/%ff", session, next(seq)) == 400
        for bad in ("bytes=abc", "bytes=" + "9" * 5000, "bytes=-5", "bytes=0-1,2-3", "bytes=99999999"):
            assert server.status("/file/blobs/c0", session, next(seq), bad) in (400, 416), bad
        assert server.raw(b"\x00\xff garbage\r\n\r\n")[9:12] == b"400"
        assert server.raw(b"POST /file/blobs/c0 HTTP/1.0\r\nContent-Length: -1\r\n\r\n")[9:12] == b"405"
        assert server.raw(b"GET /hello HTTP/1.0\r\nX-Sparkforge-Nonce: ../../x\r\n\r\n")[9:12] == b"400"
        # A file replaced on the head after the manifest was made: refused, not served as the manifest's.
        (src / "blobs" / "c0").write_text("replaced, and longer than before")
        assert server.status("/file/blobs/c0", session, next(seq)) == 409
    finally:
        err = server.stop()
    assert "Traceback" not in err, err


def test_unproven_clients_cannot_take_the_slots_nor_drip_forever(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    data = _model(src)
    server = Server(src, tmp_path / "m", {"SPARKFORGE_HEAD_S": "2", "SPARKFORGE_MAX_CLIENTS": "2"})
    stop = threading.Event()
    cut: list[float] = []

    def drip(source: str) -> None:
        # A slow client: a byte of request head every 0.2 s, never the blank line.
        try:
            sock = socket.create_connection((HEAD, server.port), timeout=30, source_address=(source, 0))
        except OSError:
            return
        began = time.monotonic()
        try:
            while not stop.is_set():
                sock.sendall(b"G")
                time.sleep(0.2)
        except OSError:
            cut.append(time.monotonic() - began)
        finally:
            sock.close()

    attackers = [
        threading.Thread(target=drip, args=(f"127.0.0.{3 + i % 5}",), daemon=True) for i in range(100)
    ]  # 20 slow clients from each of 5 addresses
    try:
        for thread in attackers:
            thread.start()
        time.sleep(0.5)
        start = time.monotonic()
        code, events, err = _pull(server.base, dst, server.digest, env={"SPARKFORGE_DEADLINE_S": "30"})
        wall = time.monotonic() - start
        time.sleep(2.5)
        print(f"pull under 100 dripping clients: {wall:.1f} s; {len(cut)} dripping connections cut")
        assert code == 0, (events[-1:], err)
        assert (dst / "blobs" / "w0").read_bytes() == data and wall < 15
        # Each address held at most 4 connections at the head (the rest refused at once); those held were cut
        # at the 2 s head deadline, however alive they kept the connection.
        held = [t for t in cut if t >= 1.5]
        assert len(cut) == 100 and 0 < len(held) <= 20 and max(cut) < 5, sorted(cut)
    finally:
        stop.set()
        for thread in attackers:
            thread.join(5)
        err = server.stop()
    assert "Traceback" not in err, err


def test_a_flood_from_many_addresses_cannot_starve_the_owners_puller(tmp_path: Path) -> None:
    # 24 addresses (more than MAX_UNPROVEN / PER_ADDRESS = 16) each keep PER_ADDRESS dripping connections open,
    # reconnecting as soon as one is cut: every unproven slot is taken the whole time, by the server's defaults.
    src, dst = tmp_path / "src", tmp_path / "dst"
    data = _model(src)
    server = Server(src, tmp_path / "m")
    stop = threading.Event()
    opened, refused = [0], [0]

    def flood(source: str) -> None:
        while not stop.is_set():
            try:
                sock = socket.create_connection((HEAD, server.port), timeout=5, source_address=(source, 0))
            except OSError:
                continue
            opened[0] += 1
            try:
                while not stop.is_set():
                    sock.sendall(b"G")
                    if sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK):
                        refused[0] += 1  # answered (503 or 408): the server let it go
                        break
                    time.sleep(0.1)
            except BlockingIOError:
                time.sleep(0.1)
                continue
            except OSError:
                pass
            finally:
                sock.close()

    attackers = [
        threading.Thread(target=flood, args=(f"127.0.0.{10 + i % 24}",), daemon=True) for i in range(24 * 4)
    ]
    try:
        for thread in attackers:
            thread.start()
        time.sleep(1.0)
        start = time.monotonic()
        code, events, err = _pull(server.base, dst, server.digest, env={"SPARKFORGE_DEADLINE_S": "30"})
        wall = time.monotonic() - start
        print(f"pull under a flood from 24 addresses: {wall:.1f} s; {opened[0]} flood connections opened")
        assert code == 0, (events[-1:], err)
        assert (dst / "blobs" / "w0").read_bytes() == data and wall < 15
    finally:
        stop.set()
        for thread in attackers:
            thread.join(5)
        err = server.stop()
    assert "Traceback" not in err, err


def test_tls_with_a_per_run_certificate_pinned_by_its_sha256(tmp_path: Path) -> None:
    import ssl

    src = tmp_path / "src"
    data = _model(src)
    server = Server(src, tmp_path / "m", {"SPARKFORGE_HEAD_S": "2"}, tls=True)
    other = Server(src, tmp_path / "m2", tls=True)  # the same key and files, another certificate
    try:
        cert = server.event["cert_sha256"]
        assert re.fullmatch(r"[0-9a-f]{64}", cert) and cert != other.event["cert_sha256"]
        # What the server presents is the certificate whose sha256 it printed on the control channel.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        raw = socket.create_connection((HEAD, server.port), timeout=10)
        with context.wrap_socket(raw) as tls:
            assert hashlib.sha256(tls.getpeercert(binary_form=True)).hexdigest() == cert
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
        code, events, err = _pull(server.base, tmp_path / "dst", server.digest, cert=cert)
        assert code == 0, (events[-1:], err)
        assert (tmp_path / "dst" / "blobs" / "w0").read_bytes() == data
        # The puller sends nothing to a server with another certificate, even one holding the run's key.
        code, events, _ = _pull(other.base, tmp_path / "no", other.digest, cert=cert)
        assert code == 1 and "presented a certificate with sha256" in events[-1]["error"]
        assert not (tmp_path / "no" / "blobs").exists()
        # Nor does it fall back to plain HTTP, nor take a plain http:// URL with a certificate.
        code, events, _ = _pull(f"http://{HEAD}:{server.port}", tmp_path / "no", server.digest, cert=cert)
        assert code == 1 and "not https://HOST:PORT" in events[-1]["error"]
        # Plain HTTP at the TLS server is cut, no traceback; a handshake that never completes is cut at HEAD_S.
        assert b"200" not in server.raw(b"GET /hello HTTP/1.0\r\n\r\n")
        began = time.monotonic()
        with socket.create_connection((HEAD, server.port), timeout=10) as silent:
            silent.sendall(b"\x16\x03\x01")  # the start of a ClientHello, then nothing
            assert silent.recv(100) == b""
        assert 1.5 < time.monotonic() - began < 5
    finally:
        err = server.stop() + other.stop()
    assert "Traceback" not in err, err


class _Head(http.server.BaseHTTPRequestHandler):
    """A server at another address. `key` None: a spoofer that does not hold the run's key (it answers /hello
    with a made-up proof, or relays it to the real head when `relay` is set). With `key`: a hostile head that
    proves the key and then answers with `answer(target) -> (status, headers, body, drip_s)`."""

    key: str | None = None
    relay: tuple[str, int] | None = None
    answer: Callable[[str], tuple[int, dict[str, str], bytes, float]] = staticmethod(
        lambda target: (404, {}, b"", 0.0)
    )
    seen: list[dict[str, str]] = []
    protocol_version = "HTTP/1.0"

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        type(self).seen.append({"target": self.path, **dict(self.headers.items())})
        if self.path == "/hello":
            ours = secrets.token_hex(32)
            if self.relay is not None:
                with socket.create_connection(
                    self.relay, source_address=(self.server.server_address[0], 0)
                ) as s:
                    s.sendall(
                        f"GET /hello HTTP/1.0\r\nX-Sparkforge-Nonce: {self.headers['X-Sparkforge-Nonce']}\r\n\r\n".encode()
                    )
                    lines = _reply(s).decode().split("\r\n\r\n")[0].split("\r\n")[1:]
                got = dict(line.split(": ", 1) for line in lines)
                ours, proof = got["X-Sparkforge-Nonce"], got["X-Sparkforge-Proof"]
            elif self.key is None:
                proof = "f" * 64
            else:
                where = f"{self.server.server_address[0]}:{self.server.server_address[1]}"
                proof = _mac("head", self.headers["X-Sparkforge-Nonce"], ours, where, key=self.key)
            return self._send(200, {"X-Sparkforge-Nonce": ours, "X-Sparkforge-Proof": proof}, b"", 0)
        self._send(*type(self).answer(self.path))

    def _send(self, status: int, headers: dict[str, str], body: bytes, drip_s: float) -> None:
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        try:
            for i in range(0, len(body), 1 if drip_s else len(body) or 1):
                self.wfile.write(body[i : i + (1 if drip_s else len(body))])
                self.wfile.flush()
                time.sleep(drip_s)
        except OSError:
            pass


@pytest.fixture
def head_at():
    servers = []

    def make(address: str, **attrs: object) -> tuple[type[_Head], str]:
        handler = type("Head", (_Head,), {"seen": [], **attrs})
        server = http.server.ThreadingHTTPServer((address, 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return handler, f"http://{address}:{server.server_address[1]}"

    yield make
    for server in servers:
        server.shutdown()


def _manifest(entries: list[dict[str, object]]) -> tuple[bytes, str]:
    body = json.dumps(entries).encode()
    return body, hashlib.sha256(body).hexdigest()


def _entry(path: str, data: bytes, **more: object) -> dict[str, object]:
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), **more}


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def test_a_spoofed_head_or_a_relay_to_the_real_one_gets_nothing_secret(tmp_path: Path, head_at) -> None:
    src = tmp_path / "src"
    _model(src)
    real = Server(src, tmp_path / "m")
    try:
        for spoof, base in (head_at("127.0.0.3"), head_at("127.0.0.3", relay=(HEAD, real.port))):
            code, events, _ = _pull(base, tmp_path / "dst", real.digest)
            assert code == 1 and "did not prove it holds this run's key" in events[-1]["error"]
            assert [s["target"] for s in spoof.seen] == ["/hello"]  # nothing else was asked
            sent = json.dumps(spoof.seen)
            assert KEY not in sent and AUTH_HEADER not in sent  # no key, no proof a replay could use
            assert not (tmp_path / "dst" / "blobs").exists()
        # The real head, with the wrong key on the puller's side: it proves nothing the puller accepts either.
        code, events, _ = _pull(real.base, tmp_path / "dst", real.digest, key="n" * 64)
        assert code == 1 and "did not prove" in events[-1]["error"]
    finally:
        assert "Traceback" not in real.stop()


def test_the_pull_follows_no_redirect_and_keeps_one_deadline(tmp_path: Path, head_at) -> None:
    good = b"weights" * 1000
    body, digest = _manifest([_entry("blobs/w0", good)])
    elsewhere, other = head_at("127.0.0.5", key=KEY)
    moved = lambda target: (302, {"Location": f"{other}{target}"}, b"", 0.0)  # noqa: E731
    for answer in (moved, lambda t: (200, {}, body, 0.0) if t == "/manifest" else moved(t)):
        _, base = head_at("127.0.0.3", key=KEY, answer=staticmethod(answer))
        code, events, _ = _pull(base, tmp_path / "dst", digest)
        assert code == 1 and "redirect" in events[-1]["error"] and "never followed" in events[-1]["error"]
    assert elsewhere.seen == []
    # A dripping head: a byte every 0.3 s keeps every read alive; the one deadline stops it.
    drip = lambda t: (200, {}, body, 0.0) if t == "/manifest" else (200, {}, good, 0.3)  # noqa: E731
    _, base = head_at("127.0.0.6", key=KEY, answer=staticmethod(drip))
    start = time.monotonic()
    code, events, _ = _pull(base, tmp_path / "drip", digest, env={"SPARKFORGE_DEADLINE_S": "3"})
    assert code == 1 and "deadline of 3 s" in events[-1]["error"] and time.monotonic() - start < 8
    # A head that never finishes its /hello headers: the same deadline.
    with socket.create_server(("127.0.0.7", 0)) as silent:
        start = time.monotonic()
        code, events, _ = _pull(
            f"http://127.0.0.7:{silent.getsockname()[1]}",
            tmp_path / "x",
            digest,
            env={"SPARKFORGE_DEADLINE_S": "2"},
        )
    assert code == 1 and "deadline" in events[-1]["error"] and time.monotonic() - start < 6


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        ([{"path": "blobs/w0", "size": 7, "sha256": "../../../outside/planted"}], "hex sha256"),
        ([{"path": "blobs/w0", "size": 7, "sha256": "A" * 64}], "hex sha256"),
        ([{"path": "blobs/w0", "size": 7.0, "sha256": "a" * 64}], "hex sha256"),
        ([{"path": "blobs/w0", "size": True, "sha256": "a" * 64}], "hex sha256"),
        ([_entry("blobs/w0", b"a"), _entry("blobs/w0", b"b")], "listed twice"),
        ([_entry("blobs/w0", b"a"), {"path": "blobs/w0", "link": "c0"}], "listed twice"),
        ([_entry("blobs", b"a"), _entry("blobs/w0", b"b")], "both a file and a folder"),
        ([_entry("../escape", b"a")], "not a relative path"),
        ([_entry("/abs/escape", b"a")], "not a relative path"),
        ([_entry("blobs/../../escape", b"a")], "not a relative path"),
        ([_entry(".sparkforge-part/x", b"a")], "not a relative path"),
        (
            [_entry("blobs/w0", b"a"), {"path": "snapshots/r/m", "link": "../../../outside/hf_token"}],
            "leaves",
        ),
        ([_entry("blobs/w0", b"a"), {"path": "snapshots/r/m", "link": "/tmp/x"}], "leaves"),
        ([_entry("blobs/w0", b"a"), {"path": "snapshots/r/m.py", "link": "../../blobs/added.py"}], "no file"),
        ({"not": "a list"}, "not a relative path"),
    ],
)
def test_the_manifest_is_validated_before_anything_is_written(tmp_path: Path, head_at, entries, says) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "hf_token").write_text("hf_secret")
    body, digest = _manifest(entries)
    head, base = head_at(
        "127.0.0.3",
        key=KEY,
        answer=staticmethod(lambda t: (200, {}, body if t == "/manifest" else b"a", 0.0)),
    )
    dest = tmp_path / "dest"
    code, events, _ = _pull(base, dest, digest)
    assert code == 1 and says in events[-1]["error"] and "nothing written" in events[-1]["error"], events[-1]
    assert [s["target"] for s in head.seen] == ["/hello", "/manifest"]  # no file asked
    assert _tree(outside) == {"hf_token"} and _tree(dest) == set() and not (tmp_path / "escape").exists()


def test_the_pull_refuses_what_the_head_did_not_send(tmp_path: Path, head_at) -> None:
    good = b"weights" * 1000
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "hf_token").write_text("hf_secret")
    dest = tmp_path / "dest"
    dest.mkdir()
    served: dict[str, bytes] = {}
    head, base = head_at(
        "127.0.0.3", key=KEY, answer=staticmethod(lambda t: (200, {}, served.get(t, b""), 0.0))
    )

    def pull(into: Path, entries: list[dict[str, object]]) -> tuple[int, list[dict], str]:
        served["/manifest"], digest = _manifest(entries)
        return _pull(base, into, digest)

    # A replaced file: the right size, other bytes.
    served["/file/blobs/w0"] = b"X" * len(good)
    code, events, _ = pull(dest, [_entry("blobs/w0", good)])
    assert code == 1 and "is not the head's" in events[-1]["error"]
    assert not (dest / "blobs" / "w0").exists() and not list((dest / ".sparkforge-part").iterdir())
    # More bytes than the manifest says: refused while reading, nothing kept.
    served["/file/blobs/w0"] = good + b"A" * (64 << 10)
    code, events, _ = pull(dest, [_entry("blobs/w0", good)])
    assert code == 1 and "more than the manifest" in events[-1]["error"]
    assert not (dest / "blobs" / "w0").exists() and not list((dest / ".sparkforge-part").iterdir())
    # Only the manifest's files are asked for: whatever else the server offers (an added .py) is never fetched.
    served.update({"/file/blobs/w0": good, "/file/blobs/added.py": b"import os"})
    head.seen.clear()
    code, events, err = pull(dest, [_entry("blobs/w0", good)])
    assert code == 0, err
    assert [s["target"] for s in head.seen] == ["/hello", "/manifest", "/file/blobs/w0"]
    assert not (dest / "blobs" / "added.py").exists()
    # A link planted where a folder goes, and one planted where the file goes: never written through.
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "snapshots").symlink_to(outside)
    served["/file/snapshots/r/w0"] = good
    code, events, _ = pull(planted, [_entry("snapshots/r/w0", good)])
    assert code == 1 and "is a link or a file" in events[-1]["error"] and _tree(outside) == {"hf_token"}
    (dest / "blobs" / "w0").unlink()
    (dest / "blobs" / "w0").symlink_to(outside / "hf_token")
    code, events, err = pull(dest, [_entry("blobs/w0", good)])
    assert code == 0, err
    assert (outside / "hf_token").read_text() == "hf_secret"  # the link was replaced, not followed
    assert not (dest / "blobs" / "w0").is_symlink() and (dest / "blobs" / "w0").read_bytes() == good
