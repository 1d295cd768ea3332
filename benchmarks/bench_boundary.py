"""The input boundary's round-2 costs, measured: what each hostile input costs before it is refused.

Usage (light: no engine, no network but 127.0.0.1):
  python3 benchmarks/bench_boundary.py > benchmarks/results/bench_boundary.json
1. the one fetcher against a local server: a body dripped one byte every 0.2 s (deadline 2 s), a server that
   never answers (deadline 2 s), a 1 GiB declared body, 64 MiB of zeros gzipped (cap 1 MiB);
2. a 2 MB log line searched by vLLM's MoE selection pattern: Python's re and the boundary's RE2 (8 KiB lines);
3. the real command lines refusing a bad number (`bench --concurrency 1_0,٣`) and a FIFO (`kernels --image`),
   Python and Invoke start included.
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparkforge.urlfetch import FetchError, fetch_url  # noqa: E402
from sparkforge.verify.started import PATTERNS, started_backends  # noqa: E402

BOMB = gzip.compress(b"\0" * (64 << 20))


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def handle(self) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the fetcher hung up: the point
            super().handle()

    def do_GET(self) -> None:
        if self.path == "/drip":
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            for _ in range(100000):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.2)
        elif self.path == "/silent":
            time.sleep(60)
        elif self.path == "/huge":
            self.send_response(200)
            self.send_header("Content-Length", str(1 << 30))
            self.end_headers()
            self.wfile.write(b"z" * 65536)
        else:
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(BOMB)))
            self.end_headers()
            self.wfile.write(BOMB)


def _timed(fn) -> dict[str, object]:
    start = time.monotonic()
    try:
        fn()
        outcome = "accepted"
    except FetchError as exc:
        outcome = str(exc)[:160]
    return {"seconds": round(time.monotonic() - start, 3), "outcome": outcome}


def main() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    session = requests.Session()
    out: dict[str, object] = {}
    for name, path, cap in (("drip", "/drip", 1 << 20), ("silent", "/silent", 1 << 20),
                            ("declared-1GiB", "/huge", 1 << 20), ("gzip-64MiB", "/bomb", 1 << 20)):  # fmt: skip
        out[f"fetch {name}"] = _timed(
            lambda p=path, c=cap, n=name: fetch_url(session, base + p, what=n, max_bytes=c, deadline=2.0)
        )
    line = "Using a " * 250_000  # 2 MB: every 'Using' starts a lazy repeat that runs to the line's end
    moe = dict(PATTERNS)["moe"]
    for size in (16_000, 32_000):  # quadratic: 2 MB would take hours
        start = time.monotonic()
        re.search(moe, line[:size])
        out[f"re over the first {size // 1000} KB of the line"] = round(time.monotonic() - start, 3)
    start = time.monotonic()
    started_backends(line)
    out["RE2 over the 2 MB line (cut at 8 KiB)"] = round(time.monotonic() - start, 4)
    with tempfile.TemporaryDirectory() as tmp:
        fifo = Path(tmp) / "w.whl"
        os.mkfifo(fifo)
        for name, argv in (
            ("bench --concurrency 1_0,٣", ["bench", "--recipe", "vllm-qwen35", "--profile", "x", "--concurrency",
                                            "1_0,٣"]),
            ("kernels --image FIFO", ["kernels", "--recipe", "vllm-qwen35", "--image", str(fifo)]),
        ):  # fmt: skip
            start = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "invoke", *argv], cwd=ROOT, capture_output=True, text=True,
                                  env={**os.environ, "DOCKER_HOST": "tcp://192.0.2.1:9"}, timeout=60)  # fmt: skip
            out[f"cli {name}"] = {"seconds": round(time.monotonic() - start, 3), "exit": proc.returncode,
                                  "message": proc.stderr.strip()[-200:]}  # fmt: skip
    server.shutdown()
    json.dump(out, sys.stdout, indent=2, ensure_ascii=False)
    print()


if __name__ == "__main__":
    main()
