"""The doctor's quick stages on four namespaced nodes with their own engines (tests/engine/cluster.py), holding only
the offline Debian base with vLLM's address-choice source (the probe needs python3 and that file: no 10 GB vLLM
image), first on one switch (a bridge), then
re-cabled as a switchless ring by veth links: the topology stage names the layout, the routes each advertised
address needs, and a planted second IPv4 address; the reach stage proves the routes it printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import DOCKER, TestCluster, sh
from cluster_fixtures import cluster_holding

from sparkforge.recipe.loader import REPO_ROOT

# CI budget (tests/engine/ci_budget.py): four engines and one 0.4 GB image cloned by hard links.
pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow(cost_s=120, rank=40, reason="four namespaced engines and three doctor runs"),
]


PROBE_REF = "sparkforge-run-test/probe:vllm-source"


@pytest.fixture(scope="module")
def probe_image(base_amd64: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The offline base plus vLLM's own source of the address choice the probe runs (vllm/__init__.py and
    vllm/utils/network_utils.py from vLLM's PyPI sdist, read by the probe, never imported): what the doctor's
    cheap stages need of an image, at 0.4 GB instead of the 10 GB vLLM image."""
    from sparkforge.preflight.fetch import make_fetcher
    from sparkforge.preflight.sources import from_pypi_sdist

    tree = from_pypi_sdist(make_fetcher(), "vllm", "0.31.0")
    context = tmp_path_factory.mktemp("probe-image")
    for rel in ("vllm/__init__.py", "vllm/utils/network_utils.py"):
        (context / rel).parent.mkdir(parents=True, exist_ok=True)
        (context / rel).write_bytes((tree.root / rel).read_bytes())
    (context / "Dockerfile").write_text(
        f"FROM {base_amd64}\nCOPY vllm /usr/local/lib/python3.11/dist-packages/vllm\n"
    )
    sh(DOCKER, "build", "--network", "none", "-t", PROBE_REF, str(context), timeout=300)
    yield PROBE_REF
    sh(DOCKER, "rmi", PROBE_REF, check=False)


@pytest.fixture(scope="module")
def four_nodes(probe_image: str) -> Iterator[TestCluster]:
    with cluster_holding(probe_image, 4, {}, tag=f"sf4n{os.getpid()}") as cluster:
        yield cluster


def _doctor(
    cluster: TestCluster, image: str, tmp_path: Path, nodes: str, *extra: str
) -> tuple[int, dict, float]:
    report = tmp_path / f"doctor-{time.monotonic_ns()}.json"
    argv = [sys.executable, "-m", "invoke", "cluster.doctor", "--image", image, "--nodes", nodes, "--quick"]
    argv += ["--json", str(report), *extra]
    env = {**os.environ, "SPARKFORGE_STATE": str(tmp_path / "state")}
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    wall = time.monotonic() - start
    print(proc.stdout[-3000:], proc.stderr[-3000:], f"\ncluster.doctor --quick on 4 nodes: {wall:.1f} s")
    checks = {c["name"]: c for c in json.loads(report.read_text())["checks"]}
    return proc.returncode, checks, wall


def _ring(cluster: TestCluster) -> list[str]:
    """Re-cable the switch as a ring: a cable from each node to the next, each its own subnet; every node may
    forward. Returns each node's advertised address (its end of the cable to the next node)."""
    count = len(cluster.nodes)
    return cluster.recable([(i, (i + 1) % count, f"10.79.{i}") for i in range(count)], forward=True)


def test_four_nodes_switch_then_ring(four_nodes: TestCluster, probe_image: str, tmp_path: Path) -> None:
    urls = [n.url for n in four_nodes.nodes]
    code, checks, _wall = _doctor(four_nodes, probe_image, tmp_path, ",".join(urls), "--layout", "switch")
    assert code == 0, checks
    assert checks["topology"]["status"] == "passed" and checks["topology"]["reason"].startswith("switch: ")
    quick = sum(c["duration_s"] for c in checks.values() if c["status"] != "skipped")
    assert quick < 10, f"the quick stages took {quick:.1f} s on four nodes"

    advertised = _ring(four_nodes)
    nodes = ",".join(f"{u}={a}" for u, a in zip(urls, advertised, strict=True))
    code, checks, _ = _doctor(four_nodes, probe_image, tmp_path, nodes, "--layout", "ring4")
    topology = checks["topology"]
    assert topology["status"] == "passed" and topology["reason"].startswith("ring: "), topology
    assert topology["details"]["env"][next(iter(topology["details"]["env"]))]["NCCL_ALGO"] == "Ring"
    routes = topology["details"]["routes"]
    assert (
        code == 1 and checks["reach"]["status"] == "failed"
    )  # no route yet to an address off a node's cables
    assert "On this ring layout the advertised addresses need routes" in checks["reach"]["reason"]
    for hint in routes:  # the routes the stage printed, applied as a user would
        label, _, command = hint.partition(": ip route add ")
        target, *rest = command.split(" (")[0].split()
        rank = int(label.split()[0].removeprefix("node"))
        sh("ip", "-n", four_nodes.nodes[rank].netns, "route", "add", target, *rest)
    code, checks, _ = _doctor(four_nodes, probe_image, tmp_path, nodes, "--layout", "ring4")
    assert code == 0 and checks["reach"]["status"] == "passed", checks["reach"]

    sh("ip", "-n", four_nodes.nodes[1].netns, "addr", "add", "10.79.1.42/24", "dev", "to3")
    code, checks, _ = _doctor(four_nodes, probe_image, tmp_path, nodes, "--layout", "ring4")
    assert code == 1 and checks["topology"]["status"] == "failed"
    assert (
        "fabric interface to3 holds 2 IPv4 addresses (10.79.1.2, 10.79.1.42)" in checks["topology"]["reason"]
    )
    assert checks["reach"]["status"] == "skipped"  # named before anything dials
