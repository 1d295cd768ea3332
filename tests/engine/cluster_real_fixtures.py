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
from cluster import DOCKER, PREFIX, TestCluster
from cluster_fixtures import _missing_tools
from real_fixtures import REAL_TIMINGS

from tests.prerequisites import skip_or_fail


@contextmanager
def twin_cluster(cpu_twin: str, count: int, tag: str) -> Iterator[TestCluster]:
    """`count` namespaced nodes holding the twin: streamed once into the first node's engine, the others' stores
    hard-linked copies of it; each node its own share of this machine's CPUs (shared when there are fewer CPUs
    than nodes). Everything removed on the way out, also on failure."""
    from sparkforge.commands import Command
    from sparkforge.run.nodes import NodeEngine, distribute_image, parse_node

    missing = _missing_tools()
    if missing:
        skip_or_fail(f"the namespaced test cluster needs {', '.join(missing)} (apt: iproute2 util-linux)")
    cluster = TestCluster.create(count, tag=tag, own_cpus=True)
    try:
        first = cluster.nodes[0]
        cluster.start_engine(first)
        start = time.monotonic()
        size = distribute_image(Command((DOCKER,)), cpu_twin, [NodeEngine(parse_node(first.url))])
        REAL_TIMINGS["twin_stream_s"], REAL_TIMINGS["twin_gb"] = (
            round(time.monotonic() - start, 1),
            size / 1e9,
        )
        cluster.stop_engine(first)
        start = time.monotonic()
        for node in cluster.nodes[1:]:
            cluster.clone_store(first, node)
        REAL_TIMINGS["twin_clone_s"] = round(time.monotonic() - start, 1)
        for node in cluster.nodes:
            cluster.start_engine(node)
        # Each node its own CPUs, as each Spark has (cluster_cpus.py): the ranks' OpenMP threads never share one.
        held = {n.name: cluster_cpus.allowed(f"{cluster.tag}-{n.name}") for n in cluster.nodes}
        assert held == {n.name: cluster.cpus(n) for n in cluster.nodes}, held
        if len(cluster_cpus.machine_cpus()) >= count:
            assert not set(held["a"]) & set(held["b"]), held
        yield cluster
    finally:
        start = time.monotonic()
        cluster.close()
        REAL_TIMINGS["twin_cluster_close_s"] = round(time.monotonic() - start, 1)
        print(f"\nreal cluster timings: {REAL_TIMINGS}")


@pytest.fixture(scope="session")
def twin_nodes(cpu_twin: str) -> Iterator[TestCluster]:
    with twin_cluster(cpu_twin, 2, f"{PREFIX}t{os.getpid()}") as cluster:
        yield cluster
