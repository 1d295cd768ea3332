#!/usr/bin/env python3
"""What the cluster doctor reads on a node, standard library only: interfaces and their IPv4 addresses, RDMA devices
and their GID tables from sysfs, the routing table, host drivers and logind's RemoveIPC, paths on the node, the
image's package versions. The doctor's helper (cluster_sanity.py) imports it; sparkforge/run/cluster/inventory.py reads
this machine (or a fake tree) with the same functions, so one reader serves both.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import re
import socket
import stat
import struct
import sys


def _ipv4_of(name: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def _default_route_interface() -> str | None:
    try:
        with open("/proc/net/route") as handle:
            lines = handle.read().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            return fields[0]
    return None


def interfaces() -> list[dict[str, object]]:
    out = []
    default = _default_route_interface()
    for name in sorted(os.listdir("/sys/class/net")):
        try:
            with open(f"/sys/class/net/{name}/mtu") as handle:
                mtu = int(handle.read())
            with open(f"/sys/class/net/{name}/operstate") as handle:
                state = handle.read().strip()
        except OSError:
            continue
        out.append(
            {
                "name": name,
                "ipv4": _ipv4_of(name),
                "mtu": mtu,
                "state": state,
                "default_route": name == default,
            }
        )
    return out


SYSFS_MAX = 65536  # a sysfs attribute is at most a page; more is no attribute
MAX_ENTRIES = 1024  # devices, ports, net devices or GIDs in one folder (a GID table holds at most 256)
_GID, _HEX32 = re.compile(r"[0-9a-f]{4}(?::[0-9a-f]{4}){7}"), re.compile(r"[0-9A-Fa-f]{8}")
_TREE: list[str] = []  # the tree being read (realpath): an attribute linked out of it reads as absent


def _small_int(text: str | None, digits: int = 7) -> int | None:
    """A sysfs number: ASCII digits only ('²'.isdigit() is True), at most `digits` of them."""
    good = text and len(text) <= digits and text.isascii() and text.isdigit()
    return int(text) if good else None  # type: ignore[arg-type]


def _read(path: str) -> str | None:
    """One attribute: regular (O_NONBLOCK: a FIFO never hangs), bounded, inside the tree being read."""
    if _TREE and not any(f"{os.path.realpath(path)}/".startswith(f"{top}/") for top in _TREE):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # a FIFO, device (/dev/zero) or folder planted in the tree
        return os.read(fd, SYSFS_MAX).decode("utf-8", "replace").strip()
    except (OSError, ValueError):  # sysfs answers EINVAL/EOPNOTSUPP for attributes a driver lacks
        return None
    finally:
        os.close(fd)


def _names(path: str) -> list[str]:
    """At most MAX_ENTRIES + 1 names (the caller flags more); a link loop or a missing folder is empty."""
    try:
        with os.scandir(path) as entries:
            names = [e.name for e in itertools.islice(entries, MAX_ENTRIES + 1)]
    except (OSError, ValueError):
        return []
    return sorted(names)


def routes(path: str) -> list[dict[str, object]]:
    """/proc/net/route (little-endian hex) as dotted addresses: each interface's subnets and the default route."""
    out: list[dict[str, object]] = []
    for line in (_read(path) or "").splitlines()[1:MAX_ENTRIES]:
        fields = line.split()
        if len(fields) < 8 or not all(_HEX32.fullmatch(fields[i]) for i in (1, 2, 7)):
            continue  # not a route line the kernel writes: 8 hex digits per address

        def dotted(word: str) -> str:
            return socket.inet_ntoa(struct.pack("<I", int(word, 16)))

        out.append(
            {
                "iface": fields[0],
                "destination": dotted(fields[1]),
                "gateway": dotted(fields[2]),
                "mask": dotted(fields[7]),
            }
        )
    return out


_DOTTED = re.compile(r"\|-- (\d{1,3}(?:\.\d{1,3}){3})$")


def local_ipv4(path: str) -> list[str]:
    """Every IPv4 address this node holds (/proc/net/fib_trie's `/32 host LOCAL` leaves), secondary ones too:
    the ioctl answers one address per interface, and a second one on a fabric interface moves the RoCE GID."""
    found: list[str] = []
    last = None
    for line in (_read(path) or "").splitlines()[: MAX_ENTRIES * 8]:
        text = line.strip()
        match = _DOTTED.search(text)
        if match:
            last = match.group(1)
        elif last and text.startswith("/32 host LOCAL") and last not in found and not last.startswith("127."):
            found.append(last)
    return found[:MAX_ENTRIES]


def fabric(root: str = "/sys", proc: str = "/proc", addresses: bool = True) -> dict[str, object]:
    """Raw RDMA and network facts from a sysfs tree (sparkforge/run/cluster/fabric.py decides from them).

    RDMA devices with their PCI slot, GUIDs, net devices and per port state, link layer and non-zero GIDs (type and
    net device); net devices with state, MTU, physical port facts and, when `addresses`, their IPv4 (an ioctl:
    only for the live system); the routing table. /dev/infiniband is what a container needs for the devices.
    """
    _TREE[:] = [os.path.realpath(root), os.path.realpath(proc)]
    try:
        return _fabric(root, proc, addresses)
    finally:
        _TREE.clear()


def _fabric(root: str, proc: str, addresses: bool) -> dict[str, object]:
    rdma: dict[str, object] = {}
    refused: list[str] = []  # what a planted tree held that no kernel writes (named by the decision side)
    base = f"{root}/class/infiniband"
    devices = _names(base)
    refused += [f"{base}: more than {MAX_ENTRIES} RDMA devices"] if len(devices) > MAX_ENTRIES else []
    for device in devices[:MAX_ENTRIES]:
        uevent = _read(f"{base}/{device}/device/uevent") or ""
        slot = next(
            (v for k, _, v in (x.partition("=") for x in uevent.splitlines()) if k == "PCI_SLOT_NAME"), None
        )
        ports: dict[str, object] = {}
        for port in _names(f"{base}/{device}/ports"):
            where = f"{base}/{device}/ports/{port}"
            gids = []
            names = _names(f"{where}/gids")
            if len(names) > MAX_ENTRIES:
                refused.append(f"{device} port {port}: more than {MAX_ENTRIES} GIDs")
                names = []
            for index in sorted((n for n in names if _small_int(n, 4) is not None), key=int):
                gid = _read(f"{where}/gids/{index}")
                if not gid or not gid.replace(":", "").strip("0"):
                    continue
                if not _GID.fullmatch(gid):
                    refused.append(f"{device} port {port} GID {index}: {gid[:60]!r} is not a GID")
                    continue
                gids.append(
                    {
                        "index": int(index),
                        "gid": gid,
                        "type": _read(f"{where}/gid_attrs/types/{index}"),
                        "ndev": _read(f"{where}/gid_attrs/ndevs/{index}"),
                    }
                )
            ports[port] = {
                "state": _read(f"{where}/state"),
                "phys_state": _read(f"{where}/phys_state"),
                "link_layer": _read(f"{where}/link_layer"),
                "rate": _read(f"{where}/rate"),
                "gids": gids,
            }
        rdma[device] = {
            "pci": slot,
            "node_guid": _read(f"{base}/{device}/node_guid"),
            "sys_image_guid": _read(f"{base}/{device}/sys_image_guid"),
            "netdevs": _names(f"{base}/{device}/device/net"),
            "ports": ports,
        }
    net: dict[str, object] = {}
    netdevs = _names(f"{root}/class/net")
    refused += (
        [f"{root}/class/net: more than {MAX_ENTRIES} net devices"] if len(netdevs) > MAX_ENTRIES else []
    )
    for name in netdevs[:MAX_ENTRIES]:
        where = f"{root}/class/net/{name}"
        mtu = _read(f"{where}/mtu")
        net[name] = {
            "operstate": _read(f"{where}/operstate"),
            "mtu": _small_int(mtu),
            "phys_port_name": _read(f"{where}/phys_port_name"),
            "phys_port_id": _read(f"{where}/phys_port_id"),
            "phys_switch_id": _read(f"{where}/phys_switch_id"),
            "bridge": os.path.isdir(f"{where}/bridge"),  # a bridge is this node's own segment, not a cable
            "ipv4": _ipv4_of(name) if addresses else None,
        }
    found: dict[str, object] = {"root": root, "rdma": rdma, "net": net, "routes": routes(f"{proc}/net/route"),
                                "local_ipv4": local_ipv4(f"{proc}/net/fib_trie"), "refused": refused}  # fmt: skip
    if addresses:  # the live system: can this image's NCCL use the devices at all?
        found["verbs"] = verbs()
    return found


def verbs() -> dict[str, object]:
    """Whether libibverbs.so.1 (the name NCCL dlopens) loads here and the mlx5 provider is registered."""
    import ctypes
    import glob
    import shutil

    try:
        ctypes.CDLL("libibverbs.so.1")
        loaded, error = True, None
    except OSError as exc:
        loaded, error = False, str(exc)
    return {
        "libibverbs": loaded,
        "error": error,
        "perftest": shutil.which("ib_write_bw") is not None,
        "mlx5": os.path.isfile("/etc/libibverbs.d/mlx5.driver")
        and bool(
            glob.glob("/usr/lib/*/libibverbs/libmlx5-rdmav*.so")
            + glob.glob("/usr/lib*/libibverbs/libmlx5-rdmav*.so")
        ),
    }


HOST_ROOT = (
    "/run/sparkforge-host"  # what the probe reads of the node, mounted read-only (run/jobs.py HOST_READS)
)
HOST_ETC = f"{HOST_ROOT}/etc"


def host_paths(specs: list[str], root: str = HOST_ROOT) -> list[dict[str, object]]:
    """KIND=PATH on the node (not where sparkforge runs): exists, file or directory, readable, a model's config."""
    out = []
    for spec in specs:
        kind, _, path = spec.partition("=")
        where = root + path if os.path.isdir(root) else None
        entry: dict[str, object] = {"kind": kind, "path": path, "mounted": where is not None}
        if where:
            entry.update(
                exists=os.path.exists(where),
                file=os.path.isfile(where),
                directory=os.path.isdir(where),
                readable=os.access(where, os.R_OK),
                config=os.path.isfile(os.path.join(where, "config.json")),
            )
        out.append(entry)
    return out


NCCL_DIRS = ("/usr/lib/aarch64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib",
             "/usr/local/cuda/lib64")  # fmt: skip


def host_nccl(root: str = HOST_ROOT) -> dict[str, object] | None:
    """The node's own NCCL (DGX OS ships one), read through the host mount: path on the node, version, sha256."""
    import hashlib
    import re

    if not os.path.isdir(root):
        return None
    for where in NCCL_DIRS:
        for name in _names(root + where):
            match = re.fullmatch(r"libnccl\.so\.(\d+)\.(\d+)\.(\d+)", name)
            full = f"{root}{where}/{name}"
            if match and os.path.isfile(full) and not os.path.islink(full):
                with open(full, "rb") as handle:
                    digest = hashlib.sha256(handle.read()).hexdigest()
                return {"path": f"{where}/{name}", "version": ".".join(match.groups()),
                        "soname": f"libnccl.so.{match.group(1)}", "sha256": digest}  # fmt: skip
    return None


def host_facts(etc: str = HOST_ETC) -> dict[str, object]:
    """Host driver versions (the kernel is shared with the container) and systemd-logind's RemoveIPC."""
    nvidia = (_read("/proc/driver/nvidia/version") or "").splitlines()
    remove_ipc, source = "yes", "systemd's default"
    if os.path.isdir(etc):
        confs = [f"{etc}/systemd/logind.conf"]
        confs += [
            f"{etc}/systemd/logind.conf.d/{n}"
            for n in _names(f"{etc}/systemd/logind.conf.d")
            if n.endswith(".conf")
        ]
        for conf in confs:
            for line in (_read(conf) or "").splitlines():
                key, _, value = line.strip().partition("=")
                if key.strip() == "RemoveIPC" and value.strip():
                    remove_ipc, source = value.strip().lower(), conf.replace(etc, "/etc", 1)
    else:
        source = "the node's /etc was not mounted"
    return {
        "kernel": os.uname().release,
        "nvidia": _read("/sys/module/nvidia/version") or (nvidia[0] if nvidia else None),
        "mlx5_core": _read("/sys/module/mlx5_core/version")
        or ("in-tree" if os.path.isdir("/sys/module/mlx5_core") else None),
        "remove_ipc": remove_ipc,
        "remove_ipc_source": source,
        "nccl": host_nccl(os.path.dirname(etc)),
        "memory": meminfo(),
    }


def meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """The node's memory in bytes (a container reads its host's /proc/meminfo): what the doctor's memory stage
    compares with the profile's memory plan."""
    keys = {"MemTotal": "total", "MemAvailable": "available", "SwapTotal": "swap_total", "SwapFree": "swap_free",
            "Cached": "page_cache"}  # fmt: skip
    out: dict[str, int] = {}
    for line in (_read(path) or "").splitlines():
        key, _, rest = line.partition(":")
        words = rest.split()
        if key in keys and words and words[0].isdigit():
            out[keys[key]] = int(words[0]) * 1024
    return out


def infiniband() -> dict[str, list[str]]:
    """RDMA devices (NCCL_IB_HCA names) and the network interfaces they carry."""
    found: dict[str, list[str]] = {}
    root = "/sys/class/infiniband"
    for hca in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        net = f"{root}/{hca}/device/net"
        found[hca] = sorted(os.listdir(net)) if os.path.isdir(net) else []
    return found


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, object]:
    """From package metadata and torch/version.py: importing torch here would cost seconds per node."""
    import importlib.util
    import re

    found: dict[str, object] = {"python": sys.version.split()[0], "torch": _dist_version("torch")}
    spec = importlib.util.find_spec("torch")
    if spec and spec.origin:
        try:
            with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as handle:
                match = re.search(r"^cuda(?:: \S+)? = '([^']*)'", handle.read(), re.M)
            found["cuda"] = match.group(1) if match else None
        except OSError:
            found["cuda"] = None
    nccl = [v for v in (_dist_version(f"nvidia-nccl-cu{m}") for m in (13, 12)) if v]
    found["nccl"] = nccl[0] if nccl else None
    found["vllm"] = _dist_version("vllm")
    found["ray"] = _dist_version("ray")
    found["gpu_devices"] = len([d for d in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", d)])
    return found


def gpu_clocks() -> list[dict[str, object]] | None:
    """Each visible GPU's current and maximum SM and memory clocks (MHz) as nvidia-smi reports them: published
    tok/s and bandwidth figures are only comparable with the clocks recorded. None without nvidia-smi."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    keys = ("index", "name", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem")
    query = [smi, f"--query-gpu={','.join(keys)}", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [
        dict(zip(keys, (v.strip() for v in line.split(",")), strict=False))
        for line in out.splitlines()
        if line
    ]


def vllm_get_ip() -> tuple[str, str]:
    """vLLM's own `vllm.utils.network_utils.get_ip()`, run from its source without importing vLLM (that import
    loads torch: ~15 s on a busy node, before any check could speak). Returns (address, how it was run)."""
    import ast
    import importlib.util
    import logging
    import types
    import warnings

    spec = importlib.util.find_spec("vllm")  # finds the package without executing it
    path = (
        os.path.join(os.path.dirname(spec.origin), "utils", "network_utils.py")
        if spec and spec.origin
        else ""
    )
    try:
        with open(path) as handle:
            tree = ast.parse(handle.read())
        func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_ip")
        env = types.SimpleNamespace(VLLM_HOST_IP=os.environ.get("VLLM_HOST_IP", ""))
        scope = {"os": os, "socket": socket, "warnings": warnings, "envs": env,
                 "logger": logging.getLogger("vllm"), "__builtins__": __builtins__}  # fmt: skip
        exec(compile(ast.Module(body=[func], type_ignores=[]), path, "exec"), scope)
        return str(scope["get_ip"]()), "vllm.utils.network_utils.get_ip (from its source)"
    except (OSError, SyntaxError, StopIteration, KeyError, NameError):
        from vllm.utils.network_utils import get_ip  # the image's vLLM moved it: import it (slow)

        return str(get_ip()), "vllm.utils.network_utils.get_ip (imported)"
