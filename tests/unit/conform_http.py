"""What the conform row tests share: a real HTTP server on 127.0.0.1 with a test's own handler class, and a
ConformRun against it for a profile (no engine: the rows only talk HTTP to the served deployment)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.recipe.profile import load_profile
from sparkforge.report import Report
from sparkforge.run.conform.client import OpenAIClient
from sparkforge.run.conform.conformrun import ConformOptions, ConformRun
from sparkforge.run.conform.servers import Servers
from sparkforge.run.conform.session import settings_of


@contextmanager
def http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler` on a free port of 127.0.0.1 until the block ends; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def conform_run(profile: Path, base: str, started: list[dict] | None = None) -> ConformRun:
    """A conform run of `profile` against the server at `base` (servers `started` as conform records them)."""
    loaded = load_profile(profile)
    session = Session(echo=lambda _: None, runner=Runner(stream=False))
    return ConformRun(
        Report(command="conform", subject=loaded.name),
        OpenAIClient(base, "tiny-qwen35moe"),
        [],
        loaded,
        settings_of(loaded),
        ConformOptions(),
        Servers(session, None, started=started or []),
        session,
        [],
        [],
    )
