"""`--weights shared`'s two in-image scripts, run here on 127.0.0.1 (the engine test runs them in containers on
the namespaced nodes over their fabric link): a partial file resumed, symlinks recreated, a wrong token refused."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from sparkforge.run.weightstream import _PULL, _SERVE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_pull_resumes_and_recreates_the_cache_layout(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "blobs").mkdir(parents=True)
    (src / "snapshots" / "r1").mkdir(parents=True)
    data = os.urandom(3 << 20)
    (src / "blobs" / "w0").write_bytes(data)
    (src / "blobs" / "w0.lock").write_text("")  # a download's leftovers are not served
    (src / "snapshots" / "r1" / "model.safetensors").symlink_to("../../blobs/w0")
    (dst / "blobs").mkdir(parents=True)
    (dst / "blobs" / "w0.sparkforge-part").write_bytes(data[: 1 << 20])
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(src), "127.0.0.1", str(port), "tok"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert json.loads(server.stdout.readline())["files"] == 2  # type: ignore[union-attr]
        base = f"http://127.0.0.1:{port}"
        env = {**os.environ, "SPARKFORGE_PROGRESS_S": "0"}
        pull = subprocess.run(
            [sys.executable, "-c", _PULL, base, str(dst), "tok"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        events = [json.loads(line) for line in pull.stdout.splitlines()]
        assert pull.returncode == 0 and events[-1]["event"] == "done", pull.stderr
        assert events[-1]["moved"] == len(data) - (1 << 20) and events[-1]["resumed"] == 1
        assert any(e["event"] == "progress" for e in events)
        assert (dst / "blobs" / "w0").read_bytes() == data and not (dst / "blobs" / "w0.lock").exists()
        assert os.readlink(dst / "snapshots" / "r1" / "model.safetensors") == "../../blobs/w0"
        again = subprocess.run(
            [sys.executable, "-c", _PULL, base, str(dst), "tok"], capture_output=True, text=True, timeout=60
        )
        assert json.loads(again.stdout.splitlines()[-1])["moved"] == 0
        wrong = subprocess.run(
            [sys.executable, "-c", _PULL, base, str(tmp_path / "x"), "nope"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert wrong.returncode != 0 and "403" in wrong.stderr
    finally:
        server.terminate()
        server.wait(timeout=10)
