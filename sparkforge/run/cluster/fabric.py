"""The cluster fabric: which interface, which RDMA devices and which GID each node uses, decided from sysfs facts.

Pure: the facts are the raw JSON of the doctor's in-image helper (`fabric()` in tests/image/cluster_facts.py),
read on each node inside a probe container, or on this machine from /sys (or the tree SPARKFORGE_SYSFS names).
NCCL_IB_HCA names both twins of the port in use (sparkforge/run/cluster/rdma.py ties them).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkforge.errors import RunError
from sparkforge.run.cluster.rdma import Interface, NodeFabric, Port, describe_ports, parse_node, twins

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


def choose(
    node: NodeFabric,
    interface: str | None = None,
    peers: Sequence[NodeFabric] = (),
    *,
    address: str | None = None,
    gid_index: int | None = None,
) -> FabricChoice:
    """The fabric interface and environment of one node (RunError: one paragraph naming the device and the fix).

    `address` (a `--nodes host=ADDR`) names the interface that holds it; it then goes through the same decision
    as `--interface`: both twins of that port, the same GID handling, the same warnings."""
    groups, tie = twins(node)
    choice = FabricChoice(node.label, twins=[[p.device for p in g] for g in groups if len(g) > 1], tie=tie)
    choice.rdma = bool(node.ports)
    if address and not interface:
        holder = next((i for i in node.interfaces if i.ipv4 == address), None)
        if holder is None:
            names = ", ".join(f"{i.name} {i.ipv4 or '-'}" for i in node.interfaces)
            raise _error(
                node, f"no interface holds the declared address {address} (it has: {names}); fix: correct it"
            )
        interface = holder.name
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
        choice.reason = f"--nodes ...={address} (on {interface})" if address else f"--interface {interface}"
        return _finish(node, choice, found, group, gid_index)
    active = [[p for p in g if p.active] for g in groups]
    cabled = [g for g in active if g]
    addressed = [g for g in cabled if any(p.ipv4_gid() for p in g)]
    if cabled and not addressed:
        raise _no_gid(node, cabled[0][0])
    if addressed:
        primaries = [next(p for p in g if p.ipv4_gid()) for g in addressed]
        _one_subnet_per_port(node, primaries, choice)
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
        return _finish(node, choice, found, groups[active.index(addressed[index])], gid_index)
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
        return _finish(node, choice, candidates[0], None, gid_index)
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


ARP_FIX = (
    "set net.ipv4.conf.all.arp_ignore=1 and net.ipv4.conf.all.arp_announce=2 (each interface answers ARP only "
    "for its own address) and net.ipv4.conf.all.rp_filter=2 (loose: a reply may come in on the other one), in "
    "/etc/sysctl.d/, or give each {what} its own subnet (e.g. 192.168.177.0/24 and 192.168.178.0/24)"
)


def _arp_flux(node: NodeFabric, subnet: object, names: Sequence[str], what: str) -> str:
    return (
        f"{node.label}: {' and '.join(names)} are on one subnet {subnet}: without ARP settings the kernel may "
        f"answer for either address on either interface (ARP flux) and route both through one of them; fix: "
        + ARP_FIX.format(what=what)
    )


def _one_subnet_per_port(node: NodeFabric, primaries: Sequence[Port], choice: FabricChoice) -> None:
    """Two physical ports on one subnet: NCCL still works (it names devices), the IP layer may flux: a warning."""
    seen: dict[ipaddress.IPv4Network, Port] = {}
    for port in primaries:
        found = node.interface(port.netdev)
        if found is None or found.subnet is None:
            continue
        if found.subnet in seen:
            other = seen[found.subnet]
            choice.warnings.append(
                _arp_flux(node, found.subnet, [str(other.netdev), str(port.netdev)], "physical port")
            )
        seen[found.subnet] = port


def _finish(
    node: NodeFabric,
    choice: FabricChoice,
    found: Interface,
    group: Sequence[Port] | None,
    gid_index: int | None = None,
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
            if twin_if and twin_if.subnet and found.subnet and twin_if.subnet == found.subnet:
                choice.warnings.append(
                    _arp_flux(
                        node, found.subnet, [found.name, str(twin.netdev)], "twin (the community layout)"
                    )
                )
        hcas = [primary, *(t for t in group if t is not primary and t.active)]
    choice.hcas = tuple(p.device for p in hcas)
    choice.env = network_env(found.name, address, ("=" + ",".join(choice.hcas),) if hcas else ())
    if hcas:
        choice.env["NCCL_IB_DISABLE"] = "0"
        choice.gid = {p.device: (g.index if (g := p.ipv4_gid()) else None) for p in hcas}
        if gid_index is not None:
            _pin_gid(node, hcas, gid_index, choice)
        else:  # NCCL picks each device's RoCE v2 IPv4 GID itself: the index moves (3 <-> 4) when addresses change
            choice.env["NCCL_IB_ADDR_FAMILY"] = "AF_INET"
            choice.env["NCCL_IB_ROCE_VERSION_NUM"] = "2"
        bare = ", ".join(d for d, i in choice.gid.items() if i is None)
        if bare:
            choice.warnings.append(
                f"{node.label}: {bare} carries no IPv4 GID: NCCL cannot use it over RoCE v2/IPv4; fix: address "
                "its net device (its own subnet, or the port's with the ARP settings)"
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


def _pin_gid(node: NodeFabric, hcas: Sequence[Port], index: int, choice: FabricChoice) -> None:
    """--gid-index N: every chosen device must have entry N; a non-RoCE-v2-IPv4 entry is warned about."""
    for port in hcas:
        entry = next((g for g in port.gids if g.index == index), None)
        if entry is None:
            table = ", ".join(f"{g.index} {g.version} {g.ipv4 or g.gid}" for g in port.gids) or "empty"
            raise _error(
                node,
                f"--gid-index {index} is not in the GID table of {port.device} ({port.netdev}): {table}; fix: "
                "leave --gid-index out (NCCL then picks the RoCE v2 IPv4 GID itself) or name an index listed",
            )
        if entry.version != "RoCE v2" or not entry.ipv4:
            choice.warnings.append(
                f"{node.label}: --gid-index {index} on {port.device} is {entry.version} {entry.gid}, not the RoCE "
                "v2 IPv4 GID: NCCL's queue pairs may not connect; fix: leave --gid-index out"
            )
    choice.env["NCCL_IB_GID_INDEX"] = str(index)


def _twin_subnets(node: NodeFabric, choice: FabricChoice) -> dict[str, ipaddress.IPv4Network | None]:
    """Device -> the subnet of its net device (None: no address)."""
    found: dict[str, ipaddress.IPv4Network | None] = {}
    for device in choice.hcas:
        port = next(p for p in node.ports if p.device == device)
        iface = node.interface(port.netdev)
        found[device] = iface.subnet if iface else None
    return found


def _match_twins(nodes: Sequence[NodeFabric], choices: list[FabricChoice]) -> None:
    """Keep the twins whose subnet every RDMA peer has a twin on: a RoCE v2 packet from any other has no route to
    the peer (NCCL's connection over it fails or hangs). Fewer twins: a warning; none left: that node fails."""
    live = [(n, c) for n, c in zip(nodes, choices, strict=False) if c.hcas and not c.error]
    if len(live) < 2:
        return
    subnets = [_twin_subnets(n, c) for n, c in live]
    common = set.intersection(*({s for s in found.values() if s} for found in subnets))
    for (node, choice), found in zip(live, subnets, strict=False):
        alone = [d for d, s in found.items() if s and s not in common]
        if not alone:
            continue
        peers = "; ".join(
            f"{c.label}: {', '.join(sorted(str(s) for s in f.values() if s))}"
            for (_, c), f in zip(live, subnets, strict=False)
            if c is not choice
        )
        named = ", ".join(f"{d} on {found[d]}" for d in alone)
        keep = tuple(d for d in choice.hcas if d not in alone)
        if not keep:
            choice.error = (
                f"{node.label}: RDMA devices {named}: no peer has a twin on those subnets ({peers}); RoCE v2 "
                "packets have no route to the peer, so NCCL's connections fail or hang; fix: put each twin pair "
                "on one subnet on both nodes (e.g. 192.168.177.0/24 for twin A and 192.168.178.0/24 for twin B)"
            )
            continue
        choice.hcas = keep
        choice.gid = {d: i for d, i in choice.gid.items() if d in keep}
        choice.env["NCCL_IB_HCA"] = "=" + ",".join(keep)
        choice.warnings.append(
            f"{node.label}: {named} left out of NCCL_IB_HCA: no peer has a twin on that subnet ({peers}), so "
            "NCCL could not reach the peer through it (half the port); fix: put the peer's twin on that subnet "
            "and bring it up"
        )


def choose_all(
    nodes: Sequence[NodeFabric],
    interface: str | None = None,
    addresses: Sequence[str | None] = (),
    gid_index: int | None = None,
) -> list[FabricChoice]:
    """Every node's choice, each judged against its peers (shared subnets, twin subnets); a node's bad input
    lands in its choice's `error`; `addresses` are the `--nodes host=ADDR` ones (None where not given)."""
    choices = []
    for i, node in enumerate(nodes):
        declared = addresses[i] if i < len(addresses) else None
        try:
            peers = [p for p in nodes if p is not node]
            choices.append(choose(node, interface, peers, address=declared, gid_index=gid_index))
        except RunError as exc:
            choices.append(FabricChoice(node.label, rdma=bool(node.ports), error=str(exc)))
    _match_twins(nodes, choices)
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
