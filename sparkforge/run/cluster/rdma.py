"""RDMA facts parsed from the in-image helper's raw sysfs reading: ports, GIDs, interfaces, and the twins.

On a DGX Spark the CX-7 runs in Socket Direct mode: each physical QSFP port is served by two PCIe functions in
different PCIe domains ("twins", e.g. rocep1s0f1 -> enp1s0f1np1 and roceP2p1s0f1 -> enP2p1s0f1np1, as published
`ibdev2netdev` listings show); one x4 path carries ~100 Gb/s, so full bandwidth needs both.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str
    version: str  # "RoCE v2", "IB/RoCE v1"
    ndev: str | None
    ipv4: str | None  # the IPv4 address of a ::ffff:a.b.c.d GID


@dataclass(frozen=True)
class Port:
    """One RDMA device's port and the net device it carries."""

    device: str
    port: str
    state: str
    link_layer: str
    netdev: str | None
    pci: str | None
    sys_image_guid: str | None
    phys_port_name: str | None
    mtu: int | None
    gids: tuple[Gid, ...]
    rate_gbps: float | None = None  # sysfs `rate`, e.g. "200 Gb/sec (4X HDR)"

    @property
    def active(self) -> bool:
        return self.state.endswith("ACTIVE")

    @property
    def domain(self) -> str:
        return (self.pci or "").split(":")[0] or "?"

    def ipv4_gid(self) -> Gid | None:
        """The RoCE v2 GID carrying this port's net device's IPv4 address."""
        return next(
            (g for g in self.gids if g.ipv4 and g.version == "RoCE v2" and g.ndev in (None, self.netdev)),
            None,
        )


@dataclass(frozen=True)
class Interface:
    name: str
    up: bool
    ipv4: str | None
    subnet: ipaddress.IPv4Network | None
    mtu: int | None
    addresses: tuple[str, ...] = ()  # every IPv4 it holds (a second one moves the RoCE v2 GID)
    bridge: bool = False  # a bridge (docker0, br-*): the node's own segment, never a cable to a peer


@dataclass(frozen=True)
class NodeFabric:
    """A node's facts, parsed: RDMA ports, interfaces (addresses from the GID table when read from a tree)."""

    label: str
    ports: tuple[Port, ...]
    interfaces: tuple[Interface, ...]
    default_route: str | None
    tree: bool = False

    def interface(self, name: str | None) -> Interface | None:
        return next((i for i in self.interfaces if i.name == name), None)

    def port_of(self, netdev: str) -> Port | None:
        return next((p for p in self.ports if p.netdev == netdev), None)


def _gid(raw: Mapping[str, Any]) -> Gid:
    text = str(raw.get("gid") or "")
    try:
        mapped = ipaddress.IPv6Address(text).ipv4_mapped
    except ValueError:
        mapped = None
    return Gid(
        int(raw["index"]), text, str(raw.get("type") or ""), raw.get("ndev"), str(mapped) if mapped else None
    )


def _rate(text: object) -> float | None:
    match = re.match(r"\s*([0-9.]+)\s*Gb/sec", str(text or ""))
    return float(match.group(1)) if match else None


def _subnets(routes: Sequence[Mapping[str, Any]]) -> dict[str, list[ipaddress.IPv4Network]]:
    found: dict[str, list[ipaddress.IPv4Network]] = {}
    for route in routes:
        if route.get("gateway") not in (None, "0.0.0.0") or route.get("mask") == "0.0.0.0":
            continue
        try:
            net = ipaddress.IPv4Network(f"{route['destination']}/{route['mask']}", strict=False)
        except ValueError:
            continue
        found.setdefault(str(route["iface"]), []).append(net)
    return found


def parse_node(label: str, raw: Mapping[str, Any]) -> NodeFabric:
    """The helper's raw facts -> a NodeFabric. From a tree (root is not /sys) every address comes from the GIDs."""
    tree = str(raw.get("root", "/sys")) != "/sys"
    net: Mapping[str, Mapping[str, Any]] = raw.get("net", {})
    ports: list[Port] = []
    for device, info in sorted(raw.get("rdma", {}).items()):
        netdevs = list(info.get("netdevs") or [])
        for number, port in sorted(info.get("ports", {}).items()):
            gids = tuple(_gid(g) for g in port.get("gids", []))
            netdev = netdevs[0] if netdevs else next((g.ndev for g in gids if g.ndev), None)
            facts = net.get(netdev or "", {})
            ports.append(
                Port(
                    device=device,
                    port=str(number),
                    state=str(port.get("state") or "?").split(":")[-1].strip(),
                    link_layer=str(port.get("link_layer") or "?"),
                    netdev=netdev,
                    pci=info.get("pci"),
                    sys_image_guid=info.get("sys_image_guid"),
                    phys_port_name=facts.get("phys_port_name"),
                    mtu=facts.get("mtu"),
                    gids=gids,
                    rate_gbps=_rate(port.get("rate")),
                )
            )
    subnets = _subnets(raw.get("routes", []))
    local = [str(a) for a in raw.get("local_ipv4") or [] if _ipv4(a)]
    interfaces = []
    for name, facts in sorted(net.items()):
        if name == "lo":
            continue
        port = next((p for p in ports if p.netdev == name), None)
        gid = port.ipv4_gid() if port else None
        address = (None if tree else facts.get("ipv4")) or (gid.ipv4 if gid else None)
        subnet = next(
            (s for s in subnets.get(name, []) if address and ipaddress.IPv4Address(address) in s), None
        )
        state = str(facts.get("operstate") or "")
        up = state == "up" or (state in ("unknown", "") and bool(port and port.active))
        held = _held(name, address, port, subnets, local, tree)
        interfaces.append(
            Interface(name, up, address, subnet, facts.get("mtu"), held, facts.get("bridge") is True)
        )
    default = next(
        (str(r["iface"]) for r in raw.get("routes", []) if r.get("destination") == "0.0.0.0"), None
    )
    return NodeFabric(label, tuple(ports), tuple(interfaces), default, tree)


def _ipv4(text: object) -> bool:
    try:
        ipaddress.IPv4Address(str(text))
    except ValueError:
        return False
    return True


def _held(
    name: str,
    address: str | None,
    port: Port | None,
    subnets: Mapping[str, Sequence[ipaddress.IPv4Network]],
    local: Sequence[str],
    tree: bool,
) -> tuple[str, ...]:
    """Every IPv4 address on interface `name`: from a tree, its RoCE v2 IPv4 GIDs; live, the node's local
    addresses inside a subnet routed only through this interface (besides its own primary address)."""
    if tree or not local:
        gids = [g.ipv4 for g in (port.gids if port else ()) if g.ipv4 and g.version == "RoCE v2"]
        found = dict.fromkeys([*([address] if address else []), *(g for g in gids if g)])
        return tuple(found)
    mine = subnets.get(name, [])
    others = [s for other, nets in subnets.items() if other != name for s in nets]
    held = [
        a
        for a in local
        if a == address
        or (
            any(ipaddress.IPv4Address(a) in s for s in mine)
            and not any(ipaddress.IPv4Address(a) in s for s in others)
        )
    ]
    return tuple(dict.fromkeys([*([address] if address else []), *held]))


# ---- twins --------------------------------------------------------------------------------------------


_DOMAIN = re.compile(r"P\d+(?=p\d)")  # roceP2p1s0f1 -> rocep1s0f1: the name without its PCIe domain


def twins(node: NodeFabric) -> tuple[list[list[Port]], str]:
    """Group the Ethernet ports by physical port; returns the groups and how they were tied.

    By sysfs facts first: the same system image GUID (one adapter) and the same physical port name (the net
    device's `phys_port_name`, the `npN` in its name), or else the same PCI function number, always in
    different PCIe domains; by name (the name without its `P<domain>` part) only when sysfs says nothing.
    """
    ports = [p for p in node.ports if p.link_layer == "Ethernet"]
    keys = (
        ("same system image GUID and physical port name", lambda p: (p.sys_image_guid, p.phys_port_name)),
        (
            "same system image GUID and PCI function",
            lambda p: (p.sys_image_guid, (p.pci or "").rpartition(".")[2]),
        ),
    )
    for how, key in keys:
        if any(None in key(p) or "" in key(p) for p in ports):
            continue
        groups: dict[Any, list[Port]] = {}
        for port in ports:
            groups.setdefault(key(port), []).append(port)
        pairs = [g for g in groups.values() if len(g) > 1]
        if pairs and all(len({p.domain for p in g}) == len(g) for g in pairs):
            return [sorted(g, key=lambda p: p.domain) for g in groups.values()], f"sysfs: {how}"
    groups = {}
    for port in ports:
        groups.setdefault(_DOMAIN.sub("", port.device), []).append(port)
    return [sorted(g, key=lambda p: p.domain) for g in groups.values()], "by name only (sysfs ties none)"


def describe_ports(node: NodeFabric) -> list[dict[str, Any]]:
    """Per RDMA port: what `ibdev2netdev` shows, plus the link layer, MTU, PCI slot and the IPv4 GID index."""
    out = []
    for port in node.ports:
        gid = port.ipv4_gid()
        out.append(
            {
                "device": port.device,
                "port": port.port,
                "state": port.state,
                "link_layer": port.link_layer,
                "netdev": port.netdev,
                "mtu": port.mtu,
                "pci": port.pci,
                "ipv4_gid_index": gid.index if gid else None,
                "ipv4": gid.ipv4 if gid else None,
            }
        )
    return out
