"""The layout read for real: three and four namespaced nodes cabled as mesh3, ring and switch by veth links and a
bridge (tests/engine/netfabric.py), each node's sysfs, routes and addresses read inside its namespace by the
doctor's reader, then `read_topology` and `cluster.fabric`'s report. Planted miswirings (a cable pulled, two
cables on one subnet, a second IPv4 address, an MTU mismatch) are named. No engine or image: seconds per layout.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from netfabric import Fabric

from sparkforge.run.cluster.inventory import fabric_report
from sparkforge.run.cluster.rdma import parse_node
from sparkforge.run.cluster.topology import node_environment, read_topology
from tests.prerequisites import skip_or_fail

pytestmark = pytest.mark.engine


@pytest.fixture
def make() -> Iterator:
    if os.geteuid() != 0 or not shutil.which("ip"):
        skip_or_fail("network namespaces need root and iproute2")
    made: list[Fabric] = []

    def build(count: int) -> Fabric:
        made.append(Fabric(count, f"sftopo{os.getpid()}x{len(made)}"))
        return made[-1]

    yield build
    for fabric in made:
        fabric.close()


def _topology(fabric: Fabric, declared: str | None = None):
    raws = fabric.facts()
    labels = [f"node{i + 1}" for i in range(fabric.count)]
    return read_topology(
        [parse_node(label, raw) for label, raw in zip(labels, raws, strict=True)], declared
    ), raws


def _mesh3(make) -> Fabric:
    fabric = make(3)
    fabric.cable(0, 1, "10.90.12")
    fabric.cable(1, 2, "10.90.23")
    fabric.cable(0, 2, "10.90.13")
    return fabric


def test_mesh3_read_from_three_namespaced_nodes(make) -> None:
    fabric = _mesh3(make)
    topo, raws = _topology(fabric)
    assert topo.layout == "mesh3" and not topo.problems, topo.problems
    assert topo.address_towards(0, 1) == "10.90.12.1" and topo.address_towards(2, 0) == "10.90.13.3"
    # lan0 (the default route) and docker0 (the same address on every node) are no cables
    assert {p.interface for p in topo.ports[0]} == {"to2", "to3"}
    assert node_environment(topo, 0)["NCCL_SOCKET_IFNAME"] == "to2,to3"
    report, _ = fabric_report([f"node{i + 1}" for i in range(3)], raws, layout=None)
    layout_check = next(c for c in report.checks if c.name == "topology")
    assert layout_check.status == "passed" and layout_check.reason.startswith("mesh3: ")


def test_ring4_found_and_a_pulled_cable_named(make) -> None:
    fabric = make(4)
    for a, b in ((0, 1), (1, 2), (2, 3), (3, 0)):
        fabric.cable(a, b, f"10.91.{a}{b}")
    topo, _ = _topology(fabric, "ring4")
    assert topo.layout == "ring" and topo.order == (0, 1, 2, 3) and not topo.problems
    fabric.ip(3, "link", "del", "to1")  # the cable between node4 and node1 pulled (a veth goes with its peer)
    topo, raws = _topology(fabric)
    assert topo.layout is None
    assert topo.problems[0].startswith("missing link between node1 and node4: the cables form a chain")
    report, _ = fabric_report([f"node{i + 1}" for i in range(4)], raws)
    assert report.status == "failed"


def test_switch_and_its_miswirings(make) -> None:
    fabric = make(4)
    fabric.switch("10.92.0")
    topo, _ = _topology(fabric)
    assert topo.layout == "switch" and not topo.problems, topo.problems
    fabric.ip(2, "link", "set", "fabric0", "mtu", "1500")  # node3 after a firmware reboot
    fabric.ip(
        1, "addr", "add", "10.92.0.42/24", "dev", "fabric0"
    )  # a second IPv4 on node2's fabric interface
    topo, _ = _topology(fabric)
    mtu = next(p for p in topo.problems if p.startswith("MTU mismatch on 10.92.0.0/24"))
    assert "node3 fabric0 1500" in mtu and "node1 fabric0 9000" in mtu
    second = next(p for p in topo.problems if "IPv4 addresses" in p)
    assert second.startswith("node2: fabric interface fabric0 holds 2 IPv4 addresses (10.92.0.2, 10.92.0.42)")


def test_two_cables_on_one_subnet_in_a_mesh(make) -> None:
    fabric = make(3)
    fabric.cable(0, 1, "10.93.0")
    fabric.cable(1, 2, "10.93.1")
    fabric.cable(0, 2, "10.93.0", first=11)  # node1's cable to node3 put on node1-node2's subnet
    topo, _ = _topology(fabric)
    assert any(
        p.startswith("node1: to2 and to3 (two cables) are on one subnet 10.93.0.0/24") for p in topo.problems
    ), topo.problems
