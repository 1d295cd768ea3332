#!/usr/bin/env python3
"""The cluster doctor's in-image helper: runs on each node, inside the image that will serve, with its torch/vLLM.

Modes (one JSON object per line on stdout, each with an "event" key, so the doctor can follow a rank's progress):
  probe [--listen PORT]  the address vLLM would advertise (its own get_ip()), interfaces, MTUs, versions;
                         then, with --listen, accept connections on every address at PORT until killed
  listen HOST:PORT...    accept TCP connections on each address until killed (peers prove they reach it)
  connect HOST:PORT...   try each address once with a short timeout
  sanity                 torch.distributed across nodes: rendezvous, Gloo all-reduce on CPU, NCCL all-reduce
                         where GPUs exist, then vLLM's shared-memory-broadcast MessageQueue with remote readers
Standard library + what the image ships. The doctor passes this file's text with `python3 -c`, so it also
runs on images built before it existed; it is the same script the GPU machine runs with torchrun-free ranks.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import json
import os
import socket
import struct
import sys
import time


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, "t": round(time.time(), 3), **fields}), flush=True)


# ---- probe ------------------------------------------------------------------------------------------


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


def _read(path: str) -> str | None:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except (OSError, ValueError):  # sysfs answers EINVAL/EOPNOTSUPP for attributes a driver lacks
        return None


def _names(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def routes(path: str) -> list[dict[str, object]]:
    """/proc/net/route (little-endian hex) as dotted addresses: each interface's subnets and the default route."""
    out: list[dict[str, object]] = []
    for line in (_read(path) or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue

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


def fabric(root: str = "/sys", proc: str = "/proc", addresses: bool = True) -> dict[str, object]:
    """Raw RDMA and network facts from a sysfs tree (sparkforge/run/fabric.py decides from them).

    RDMA devices with their PCI slot, GUIDs, net devices and per port state, link layer and non-zero GIDs (type and
    net device); net devices with state, MTU, physical port facts and, when `addresses`, their IPv4 (an ioctl:
    only for the live system); the routing table. /dev/infiniband is what a container needs for the devices.
    """
    rdma: dict[str, object] = {}
    base = f"{root}/class/infiniband"
    for device in _names(base):
        uevent = _read(f"{base}/{device}/device/uevent") or ""
        slot = next(
            (v for k, _, v in (x.partition("=") for x in uevent.splitlines()) if k == "PCI_SLOT_NAME"), None
        )
        ports: dict[str, object] = {}
        for port in _names(f"{base}/{device}/ports"):
            where = f"{base}/{device}/ports/{port}"
            gids = []
            for index in sorted(_names(f"{where}/gids"), key=lambda n: int(n) if n.isdigit() else -1):
                gid = _read(f"{where}/gids/{index}")
                if not gid or not gid.replace(":", "").strip("0"):
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
    for name in _names(f"{root}/class/net"):
        where = f"{root}/class/net/{name}"
        mtu = _read(f"{where}/mtu")
        net[name] = {
            "operstate": _read(f"{where}/operstate"),
            "mtu": int(mtu) if mtu and mtu.isdigit() else None,
            "phys_port_name": _read(f"{where}/phys_port_name"),
            "phys_port_id": _read(f"{where}/phys_port_id"),
            "phys_switch_id": _read(f"{where}/phys_switch_id"),
            "ipv4": _ipv4_of(name) if addresses else None,
        }
    return {"root": root, "rdma": rdma, "net": net, "routes": routes(f"{proc}/net/route")}


HOST_ROOT = "/run/sparkforge-host"  # the node's / mounted read-only by the doctor's probe
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
    }


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


def probe(listen_port: int | None, paths: list[str] | None = None) -> int:
    try:
        from vllm.utils.network_utils import get_ip  # vLLM's own choice of the address it advertises
    except ImportError:
        emit("probe", error="vLLM is not importable in this image: vllm.utils.network_utils.get_ip missing")
        return 2
    chosen = get_ip()
    source = "VLLM_HOST_IP" if os.environ.get("VLLM_HOST_IP") else "default route (auto-picked)"
    found = interfaces()
    emit(
        "probe",
        ip=chosen,
        ip_source=source,
        interfaces=found,
        infiniband=infiniband(),
        fabric=fabric(),
        host=host_facts(),
        paths=host_paths(paths or []),
        versions=versions(),
        hostname=socket.gethostname(),
    )
    if listen_port is None:
        return 0
    # Stay up as this node's reach listener: peers dial every address here on the launch port.
    addresses = [f"{i['ipv4']}:{listen_port}" for i in found if i["ipv4"] and i["name"] != "lo"]
    return listen(addresses)


# ---- reachability ---------------------------------------------------------------------------------


IP_MTU_DISCOVER, IP_PMTUDISC_DO = 10, 2  # linux/in.h: set the don't-fragment bit, never fragment locally


def listen(addresses: list[str]) -> int:
    """Accept TCP connections on each address, and answer UDP datagrams there with their size (the DF probe)."""
    servers, echoes = [], []
    for address in addresses:
        host, _, port = address.rpartition(":")
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        echo = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            server.bind((host, int(port)))
            echo.bind((host, int(port)))
        except OSError as exc:
            emit("listen-failed", address=address, error=str(exc))
            return 3
        server.listen(16)
        server.setblocking(False)
        echo.setblocking(False)
        servers.append(server)
        echoes.append(echo)
    emit("listening", addresses=addresses)
    while True:
        for server in servers:
            try:
                conn, peer = server.accept()
            except BlockingIOError:
                continue
            host, port = server.getsockname()[:2]
            emit("accepted", address=f"{host}:{port}", peer=peer[0])
            conn.close()
        for echo in echoes:
            try:
                data, peer = echo.recvfrom(65536)
            except BlockingIOError:
                continue
            echo.sendto(str(len(data)).encode(), peer)  # a short answer: the size that arrived whole
        time.sleep(0.05)


def df_probe(target: str, size: int, tries: int = 3) -> None:
    """One UDP datagram of `size` bytes (MTU-28: a full-MTU IP packet) with don't-fragment set; the peer answers."""
    host, _, port = target.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
        sock.settimeout(1.0)
        error = "no answer (dropped on the way: an MTU below the packet's on the path or at the peer)"
        for _ in range(tries):
            try:
                sock.sendto(b"\0" * size, (host, int(port)))
                answer, _ = sock.recvfrom(64)
            except TimeoutError:
                continue
            except OSError as exc:
                error = f"{exc.__class__.__name__}: {exc}"
                break
            if answer.decode(errors="replace") == str(size):
                emit("df", target=target, size=size, ok=True)
                return
        emit("df", target=target, size=size, ok=False, error=error)


def connect(targets: list[str], timeout: float, df: list[str] | None = None) -> int:
    import threading

    failed = []

    def attempt(target: str) -> None:
        host, _, port = target.rpartition(":")
        start = time.monotonic()
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                emit("reached", target=target, seconds=round(time.monotonic() - start, 3))
        except OSError as exc:
            failed.append(target)
            error = f"{exc.__class__.__name__}: {exc}"
            emit("unreachable", target=target, error=error, seconds=round(time.monotonic() - start, 3))

    threads = [threading.Thread(target=attempt, args=(t,)) for t in targets]
    for spec in df or []:  # HOST:PORT:SIZE
        where, _, size = spec.rpartition(":")
        threads.append(threading.Thread(target=df_probe, args=(where, int(size))))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    emit("connected", failed=len(failed))
    return 0


def nccl_library() -> int:
    """The NCCL library this image's torch really loads (from /proc/self/maps after importing torch): path,
    version, sha256."""
    import hashlib

    import torch

    path = None
    with open("/proc/self/maps") as handle:
        for line in handle:
            name = line.split()[-1] if len(line.split()) >= 6 else ""
            if "libnccl" in os.path.basename(name):
                path = name
                break
    version = None
    try:
        version = ".".join(str(p) for p in torch.cuda.nccl.version())
    except Exception as exc:  # a CPU-only torch has no NCCL at all
        emit("nccl-library", path=path, version=None, sha256=None, error=f"{exc.__class__.__name__}: {exc}")
        return 0
    digest = None
    if path:
        with open(path, "rb") as handle:
            digest = hashlib.sha256(handle.read()).hexdigest()
    emit("nccl-library", path=path, version=version, sha256=digest, torch=torch.__version__)
    return 0


# ---- sanity ---------------------------------------------------------------------------------------


def sanity(rank: int, world: int, master: str, timeout_s: float, nccl: str, mq: bool, local_rank: int) -> int:
    import torch
    import torch.distributed as dist

    timeout = dt.timedelta(seconds=timeout_s)
    emit("stage", stage="rendezvous", rank=rank, world=world, master=master)
    start = time.monotonic()
    dist.init_process_group(
        "gloo", init_method=f"tcp://{master}", rank=rank, world_size=world, timeout=timeout
    )
    emit("done", stage="rendezvous", rank=rank, seconds=round(time.monotonic() - start, 3))

    emit("stage", stage="gloo-allreduce", rank=rank)
    start = time.monotonic()
    data = torch.ones(128)
    dist.all_reduce(data)
    if not torch.allclose(data, torch.full_like(data, world)):
        emit("failed", stage="gloo-allreduce", rank=rank, got=float(data.mean()))
        return 1
    emit(
        "done",
        stage="gloo-allreduce",
        rank=rank,
        seconds=round(time.monotonic() - start, 3),
        mean=float(data.mean()),
    )

    use_nccl = nccl == "yes" or (nccl == "auto" and torch.cuda.is_available())
    if use_nccl:
        emit("stage", stage="nccl-allreduce", rank=rank)
        start = time.monotonic()
        torch.cuda.set_device(local_rank)
        group = dist.new_group(backend="nccl", timeout=timeout)
        data = torch.ones(128, device="cuda")
        dist.all_reduce(data, group=group)
        torch.cuda.synchronize()
        ok = torch.allclose(data, torch.full_like(data, world))
        size = 1 << 26  # 256 MiB of float32: a bandwidth figure beside the correctness check
        big = torch.ones(size, device="cuda")
        dist.all_reduce(big, group=group)
        torch.cuda.synchronize()
        t0 = time.monotonic()
        for _ in range(5):
            dist.all_reduce(big, group=group)
        torch.cuda.synchronize()
        per = (time.monotonic() - t0) / 5
        busbw = 2 * (world - 1) / world * size * 4 / per / 1e9
        emit(
            "done" if ok else "failed",
            stage="nccl-allreduce",
            rank=rank,
            seconds=round(time.monotonic() - start, 3),
            mean=float(data.mean()),
            allreduce_256MiB_s=round(per, 5),
            busbw_GBps=round(busbw, 2),
            nccl=".".join(str(p) for p in torch.cuda.nccl.version()),
        )
        if not ok:
            return 1
    else:
        emit("skipped", stage="nccl-allreduce", rank=rank, reason="no GPU in this container")

    if mq:
        emit("stage", stage="message-queue", rank=rank)
        start = time.monotonic()
        try:
            from vllm.distributed.device_communicators.shm_broadcast import MessageQueue
        except ImportError:
            emit("skipped", stage="message-queue", rank=rank, reason="vLLM is not importable here")
            mq = False
    if mq:
        # vLLM's own construction: the writer advertises get_ip() (VLLM_HOST_IP or the default-route address).
        queue = MessageQueue.create_from_process_group(dist.group.WORLD, 1 << 20, 2, writer_rank=0)
        ready = round(time.monotonic() - start, 3)
        if rank == 0:
            queue.enqueue({"hello": "from rank 0", "world": world})
            received = None
        else:
            received = queue.dequeue(timeout=timeout_s)
            if received != {"hello": "from rank 0", "world": world}:
                emit("failed", stage="message-queue", rank=rank, got=repr(received))
                return 1
        address = getattr(queue.handle, "remote_subscribe_addr", None)
        emit(
            "done",
            stage="message-queue",
            rank=rank,
            seconds=round(time.monotonic() - start, 3),
            ready_s=ready,
            remote_subscribe_addr=address,
        )
        dist.barrier()
    dist.destroy_process_group()
    emit("finished", rank=rank)
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cluster_sanity")
    sub = parser.add_subparsers(dest="mode", required=True)
    p_probe = sub.add_parser("probe")
    p_probe.add_argument(
        "--listen", type=int, help="then accept TCP connections on every address at this port"
    )
    p_probe.add_argument("--path", action="append", default=[], help="KIND=PATH to look for on the node")
    p_listen = sub.add_parser("listen")
    p_listen.add_argument("addresses", nargs="+", help="HOST:PORT to accept connections on")
    p_connect = sub.add_parser("connect")
    p_connect.add_argument("targets", nargs="+")
    p_connect.add_argument("--timeout", type=float, default=3.0)
    p_connect.add_argument("--df", action="append", default=[], help="HOST:PORT:SIZE don't-fragment probe")
    sub.add_parser("nccl-library")
    p_fabric = sub.add_parser("fabric")
    p_fabric.add_argument("--root", default="/sys")
    p_fabric.add_argument("--proc", default="/proc")
    p_sanity = sub.add_parser("sanity")
    p_sanity.add_argument("--rank", type=int, required=True)
    p_sanity.add_argument("--world", type=int, required=True)
    p_sanity.add_argument("--master", required=True, help="HOST:PORT of rank 0's rendezvous")
    p_sanity.add_argument("--timeout", type=float, default=45.0)
    p_sanity.add_argument("--nccl", choices=["auto", "yes", "no"], default="auto")
    p_sanity.add_argument("--no-mq", action="store_true")
    p_sanity.add_argument("--local-rank", type=int, default=0)
    args = parser.parse_args(argv)
    if args.mode == "probe":
        return probe(args.listen, args.path)
    if args.mode == "listen":
        return listen(args.addresses)
    if args.mode == "fabric":
        emit("fabric", facts=fabric(args.root, args.proc, args.root == "/sys"))
        return 0
    if args.mode == "connect":
        return connect(args.targets, args.timeout, args.df)
    if args.mode == "nccl-library":
        return nccl_library()
    return sanity(
        args.rank, args.world, args.master, args.timeout, args.nccl, not args.no_mq, args.local_rank
    )


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception as exc:  # a crash is evidence: the doctor shows it as the rank's last line
        emit("crashed", error=f"{exc.__class__.__name__}: {exc}")
        raise
