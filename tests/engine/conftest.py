"""Engine fixtures: skip with an explicit reason when no Docker engine (or no offline base) is available.

The publish, signing and buildx fixtures live in their own modules and are registered here once, so that the
tests split by behaviour across several modules share one session's images and registries.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import ci_budget
import ci_record
import pytest
from buildx_fixtures import buildx_published  # noqa: F401 - fixtures, registered for every engine test
from cluster_fixtures import two_nodes, vllm_image  # noqa: F401 - one cluster per session, shared by its modules
from cluster_real_fixtures import twin_nodes  # noqa: F401 - one twin cluster per session (cluster, conform PP=2)
from conform_fixtures import clean_conform  # noqa: F401 - one clean conform run per session, shared by its modules
from history_fixtures import releases  # noqa: F401
from publish_fixtures import published, smoke, smoke_registry  # noqa: F401
from signing_fixtures import signed  # noqa: F401

from sparkforge import engine
from sparkforge.imagebuild.hostsetup import base_image_name
from sparkforge.imagebuild.pipeline import build
from sparkforge.imagebuild.stage import BuildOptions, parse_base_image
from sparkforge.recipe.loader import Recipe
from tests.engine.sessions import build_session
from tests.prerequisites import skip_or_fail

CANARY = "sparkforge-secret-canary-3f9c1e7a"  # constant: any build that ever leaked it would show it


def _engine_reason() -> str | None:
    try:
        from sparkforge.engine import detect_engine

        detect_engine()
    except Exception as exc:
        return f"no usable Docker engine ({exc}); run 'invoke engine.up' (CI: .ci/run does)"
    return None


@pytest.fixture(scope="session")
def engine_ready() -> None:
    reason = _engine_reason()
    if reason:
        skip_or_fail(reason)


def _offline_base(platform: str) -> str:
    name = base_image_name(platform)
    if subprocess.run(["/usr/bin/docker", "image", "inspect", name], capture_output=True).returncode != 0:
        skip_or_fail(f"offline base {name} missing; run 'invoke engine.bases --platform {platform}'")
    return name


@pytest.fixture(scope="session")
def base_amd64(engine_ready: None) -> str:
    return _offline_base("linux/amd64")


@pytest.fixture(scope="session")
def base_arm64(engine_ready: None) -> str:
    return _offline_base("linux/arm64")


@pytest.fixture(scope="session")
def qemu_arm64() -> None:
    """arm64 images build and run here under QEMU: its binfmt entry must be registered."""
    entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    if not entry.exists() or "enabled" not in entry.read_text():
        skip_or_fail("qemu-aarch64 binfmt is not registered; run 'invoke engine.up --qemu'")


BaseStages = Callable[[Recipe, Path], AbstractContextManager[dict[str, str]]]


@pytest.fixture(scope="session")
def base_stages(base_amd64: str, base_arm64: str, qemu_arm64: None) -> BaseStages:
    """Builds a recipe's quick 'base' stage for amd64 and arm64 (QEMU) on the offline Debian bases.

    `with base_stages(recipe, log_root) as candidates:` maps each platform of the recipe to its local image;
    the images are removed when the block ends."""
    bases = {"linux/amd64": base_amd64, "linux/arm64": base_arm64}

    @contextmanager
    def built(recipe: Recipe, log_root: Path) -> Iterator[dict[str, str]]:
        candidates: dict[str, str] = {}
        try:
            for platform in recipe.model.platforms:
                options = BuildOptions(
                    preflight=False,
                    platform=platform,
                    target="base",
                    bases=parse_base_image(bases[platform]),
                    verify=False,
                    log_root=log_root,
                )
                candidates[platform] = build(build_session(quiet=True), recipe, options).candidate
            yield candidates
        finally:
            for image in candidates.values():
                engine.remove_image(image)

    return built


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


def pytest_configure(config: pytest.Config) -> None:
    """.ci/run's record of what this run did (tests/engine/ci_record.py; nothing unless its variables are set)."""
    ci_record.register(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """.ci/run's tiers: the must-run tests always, the rotating ones when due or while they fit
    (tests/engine/ci_budget.py)."""
    ci_budget.apply(config, items)
