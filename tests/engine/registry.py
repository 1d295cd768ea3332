"""A real registry for tests: Debian's docker-registry (distribution 2.8) on 127.0.0.1, started and stopped here.

Tests read it through its HTTP API as an oracle independent of the docker CLI that sparkforge uses.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

BINARY = "docker-registry"
ACCEPT = ", ".join(
    [
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
    ]
)


def unavailable_reason() -> str | None:
    """Why no registry can be started here, or None."""
    if shutil.which(BINARY) is None:
        return f"{BINARY} is not installed (Debian package docker-registry; .ci/run installs it)"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class LocalRegistry:
    """A running registry; `host` is what image references start with (localhost:PORT)."""

    host: str
    port: int
    root: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tags(self, name: str) -> list[str]:
        response = requests.get(f"{self.url}/v2/{name}/tags/list", timeout=10)
        if response.status_code == 404:
            return []
        response.raise_for_status()
        return sorted(response.json().get("tags") or [])

    def manifest(self, name: str, reference: str) -> tuple[str, dict[str, Any]] | None:
        """(digest, manifest) for a tag or digest, or None when absent."""
        response = requests.get(
            f"{self.url}/v2/{name}/manifests/{reference}", headers={"Accept": ACCEPT}, timeout=10
        )
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.headers["Docker-Content-Digest"], response.json()

    def blob(self, name: str, digest: str) -> Any:
        """A JSON blob (image config, attestation statement) by digest."""
        response = requests.get(f"{self.url}/v2/{name}/blobs/{digest}", timeout=10)
        response.raise_for_status()
        return response.json()


@contextlib.contextmanager
def local_registry(root: Path, wait_s: float = 20.0) -> Iterator[LocalRegistry]:
    """Start docker-registry with its own config and storage under `root`; stop it on exit."""
    port = free_port()
    (root / "data").mkdir(parents=True, exist_ok=True)
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n  secret: sparkforge-tests\n"
    )
    log = (root / "registry.log").open("wb")
    # A long-running server, not a step: started directly and stopped by its own pid below.
    process = subprocess.Popen([BINARY, "serve", str(config)], stdout=log, stderr=log)
    registry = LocalRegistry(f"localhost:{port}", port, root)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{registry.url}/v2/", timeout=2).status_code == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{BINARY} did not start: {(root / 'registry.log').read_text()[-800:]}")
            time.sleep(0.2)
        yield registry
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
