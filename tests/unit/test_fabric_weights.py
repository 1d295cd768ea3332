"""`--weights shared`'s two in-image programs, run here on 127.0.0.1 as real processes (the engine test runs them
in containers on the namespaced nodes): the happy path (resume, the cache's links, the cached manifest), the
server attacked with raw sockets, and the puller attacked by a hostile server and a hostile folder."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sparkforge.run.weights.weightscripts import SECRET_HEADER, pull_args, serve_args

SECRET = "s" * 64


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


class Server:
    """The head's weight server as a process on 127.0.0.1, its manifest read from its first line."""

    def __init__(self, root: Path, cache: Path, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *serve_args(str(root), "127.0.0.1", 0, SECRET, str(cache / "src.json"))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        event = json.loads(self.proc.stdout.readline())  # type: ignore[union-attr]
        self.port = int(event["address"].rsplit(":", 1)[1])
        self.manifest = event["manifest"]
        self.base = f"http://127.0.0.1:{self.port}"

    def raw(self, request: bytes, timeout: float = 10) -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(request)
            out = b""
            while chunk := sock.recv(65536):
                out += chunk
        return out

    def status(self, path: str, headers: str = f"{SECRET_HEADER}: {SECRET}\r\n") -> int:
        reply = self.raw(f"GET {path} HTTP/1.0\r\n{headers}\r\n".encode("latin-1"))
        return int(reply.split(b" ", 2)[1])

    def stop(self) -> str:
        self.proc.terminate()
        _, err = self.proc.communicate(timeout=10)
        return err


def _pull(base: str, dest: Path, manifest: object, secret: str = SECRET) -> tuple[int, list[dict], str]:
    done = subprocess.run(
        [sys.executable, *pull_args(base, str(dest), secret, manifest)],  # type: ignore[arg-type]
        capture_output=True,
        text=True,
        env={**os.environ, "SPARKFORGE_PROGRESS_S": "0"},
        timeout=60,
    )
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()], done.stderr


def test_the_pull_verifies_resumes_and_recreates_the_cache_layout(tmp_path: Path) -> None:
    src, dst, cache = tmp_path / "src", tmp_path / "dst", tmp_path / "manifests"
    data = _model(src)
    server = Server(src, cache)
    try:
        files = {e["path"]: e for e in server.manifest if "sha256" in e}
        assert set(files) == {"blobs/w0", "blobs/c0"}  # the .lock is not served
        assert files["blobs/w0"]["sha256"] == hashlib.sha256(data).hexdigest()
        # An interrupted transfer: the first MiB in the part folder, named by the file's digest.
        (dst / ".sparkforge-part").mkdir(parents=True)
        (dst / ".sparkforge-part" / files["blobs/w0"]["sha256"]).write_bytes(data[: 1 << 20])
        code, events, err = _pull(server.base, dst, server.manifest)
        assert code == 0 and events[-1]["event"] == "done", err
        assert events[-1]["moved"] == len(data) - (1 << 20) + files["blobs/c0"]["size"]
        assert events[-1]["resumed"] == 1 and any(e["event"] == "progress" for e in events)
        assert (dst / "blobs" / "w0").read_bytes() == data and not (dst / "blobs" / "w0.lock").exists()
        assert os.readlink(dst / "snapshots" / "r1" / "model.safetensors") == "../../blobs/w0"
        again = _pull(server.base, dst, server.manifest)
        assert again[0] == 0 and again[1][-1]["moved"] == 0  # verified in place, nothing moved
    finally:
        assert "Traceback" not in server.stop()
    # The manifest is cached per snapshot folder: a second server reuses the digests (same size and mtime).
    cached = json.loads((cache / "src.json").read_text())
    assert {e["path"] for e in cached if "sha256" in e} == {"blobs/w0", "blobs/c0"}
    for entry in cached:
        if entry["path"] == "blobs/c0":
            entry["sha256"] = "0" * 64  # a planted cache entry is used only while size and mtime match
    (cache / "src.json").write_text(json.dumps(cached))
    second = Server(src, cache)
    try:
        assert {e["path"]: e.get("sha256") for e in second.manifest}["blobs/c0"] == "0" * 64
        os.utime(src / "blobs" / "c0", ns=(1, 1))  # touched: hashed again
    finally:
        second.stop()
    third = Server(src, cache)
    third.stop()
    assert {e["path"]: e.get("sha256") for e in third.manifest}["blobs/c0"] == hashlib.sha256(
        (src / "blobs" / "c0").read_bytes()
    ).hexdigest()


def test_the_server_refuses_raw_attacks_with_4xx_and_no_traceback(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _model(src)
    (tmp_path / "outside").write_text("token")
    server = Server(src, tmp_path / "m", {"SPARKFORGE_IDLE_S": "1", "SPARKFORGE_MAX_CLIENTS": "4"})
    try:
        assert server.status("/file/blobs/c0") == 200
        assert server.status("/file/blobs/c0", headers="") == 403  # no secret
        assert server.status("/file/blobs/c0", headers=f"{SECRET_HEADER}: {'x' * 64}\r\n") == 403
        assert server.status(f"/file/blobs/c0?token={SECRET}") == 404  # never in a URL
        for path in ("/file/../outside", "/file/%2e%2e/outside", "/file//etc/passwd", "/file/blobs/c0%00",
                     "/file/snapshots/r1/config.json", "/manifest", "/file/blobs/w0.lock", "/"):  # fmt: skip
            assert server.status(path) == 404, path
        assert server.status("/file/%ff") == 400
        for bad in ("bytes=abc", "bytes=" + "9" * 5000, "bytes=-5", "bytes=0-1,2-3", "bytes=99999999"):
            assert server.status("/file/blobs/c0", f"{SECRET_HEADER}: {SECRET}\r\nRange: {bad}\r\n") == 416, (
                bad
            )
        assert server.raw(b"\x00\xff garbage\r\n\r\n").startswith(b"HTTP/1.0 400")
        assert (
            server.raw(b"POST /file/blobs/c0 HTTP/1.0\r\nContent-Length: -1\r\n\r\n").split(b" ")[1] == b"405"
        )
        # Idle connections: at most 4 held, each dropped after 1 s; a real request still gets through.
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(40)]
        time.sleep(2.5)
        assert server.status("/file/blobs/c0") == 200
        for sock in idle:
            sock.close()
        # A file replaced on the head after the manifest was made: refused, not served as the manifest's.
        (src / "blobs" / "c0").write_text("replaced, and longer than before")
        assert server.status("/file/blobs/c0") == 409
    finally:
        err = server.stop()
    assert "Traceback" not in err, err


class _Hostile(http.server.BaseHTTPRequestHandler):
    """A server that is not the head's: answers every path with whatever `bodies` says."""

    bodies: dict[str, bytes] = {}
    seen: list[str] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        type(self).seen.append(self.path)
        body = type(self).bodies.get(self.path.removeprefix("/file/"), b"")
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def hostile():
    handler = type("Hostile", (_Hostile,), {"bodies": {}, "seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _entry(path: str, data: bytes) -> dict[str, object]:
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def test_the_pull_refuses_what_the_head_did_not_send(tmp_path: Path, hostile) -> None:
    handler, base = hostile
    good = b"weights" * 1000
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "hf_token").write_text("hf_secret")
    dest = tmp_path / "dest"
    dest.mkdir()
    # A replaced file: the right size, other bytes.
    handler.bodies = {"blobs/w0": b"X" * len(good)}
    code, events, _ = _pull(base, dest, [_entry("blobs/w0", good)])
    assert code == 1 and "is not the head's" in events[-1]["error"]
    assert not (dest / "blobs" / "w0").exists() and not list((dest / ".sparkforge-part").iterdir())
    # More bytes than the manifest says: refused while reading, nothing kept.
    handler.bodies = {"blobs/w0": good + b"A" * (64 << 10)}
    code, events, _ = _pull(base, dest, [_entry("blobs/w0", good)])
    assert code == 1 and "more than the manifest" in events[-1]["error"]
    assert not (dest / "blobs" / "w0").exists() and not list((dest / ".sparkforge-part").iterdir())
    # Paths and links that leave the folder: refused before any request, nothing written.
    handler.seen.clear()
    for manifest in (
        [_entry("../escape", good)],
        [_entry("/abs/escape", good)],
        [_entry("blobs/../../escape", good)],
        [_entry(".sparkforge-part/x", good)],
        [_entry("blobs/w0", good), {"path": "snapshots/r/m", "link": "../../../outside/hf_token"}],
        [_entry("blobs/w0", good), {"path": "snapshots/r/m", "link": "/tmp/x"}],
        [_entry("blobs/w0", good), {"path": "snapshots/r/m.py", "link": "../../blobs/added.py"}],
        {"not": "a list"},
    ):
        code, events, _ = _pull(base, dest, manifest)
        assert code == 1 and "nothing written" in events[-1]["error"], manifest
    assert handler.seen == [] and _tree(outside) == {"hf_token"} and not (tmp_path / "escape").exists()
    # Only the manifest's files are asked for: whatever else the server offers (an added .py) is never fetched.
    handler.bodies = {"blobs/w0": good, "blobs/added.py": b"import os"}
    code, events, err = _pull(base, dest, [_entry("blobs/w0", good)])
    assert code == 0, err
    assert handler.seen == ["/file/blobs/w0"] and not (dest / "blobs" / "added.py").exists()
    # A link planted where a folder goes, and one planted where the file goes: never written through.
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "snapshots").symlink_to(outside)
    code, events, _ = _pull(base, planted, [_entry("snapshots/r/w0", good)])
    assert code == 1 and "is a link or a file" in events[-1]["error"] and _tree(outside) == {"hf_token"}
    (dest / "blobs" / "w0").unlink()
    (dest / "blobs" / "w0").symlink_to(outside / "hf_token")
    code, events, err = _pull(base, dest, [_entry("blobs/w0", good)])
    assert code == 0, err
    assert (outside / "hf_token").read_text() == "hf_secret"  # the link was replaced, not followed
    assert not (dest / "blobs" / "w0").is_symlink() and (dest / "blobs" / "w0").read_bytes() == good


def test_the_pull_against_the_real_server_with_a_wrong_secret(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _model(src)
    server = Server(src, tmp_path / "m")
    try:
        code, events, _ = _pull(server.base, tmp_path / "dst", server.manifest, secret="nope")
    finally:
        server.stop()
    assert code == 1 and "403" in events[-1]["error"]
    assert not (tmp_path / "dst" / "blobs").exists() or not list((tmp_path / "dst" / "blobs").iterdir())
