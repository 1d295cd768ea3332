"""Namespaced nodes (two, or `twin_cluster(count)`) holding the CPU twin image (the cluster of
tests/engine/cluster.py, a cluster of its own).

Its own tag (not the GPU image's `two_nodes` cluster, which a session may hold at the same time): the twin is
streamed once into node a, node b's store is a hard-linked copy. Teardown removes everything, also on failure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import cluster_cpus
import pytest
from cluster import PREFIX, TestCluster
from cluster_fixtures import cluster_holding
from real_fixtures import REAL_TIMINGS


@contextmanager
def twin_cluster(cpu_twin: str, count: int, tag: str) -> Iterator[TestCluster]:
    """`count` namespaced nodes holding the twin (cluster_holding: streamed once into the first node's engine, the
    others' stores hard-linked copies of it); each node its own share of this machine's CPUs (shared when there are
    fewer CPUs than nodes). Everything removed on the way out, also on failure."""
    figures: dict[str, float] = {}
    start = time.monotonic()
    try:
        with cluster_holding(cpu_twin, count, figures, tag=tag, own_cpus=True) as cluster:
            REAL_TIMINGS.update({f"twin_{k}": v for k, v in figures.items()})
            # Each node its own CPUs, as each Spark has (cluster_cpus.py): the ranks' OpenMP threads never share one.
            held = {n.name: cluster_cpus.allowed(f"{cluster.tag}-{n.name}") for n in cluster.nodes}
            assert held == {n.name: cluster.cpus(n) for n in cluster.nodes}, held
            if len(cluster_cpus.machine_cpus()) >= count:
                names = sorted(held)
                assert not any(set(held[x]) & set(held[y]) for x in names for y in names if x < y), held
            yield cluster
            start = time.monotonic()
    finally:
        REAL_TIMINGS["twin_cluster_close_s"] = round(time.monotonic() - start, 1)
        print(f"\nreal cluster timings: {REAL_TIMINGS}")


@pytest.fixture(scope="session")
def twin_nodes(cpu_twin: str) -> Iterator[TestCluster]:
    with twin_cluster(cpu_twin, 2, f"{PREFIX}t{os.getpid()}") as cluster:
        yield cluster
