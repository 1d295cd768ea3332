"""The whole doctor on three namespaced nodes cabled as a mesh (three veth cables, each its own subnet, no switch),
each with its own engine holding the CPU twin (torch, vLLM): the topology stage names mesh3 and the routes each
advertised address needs, the reach stage fails until they are in place, then every stage passes: the same libnccl
on every rank, and the sanity run's rendezvous, Gloo all-reduce and vLLM's message queue across all three ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import TestCluster, sh
from cluster_fixtures import cluster_holding
from real_fixtures import cpu_twin  # noqa: F401 - the session's twin image, shared with the other real tests

from sparkforge.recipe.loader import REPO_ROOT

# CI budget (tests/engine/ci_budget.py): one 6.1 GB stream of the twin (~200 s under load), two hard-link clones.
pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow(cost_s=300, rank=45, reason="three engines holding the CPU twin, two full doctor runs"),
]
ADVERTISED = ("10.80.1.1", "10.80.2.2", "10.80.3.3")  # each node's end of one of its cables


@pytest.fixture(scope="module")
def mesh3(cpu_twin: str) -> Iterator[TestCluster]:  # noqa: F811 - the fixture imported above
    with cluster_holding(cpu_twin, 3, {}, tag=f"sfm3{os.getpid()}") as cluster:
        cluster.recable([(0, 1, "10.80.1"), (1, 2, "10.80.2"), (0, 2, "10.80.3")])  # the switch out: 3 cables
        yield cluster


def _doctor(cluster: TestCluster, image: str, tmp_path: Path) -> tuple[int, dict]:
    report = tmp_path / f"doctor-{time.monotonic_ns()}.json"
    nodes = ",".join(f"{n.url}={a}" for n, a in zip(cluster.nodes, ADVERTISED, strict=True))
    argv = [sys.executable, "-m", "invoke", "cluster.doctor", "--image", image, "--nodes", nodes, "--layout"]
    argv += ["mesh3", "--json", str(report)]
    env = {**os.environ, "SPARKFORGE_STATE": str(tmp_path / "state")}
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=env)
    print(
        proc.stdout[-3000:],
        proc.stderr[-2000:],
        f"\ncluster.doctor on mesh3: {time.monotonic() - start:.1f} s",
    )
    return proc.returncode, {c["name"]: c for c in json.loads(report.read_text())["checks"]}


def test_mesh3_doctor_names_the_routes_then_all_reduces_across_three_ranks(
    mesh3: TestCluster,
    cpu_twin: str,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    code, checks = _doctor(mesh3, cpu_twin, tmp_path)
    assert checks["topology"]["status"] == "passed" and checks["topology"]["reason"].startswith("mesh3: ")
    assert code == 1 and checks["reach"]["status"] == "failed"
    assert "On this mesh3 layout the advertised addresses need routes" in checks["reach"]["reason"]
    assert checks["sanity"]["status"] == "skipped"  # nothing dialled before the routes
    for hint in checks["topology"]["details"]["routes"]:  # as a user would apply them
        label, _, command = hint.partition(": ip route add ")
        target, *rest = command.split(" (")[0].split()
        sh(
            "ip",
            "-n",
            mesh3.nodes[int(label.split()[0].removeprefix("node"))].netns,
            "route",
            "add",
            target,
            *rest,
        )
    code, checks = _doctor(mesh3, cpu_twin, tmp_path)
    assert code == 0, {k: v["reason"][:300] for k, v in checks.items() if v["status"] == "failed"}
    assert checks["nccl-library"]["status"] in ("passed", "skipped")  # one libnccl on every rank (or none)
    sanity = checks["sanity"]
    assert sanity["reason"].startswith("3 ranks passed") and "gloo-allreduce" in sanity["reason"]
    assert "message-queue" in sanity["reason"]
    env = checks["topology"]["details"]["env"]
    assert all(
        e["NCCL_IB_SUBNET_AWARE_ROUTING"] == "1" and "," in e["NCCL_SOCKET_IFNAME"] for e in env.values()
    )
