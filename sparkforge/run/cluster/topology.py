"""Cluster layouts as data, and the layout each node's fabric facts show (or what is miswired).

A layout declares how its nodes are cabled: `pair` (two Sparks, one cable: the two-node layout), `mesh3` (three
Sparks, each pair on its own cable and subnet), `ring` (four to eight Sparks without a switch, each cabled to its
two neighbours), `switch` (every node on one switch, one subnet). `read_topology` works from the same sysfs facts
the fabric choice uses (rdma.parse_node): a node's fabric interfaces are its RDMA ports' net devices, or, on a
node without RDMA devices, its addressed interfaces other than the default route and bridges. Two interfaces of
different nodes on one subnet are cabled to each other (a point-to-point link), or to one switch when the subnet
holds more than two nodes. Pure: no I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkforge.errors import RunError
from sparkforge.run.cluster.rdma import NodeFabric, twins


@dataclass(frozen=True)
class Layout:
    """One way to cable Sparks: how many nodes, which pairs a cable joins (None: one switch); docs/clusters.md
    draws each."""

    name: str
    help: str
    nodes: tuple[int, int]  # the fewest and most nodes it is cabled for
    switchless: bool

    def fits(self, count: int) -> bool:
        return self.nodes[0] <= count <= self.nodes[1]

    def cables(self, count: int) -> tuple[frozenset[int], ...] | None:
        """The node pairs (positions in ring order) a cable joins; None for a switch (one shared subnet)."""
        if not self.switchless:
            return None
        if count == 2:
            return (frozenset((0, 1)),)
        if self.name == "mesh3":
            return tuple(frozenset(p) for p in ((0, 1), (1, 2), (0, 2)))
        return tuple(frozenset((i, (i + 1) % count)) for i in range(count))


LAYOUTS: tuple[Layout, ...] = (
    Layout(
        "pair",
        "two Sparks, one QSFP cable between the same port of each (both twins of the port addressed)",
        (2, 2),
        True,
    ),
    Layout(
        "mesh3",
        "three Sparks without a switch: each pair on its own cable and its own subnet (two ports per node)",
        (3, 3),
        True,
    ),
    Layout(
        "ring",
        "four to eight Sparks without a switch: each cabled to its two neighbours, each cable its own subnet; "
        "stock NCCL cannot use it for TP (tree connections to non-adjacent ranks)",
        (4, 8),
        True,
    ),
    Layout(
        "switch",
        "two to eight Sparks, each cabled to one switch, every fabric interface on one subnet",
        (2, 8),
        False,
    ),
)
ALIASES = {"ring4": "ring"}  # ring4: the four-node ring the field names that way


def layout(name: str) -> Layout:
    """The layout called `name` (or its alias); RunError listing the known ones."""
    wanted = ALIASES.get(name, name)
    found = next((lay for lay in LAYOUTS if lay.name == wanted), None)
    if found is None:
        known = ", ".join([*(lay.name for lay in LAYOUTS), *ALIASES])
        raise RunError(f"--layout {name!r} is not a known layout ({known}); fix: name one of those")
    return found


@dataclass(frozen=True)
class FabricPort:
    """One fabric interface of one node: what it is cabled to is read from its subnet."""

    node: int
    interface: str
    address: str
    subnet: ipaddress.IPv4Network
    mtu: int | None
    cable: str  # the physical port: the twins of one port share it
    addresses: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()  # the RDMA devices behind it (NCCL_IB_HCA)


@dataclass(frozen=True)
class Link:
    """A subnet shared by two nodes (a cable) or by more (a switch)."""

    subnet: ipaddress.IPv4Network
    ports: tuple[FabricPort, ...]

    @property
    def nodes(self) -> frozenset[int]:
        return frozenset(p.node for p in self.ports)


@dataclass
class Topology:
    """What the fabric facts show: the layout found (None: none fits), the links, and what is miswired."""

    labels: tuple[str, ...]
    layout: str | None = None
    links: list[Link] = field(default_factory=list)
    order: tuple[int, ...] = ()  # ring order of the nodes (positions in --nodes), the head first
    ports: dict[int, list[FabricPort]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def switchless(self) -> bool:
        return self.layout is not None and layout(self.layout).switchless

    def reason(self) -> str:
        if self.problems:
            return "; ".join(self.problems)
        if self.layout is None:
            return "one node: no fabric to read"
        cabled = ", ".join(_describe(link, self.labels) for link in self.links)
        return f"{self.layout}: {cabled}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout,
            "order": [self.labels[i] for i in self.order],
            "links": [
                {
                    "subnet": str(link.subnet),
                    "ends": [
                        {
                            "node": self.labels[p.node],
                            "interface": p.interface,
                            "address": p.address,
                            "mtu": p.mtu,
                        }
                        for p in link.ports
                    ],
                }
                for link in self.links
            ],
            "problems": list(self.problems),
            "warnings": list(self.warnings),
        }

    def address_towards(self, node: int, peer: int) -> str | None:
        """The address of `node` on the link it shares with `peer` (what `peer` dials), None when unlinked."""
        for link in self.links:
            if {node, peer} <= link.nodes:
                return next(p.address for p in link.ports if p.node == node)
        return None


def _describe(link: Link, labels: Sequence[str]) -> str:
    ends = " - ".join(f"{labels[p.node]} {p.interface}" for p in link.ports)
    return f"{ends} on {link.subnet}"


def fabric_ports(index: int, node: NodeFabric) -> list[FabricPort]:
    """A node's fabric interfaces: its cabled RDMA ports' net devices (twins share a cable), else its addressed
    interfaces other than the default route and bridges (the namespaced test nodes, a node without a CX-7)."""
    found: list[FabricPort] = []
    groups, _ = twins(node)
    active = [[p for p in g if p.active and p.netdev] for g in groups]
    if any(active):
        for number, group in enumerate(active):
            for port in group:
                iface = node.interface(port.netdev)
                if iface is None or iface.subnet is None or iface.ipv4 is None:
                    continue
                found.append(
                    FabricPort(
                        index,
                        iface.name,
                        iface.ipv4,
                        iface.subnet,
                        iface.mtu,
                        f"port{number}",
                        iface.addresses,
                        (port.device,),
                    )
                )
        return found
    for iface in node.interfaces:
        if not iface.up or iface.bridge or iface.name == node.default_route:
            continue
        if iface.ipv4 is None or iface.subnet is None:
            continue
        found.append(
            FabricPort(index, iface.name, iface.ipv4, iface.subnet, iface.mtu, iface.name, iface.addresses)
        )
    return found


def _links(ports: Sequence[FabricPort]) -> list[Link]:
    """Subnets shared by two or more nodes, each node's address on it its own (one address on every node is a
    node-local segment such as docker0, not a cable)."""
    by_subnet: dict[ipaddress.IPv4Network, list[FabricPort]] = {}
    for port in ports:
        by_subnet.setdefault(port.subnet, []).append(port)
    links = []
    for subnet, members in sorted(
        by_subnet.items(), key=lambda kv: (int(kv[0].network_address), kv[0].prefixlen)
    ):
        nodes = {p.node for p in members}
        if len(nodes) < 2 or len({p.address for p in members}) < len(nodes):
            continue
        links.append(Link(subnet, tuple(sorted(members, key=lambda p: (p.node, p.interface.casefold())))))
    return links


def read_topology(nodes: Sequence[NodeFabric], declared: str | None = None) -> Topology:
    """The layout the nodes' fabric facts show, checked against `declared` (a layout name) when given; the
    problems name each miswiring (a missing link, two cables on one subnet, a second IPv4 address on a fabric
    interface, an MTU mismatch on a link) with its fix."""
    labels = tuple(n.label for n in nodes)
    topo = Topology(labels)
    wanted = layout(declared) if declared else None
    if wanted and not wanted.fits(len(nodes)):
        raise RunError(
            f"--layout {wanted.name} is cabled for {wanted.nodes[0]}-{wanted.nodes[1]} nodes, but {len(nodes)} were "
            f"given; fix: pass that many nodes, or name the layout they are cabled as"
        )
    if len(nodes) < 2:
        return topo
    for i, node in enumerate(nodes):
        topo.ports[i] = fabric_ports(i, node)
    every = [p for found in topo.ports.values() for p in found]
    topo.links = _links(every)
    _second_addresses(topo)
    _one_subnet_two_cables(topo)
    _mtu(topo)
    _classify(topo, wanted)
    return topo


def _second_addresses(topo: Topology) -> None:
    for port in (p for found in topo.ports.values() for p in found):
        extra = [a for a in port.addresses if a != port.address]
        if extra:
            topo.problems.append(
                f"{topo.labels[port.node]}: fabric interface {port.interface} holds {len(port.addresses)} IPv4 "
                f"addresses ({', '.join(port.addresses)}): each adds a RoCE v2 IPv4 GID, and NCCL may pick the one "
                "no peer routes to (the switchless NCCL guide: one IPv4 per fabric interface before the GID is "
                f"read); fix: 'ip addr del {extra[0]}/{port.subnet.prefixlen} dev {port.interface}' and keep one "
                "address per fabric interface in the netplan file"
            )


def _one_subnet_two_cables(topo: Topology) -> None:
    """Two cables (physical ports) of one node on one subnet: with one peer it is a warning (the fabric choice
    names the ARP flux); with several, the kernel routes the whole subnet through one cable."""
    for link in topo.links:
        cables: dict[int, set[str]] = {}
        for port in link.ports:
            cables.setdefault(port.node, set()).add(port.cable)
        for node, found in cables.items():
            if len(found) < 2:
                continue
            names = sorted(p.interface for p in link.ports if p.node == node)
            text = f"{topo.labels[node]}: {' and '.join(names)} (two cables) are on one subnet {link.subnet}"
            if len(link.nodes) == 2:
                topo.warnings.append(
                    f"{text}, both to one peer: the kernel may route both through one of them"
                )
                continue
            topo.problems.append(
                f"{text}, which {len(link.nodes)} nodes share: the kernel routes the subnet through one of them, so "
                "traffic for the neighbour behind the other leaves on the wrong cable (two links on one subnet); "
                "fix: give each cable its own subnet (e.g. 192.168.201.0/24 for spark1-spark2, 192.168.202.0/24 "
                "for spark2-spark3)"
            )


def _mtu(topo: Topology) -> None:
    for link in topo.links:
        mtus = {p.mtu for p in link.ports}
        if len(mtus) > 1:
            listing = ", ".join(f"{topo.labels[p.node]} {p.interface} {p.mtu}" for p in link.ports)
            topo.problems.append(
                f"MTU mismatch on {link.subnet} ({listing}): frames larger than the smaller MTU are dropped "
                "(IBV_WC_RETRY_EXC_ERR, a hang); fix: one MTU on both ends (mtu: 9000 in each node's netplan file; "
                "a CX-7 firmware reboot resets it to 1500)"
            )
    seen = {p.mtu for link in topo.links for p in link.ports}
    if len(seen) > 1 and not any("MTU mismatch" in p for p in topo.problems):
        topo.warnings.append(
            f"the links run different MTUs ({', '.join(str(m) for m in sorted(m or 0 for m in seen))}): a ring or "
            "pipeline runs at its slowest link; fix: one MTU on every fabric interface"
        )


def _edges(topo: Topology) -> set[frozenset[int]]:
    return {link.nodes for link in topo.links if len(link.nodes) == 2}


def _ring_order(count: int, edges: set[frozenset[int]]) -> tuple[int, ...] | None:
    """The nodes in ring order from node 0 when the cables form one cycle through all of them, else None."""
    degree = {i: sum(1 for e in edges if i in e) for i in range(count)}
    if any(d != 2 for d in degree.values()):
        return None
    order, previous = [0], None
    while len(order) < count:
        here = order[-1]
        step = next((n for e in edges if here in e for n in e if n != here and n != previous), None)
        if step is None or step in order:
            return None
        previous = here
        order.append(step)
    return tuple(order) if frozenset((order[-1], 0)) in edges else None


def _classify(topo: Topology, wanted: Layout | None) -> None:
    count = len(topo.labels)
    shared = [link for link in topo.links if len(link.nodes) == count and count > 2]
    edges = _edges(topo)
    found: str | None = None
    if shared:
        found = "switch"
        topo.order = tuple(range(count))
    elif count == 2 and edges:
        found = "pair"
        topo.order = (0, 1)
    elif count == 3 and len(edges) == 3:
        found = "mesh3"
        topo.order = (0, 1, 2)
    elif count >= 4:
        order = _ring_order(count, edges)
        if order is not None and count <= 8:
            found, topo.order = "ring", order
    expected = wanted or layout(found) if found else wanted
    if expected is None:  # nothing fits: the nearest layout names what is missing
        expected = layout(
            "pair" if count == 2 else "mesh3" if count == 3 else "ring" if count <= 8 else "switch"
        )
    if wanted and found and found != wanted.name and not (found == "pair" and wanted.name == "switch"):
        topo.problems.append(
            f"--layout {wanted.name}, but the fabric is cabled as {found} ({topo.reason()}); fix: name --layout "
            f"{found}, or cable the nodes as {wanted.name}"
        )
        return
    if found and (wanted is None or found == wanted.name or found == "pair"):
        topo.layout = found
        _extra_links(topo, edges)
        return
    _missing(topo, expected, edges)


def _extra_links(topo: Topology, edges: set[frozenset[int]]) -> None:
    if topo.layout != "ring":
        return
    ring = {frozenset((topo.order[i], topo.order[(i + 1) % len(topo.order)])) for i in range(len(topo.order))}
    for extra in sorted(edges - ring, key=sorted):
        a, b = sorted(extra)
        topo.warnings.append(f"a cable between {topo.labels[a]} and {topo.labels[b]} is not part of the ring")


def _missing(topo: Topology, expected: Layout, edges: set[frozenset[int]]) -> None:
    """Name what the expected layout lacks: the node off the switch's subnet, or the pairs with no cable."""
    count = len(topo.labels)
    linked = ", ".join(_describe(link, topo.labels) for link in topo.links) or "none"
    if not expected.switchless:
        biggest = max((link for link in topo.links), key=lambda link: len(link.nodes), default=None)
        off = [topo.labels[i] for i in range(count) if biggest is None or i not in biggest.nodes]
        where = f" {biggest.subnet}" if biggest else ""
        topo.problems.append(
            f"missing link: {', '.join(off)} not on the switch's subnet{where} (links found: {linked}); fix: cable "
            "each node to the switch and address its fabric interface on that subnet"
        )
        return
    if count >= 4:
        degree = {i: sum(1 for e in edges if i in e) for i in range(count)}
        loose = [i for i, d in degree.items() if d < 2]
        if len(loose) == 2 and len(edges) == count - 1:
            a, b = loose
            topo.problems.append(
                f"missing link between {topo.labels[a]} and {topo.labels[b]}: the cables form a chain, not a ring "
                f"(links found: {linked}); fix: cable {topo.labels[a]} to {topo.labels[b]} and give that cable "
                "its own subnet"
            )
            return
        short = ", ".join(f"{topo.labels[i]} ({degree[i]})" for i in loose) or "none"
        topo.problems.append(
            f"no ring: every node needs a cable to each of its two neighbours; nodes with fewer: {short} (links "
            f"found: {linked}); fix: cable each node to two neighbours, each cable its own subnet"
        )
        return
    wanted = expected.cables(count) or ()
    absent = [sorted(pair) for pair in wanted if pair not in edges]
    for a, b in absent:
        topo.problems.append(
            f"missing link between {topo.labels[a]} and {topo.labels[b]} ({expected.name} cables every pair; links "
            f"found: {linked}); fix: cable {topo.labels[a]} to {topo.labels[b]} and address both ends on a "
            "subnet of their own"
        )


def route_hints(topo: Topology, advertised: Sequence[str]) -> list[str]:
    """The routes that make each node's advertised address (VLLM_HOST_IP: vLLM's rendezvous and message queue dial
    it) reachable from every peer on a layout without one shared subnet: over the direct cable (mesh3, ring
    neighbours: the peer answers for any of its addresses), or via the neighbour nearer on the ring (which
    forwards: net.ipv4.ip_forward=1 there)."""
    hints: list[str] = []
    count = len(topo.labels)
    for i in range(count):
        mine = topo.ports.get(i, [])
        for j in range(count):
            if i == j or not advertised[j]:
                continue
            target = ipaddress.IPv4Address(advertised[j])
            if any(target in p.subnet for p in mine):
                continue
            subnet = _subnet_of(topo, i, j)
            direct = next((p for p in mine if p.subnet == subnet), None) if subnet else None
            if direct is not None:
                hints.append(f"{topo.labels[i]}: ip route add {target}/32 dev {direct.interface}")
                continue
            hop = _next_hop(topo, i, j)
            if hop is None:
                continue
            via = topo.address_towards(hop, i)
            hints.append(
                f"{topo.labels[i]}: ip route add {target}/32 via {via} (with net.ipv4.ip_forward=1 on "
                f"{topo.labels[hop]})"
            )
    return hints


def _subnet_of(topo: Topology, a: int, b: int) -> ipaddress.IPv4Network | None:
    return next((link.subnet for link in topo.links if {a, b} <= link.nodes), None)


def _next_hop(topo: Topology, here: int, there: int) -> int | None:
    """The ring neighbour of `here` on the shorter way to `there` (None off a ring)."""
    order = list(topo.order)
    if topo.layout != "ring" or here not in order or there not in order:
        return None
    n, a, b = len(order), order.index(here), order.index(there)
    forward = (b - a) % n
    return order[(a + 1) % n] if forward <= n - forward else order[(a - 1) % n]


def nccl_environment(topo: Topology) -> dict[str, str]:
    """NCCL's settings that follow from the layout (not typed by hand): on a switchless layout with several
    cables per node, subnet-aware routing (NCCL >= 2.30) and one device per cable; on a ring, ring-only
    connections (the switchless NCCL's NCCL_SKIP_TREE_CONNECT, with NCCL_ALGO=Ring)."""
    if topo.layout in (None, "pair", "switch"):
        return {}
    env = {"NCCL_IB_SUBNET_AWARE_ROUTING": "1", "NCCL_IB_MERGE_NICS": "0"}
    if topo.layout == "ring":
        env.update({"NCCL_ALGO": "Ring", "NCCL_SKIP_TREE_CONNECT": "1"})
    return env


def node_environment(topo: Topology, node: int) -> dict[str, str]:
    """One node's additions for a layout with two cables per node: every fabric interface in NCCL_SOCKET_IFNAME
    and every RDMA device in NCCL_IB_HCA (the pair and the switch keep the fabric choice's one port)."""
    if topo.layout in (None, "pair", "switch"):
        return {}
    ports = topo.ports.get(node, [])
    names = ",".join(dict.fromkeys(p.interface for p in ports))
    # NCCL takes a list (one NIC per cable); Gloo stays on the interface holding VLLM_HOST_IP (the routes reach
    # every peer from there; a Gloo device per interface would pair addresses no cable joins)
    env = {**nccl_environment(topo), "NCCL_SOCKET_IFNAME": names}
    devices = [d for p in ports for d in p.devices]
    if devices:
        env["NCCL_IB_HCA"] = "=" + ",".join(dict.fromkeys(devices))
    return env
