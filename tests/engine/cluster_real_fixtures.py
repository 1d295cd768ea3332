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
from cluster import DOCKER, PREFIX, TestCluster
from cluster_fixtures import _missing_tools
from real_fixtures import REAL_TIMINGS

from tests.prerequisites import skip_or_fail


@pytest.fixture(scope="session")
def twin_nodes(cpu_twin: str) -> Iterator[TestCluster]:
    from sparkforge.commands import Command
    from sparkforge.run.nodes import NodeEngine, distribute_image, parse_node

    missing = _missing_tools()
    if missing:
        skip_or_fail(f"the namespaced test cluster needs {', '.join(missing)} (apt: iproute2 util-linux)")
    cluster = TestCluster.create(2, tag=f"{PREFIX}t{os.getpid()}", own_cpus=True)
    try:
        a, b = cluster.nodes
        cluster.start_engine(a)
        start = time.monotonic()
        size = distribute_image(Command((DOCKER,)), cpu_twin, [NodeEngine(parse_node(a.url))])
        REAL_TIMINGS["twin_stream_s"], REAL_TIMINGS["twin_gb"] = (
            round(time.monotonic() - start, 1),
            size / 1e9,
        )
        cluster.stop_engine(a)
        start = time.monotonic()
        cluster.clone_store(a, b)
        REAL_TIMINGS["twin_clone_s"] = round(time.monotonic() - start, 1)
        cluster.start_engine(a)
        cluster.start_engine(b)
        # Each node its own CPUs, as each Spark has (cluster_cpus.py): the ranks' OpenMP threads never share one.
        held = {n.name: cluster_cpus.allowed(f"{cluster.tag}-{n.name}") for n in (a, b)}
        assert held == {n.name: cluster.cpus(n) for n in (a, b)}, held
        if len(cluster_cpus.machine_cpus()) > 1:
            assert not set(held["a"]) & set(held["b"]), held
        yield cluster
    finally:
        start = time.monotonic()
        cluster.close()
        REAL_TIMINGS["twin_cluster_close_s"] = round(time.monotonic() - start, 1)
        print(f"\nreal cluster timings: {REAL_TIMINGS}")
