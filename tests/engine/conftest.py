"""Engine fixtures: skip with an explicit reason when no Docker engine (or no offline base) is available."""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkforge.build.hostsetup import base_image_name

CANARY = "sparkforge-secret-canary-3f9c1e7a"  # constant: any build that ever leaked it would show it


def _engine_reason() -> str | None:
    try:
        from sparkforge.engine import detect_engine

        detect_engine()
    except Exception as exc:
        return f"no usable Docker engine ({exc}); run 'invoke engine.up' (CI: .ci/run does)"
    return None


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("SPARKFORGE_REQUIRE_ENGINE") == "1":
        pytest.fail(f"SPARKFORGE_REQUIRE_ENGINE=1 but {reason}")  # CI must not pass by skipping
    pytest.skip(reason)


@pytest.fixture(scope="session")
def engine_ready() -> None:
    reason = _engine_reason()
    if reason:
        _skip_or_fail(reason)


def _offline_base(platform: str) -> str:
    name = base_image_name(platform)
    if subprocess.run(["/usr/bin/docker", "image", "inspect", name], capture_output=True).returncode != 0:
        _skip_or_fail(f"offline base {name} missing; run 'invoke engine.bases --platform {platform}'")
    return name


@pytest.fixture(scope="session")
def base_amd64(engine_ready: None) -> str:
    return _offline_base("linux/amd64")


@pytest.fixture(scope="session")
def base_arm64(engine_ready: None) -> str:
    return _offline_base("linux/arm64")


@pytest.fixture(scope="session")
def canary() -> str:
    return CANARY


@pytest.fixture(scope="session")
def canary_secrets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A CA bundle (the host's, plus a canary comment) and an HF token file carrying the canary."""
    root = tmp_path_factory.mktemp("secrets")
    host = Path(os.environ.get("SPARKFORGE_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt"))
    bundle = root / "ca.pem"
    bundle.write_text((host.read_text() if host.is_file() else "") + f"\n# {CANARY}\n")
    token = root / "hf_token"
    token.write_text(f"hf_{CANARY}\n")
    return bundle, token


@pytest.fixture(scope="session", autouse=True)
def _remove_test_images() -> object:
    """Leave no throwaway images behind (real vLLM images are 10 GB each; layers stay cached)."""
    yield
    docker = "/usr/bin/docker"
    listed = subprocess.run(
        [docker, "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True
    ).stdout.split()
    throwaway = [
        ref
        for ref in listed
        if ref.startswith("sparkforge-test/")
        or ref.startswith(("sparkforge-candidate/missing-arch:", "sparkforge-candidate/bad-pin:"))
    ]
    if throwaway:
        subprocess.run([docker, "rmi", "--force", *throwaway], capture_output=True)
    subprocess.run([docker, "image", "prune", "--force"], capture_output=True)


@pytest.fixture(scope="session")
def sdist_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM 0.31.0's sdist from PyPI (cached), served over real HTTP on 127.0.0.1 (probe and source-stage tests)."""
    from sparkforge.preflight.fetch import make_fetcher
    from sparkforge.preflight.pypi import resolve_file

    fetcher = make_fetcher()
    dist = resolve_file(fetcher, "vllm", "0.31.0", wheel=None)
    sdist = fetcher.download(dist.url, what="vLLM 0.31.0 sdist", sha256=dist.sha256)
    root = tmp_path_factory.mktemp("served")
    shutil.copyfile(sdist, root / "vllm-0.31.0.tar.gz")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/vllm-0.31.0.tar.gz"
    server.shutdown()
