"""The layouts the field cables, on fake Spark trees: each yields both twins and no pinned GID; a declared
`host=ADDR` goes through the same decision; `--gid-index N` pins only when asked."""

from __future__ import annotations

from pathlib import Path

import pytest
from fabric_trees import LAYOUTS, NodeTree, build, spark

from sparkforge.run.cluster.fabric import choose, choose_all, parse_node
from sparkforge.run.cluster.inventory import local_facts


def _node(tmp_path: Path, tree: NodeTree, name: str = "node0"):
    return parse_node(name, local_facts({"SPARKFORGE_SYSFS": str(build(tmp_path / name, tree))}))


def _pair(tmp_path: Path, layout: str, **kw):
    return [
        _node(tmp_path, spark(layout=layout, **kw), "node0"),
        _node(tmp_path, spark(layout=layout, host=20), "node1"),
    ]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_uses_both_twins_and_lets_nccl_pick_the_gid(tmp_path: Path, layout: str) -> None:
    head, worker = choose_all(_pair(tmp_path, layout))
    for choice in (head, worker):
        assert choice.error is None, choice.error
        assert choice.hcas == ("rocep1s0f1", "roceP2p1s0f1")
        assert choice.env["NCCL_IB_HCA"] == "=rocep1s0f1,roceP2p1s0f1"
        assert "NCCL_IB_GID_INDEX" not in choice.env
        assert (
            choice.env["NCCL_IB_ADDR_FAMILY"] == "AF_INET" and choice.env["NCCL_IB_ROCE_VERSION_NUM"] == "2"
        )
        assert choice.interface == "enp1s0f1np1"
    flux = [w for w in head.warnings if "ARP flux" in w]
    if layout == "separate":  # the community guide's layout: nothing to warn about
        assert not flux and head.address == "192.168.177.10" and worker.address == "192.168.177.20"
        assert not any("different subnets" in w for w in head.warnings)
    else:
        (line,) = flux
        assert "enp1s0f1np1 and enP2p1s0f1np1 are on one subnet" in line
        assert "net.ipv4.conf.all.arp_ignore=1" in line and "arp_announce=2" in line and "rp_filter=2" in line
    if layout == "link-local":
        assert head.address == "169.254.100.10" and "169.254.0.0/16" in flux[0]


def test_separate_subnets_with_a_twin_down_keep_the_pair_that_can_talk(tmp_path: Path) -> None:
    nodes = [
        _node(tmp_path, spark(layout="separate", twin_down=True)),
        _node(tmp_path, spark(layout="separate"), "n1"),
    ]
    head, worker = choose_all(nodes)
    assert head.error is None and head.hcas == ("rocep1s0f1",)
    assert any("roceP2p1s0f1 (enP2p1s0f1np1), the twin of rocep1s0f1" in w for w in head.warnings)
    # the peer's twin B (192.168.178.0/24) has no partner: left out, not a hang
    assert (
        worker.error is None and worker.hcas == ("rocep1s0f1",) and worker.env["NCCL_IB_HCA"] == "=rocep1s0f1"
    )
    assert any("roceP2p1s0f1 on 192.168.178.0/24 left out of NCCL_IB_HCA" in w for w in worker.warnings)


def test_twins_on_subnets_no_peer_twin_shares(tmp_path: Path) -> None:
    odd = spark(layout="separate", host=20)
    next(f for f in odd.functions if f.device == "roceP2p1s0f1").ipv4 = "192.168.179.20"
    head, worker = choose_all([_node(tmp_path, spark(layout="separate")), _node(tmp_path, odd, "node1")])
    assert head.hcas == worker.hcas == ("rocep1s0f1",)
    assert any(
        "roceP2p1s0f1 on 192.168.178.0/24 left out" in w and "node1: 192.168.177.0/24, 192.168.179.0/24" in w
        for w in head.warnings
    )
    apart = spark(layout="separate", host=20)
    for function in apart.functions:
        if function.ipv4:
            function.ipv4 = function.ipv4.replace("192.168.17", "192.168.7")
    head, worker = choose_all(
        [_node(tmp_path / "x", spark(layout="separate")), _node(tmp_path / "x", apart, "node1")]
    )
    for choice in (head, worker):
        assert (
            choice.error
            and "\n" not in choice.error
            and "no peer has a twin on those subnets" in choice.error
        )
        assert "fix: put each twin pair on one subnet on both nodes" in choice.error


def test_two_physical_ports_on_one_subnet_are_warned_not_refused(tmp_path: Path) -> None:
    tree = spark(("p0", "p1"))
    moved = {"rocep1s0f0": "192.168.100.30", "roceP2p1s0f0": "192.168.100.31"}
    for function in tree.functions:
        function.ipv4 = moved.get(function.device, function.ipv4)
    choice = choose(_node(tmp_path, tree))
    assert choice.interface == "enp1s0f0np0" and choice.hcas == ("rocep1s0f0", "roceP2p1s0f0")
    assert any("enp1s0f0np0 and enp1s0f1np1 are on one subnet 192.168.100.0/24" in w for w in choice.warnings)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_declared_address_goes_through_the_same_decision(tmp_path: Path, layout: str) -> None:
    nodes = _pair(tmp_path, layout)
    found = choose_all(nodes)
    declared = choose_all(nodes, addresses=[found[0].address, found[1].address])
    for auto, given in zip(found, declared, strict=True):
        assert given.hcas == auto.hcas == ("rocep1s0f1", "roceP2p1s0f1")
        assert given.env == auto.env
        assert [w for w in given.warnings if "ARP" in w] == [w for w in auto.warnings if "ARP" in w]
    # twin B's own address (separate subnets): that twin leads, both are still used
    if layout == "separate":
        (b_head, _) = choose_all(nodes, addresses=["192.168.178.10", "192.168.178.20"])
        assert b_head.interface == "enP2p1s0f1np1" and b_head.hcas == ("roceP2p1s0f1", "rocep1s0f1")
        assert b_head.env["VLLM_HOST_IP"] == "192.168.178.10" and b_head.error is None


def test_a_declared_address_no_interface_holds_is_refused(tmp_path: Path) -> None:
    (choice,) = choose_all([_node(tmp_path, spark())], addresses=["192.168.100.99"])
    assert choice.error and "no interface holds the declared address 192.168.100.99" in choice.error
    assert "enp1s0f1np1 192.168.100.10" in choice.error and "fix:" in choice.error


def test_gid_index_pins_only_when_asked_and_must_be_in_every_table(tmp_path: Path) -> None:
    node = _node(tmp_path, spark(layout="separate"))
    pinned = choose(node, gid_index=5)
    assert pinned.env["NCCL_IB_GID_INDEX"] == "5" and "NCCL_IB_ADDR_FAMILY" not in pinned.env
    assert not any("--gid-index" in w for w in pinned.warnings)
    wrong = choose(node, gid_index=1)  # the MAC-derived fe80 RoCE v2 entry: in the table, not IPv4
    assert wrong.env["NCCL_IB_GID_INDEX"] == "1"
    assert any("--gid-index 1 on rocep1s0f1 is RoCE v2 fe80" in w for w in wrong.warnings)
    (refused,) = choose_all([node], gid_index=9)
    assert refused.error and "\n" not in refused.error
    assert "--gid-index 9 is not in the GID table of rocep1s0f1 (enp1s0f1np1): 0 IB/RoCE v1" in refused.error
    assert "fix: leave --gid-index out" in refused.error
