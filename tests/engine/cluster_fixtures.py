"""Session fixtures for the cluster and serve tests: the real vLLM image, and two namespaced nodes holding it."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster import DOCKER, DOCKERD, TestCluster, sh
from cluster_stale import remove_stale

from tests.prerequisites import skip_or_fail

# Not under sparkforge-test/: the engine conftest of any concurrent pytest session removes those tags at its end.
VLLM_REF = "sparkforge-run-test/cluster:vllm"
TIMINGS: dict[str, float] = {}  # set-up figures, printed by the tests and recorded in benchmarks/cluster.md


def _missing_tools() -> list[str]:
    return [t for t in ("ip", "nsenter", "/usr/sbin/sshd", "ssh-keygen", DOCKERD) if not shutil.which(t)]


def build_test_image(
    recipe: str, tag: str, base: str, secrets: tuple[Path, Path], log_root: Path, network: str | None = None
) -> None:
    """A recipe's runtime image built by sparkforge's own pipeline under a test tag, unverified (the tests run it)."""
    from sparkforge.imagebuild.pipeline import build
    from sparkforge.imagebuild.stage import BuildOptions, parse_base_image
    from sparkforge.recipe.loader import load_recipe

    ca, token = secrets
    options = BuildOptions(
        platform="linux/amd64",
        bases=parse_base_image(base),
        secrets=(f"id=hf_token,src={token}",),
        tags=(tag,),
        verify=False,
        gpus="none",
        preflight=False,
        network=network,
        log_root=log_root,
    )
    from tests.engine.sessions import build_session

    build(build_session(ca), load_recipe(recipe), options)


@pytest.fixture(scope="session")
def vllm_image(
    base_amd64: str, canary_secrets: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> str:
    """The CI recipe's real vLLM 0.33.0 image (a cached rebuild when another test built it), under a test tag."""
    from sparkforge.recipe.loader import REPO_ROOT

    recipe = str(REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml")
    log_root = tmp_path_factory.mktemp("run-build") / "logs"
    start = time.monotonic()
    build_test_image(recipe, VLLM_REF, base_amd64, canary_secrets, log_root)
    TIMINGS["image_build_s"] = time.monotonic() - start
    yield VLLM_REF
    sh(DOCKER, "rmi", VLLM_REF, check=False)  # the tag only: the layers stay with the recipe's candidate


@contextlib.contextmanager
def cluster_holding(
    image: str, count: int, figures: dict[str, float], **create: Any
) -> Iterator[TestCluster]:
    """`count` namespaced nodes holding `image` (TestCluster.load_image: streamed once, the other stores
    hard-linked copies), removed at the end, also on failure; the set-up figures land in `figures`."""
    missing = _missing_tools()
    if missing:
        skip_or_fail(
            f"the namespaced test cluster needs {', '.join(missing)} (apt: iproute2 util-linux openssh-server)"
        )
    cluster = TestCluster.create(count, **create)
    try:
        figures.update(cluster.load_image(image))
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def two_nodes(vllm_image: str) -> Iterator[TestCluster]:
    """Two namespaced nodes holding the real image: streamed once into node a, node b shares its store."""
    remove_stale()
    try:
        with cluster_holding(vllm_image, 2, TIMINGS) as cluster:
            yield cluster
    finally:
        print(f"\ncluster set-up timings: {TIMINGS}")
