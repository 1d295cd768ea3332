"""Layouts as data: read_topology names pair, mesh3, ring and switch from Spark-shaped sysfs trees (both twins of
each cabled port addressed, one subnet per cable), and names each miswiring with its fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from fabric_trees import SPARK_FUNCTIONS, Function, NodeTree, build

from sparkforge.errors import RunError
from sparkforge.run.cluster.inventory import local_facts
from sparkforge.run.cluster.rdma import parse_node
from sparkforge.run.cluster.topology import (
    LAYOUTS,
    layout,
    nccl_environment,
    node_environment,
    read_topology,
    route_hints,
)


def _spark(host: int, ports: dict[str, str], mtu: int = 9000) -> NodeTree:
    """A Spark whose physical ports in `ports` are cabled, each on the /24 given (twin A .host, twin B .host+100)."""
    functions = []
    for device, (_, _, port) in SPARK_FUNCTIONS.items():
        if port in ports:
            twin_b = device.startswith("roceP2")
            functions.append(Function(device, True, f"{ports[port]}.{host + 100 * twin_b}"))
        else:
            functions.append(Function(device, False, None))
    return NodeTree(functions=functions, mtu=mtu)


def _nodes(tmp_path: Path, trees: list[NodeTree], mutate=None) -> list:
    nodes = []
    for i, tree in enumerate(trees):
        raw = local_facts({"SPARKFORGE_SYSFS": str(build(tmp_path / f"n{i}", tree))})
        if mutate:
            mutate(i, raw)
        nodes.append(parse_node(f"spark{i + 1}", raw))
    return nodes


def _mesh3() -> list[NodeTree]:
    # cables: spark1 p0 - spark2 p1 (10.0.12), spark2 p0 - spark3 p1 (10.0.23), spark3 p0 - spark1 p1 (10.0.31)
    return [
        _spark(1, {"p0": "10.0.12", "p1": "10.0.31"}),
        _spark(2, {"p1": "10.0.12", "p0": "10.0.23"}),
        _spark(3, {"p1": "10.0.23", "p0": "10.0.31"}),
    ]


def _ring(count: int) -> list[NodeTree]:
    # node i: p0 to the next node (subnet 10.1.i), p1 to the previous one (subnet 10.1.i-1)
    return [_spark(i + 1, {"p0": f"10.1.{i}", "p1": f"10.1.{(i - 1) % count}"}) for i in range(count)]


def test_pair_is_todays_two_node_layout(tmp_path: Path) -> None:
    topo = read_topology(
        _nodes(tmp_path, [_spark(1, {"p1": "192.168.100"}), _spark(2, {"p1": "192.168.100"})])
    )
    assert topo.layout == "pair" and not topo.problems
    assert nccl_environment(topo) == {} and node_environment(topo, 0) == {}  # the pair keeps today's env


def test_mesh3_each_pair_on_its_own_cable(tmp_path: Path) -> None:
    topo = read_topology(_nodes(tmp_path, _mesh3()))
    assert topo.layout == "mesh3" and not topo.problems, topo.problems
    assert topo.address_towards(0, 1) == "10.0.12.1" and topo.address_towards(0, 2) == "10.0.31.1"
    env = node_environment(topo, 0)
    assert env["NCCL_IB_SUBNET_AWARE_ROUTING"] == "1" and "NCCL_SKIP_TREE_CONNECT" not in env
    assert set(env["NCCL_IB_HCA"].removeprefix("=").split(",")) == set(
        SPARK_FUNCTIONS
    )  # both ports, both twins
    assert set(env["NCCL_SOCKET_IFNAME"].split(",")) == {n for _, n, _ in SPARK_FUNCTIONS.values()}


@pytest.mark.parametrize("count", [4, 6])
def test_ring_found_in_ring_order(tmp_path: Path, count: int) -> None:
    trees = _ring(count)
    trees[1], trees[2] = trees[2], trees[1]  # --nodes not in cable order: the order is read from the cables
    topo = read_topology(_nodes(tmp_path, trees), "ring4" if count == 4 else None)
    assert topo.layout == "ring" and not topo.problems, topo.problems
    assert topo.order[:3] in ((0, 2, 1), (0, 3, 2)) or len(topo.order) == count
    assert len(topo.order) == count and set(topo.order) == set(range(count))
    env = nccl_environment(topo)
    assert env["NCCL_ALGO"] == "Ring" and env["NCCL_SKIP_TREE_CONNECT"] == "1"


def test_switch_every_node_on_one_subnet(tmp_path: Path) -> None:
    trees = [_spark(i + 1, {"p1": "10.9.0"}) for i in range(4)]
    topo = read_topology(_nodes(tmp_path, trees))
    assert topo.layout == "switch" and not topo.problems and nccl_environment(topo) == {}


def test_ring_missing_one_cable_names_the_two_nodes(tmp_path: Path) -> None:
    trees = _ring(4)
    trees[3] = _spark(4, {"p1": "10.1.2"})  # spark4's cable to spark1 (10.1.3) is unplugged
    trees[0] = _spark(1, {"p0": "10.1.0"})
    topo = read_topology(_nodes(tmp_path, trees))
    assert topo.layout is None
    (problem,) = topo.problems
    assert (
        problem.startswith("missing link between spark1 and spark4")
        and "fix: cable spark1 to spark4" in problem
    )


def test_mesh3_missing_link(tmp_path: Path) -> None:
    trees = _mesh3()
    trees[2] = _spark(3, {"p1": "10.0.23"})
    trees[0] = _spark(1, {"p0": "10.0.12"})
    topo = read_topology(_nodes(tmp_path, trees))
    assert topo.layout is None and [p.split(" (")[0] for p in topo.problems] == [
        "missing link between spark1 and spark3"
    ]


def test_two_cables_on_one_subnet(tmp_path: Path) -> None:
    trees = [_spark(i + 1, {"p0": "10.5.0", "p1": "10.5.0"}) for i in range(4)]
    for i, tree in enumerate(trees):  # distinct addresses per port: .1x on p0, .2x on p1
        for fn in tree.functions:
            if fn.ipv4:
                fn.ipv4 = f"10.5.0.{(10 if SPARK_FUNCTIONS[fn.device][2] == 'p0' else 20) + i + (fn.device.startswith('roceP2')) * 100}"
    topo = read_topology(_nodes(tmp_path, trees))
    assert sum("two links on one subnet" in p for p in topo.problems) == 4
    assert (
        "spark1: enP2p1s0f0np0 and enP2p1s0f1np1 and enp1s0f0np0 and enp1s0f1np1 (two cables)"
        in topo.problems[0]
    )


def test_second_ipv4_on_a_fabric_interface(tmp_path: Path) -> None:
    def plant(i: int, raw: dict) -> None:
        if i == 1:  # a second address on spark2's enp1s0f1np1: a second RoCE v2 IPv4 GID on rocep1s0f1
            gids = raw["rdma"]["rocep1s0f1"]["ports"]["1"]["gids"]
            gids.append(
                {
                    "index": 9,
                    "gid": "0000:0000:0000:0000:0000:ffff:0a63:0007",
                    "type": "RoCE v2",
                    "ndev": "enp1s0f1np1",
                }
            )

    topo = read_topology(
        _nodes(tmp_path, [_spark(1, {"p1": "192.168.100"}), _spark(2, {"p1": "192.168.100"})], plant)
    )
    (problem,) = topo.problems
    assert problem.startswith(
        "spark2: fabric interface enp1s0f1np1 holds 2 IPv4 addresses (192.168.100.2, 10.99.0.7)"
    )
    assert "ip addr del 10.99.0.7/24 dev enp1s0f1np1" in problem


def test_mtu_mismatch_on_a_link(tmp_path: Path) -> None:
    trees = _mesh3()
    trees[1] = _spark(2, {"p1": "10.0.12", "p0": "10.0.23"}, mtu=1500)
    topo = read_topology(_nodes(tmp_path, trees))
    mismatches = [p for p in topo.problems if p.startswith("MTU mismatch")]
    assert len(mismatches) == 2  # spark2's two cables (both twins of each on the cable's subnet)
    assert "spark2 enp1s0f0np0 1500" in " ".join(mismatches) and topo.layout == "mesh3"


def test_declared_layout_differs_and_unknown_names(tmp_path: Path) -> None:
    topo = read_topology(_nodes(tmp_path, _mesh3()), "switch")
    assert topo.problems[0].startswith("--layout switch, but the fabric is cabled as mesh3")
    with pytest.raises(RunError, match="cabled for 4-8 nodes, but 3"):
        read_topology(_nodes(tmp_path / "x", _mesh3()), "ring")
    with pytest.raises(RunError, match="not a known layout"):
        layout("torus")
    assert {lay.name for lay in LAYOUTS} >= {"pair", "mesh3", "ring", "switch"}


def test_route_hints_make_each_advertised_address_reachable(tmp_path: Path) -> None:
    mesh = read_topology(_nodes(tmp_path / "mesh", _mesh3()))
    # each node advertises its address on its p0 cable: spark1 10.0.12.1, spark2 10.0.23.2, spark3 10.0.31.3
    hints = route_hints(mesh, ["10.0.12.1", "10.0.23.2", "10.0.31.3"])
    assert "spark3: ip route add 10.0.12.1/32 dev enp1s0f0np0" in hints  # spark3's cable to spark1
    assert "spark1: ip route add 10.0.23.2/32 dev enp1s0f0np0" in hints  # spark1's p0 reaches spark2
    assert len(hints) == 3
    ring = read_topology(_nodes(tmp_path / "ring", _ring(4)))
    hints = route_hints(ring, ["10.1.0.1", "10.1.1.2", "10.1.2.3", "10.1.3.4"])
    # spark1 and spark3 are not neighbours: through spark2 (or spark4), which forwards
    assert any(
        h.startswith("spark1: ip route add 10.1.2.3/32 via 10.1.") and "ip_forward=1 on spark" in h
        for h in hints
    )
