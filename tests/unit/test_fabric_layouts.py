"""cluster.fabric on fake sysfs trees shaped like a DGX Spark: the interface, twins, GID choice and env per layout."""

from __future__ import annotations

from pathlib import Path

from fabric_trees import NodeTree, build, spark

from sparkforge.recipe.profile import load_profile
from sparkforge.run.cluster.fabric import FabricChoice, choose, choose_all, parse_node
from sparkforge.run.cluster.inventory import fabric_report, local_facts
from sparkforge.run.launch import LaunchOptions, plan_launch

SOCKET = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES")


def _read(tmp_path: Path, tree: NodeTree, name: str = "node") -> dict:
    return local_facts({"SPARKFORGE_SYSFS": str(build(tmp_path / name, tree))})


def _choice(tmp_path: Path, tree: NodeTree, interface: str | None = None) -> FabricChoice:
    return choose(parse_node("node0", _read(tmp_path, tree)), interface)


def test_spark_one_cabled_port_uses_both_twins_and_the_ipv4_gid_after_the_ipv6_ones(tmp_path: Path) -> None:
    choice = _choice(tmp_path, spark())
    assert choice.interface == "enp1s0f1np1" and choice.address == "192.168.100.10"
    assert choice.hcas == ("rocep1s0f1", "roceP2p1s0f1")
    assert choice.tie == "sysfs: same system image GUID and physical port name"
    assert choice.twins == [["rocep1s0f0", "roceP2p1s0f0"], ["rocep1s0f1", "roceP2p1s0f1"]]
    # Global IPv6 GIDs come first: the IPv4 RoCE v2 GID is index 5 on both twins, not the folklore's 3.
    assert choice.gid == {"rocep1s0f1": 5, "roceP2p1s0f1": 5}
    env = choice.env
    assert env["NCCL_IB_HCA"] == "=rocep1s0f1,roceP2p1s0f1" and "NCCL_IB_GID_INDEX" not in env
    assert env["VLLM_HOST_IP"] == "192.168.100.10" and env["NCCL_IB_DISABLE"] == "0"
    assert all(env[k] == "enp1s0f1np1" for k in SOCKET)
    # NCCL picks each device's RoCE v2 IPv4 GID itself (the index moves 3 <-> 4 when addresses change).
    assert env["NCCL_IB_ADDR_FAMILY"] == "AF_INET" and env["NCCL_IB_ROCE_VERSION_NUM"] == "2"
    flux, lan = choice.warnings
    assert "enp1s0f1np1 and enP2p1s0f1np1 are on one subnet 192.168.100.0/24" in flux and "ARP flux" in flux
    assert all(k in flux for k in ("arp_ignore=1", "arp_announce=2", "rp_filter=2"))
    assert (
        "the default route is on wlP9s9, a LAN or Wi-Fi" in lan
        and "enp1s0f1np1 (192.168.100.10) is used" in lan
    )


def test_both_ports_cabled_prefer_the_subnet_the_peer_shares(tmp_path: Path) -> None:
    both = parse_node("node0", _read(tmp_path, spark(("p0", "p1")), "a"))
    alone = choose(both)
    assert alone.interface == "enp1s0f0np0" and alone.hcas == ("rocep1s0f0", "roceP2p1s0f0")
    assert any("several CX-7 ports are cabled" in w and "the first by name" in w for w in alone.warnings)
    peer = parse_node("node1", _read(tmp_path, spark(("p1",), host=20), "b"))
    head, worker = choose_all([both, peer])
    assert head.interface == "enp1s0f1np1" and head.env["NCCL_IB_HCA"] == "=rocep1s0f1,roceP2p1s0f1"
    assert any("its subnet is shared by every peer" in w and "enp1s0f0np0 not" in w for w in head.warnings)
    assert worker.env["VLLM_HOST_IP"] == "192.168.100.20" and "NCCL_IB_GID_INDEX" not in worker.env


def test_a_twin_down_leaves_one_path_and_says_so(tmp_path: Path) -> None:
    choice = _choice(tmp_path, spark(twin_down=True))
    assert choice.hcas == ("rocep1s0f1",) and choice.env["NCCL_IB_HCA"] == "=rocep1s0f1"
    assert choice.gid == {"rocep1s0f1": 5} and "NCCL_IB_GID_INDEX" not in choice.env
    assert any(
        "roceP2p1s0f1 (enP2p1s0f1np1), the twin of rocep1s0f1" in w and "DOWN" in w for w in choice.warnings
    )
    assert any("half the port" in w for w in choice.warnings)


def test_no_rdma_at_all_changes_nothing(tmp_path: Path) -> None:
    choice = _choice(tmp_path, NodeTree())
    assert choice.interface is None and choice.env == {} and not choice.rdma
    assert choice.reason.startswith("no RDMA devices on node0")


def test_twins_with_different_gid_indices_use_ncclss_own_selection(tmp_path: Path) -> None:
    tree = spark()
    b = next(f for f in tree.functions if f.device == "roceP2p1s0f1")
    b.ipv6_first = False  # twin B has no global IPv6: its IPv4 GID is index 3
    choice = _choice(tmp_path, tree)
    assert choice.gid == {"rocep1s0f1": 5, "roceP2p1s0f1": 3}
    assert "NCCL_IB_GID_INDEX" not in choice.env
    assert choice.env["NCCL_IB_ADDR_FAMILY"] == "AF_INET" and choice.env["NCCL_IB_ROCE_VERSION_NUM"] == "2"


def test_a_twin_without_an_address_is_kept_with_a_warning(tmp_path: Path) -> None:
    """A published layout addresses only enp1s0f1np1 and still lists both twins in NCCL_IB_HCA."""
    tree = spark()
    next(f for f in tree.functions if f.device == "roceP2p1s0f1").ipv4 = None
    choice = _choice(tmp_path, tree)
    assert choice.hcas == ("rocep1s0f1", "roceP2p1s0f1") and choice.gid["roceP2p1s0f1"] is None
    assert choice.env["NCCL_IB_ROCE_VERSION_NUM"] == "2" and "NCCL_IB_GID_INDEX" not in choice.env
    assert any("roceP2p1s0f1 carries no IPv4 GID: NCCL cannot use it" in w for w in choice.warnings)


def test_twins_tied_by_pci_function_then_by_name(tmp_path: Path) -> None:
    tree = spark()
    for function in tree.functions:
        function.phys_port_name = False
    assert _choice(tmp_path, tree).tie == "sysfs: same system image GUID and PCI function"
    tree.guid = None
    choice = choose(parse_node("node0", _read(tmp_path, tree, "noguid")))
    assert choice.tie.startswith("by name only") and choice.hcas == ("rocep1s0f1", "roceP2p1s0f1")
    assert any("twins tied by name only" in w for w in choice.warnings)


def test_the_namespaced_layout_without_rdma_picks_the_shared_subnet_and_warns_about_the_lan() -> None:
    """What the probe reports in the engine tests' namespaced nodes: a LAN default route and a fabric veth."""

    def node(i: int) -> dict:
        return {
            "root": "/sys",
            "rdma": {},
            "net": {
                "lan0": {"operstate": "up", "mtu": 1500, "ipv4": f"10.78.{i}.1"},
                "fabric0": {"operstate": "up", "mtu": 1500, "ipv4": f"10.77.0.{i}"},
            },
            "routes": [
                {"iface": "lan0", "destination": "0.0.0.0", "gateway": f"10.78.{i}.254", "mask": "0.0.0.0"},
                {
                    "iface": "lan0",
                    "destination": f"10.78.{i}.0",
                    "gateway": "0.0.0.0",
                    "mask": "255.255.255.0",
                },
                {
                    "iface": "fabric0",
                    "destination": "10.77.0.0",
                    "gateway": "0.0.0.0",
                    "mask": "255.255.255.0",
                },
            ],
        }

    report, choices = fabric_report(["node0", "node1"], [node(1), node(2)])
    assert report.status == "passed"
    assert [c.env["VLLM_HOST_IP"] for c in choices] == ["10.77.0.1", "10.77.0.2"]
    assert all(c.env["GLOO_SOCKET_IFNAME"] == "fabric0" and "NCCL_IB_HCA" not in c.env for c in choices)
    assert "no RDMA devices on node0" in choices[0].reason
    assert "the default route is on lan0 (10.78.1.1)" in choices[0].warnings[0]


def test_launch_passes_rdma_devices_only_to_nodes_that_have_them() -> None:
    options = LaunchOptions(image="img:1", ulimits=("nofile=16384",))
    plan = plan_launch(
        load_profile("qwen35-122b-a10b-fp8-tp2"), ["10.0.0.1", "10.0.0.2"], [{}, {}], options, [True, False]
    )
    rdma, plain = (n.docker_argv() for n in plan.nodes)
    assert "--device" in rdma and rdma[rdma.index("--device") + 1] == "/dev/infiniband"
    assert "memlock=-1" in rdma and "IPC_LOCK" in rdma
    assert "--device" not in plain and "memlock=-1" not in plain


def test_this_machine_reads_without_a_tree() -> None:
    raw = local_facts({})
    assert raw["root"] == "/sys" and "lo" in raw["net"]
    choice = choose(parse_node("here", raw))
    assert choice.rdma == bool(raw["rdma"])
