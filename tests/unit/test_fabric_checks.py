"""The fabric's checks without a cluster: perftest's output, the link plan, GID/MTU drift kept per node, NCCL's
transport lines (plugins too) and the port-rate floor, the recipe's pinned RDMA userspace."""

from __future__ import annotations

from pathlib import Path

import pytest
from fabric_trees import NodeTree, build, spark

from sparkforge.errors import RecipeError, RunError
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.report import Check
from sparkforge.run.cluster.fabric import choose_all, parse_node
from sparkforge.run.cluster.fabricstate import drift
from sparkforge.run.cluster.inventory import local_facts
from sparkforge.run.cluster.linktest import link_check, parse_perftest, plan_links
from sparkforge.run.cluster.stages import transport, transport_kind
from sparkforge.run.facts import DoctorOptions, NodeFacts
from tests.recipe_files import write_recipe_file

PERFTEST = Path(__file__).parent / "golden" / "perftest"


def _raw(tmp_path: Path, tree: NodeTree, name: str) -> dict:
    return local_facts({"SPARKFORGE_SYSFS": str(build(tmp_path / name, tree))})


def test_perftest_output_in_gbits_and_mbytes() -> None:
    gbits = parse_perftest((PERFTEST / "ib_write_bw_gbits.txt").read_text())
    assert gbits == {
        "bytes": 65536, "iterations": 883264, "peak_gbps": 0.0, "average_gbps": 92.61,
        "msg_rate_mpps": 0.17664, "device": "rocep1s0f1", "gid_index": 3,
    }  # fmt: skip
    mbytes = parse_perftest((PERFTEST / "ib_write_bw_mbytes.txt").read_text())
    assert mbytes["average_gbps"] == pytest.approx(92.61, abs=0.01) and mbytes["iterations"] == 5000
    with pytest.raises(
        RunError, match=r"ib_write_bw printed no result row .*Couldn.t connect to 192\.168\.177\.20"
    ):
        parse_perftest(" Couldn't connect to 192.168.177.20:18515\nUnable to open file descriptor for socket")


def test_the_link_plan_pairs_twins_by_subnet(tmp_path: Path) -> None:
    nodes = [
        parse_node(f"node{i}", _raw(tmp_path, spark(layout="separate", host=10 * (i + 1)), str(i)))
        for i in (0, 1)
    ]
    choices = choose_all(nodes)
    (plan,) = plan_links(nodes, choices)
    assert [(x.client, x.server, x.address) for x in plan.links] == [
        ("rocep1s0f1", "rocep1s0f1", "192.168.177.20"),
        ("roceP2p1s0f1", "roceP2p1s0f1", "192.168.178.20"),
    ]
    assert [x.port for x in plan.links] == [18515, 18516] and plan.links[0].server_gid == 5


def test_the_link_test_skips_without_rdma_and_refuses_without_perftest(tmp_path: Path) -> None:
    bare = [parse_node(f"node{i}", _raw(tmp_path, NodeTree(), f"b{i}")) for i in (0, 1)]
    check = Check("link-test", "passed")
    link_check(check, [], bare, choose_all(bare), [{}, {}], "img")
    assert check.status == "skipped" and check.reason == "no RDMA devices in use on node0, node1"
    raws = [_raw(tmp_path, spark(host=10 * (i + 1)), f"s{i}") for i in (0, 1)]
    nodes = [parse_node(f"node{i}", r) for i, r in enumerate(raws)]
    raws[1]["verbs"] = {"libibverbs": True, "mlx5": True, "perftest": True}
    with pytest.raises(RunError) as caught:
        link_check(Check("link-test", "passed"), [], nodes, choose_all(nodes), raws, "img:1")
    assert "node0 (devices rocep1s0f1, roceP2p1s0f1): img:1 has no ib_write_bw (perftest)" in str(
        caught.value
    )
    assert "fix: add runtime.rdma.link_test" in str(caught.value)


def test_gid_index_and_mtu_drift_are_warned_per_node(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = [parse_node(f"node{i}", _raw(tmp_path, spark(host=10 * (i + 1)), f"a{i}")) for i in (0, 1)]
    assert drift(["ssh://a:22", "ssh://b:22"], first, choose_all(first), state) == []
    assert sorted(p.name for p in (state / "fabric").iterdir()) == ["ssh_a_22.json", "ssh_b_22.json"]
    moved = spark(host=20, mtu=1500)
    for function in moved.functions:
        function.ipv6_first = False  # the global IPv6 address is gone: the IPv4 GID moves from 5 to 3
    second = [first[0], parse_node("node1", _raw(tmp_path, moved, "b1"))]
    lines = drift(["ssh://a:22", "ssh://b:22"], second, choose_all(second), state)
    assert any("differs between devices/nodes" in w and "node1: rocep1s0f1 3" in w for w in lines)
    assert any(
        "node1: the RoCE v2 IPv4 GID index of rocep1s0f1 moved from 5 to 3 since the last run" in w
        for w in lines
    )
    assert any(
        "node1: the MTU of enp1s0f1np1 changed from 9000 to 1500 since the last run" in w for w in lines
    )
    assert (
        drift(["ssh://a:22", "ssh://b:22"], second, choose_all(second), state)[1:] == []
    )  # now the baseline


NCCL_IB = [
    "node0:1:1 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:192.168.177.10<0>",
]
NCCL_PLUGIN = [
    "node0:1:1 [0] NCCL INFO NET/IBext_v11 : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:192.168.177.10<0>",
    "node0:1:1 [0] NCCL INFO Using network IBext_v11",
]
NCCL_NO_VERBS = [
    "node0:1:1 [0] NCCL INFO Failed to open libibverbs.so[.1]",
    "node0:1:1 [0] NCCL INFO NET/Socket : Using [0]enp1s0f1np1:192.168.177.10<0>",
    "node0:1:1 [0] NCCL INFO Using network Socket",
]


def test_transport_lines_of_nccl_and_its_plugins() -> None:
    assert transport_kind(NCCL_IB) == (
        "IB",
        ["[0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:192.168.177.10<0>"],
    )
    assert transport_kind(NCCL_PLUGIN)[0] == "IB"
    assert transport_kind(NCCL_NO_VERBS)[0] == "Socket" and transport_kind([])[0] is None


def _sanity(lines: list[str], busbw: float) -> dict:
    stage = {"stage": "nccl-allreduce", "event": "done", "busbw_GBps": busbw}
    return {"ranks": {"node0": {"stages": [stage], "nccl_lines": lines}}}


def test_the_transport_floor_is_80_percent_of_the_port_rate(tmp_path: Path) -> None:
    raw = _raw(tmp_path, spark(layout="separate"), "n")
    fact = NodeFacts(0, "node0", "", "", [], {}, {}, interface="enp1s0f1np1", fabric=raw)
    slow, fast, off = Check("transport", "passed"), Check("transport", "passed"), Check("transport", "passed")
    transport(slow, [fact], _sanity(NCCL_PLUGIN, 12.0), DoctorOptions(image="i"))
    assert (
        slow.status == "failed" and slow.details["node0"]["floor_GBps"] == 20.0
    )  # 200 Gb/s -> 25 GB/s x 0.8
    assert "below the floor 20 GB/s (80 % of the port rate sysfs reports)" in slow.reason
    transport(fast, [fact], _sanity(NCCL_PLUGIN, 21.5), DoctorOptions(image="i"))
    assert fast.status == "passed" and "NET/IB" in fast.reason
    transport(off, [fact], _sanity(NCCL_IB, 12.0), DoctorOptions(image="i", min_busbw=0))
    assert off.status == "passed"
    socket = Check("transport", "passed")
    transport(socket, [fact], _sanity(NCCL_NO_VERBS, 2.0), DoctorOptions(image="i"))
    assert socket.status == "failed" and "NCCL could not open libibverbs" in socket.reason
    assert "fix: pin runtime.rdma in the recipe" in socket.reason


def test_the_recipe_pins_the_rdma_userspace(tmp_path: Path) -> None:
    gb10 = load_recipe("vllm-qwen35-wheels").model.runtime.rdma
    assert (
        gb10 is not None
        and gb10.pinned()["ibverbs-providers"] == "50.0-2ubuntu0.2"
        and "perftest" in gb10.pinned()
    )
    ci = load_recipe(str(REPO_ROOT / "tests" / "recipes" / "ci-wheels-amd64.yaml")).model.runtime.rdma
    assert ci is not None and ci.pinned() == {
        "libibverbs1": "44.0-2",
        "ibverbs-providers": "44.0-2",
        "librdmacm1": "44.0-2",
        "perftest": "4.5+0.17-1",
    }  # fmt: skip  (the list replaces the GB10 one: no noble package leaks into the bookworm image)
    for body, needle in (
        ("runtime:\n  rdma:\n    packages: [libibverbs1]\n", "has no version"),
        ("runtime:\n  rdma:\n    packages: [libibverbs1=50.0]\n", "lacks ibverbs-providers"),
        (
            "runtime:\n  rdma:\n    packages: [libibverbs1=>1, ibverbs-providers=1]\n",
            "is not one exact package version",
        ),
    ):
        path = write_recipe_file(
            tmp_path / "r.yaml", body, extends=REPO_ROOT / "recipes" / "vllm-qwen35-wheels.yaml"
        )
        with pytest.raises(RecipeError, match=needle):
            load_recipe(str(path))
