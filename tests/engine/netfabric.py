"""Namespaced nodes cabled as a layout (pair, mesh3, ring, switch) by veth links and a bridge, for the topology
tests: each node is a network namespace holding its cables (veths named after the peer), a LAN interface with the
default route (which no peer shares) and a docker0-like bridge holding the same address on every node. Each
node's fabric facts are read by the doctor's own in-image reader (tests/image/cluster_sanity.py fabric) run inside
the namespace, so the kernel's sysfs, routes and addresses are the namespace's: no engine or image is needed to
read them. `close()` removes every namespace it made and is safe after any partial set-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cluster import veth

HELPER = Path(__file__).resolve().parents[1] / "image" / "cluster_sanity.py"


def sh(*argv: str) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")
    return proc.stdout


class Fabric:
    """`Fabric(count)`, then `cable(a, b, subnet)` / `switch(subnet)`; `facts()` reads every node."""

    def __init__(self, count: int, tag: str | None = None) -> None:
        self.tag = tag or f"sftopo{os.getpid()}"
        self.count = count
        self.namespaces: list[str] = []
        try:
            for i in range(count):
                ns = self.ns(i)
                sh("ip", "netns", "add", ns)
                self.namespaces.append(ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
                # The LAN: the default route, on an address no peer shares (the Wi-Fi vLLM's get_ip() would pick).
                veth((ns, "lan0"), (ns, "uplink"))
                sh("ip", "-n", ns, "link", "set", "uplink", "up")  # the LAN's far end: no address, no peer
                sh("ip", "-n", ns, "addr", "add", f"10.88.{i}.1/24", "dev", "lan0")
                sh("ip", "-n", ns, "link", "set", "lan0", "up")
                sh("ip", "-n", ns, "route", "add", "default", "via", f"10.88.{i}.254", "dev", "lan0")
                # A docker0 on every node, one address everywhere: the node's own segment, never a cable.
                sh("ip", "-n", ns, "link", "add", "docker0", "type", "bridge")
                sh("ip", "-n", ns, "addr", "add", "172.17.0.1/16", "dev", "docker0")
                sh("ip", "-n", ns, "link", "set", "docker0", "up")
        except BaseException:
            self.close()
            raise

    def ns(self, i: int) -> str:
        return f"{self.tag}-n{i + 1}"

    def cable(self, a: int, b: int, subnet: str, mtu: int = 9000, first: int = 1) -> None:
        """A veth between node a (`to{b+1}`, address .a+first) and node b (`to{a+1}`, .b+first) on `subnet`."""
        left, right = f"to{b + 1}", f"to{a + 1}"
        veth((self.ns(a), left), (self.ns(b), right))
        for node, name in ((a, left), (b, right)):
            sh("ip", "-n", self.ns(node), "addr", "add", f"{subnet}.{node + first}/24", "dev", name)
            sh("ip", "-n", self.ns(node), "link", "set", name, "mtu", str(mtu), "up")

    def switch(self, subnet: str, mtu: int = 9000) -> None:
        """Every node's `fabric0` on one bridge (the switch, in a namespace of its own), all on `subnet`."""
        hub = f"{self.tag}-sw"
        sh("ip", "netns", "add", hub)
        self.namespaces.append(hub)
        sh("ip", "-n", hub, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", hub, "link", "set", "br0", "mtu", str(mtu), "up")
        for i in range(self.count):
            veth((hub, f"p{i + 1}"), (self.ns(i), "fabric0"))
            sh("ip", "-n", hub, "link", "set", f"p{i + 1}", "mtu", str(mtu), "master", "br0", "up")
            sh("ip", "-n", self.ns(i), "addr", "add", f"{subnet}.{i + 1}/24", "dev", "fabric0")
            sh("ip", "-n", self.ns(i), "link", "set", "fabric0", "mtu", str(mtu), "up")

    def ip(self, i: int, *args: str) -> None:
        sh("ip", "-n", self.ns(i), *args)

    def facts(self) -> list[dict]:
        """Each node's raw facts, read inside its namespace by the doctor's reader (`ip netns exec` mounts the
        namespace's own sysfs)."""
        self.settle()
        found = []
        for i in range(self.count):
            out = sh("ip", "netns", "exec", self.ns(i), sys.executable, str(HELPER), "fabric")
            event = next(e for e in map(json.loads, out.splitlines()) if e.get("event") == "fabric")
            found.append(event["facts"])
        return found

    def settle(self, timeout: float = 5) -> None:
        """Wait until every cable end reads UP: the kernel updates operstate in the background (linkwatch, up to
        a second after `link set up`), and a reading before that sees a cable that is not there yet."""
        deadline = time.monotonic() + timeout
        while True:
            states = [
                line.split()[:2]
                for i in range(self.count)
                for line in sh("ip", "-n", self.ns(i), "-br", "link").splitlines()
                if line.startswith(("to", "fabric0"))
            ]
            if all(state == "UP" for _, state in states) or time.monotonic() > deadline:
                return
            time.sleep(0.1)

    def close(self) -> None:
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        self.namespaces.clear()
