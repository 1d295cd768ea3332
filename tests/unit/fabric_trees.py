"""Fake node trees for the fabric tests: `sys/` laid out as Linux's sysfs (class/infiniband, class/net) and
`proc/net/route` beside it, shaped after a DGX Spark's CX-7 in Socket Direct mode (published ibdev2netdev
listings: rocep1s0f1 -> enp1s0f1np1 and roceP2p1s0f1 -> enP2p1s0f1np1 serve one physical port)."""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path

GUID = "4cbb:4703:00a1:b2c0"  # one adapter: every function reports the same system image GUID
SPARK_FUNCTIONS = {  # device -> (PCI slot, net device, physical port name)
    "rocep1s0f0": ("0000:01:00.0", "enp1s0f0np0", "p0"),
    "rocep1s0f1": ("0000:01:00.1", "enp1s0f1np1", "p1"),
    "roceP2p1s0f0": ("0002:01:00.0", "enP2p1s0f0np0", "p0"),
    "roceP2p1s0f1": ("0002:01:00.1", "enP2p1s0f1np1", "p1"),
}


@dataclass
class Function:
    """One RDMA device: its port state and the IPv4 its net device holds (None: no address)."""

    device: str
    active: bool = False
    ipv4: str | None = None
    prefix: int = 24
    ipv6_first: bool = (
        True  # global IPv6 GIDs sit before the IPv4 ones (the IPv4 RoCE v2 GID lands at 5, not 3)
    )
    phys_port_name: bool = True


@dataclass
class NodeTree:
    functions: list[Function] = field(default_factory=list)
    lan: tuple[str, str, str] | None = ("wlP9s9", "192.168.1.23", "192.168.1.1")  # name, address, gateway
    mtu: int = 9000
    guid: str | None = GUID


def _hex(address: str) -> str:
    return "{:08X}".format(struct.unpack("<I", socket.inet_aton(address))[0])


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _mapped(ipv4: str) -> str:
    return ":".join(f"{x:04x}" for x in struct.unpack(">8H", ipaddress.IPv6Address(f"::ffff:{ipv4}").packed))


def build(root: Path, tree: NodeTree) -> Path:
    """Write the tree under root (root/sys, root/proc); returns root/sys (what SPARKFORGE_SYSFS names)."""
    sys_ = root / "sys"
    routes = ["Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT"]
    for fn in tree.functions:
        slot, netdev, port_name = SPARK_FUNCTIONS[fn.device]
        dev = sys_ / "class" / "infiniband" / fn.device
        _write(dev / "device" / "uevent", f"DRIVER=mlx5_core\nPCI_SLOT_NAME={slot}")
        (dev / "device" / "net" / netdev).mkdir(parents=True, exist_ok=True)
        if tree.guid:
            _write(dev / "sys_image_guid", tree.guid)
        _write(dev / "node_guid", f"4cbb:4703:00a1:b2{slot[-1]}{slot[3]}")
        port = dev / "ports" / "1"
        _write(port / "state", "4: ACTIVE" if fn.active else "1: DOWN")
        _write(port / "phys_state", "5: LinkUp" if fn.active else "3: Disabled")
        _write(port / "link_layer", "Ethernet")
        _write(port / "rate", "200 Gb/sec (4X HDR)")
        mac_gid = f"fe80:0000:0000:0000:4ebb:47ff:fe03:a1{slot[-1]}{slot[3]}"
        gids = [(mac_gid, "IB/RoCE v1"), (mac_gid, "RoCE v2")]
        if fn.ipv6_first:
            global6 = f"2001:0db8:0000:0064:4ebb:47ff:fe03:a1{slot[-1]}{slot[3]}"
            gids += [(global6, "IB/RoCE v1"), (global6, "RoCE v2")]
        if fn.ipv4:
            gids += [(_mapped(fn.ipv4), "IB/RoCE v1"), (_mapped(fn.ipv4), "RoCE v2")]
        for index in range(8):  # real tables are longer; the unused entries read as zeros
            gid, kind = gids[index] if index < len(gids) else ("0000:" * 7 + "0000", None)
            _write(port / "gids" / str(index), gid)
            if kind:
                _write(port / "gid_attrs" / "types" / str(index), kind)
                _write(port / "gid_attrs" / "ndevs" / str(index), netdev)
        net = sys_ / "class" / "net" / netdev
        _write(net / "operstate", "up" if fn.active else "down")
        _write(net / "mtu", str(tree.mtu))
        if fn.phys_port_name:
            _write(net / "phys_port_name", port_name)
        if fn.ipv4:
            subnet = ipaddress.IPv4Network(f"{fn.ipv4}/{fn.prefix}", strict=False)
            routes.append(
                f"{netdev}\t{_hex(str(subnet.network_address))}\t00000000\t0001\t0\t0\t0\t{_hex(str(subnet.netmask))}\t0\t0\t0"
            )
    _write(sys_ / "class" / "net" / "lo" / "operstate", "unknown")
    _write(sys_ / "class" / "net" / "lo" / "mtu", "65536")
    if tree.lan:
        name, address, gateway = tree.lan
        _write(sys_ / "class" / "net" / name / "operstate", "up")
        _write(sys_ / "class" / "net" / name / "mtu", "1500")
        routes.insert(1, f"{name}\t00000000\t{_hex(gateway)}\t0003\t0\t0\t600\t00000000\t0\t0\t0")
        subnet = ipaddress.IPv4Network(f"{address}/24", strict=False)
        routes.append(
            f"{name}\t{_hex(str(subnet.network_address))}\t00000000\t0001\t0\t0\t600\t00FFFFFF\t0\t0\t0"
        )
    _write(root / "proc" / "net" / "route", "\n".join(routes))
    return sys_


LAYOUTS = ("one-subnet", "separate", "link-local")


def spark(
    cabled: tuple[str, ...] = ("p1",),
    *,
    twin_down: bool = False,
    host: int = 10,
    layout: str = "one-subnet",
    **tree: object,
) -> NodeTree:
    """A Spark: four functions, the cabled physical ports' twins up and addressed. Layouts the field uses:
    one-subnet: both twins on the port's /24 (192.168.100.x for p1, 192.168.200.x for p0; twin A .host, B .host+1);
    separate: each twin its own /24 (the community guide: 192.168.177.x on twin A, 192.168.178.x on twin B;
    p0: 192.168.187/188); link-local: 169.254.x.y/16 on every CX-7 interface (NVIDIA's playbook)."""
    if layout not in LAYOUTS:
        raise ValueError(layout)
    subnets = {"p0": "192.168.200", "p1": "192.168.100"}
    separate = {("p1", False): "192.168.177", ("p1", True): "192.168.178"}
    separate |= {("p0", False): "192.168.187", ("p0", True): "192.168.188"}
    functions = []
    for device, (_, _, port) in SPARK_FUNCTIONS.items():
        up = port in cabled and not (twin_down and device.startswith("roceP2"))
        b = device.startswith("roceP2")
        if not up:
            functions.append(Function(device, False, None))
        elif layout == "separate":
            functions.append(Function(device, True, f"{separate[(port, b)]}.{host}"))
        elif layout == "link-local":
            third = 100 + (port == "p0") * 100 + b
            functions.append(Function(device, True, f"169.254.{third}.{host}", prefix=16))
        else:
            functions.append(Function(device, True, f"{subnets[port]}.{host + b}"))
    return NodeTree(functions=functions, **tree)  # type: ignore[arg-type]
