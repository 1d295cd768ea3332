"""Two namespaced nodes holding the CPU twin image (the cluster of tests/engine/cluster.py, a cluster of its own).

Its own tag (not the GPU image's `two_nodes` cluster, which a session may hold at the same time): the twin is
streamed once into node a, node b's store is a hard-linked copy. Teardown removes everything, also on failure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import cluster_cpus
import pytest
from cluster import PREFIX, TestCluster
from cluster_fixtures import cluster_holding
from real_fixtures import REAL_TIMINGS


@pytest.fixture(scope="session")
def twin_nodes(cpu_twin: str) -> Iterator[TestCluster]:
    figures: dict[str, float] = {}
    start = time.monotonic()
    try:
        with cluster_holding(cpu_twin, 2, figures, tag=f"{PREFIX}t{os.getpid()}", own_cpus=True) as cluster:
            REAL_TIMINGS.update({f"twin_{k}": v for k, v in figures.items()})
            a, b = cluster.nodes
            # Each node its own CPUs, as each Spark has (cluster_cpus.py): the ranks' OpenMP threads never share one.
            held = {n.name: cluster_cpus.allowed(f"{cluster.tag}-{n.name}") for n in (a, b)}
            assert held == {n.name: cluster.cpus(n) for n in (a, b)}, held
            if len(cluster_cpus.machine_cpus()) > 1:
                assert not set(held["a"]) & set(held["b"]), held
            yield cluster
            start = time.monotonic()
    finally:
        REAL_TIMINGS["twin_cluster_close_s"] = round(time.monotonic() - start, 1)
        print(f"\nreal cluster timings: {REAL_TIMINGS}")
