#!/usr/bin/env python3
"""The cluster doctor's in-image helper: runs on each node, inside the image that will serve, with its torch/vLLM.

Modes (one JSON object per line on stdout, each with an "event" key, so the doctor can follow a rank's progress):
  probe [--listen PORT]  the address vLLM would advertise (its own get_ip()), interfaces, MTUs, versions;
                         then, with --listen, accept connections on every address at PORT until killed
  listen HOST:PORT...    accept TCP connections on each address until killed (peers prove they reach it)
  connect HOST:PORT...   try each address once with a short timeout; --df HOST:PORT:SIZE sends a don't-fragment
                         datagram of SIZE bytes that the peer's listener answers; --rdns-cap S times a reverse
                         lookup of each address (what torch's c10d rendezvous does per peer socket), given up after S
  fabric                 the raw sysfs facts (RDMA devices, GIDs, net devices, routes) sparkforge/run/cluster/fabric.py uses
  nccl-library           the libnccl torch really loads: path, version, sha256 (the node's own too, / mounted)
  sanity                 torch.distributed across nodes: rendezvous, Gloo all-reduce on CPU, NCCL all-reduce
                         where GPUs exist, then vLLM's shared-memory-broadcast MessageQueue with remote readers;
                         with --gate PATH it imports first (--library: and reports the libnccl, as
                         nccl-library does) and dials nobody until PATH exists (the doctor opens it when every
                         cheap stage passed)
Standard library + what the image ships. The doctor passes this file's text and cluster_facts.py's with
`python3 -c`, so it also runs on images built before it existed; it is the same script the GPU machine runs
with torchrun-free ranks.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import sys
import time

from cluster_facts import (
    fabric,
    gpu_clocks,
    host_facts,
    host_nccl,
    host_paths,
    infiniband,
    interfaces,
    versions,
    vllm_get_ip,
)


def emit(event: str, **fields: object) -> None:
    # One write per line: print() writes the text and its newline apart, so two dialling threads interleave.
    sys.stdout.write(json.dumps({"event": event, "t": round(time.time(), 3), **fields}) + "\n")
    sys.stdout.flush()


def probe(listen_port: int | None, paths: list[str] | None = None) -> int:
    try:
        chosen, _ = vllm_get_ip()  # vLLM's own choice of the address it advertises (its source, not imported)
    except ImportError:
        emit("probe", error="vLLM is not importable in this image: vllm.utils.network_utils.get_ip missing")
        return 2
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


_LOOKUP = """import json, socket, sys, time
start = time.monotonic()
try:
    name, error = socket.getnameinfo((sys.argv[1], 0), socket.NI_NAMEREQD)[0], None
except OSError as exc:
    name, error = None, f"{exc.__class__.__name__}: {exc}"
print(json.dumps([round(time.monotonic() - start, 3), name, error]))
"""


class ReverseLookups:
    """One reverse lookup per host (getnameinfo, as torch's c10d formats each peer socket), each in a process of
    its own: CPython's getnameinfo holds the interpreter lock while the resolver waits, so lookups in threads ran
    one after another and stalled the dials beside them (36 s for six hosts on a node whose resolver does not
    answer).

    A resolver that does not answer makes every lookup wait out its timeout (5 s by default, per attempt); the
    doctor waits at most `cap` seconds and says which lookups had not answered by then."""

    def __init__(self, hosts: list[str], cap: float) -> None:
        import subprocess

        self.cap, self.start = cap, time.monotonic()
        self.hosts = hosts
        self.done: dict[str, tuple[float, str | None, str | None]] = {}
        self.procs = {
            h: subprocess.Popen([sys.executable, "-c", _LOOKUP, h], stdout=subprocess.PIPE, text=True)
            for h in (hosts if cap > 0 else ())
        }

    def report(self) -> None:
        """Wait for the lookups until the cap; one `rdns` event each, answered within the cap or not."""
        if self.cap <= 0:
            return
        while any(p.poll() is None for p in self.procs.values()) and time.monotonic() < self.start + self.cap:
            time.sleep(0.02)
        for host, proc in self.procs.items():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                emit(
                    "rdns",
                    host=host,
                    answered=False,
                    seconds=round(time.monotonic() - self.start, 3),
                    cap=self.cap,
                )
                continue
            try:
                seconds, name, error = json.loads(proc.stdout.read() if proc.stdout else "")
            except ValueError:
                seconds, name, error = (
                    round(time.monotonic() - self.start, 3),
                    None,
                    "the lookup printed nothing",
                )
            emit("rdns", host=host, answered=True, seconds=seconds, name=name, error=error)


def connect(targets: list[str], timeout: float, df: list[str] | None = None, rdns_cap: float = 0.0) -> int:
    import threading

    failed = []
    lookups = ReverseLookups(list(dict.fromkeys(t.rpartition(":")[0] for t in targets)), rdns_cap)

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
    lookups.report()
    emit("connected", failed=len(failed))
    return 0


def nccl_library(started: float | None = None) -> int:
    """The NCCL library this image's torch really loads (from /proc/self/maps after importing torch): path,
    version, sha256; `host`: the node's own, when its / is mounted (None otherwise). `seconds`: from `started`
    (default: now, so torch's import is counted, as in a sanity rank that imported it first) to the answer."""
    import hashlib

    started = time.monotonic() if started is None else started
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
        error = f"{exc.__class__.__name__}: {exc}"
        emit("nccl-library", path=path, version=None, sha256=None, error=error, host=host_nccl())
        return 0
    digest = None
    if path:
        with open(path, "rb") as handle:
            digest = hashlib.sha256(handle.read()).hexdigest()
    emit(
        "nccl-library",
        path=path,
        version=version,
        sha256=digest,
        torch=torch.__version__,
        host=host_nccl(),
        seconds=round(time.monotonic() - started, 3),
    )
    return 0


# ---- sanity ---------------------------------------------------------------------------------------


def vllm_message_queue() -> tuple[type, bool]:
    """vLLM's MessageQueue class, and whether vllm/__init__.py ran to import it.

    The package's __init__ runs vllm.env_override (torch inductor patches, CUDA-compat library paths: ~5 s of
    the rank's imports, more than torch itself), which the queue does not use; the queue's module and everything
    it imports are loaded as usual, only that one file is not run. An image whose queue module needs it gets the
    plain import."""
    import importlib
    import importlib.util

    if "vllm" not in sys.modules:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("no vllm package")
        sys.modules["vllm"] = importlib.util.module_from_spec(spec)  # the package, its __init__ not run
        try:
            module = importlib.import_module("vllm.distributed.device_communicators.shm_broadcast")
            return module.MessageQueue, False
        except Exception:
            for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
                del sys.modules[name]
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    return MessageQueue, True


def wait_gate(path: str, timeout_s: float, poll_s: float = 0.02) -> float | None:
    """Wait until the file `path` exists (the doctor creates it with `docker exec`); the seconds waited, or None
    when `timeout_s` passed first."""
    start = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - start > timeout_s:
            return None
        time.sleep(poll_s)
    return round(time.monotonic() - start, 3)


def sanity(
    rank: int,
    world: int,
    master: str,
    timeout_s: float,
    nccl: str,
    mq: bool,
    local_rank: int,
    gate: str | None = None,
    library: bool = False,
    gate_timeout_s: float = 300.0,
) -> int:
    started = time.monotonic()
    import torch
    import torch.distributed as dist

    timeout = dt.timedelta(seconds=timeout_s)
    imports = round(time.monotonic() - started, 3)  # torch's import: most of a rank's time before it dials
    if library:
        nccl_library(started)
    preloaded: tuple[type, bool, float] | None = None  # vLLM's queue class, imported before the gate
    if gate:
        # Everything that does not touch the network happens before the gate: vLLM's queue module too.
        if mq:
            start = time.monotonic()
            try:
                found, package_init = vllm_message_queue()
                preloaded = (found, package_init, round(time.monotonic() - start, 3))
            except ImportError:
                pass
        emit("gated", rank=rank, path=gate, seconds=round(time.monotonic() - started, 3))
        waited = wait_gate(gate, gate_timeout_s)  # the doctor removes the rank first: this bounds an orphan
        if waited is None:
            emit("failed", stage="gate", rank=rank, reason=f"{gate} not opened within {gate_timeout_s:g} s")
            return 1
        emit("opened", rank=rank, waited_s=waited)
    emit("stage", stage="rendezvous", rank=rank, world=world, master=master)
    start = time.monotonic()
    dist.init_process_group(
        "gloo", init_method=f"tcp://{master}", rank=rank, world_size=world, timeout=timeout
    )
    emit(
        "done",
        stage="rendezvous",
        rank=rank,
        seconds=round(time.monotonic() - start, 3),
        torch_import_s=imports,
    )

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
            gpu_clocks=gpu_clocks(),
        )
        if not ok:
            return 1
    else:
        emit("skipped", stage="nccl-allreduce", rank=rank, reason="no GPU in this container")

    if mq:
        emit("stage", stage="message-queue", rank=rank)
        start = time.monotonic()
        try:
            MessageQueue, package_init, imported = preloaded or (*vllm_message_queue(), None)
        except ImportError:
            emit("skipped", stage="message-queue", rank=rank, reason="vLLM is not importable here")
            mq = False
    if mq:
        if imported is None:
            imported = round(time.monotonic() - start, 3)
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
            import_s=imported,
            vllm_init_run=package_init,
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
    p_connect.add_argument(
        "--rdns-cap", type=float, default=0.0, help="time reverse lookups, up to this many s"
    )
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
    p_sanity.add_argument("--gate", help="import first, then dial nobody until this file exists")
    p_sanity.add_argument("--library", action="store_true", help="report the libnccl torch loads first")
    p_sanity.add_argument("--gate-timeout", type=float, default=300.0, help="give up at the gate after this")
    args = parser.parse_args(argv)
    if args.mode == "probe":
        return probe(args.listen, args.path)
    if args.mode == "listen":
        return listen(args.addresses)
    if args.mode == "fabric":
        emit("fabric", facts=fabric(args.root, args.proc, args.root == "/sys"))
        return 0
    if args.mode == "connect":
        return connect(args.targets, args.timeout, args.df, args.rdns_cap)
    if args.mode == "nccl-library":
        return nccl_library()
    return sanity(
        args.rank,
        args.world,
        args.master,
        args.timeout,
        args.nccl,
        not args.no_mq,
        args.local_rank,
        args.gate,
        args.library,
        args.gate_timeout,
    )


if __name__ == "__main__":
    try:
        code = main(sys.argv[1:])
    except Exception as exc:  # a crash is evidence: the doctor shows it as the rank's last line
        emit("crashed", error=f"{exc.__class__.__name__}: {exc}")
        raise
    if "torch" in sys.modules:
        # Everything is said (emit flushes each line): tearing down an interpreter that imported torch and vLLM's
        # queue (zmq) took ~1.4 s of each rank's exit on the namespaced cluster, which the doctor waits for.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
