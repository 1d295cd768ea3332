"""A two-"Spark" test cluster on one machine: network namespaces, a Docker engine per node, a fabric and LANs.

Each node is a network namespace holding
  fabric0  a veth to the other node (10.77.0.N/24), standing in for the ConnectX-7 cable;
  lan0     a veth to a namespace of its own (10.78.N.1/24) holding the default route, which no peer can reach
           (the Wi-Fi/LAN interface vLLM's get_ip() picks on a multi-NIC Spark);
  dockerd  its own --data-root/--exec-root/--pidfile and unix socket, started inside the namespace, so a
           container with host networking sees exactly lo, fabric0 and lan0.
Node B can also run an sshd (for the ssh:// node test). Addresses are only ever inside these namespaces.
`TestCluster.close()` removes everything (containers, engines, mounts, namespaces, data roots) and is safe
to call after any partial set-up or failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import cluster_cpus

DOCKER = "/usr/bin/docker"
DOCKERD = "/usr/sbin/dockerd"
PREFIX = "sfrun"  # every namespace, directory and link this fixture makes starts with it
STATE_ROOT = Path("/var/lib/sparkforge-test-run")  # on the engine's disk: overlay2 needs a real filesystem
RUN_ROOT = Path("/run/sparkforge-test-run")


def sh(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, timeout=timeout)


def veth(left: tuple[str, str], right: tuple[str, str]) -> None:
    """A cable: a veth pair from (namespace, name) to (namespace, name), both ends down and unaddressed."""
    sh(
        "ip",
        "link",
        "add",
        left[1],
        "netns",
        left[0],
        "type",
        "veth",
        "peer",
        "name",
        right[1],
        "netns",
        right[0],
    )


@dataclass
class TestNode:
    """One namespaced node: its engine socket, its fabric and LAN addresses."""

    __test__ = False  # not a pytest class
    name: str
    index: int
    netns: str
    fabric_ip: str
    lan_ip: str
    root: Path
    run: Path
    dockerd: subprocess.Popen[bytes] | None = None
    sshd_pid: int | None = None
    extra_pids: list[int] = field(default_factory=list)

    @property
    def socket(self) -> Path:
        return self.run / "docker.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def docker(
        self, *args: str, check: bool = True, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        return sh(DOCKER, "--host", self.url, *args, check=check, timeout=timeout)

    def containers(self) -> list[str]:
        """Every container on this node's engine (running or not); [] when the engine is gone."""
        proc = self.docker("ps", "-aq", check=False, timeout=30)
        return proc.stdout.split() if proc.returncode == 0 else []

    def pids(self) -> list[int]:
        proc = sh("ip", "netns", "pids", self.netns, check=False)
        return [int(p) for p in proc.stdout.split() if p.isdigit()]


class TestCluster:
    """Build with `TestCluster.create(...)`; always `close()` (the pytest fixture does, also on failure)."""

    __test__ = False

    def __init__(self, tag: str, own_cpus: bool = False) -> None:
        self.tag = tag
        self.own_cpus = own_cpus  # each node its share of this machine's CPUs (cluster_cpus.py)
        self.nodes: list[TestNode] = []
        self.namespaces: list[str] = []
        self.log_dir = STATE_ROOT / tag / "logs"

    # ---- set-up --------------------------------------------------------------------------------
    @classmethod
    def create(cls, count: int = 2, tag: str | None = None, own_cpus: bool = False) -> TestCluster:
        tag = tag or f"{PREFIX}{os.getpid()}"
        cluster = cls(tag, own_cpus)
        try:
            cluster._network(count)
        except BaseException:
            cluster.close()
            raise
        return cluster

    def _netns(self, name: str) -> None:
        sh("ip", "netns", "add", name)
        self.namespaces.append(name)
        sh("ip", "-n", name, "link", "set", "lo", "up")

    def _network(self, count: int) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for i in range(1, count + 1):
            name = "ab"[i - 1] if count <= 2 else f"n{i}"
            netns = f"{self.tag}-{name}"
            self._netns(netns)
            self._netns(f"{netns}-lan")
            node = TestNode(
                name=name,
                index=i,
                netns=netns,
                fabric_ip=f"10.77.0.{i}",
                lan_ip=f"10.78.{i}.1",
                root=STATE_ROOT / self.tag / name,
                run=RUN_ROOT / self.tag / name,
            )
            node.root.mkdir(parents=True, exist_ok=True)
            node.run.mkdir(parents=True, exist_ok=True)
            # The LAN: a veth whose far end sits alone in its own namespace; the default route points there.
            veth((netns, "lan0"), (f"{netns}-lan", "uplink"))
            sh("ip", "-n", netns, "addr", "add", f"{node.lan_ip}/24", "dev", "lan0")
            sh("ip", "-n", netns, "link", "set", "lan0", "up")
            sh("ip", "-n", f"{netns}-lan", "link", "set", "uplink", "up")
            sh("ip", "-n", netns, "route", "add", "default", "via", f"10.78.{i}.254", "dev", "lan0")
            self.nodes.append(node)
        # The fabric: a point-to-point veth between two nodes (a shared bridge for more).
        if count == 2:
            a, b = self.nodes
            veth((a.netns, "fabric0"), (b.netns, "fabric0"))
        else:
            fabric = f"{self.tag}-fabric"
            self._netns(fabric)
            sh("ip", "-n", fabric, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", fabric, "link", "set", "br0", "up")
            for node in self.nodes:
                veth((fabric, f"p{node.index}"), (node.netns, "fabric0"))
                sh("ip", "-n", fabric, "link", "set", f"p{node.index}", "master", "br0", "up")
        for node in self.nodes:
            sh("ip", "-n", node.netns, "addr", "add", f"{node.fabric_ip}/24", "dev", "fabric0")
            sh("ip", "-n", node.netns, "link", "set", "fabric0", "up")

    def start_engine(self, node: TestNode, timeout: float = 60) -> None:
        """Start the node's dockerd inside its namespace (network only: cgroups and mounts stay the host's).

        With `own_cpus` its containers run on the node's share of this machine's CPUs only.
        """
        if self.own_cpus:
            cluster_cpus.confine(f"{self.tag}-{node.name}", self.cpus(node))
        log = (self.log_dir / f"dockerd-{node.name}.log").open("ab")
        node.dockerd = subprocess.Popen(
            [
                "nsenter",
                f"--net=/run/netns/{node.netns}",
                DOCKERD,
                "--data-root",
                str(node.root / "data"),
                "--exec-root",
                str(node.run / "exec"),
                "--pidfile",
                str(node.run / "dockerd.pid"),
                "--host",
                node.url,
                "--bridge",
                "none",
                "--iptables=false",
                "--ip-masq=false",
                "--ip-forward=false",
                "--userland-proxy=false",
                "--cgroup-parent",
                f"/{self.tag}-{node.name}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):  # a loaded machine answers late
                probe = node.docker("version", "--format", "{{.Server.Version}}", check=False, timeout=20)
                if probe.returncode == 0:
                    return
            if node.dockerd.poll() is not None:
                break
            time.sleep(0.3)
        tail = (self.log_dir / f"dockerd-{node.name}.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"node {node.name}'s dockerd did not come up:\n{tail}")

    def cpus(self, node: TestNode) -> list[int]:
        """The CPUs the node's containers may use (all of this machine's unless `own_cpus`)."""
        every = cluster_cpus.machine_cpus()
        return cluster_cpus.shares(every, len(self.nodes))[node.index - 1] if self.own_cpus else every

    def stop_engine(self, node: TestNode) -> None:
        """Stop the node's dockerd cleanly (its image store stays on disk)."""
        if node.dockerd is not None and node.dockerd.poll() is None:
            node.dockerd.send_signal(signal.SIGTERM)
            try:
                node.dockerd.wait(timeout=30)
            except subprocess.TimeoutExpired:
                node.dockerd.kill()
                node.dockerd.wait(timeout=10)
        node.dockerd = None
        self._unmount_under(node.run)
        self._unmount_under(node.root)

    def clone_store(self, source: TestNode, target: TestNode) -> None:
        """Give `target` the same image store as `source` by hard links (both engines stopped).

        Image layers are never written after they are unpacked (containers write to their own upper
        directories), so the two engines share the bytes of a 10 GB image instead of copying them.
        """
        dest = target.root / "data"
        sh("rm", "-rf", str(dest), check=False, timeout=900)
        dest.mkdir(parents=True)
        # Only the image store and its layers: databases (containerd's, the network's) are locked by inode,
        # so a hard-linked copy would block the second engine; it makes fresh ones.
        for part in ("image", "overlay2"):
            sh("cp", "-a", "--link", str(source.root / "data" / part), str(dest / part), timeout=600)

    def load_image(self, image: str) -> dict[str, float]:
        """`image` on every node: streamed once into the first node's engine, the others' stores hard-linked
        copies of it (clone_store); every engine running after. Returns the figures (seconds, GB)."""
        from sparkforge.commands import Command
        from sparkforge.run.nodes import NodeEngine, distribute_image, parse_node

        first = self.nodes[0]
        self.start_engine(first)
        start = time.monotonic()
        size = distribute_image(Command((DOCKER,)), image, [NodeEngine(parse_node(first.url))])
        figures = {"stream_s": round(time.monotonic() - start, 1), "image_gb": size / 1e9}
        self.stop_engine(first)
        start = time.monotonic()
        for node in self.nodes[1:]:
            self.clone_store(first, node)
        figures["clone_s"] = round(time.monotonic() - start, 1)
        for node in self.nodes:
            self.start_engine(node)
        return figures

    def recable(self, cables: list[tuple[int, int, str]], *, forward: bool = False) -> list[str]:
        """The switch (every fabric0) out, a cable per (a, b, subnet) instead (positions in `nodes`): a veth
        named after the peer (`to{index}`), each end at subnet.{its node's index}; rp_filter off (a reply may
        come in over another cable); `forward`: every node routes. Returns each cable's first end's address."""
        keys = ("net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0")
        for node in self.nodes:
            sh("ip", "-n", node.netns, "link", "del", "fabric0")
            for key in (*keys, *(("net.ipv4.ip_forward=1",) if forward else ())):
                sh("ip", "netns", "exec", node.netns, "sysctl", "-qw", key)
        for a, b, subnet in cables:
            left, right = self.nodes[a], self.nodes[b]
            veth((left.netns, f"to{right.index}"), (right.netns, f"to{left.index}"))
            for where, name in ((left, f"to{right.index}"), (right, f"to{left.index}")):
                sh("ip", "-n", where.netns, "addr", "add", f"{subnet}.{where.index}/24", "dev", name)
                sh("ip", "-n", where.netns, "link", "set", name, "up")
        time.sleep(1.5)  # linkwatch: operstate follows `link set up` within a second
        return [f"{subnet}.{self.nodes[a].index}" for a, _, subnet in cables]

    def kill_node(self, node: TestNode) -> None:
        """Power the node off: SIGKILL every process in its namespace (engine, containerd, shims, containers)."""
        for _ in range(5):
            pids = node.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.3)
        if node.dockerd is not None:
            with contextlib.suppress(Exception):
                node.dockerd.wait(timeout=10)
        node.dockerd = None
        node.sshd_pid = None

    # ---- ssh -----------------------------------------------------------------------------------
    def start_sshd(self, node: TestNode, key_dir: Path, port: int = 2222) -> Path:
        """An sshd in the node's namespace on its fabric address; returns a client wrapper dir for PATH.

        OpenSSH reads ~/.ssh from the password database, not $HOME, so the test hands the client its key and
        known-hosts file through an `ssh` wrapper first on PATH (the product uses the user's own ssh set-up).
        The session gets DOCKER_HOST of the node's engine, as a remote Spark's own default engine would be.
        """
        key_dir.mkdir(parents=True, exist_ok=True)
        host_key, user_key = key_dir / "host_ed25519", key_dir / "user_ed25519"
        for key in (host_key, user_key):
            if not key.exists():
                sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        (key_dir / "authorized_keys").write_text(user_key.with_suffix(".pub").read_text())
        (key_dir / "authorized_keys").chmod(0o600)
        (key_dir / "known_hosts").write_text(
            f"[{node.fabric_ip}]:{port} {host_key.with_suffix('.pub').read_text().split(' ', 2)[0]} "
            f"{host_key.with_suffix('.pub').read_text().split(' ', 2)[1]}\n"
        )
        config = key_dir / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"ListenAddress {node.fabric_ip}:{port}",
                    f"HostKey {host_key}",
                    f"AuthorizedKeysFile {key_dir / 'authorized_keys'}",
                    f"PidFile {node.run / 'sshd.pid'}",
                    "PermitRootLogin prohibit-password",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "UsePAM no",
                    "StrictModes no",
                    f"SetEnv DOCKER_HOST={node.url} PATH=/usr/bin:/usr/sbin:/bin:/sbin",
                    "",
                ]
            )
        )
        Path("/run/sshd").mkdir(exist_ok=True)  # privilege separation directory
        proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{node.netns}", "/usr/sbin/sshd", "-D", "-e", "-f", str(config)],
            stdout=(self.log_dir / f"sshd-{node.name}.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        node.sshd_pid = proc.pid
        node.extra_pids.append(proc.pid)
        client = key_dir / "bin"
        client.mkdir(exist_ok=True)
        wrapper = client / "ssh"
        wrapper.write_text(
            "#!/bin/sh\n"
            f"exec /usr/bin/ssh -i {user_key} -o UserKnownHostsFile={key_dir / 'known_hosts'} "
            '-o StrictHostKeyChecking=yes -o BatchMode=yes "$@"\n'
        )
        wrapper.chmod(0o755)
        time.sleep(0.5)
        if proc.poll() is not None:
            raise RuntimeError(
                f"sshd did not start: {(self.log_dir / f'sshd-{node.name}.log').read_text()[-800:]}"
            )
        return client

    # ---- teardown ------------------------------------------------------------------------------
    @staticmethod
    def _unmount_under(path: Path) -> None:
        prefix = str(path) + "/"
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for point in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
            sh("umount", "-l", point, check=False)

    def close(self) -> None:
        """Remove containers, engines, sshd, mounts, namespaces and data roots; never raises."""
        for node in self.nodes:
            with contextlib.suppress(Exception):
                ids = node.containers()
                if ids:
                    node.docker("rm", "-f", *ids, check=False, timeout=60)
            with contextlib.suppress(Exception):
                self.stop_engine(node)
            with contextlib.suppress(Exception):
                self.kill_node(node)
            for pid in node.extra_pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self._unmount_under(node.run)
            self._unmount_under(node.root)
            cluster_cpus.release(f"{self.tag}-{node.name}")
        for name in reversed(self.namespaces):
            sh("ip", "netns", "del", name, check=False)
        self.namespaces.clear()
        for path in (STATE_ROOT / self.tag, RUN_ROOT / self.tag):
            sh("rm", "-rf", "--one-file-system", str(path), check=False, timeout=900)  # C is much faster here
        for root in (STATE_ROOT, RUN_ROOT):
            with contextlib.suppress(OSError):
                root.rmdir()  # only when no other cluster is in it
