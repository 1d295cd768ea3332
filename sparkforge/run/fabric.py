"""The cluster fabric: which interface, which RDMA devices and which GID each node uses, decided from sysfs facts.

Pure: the facts are the raw JSON of the doctor's in-image helper (`fabric()` in tests/image/cluster_facts.py),
read on each node inside a probe container, or on this machine from /sys (or the tree SPARKFORGE_SYSFS names).
NCCL_IB_HCA names both twins of the port in use (sparkforge/run/rdma.py ties them).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkforge.errors import RunError
from sparkforge.run.rdma import Interface, NodeFabric, Port, describe_ports, parse_node, twins

SOCKET_VARS = (
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
    "UCX_NET_DEVICES",
    "OMPI_MCA_btl_tcp_if_include",
)
__all__ = ["FabricChoice", "choose", "choose_all", "describe_ports", "network_env", "parse_node", "twins"]
ADDRESS_FIX = (
    "give it an IPv4 address on the cluster link (NVIDIA's two-Spark playbook: a netplan drop-in such as "
    "/etc/netplan/40-cx7.yaml), or pass --interface naming the interface that has one"
)


def network_env(interface: str | None, address: str, hcas: Sequence[str] = ()) -> dict[str, str]:
    """The per-node variables that make vLLM, NCCL, Gloo, UCX and Open MPI use the cluster link."""
    env = {"VLLM_HOST_IP": address}
    if interface:
        env.update(dict.fromkeys(SOCKET_VARS, interface))
    if hcas:
        env["NCCL_IB_HCA"] = ",".join(hcas)
    return env


# ---- the choice ---------------------------------------------------------------------------------------


@dataclass
class FabricChoice:
    """What a node will use and why; `env` is what the launch and the doctor's runs set there."""

    label: str
    interface: str | None = None
    address: str | None = None
    reason: str = ""
    hcas: tuple[str, ...] = ()
    gid: dict[str, int | None] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    twins: list[list[str]] = field(default_factory=list)
    tie: str = ""
    rdma: bool = False
    error: str | None = None  # bad input on this node: one paragraph naming the device and the fix

    def to_dict(self) -> dict[str, Any]:
        return {
            "interface": self.interface,
            "address": self.address,
            "reason": self.reason,
            "rdma": self.rdma,
            "nccl_ib_hca": list(self.hcas),
            "gid_index": self.gid,
            "twins": self.twins,
            "twins_tied": self.tie,
            "env": self.env,
            "warnings": self.warnings,
            **({"error": self.error} if self.error else {}),
        }


def _error(node: NodeFabric, text: str) -> RunError:
    return RunError(f"{node.label}: {text}")


def choose(node: NodeFabric, interface: str | None = None, peers: Sequence[NodeFabric] = ()) -> FabricChoice:
    """The fabric interface and environment of one node (RunError: one paragraph naming the device and the fix)."""
    groups, tie = twins(node)
    choice = FabricChoice(node.label, twins=[[p.device for p in g] for g in groups if len(g) > 1], tie=tie)
    choice.rdma = bool(node.ports)
    if interface:
        found = node.interface(interface)
        if found is None:
            names = ", ".join(i.name for i in node.interfaces) or "none"
            raise _error(node, f"there is no interface {interface} (it has: {names}); fix: name one of those")
        if not found.up:
            raise _error(
                node,
                f"interface {interface} is down; fix: cable the port (both ends) and bring it up "
                f"('ip link set {interface} up'), or name an interface that is up",
            )
        group = next((g for g in groups if any(p.netdev == interface for p in g)), None)
        if group is not None:
            port = next(p for p in group if p.netdev == interface)
            if port.ipv4_gid() is None:
                raise _no_gid(node, port)
        elif found.ipv4 is None:
            raise _error(node, f"interface {interface} has no IPv4 address; fix: {ADDRESS_FIX}")
        choice.reason = f"--interface {interface}"
        return _finish(node, choice, found, group)
    active = [[p for p in g if p.active] for g in groups]
    cabled = [g for g in active if g]
    addressed = [g for g in cabled if any(p.ipv4_gid() for p in g)]
    if cabled and not addressed:
        raise _no_gid(node, cabled[0][0])
    if addressed:
        primaries = [next(p for p in g if p.ipv4_gid()) for g in addressed]
        _one_subnet_per_port(node, primaries)
        index = 0
        if len(addressed) > 1:
            shared = [
                i for i, p in enumerate(primaries) if peers and _shared(node.interface(p.netdev), peers)
            ]
            index = shared[0] if shared else 0
            others = ", ".join(str(p.netdev) for i, p in enumerate(primaries) if i != index)
            choice.warnings.append(
                f"{node.label}: several CX-7 ports are cabled; {primaries[index].netdev} is used "
                f"({'its subnet is shared by every peer' if shared else 'the first by name'}), {others} not"
            )
        primary = primaries[index]
        found = node.interface(primary.netdev)
        assert found is not None
        choice.reason = (
            f"RDMA port {primary.device} is ACTIVE (RoCE, {primary.link_layer}) and its net device "
            f"{primary.netdev} holds {found.ipv4}"
        )
        return _finish(node, choice, found, groups[active.index(addressed[index])])
    # No RDMA port to use: a plain interface every peer shares a subnet with, other than the default route.
    candidates = [
        i
        for i in node.interfaces
        if i.up and i.ipv4 and i.name != node.default_route and _shared(i, peers) and peers
    ]
    why = "no RDMA devices" if not node.ports else "no cabled RDMA port"
    if len(candidates) == 1:
        choice.reason = (
            f"{why} on {node.label}; {candidates[0].name} is the one interface besides the default route on a "
            "subnet every node shares"
        )
        return _finish(node, choice, candidates[0], None)
    choice.reason = f"{why} on {node.label}; vLLM, Gloo and NCCL pick their own address (the default route)"
    if node.default_route and peers:
        choice.warnings.append(
            f"{node.label}: nothing but the default-route interface {node.default_route} would be advertised "
            "(a LAN or Wi-Fi the peers may not reach, and NCCL over TCP); fix: cable the CX-7 ports and address "
            "them, or pass --interface"
        )
    return choice


def _no_gid(node: NodeFabric, port: Port) -> RunError:
    return _error(
        node,
        f"RDMA device {port.device} (net device {port.netdev}) is up but carries no RoCE v2 GID with an IPv4 "
        f"address (::ffff:a.b.c.d), so NCCL cannot pick a routable GID for it; fix: {port.netdev}: {ADDRESS_FIX}",
    )


def _shared(found: Interface | None, peers: Sequence[NodeFabric]) -> bool:
    if found is None or found.subnet is None:
        return not peers and found is not None
    return all(any(i.subnet == found.subnet and i.up for i in peer.interfaces) for peer in peers)


def _one_subnet_per_port(node: NodeFabric, primaries: Sequence[Port]) -> None:
    seen: dict[ipaddress.IPv4Network, Port] = {}
    for port in primaries:
        found = node.interface(port.netdev)
        if found is None or found.subnet is None:
            continue
        if found.subnet in seen:
            other = seen[found.subnet]
            raise _error(
                node,
                f"two CX-7 ports are on one subnet {found.subnet}: {other.netdev} ({other.device}) and "
                f"{port.netdev} ({port.device}); the kernel then routes both ports' traffic through one of them "
                "and NCCL's and vLLM's peers answer on the wrong port; fix: give each physical port its own "
                "subnet, or take one of them down",
            )
        seen[found.subnet] = port


def _finish(
    node: NodeFabric, choice: FabricChoice, found: Interface, group: Sequence[Port] | None
) -> FabricChoice:
    choice.interface, choice.address = found.name, found.ipv4
    assert found.ipv4 is not None or group is not None
    address = found.ipv4 or ""
    hcas: list[Port] = []
    if group:
        primary = next(p for p in group if p.netdev == found.name)
        for twin in group:
            if twin is primary:
                continue
            if not twin.active:
                choice.warnings.append(
                    f"{node.label}: {twin.device} ({twin.netdev}), the twin of {primary.device} on the same "
                    f"physical port, is {twin.state}: NCCL gets one PCIe x4 path (~100 Gb/s, half the port); fix: "
                    "check the cable (an approved QSFP112 cable brings both functions up) and the twin's link"
                )
                continue
            twin_if = node.interface(twin.netdev)
            if twin_if and twin_if.subnet and found.subnet and twin_if.subnet != found.subnet:
                raise _error(
                    node,
                    f"the twins of one physical port are on different subnets: {primary.netdev} ({primary.device}) "
                    f"on {found.subnet}, {twin.netdev} ({twin.device}) on {twin_if.subnet}; NCCL pairs them as one "
                    f"link; fix: put {twin.netdev} on {found.subnet} (or remove its address)",
                )
        hcas = [primary, *(t for t in group if t is not primary and t.active)]
    choice.hcas = tuple(p.device for p in hcas)
    choice.env = network_env(found.name, address, ("=" + ",".join(choice.hcas),) if hcas else ())
    if hcas:
        choice.env["NCCL_IB_DISABLE"] = "0"
        choice.gid = {p.device: (g.index if (g := p.ipv4_gid()) else None) for p in hcas}
        indices = set(choice.gid.values())
        if len(indices) == 1 and None not in indices:
            choice.env["NCCL_IB_GID_INDEX"] = str(indices.pop())
        else:
            choice.env["NCCL_IB_ROCE_VERSION_NUM"] = "2"
            if None not in indices:
                choice.env["NCCL_IB_ADDR_FAMILY"] = "AF_INET"
            else:
                bare = ", ".join(d for d, i in choice.gid.items() if i is None)
                choice.warnings.append(
                    f"{node.label}: {bare} carries no IPv4 GID: NCCL picks its RoCE v2 GID itself; fix: address "
                    "its net device on the port's subnet to pin one GID index for every device"
                )
        if choice.tie.startswith("by name"):
            choice.warnings.append(
                f"{node.label}: twins tied by name only (sysfs gave no common GUID and port name or PCI function)"
            )
    if node.default_route and node.default_route != found.name:
        lan = node.interface(node.default_route)
        at = f" ({lan.ipv4})" if lan and lan.ipv4 else ""
        choice.warnings.append(
            f"{node.label}: the default route is on {node.default_route}{at}, a LAN or Wi-Fi: without this choice "
            f"vLLM, Gloo and NCCL would advertise that address; {found.name} ({address}) is used instead"
        )
    return choice


def choose_all(nodes: Sequence[NodeFabric], interface: str | None = None) -> list[FabricChoice]:
    """Every node's choice, each judged against its peers (shared subnets); a node's bad input lands in its
    choice's `error`; warns when the chosen subnets differ."""
    choices = []
    for node in nodes:
        try:
            choices.append(choose(node, interface, [p for p in nodes if p is not node]))
        except RunError as exc:
            choices.append(FabricChoice(node.label, rdma=bool(node.ports), error=str(exc)))
    subnets = {
        str(i.subnet) if (i := n.interface(c.interface)) and i.subnet else None
        for n, c in zip(nodes, choices, strict=False)
    }
    if len(nodes) > 1 and all(c.interface for c in choices) and len(subnets) > 1:
        listing = ", ".join(f"{c.label} {c.interface} {c.address}" for c in choices)
        choices[0].warnings.append(
            f"the chosen interfaces are on different subnets ({listing}): the peers may not reach each other; fix: "
            "address the cluster link on one subnet"
        )
    return choices
