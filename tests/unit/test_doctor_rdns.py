"""The reach stage's reverse lookups: a node whose resolver does not answer is named with the fix.

torch's c10d rendezvous (every vLLM start across nodes) reverse-resolves each peer socket; a name server the node
cannot reach makes each lookup wait out the resolver's timeout (6-9 s a rendezvous, benchmarks/cluster.md). The
in-image helper runs for real here, as the doctor runs it (`python3 -c` with its readers), dialling a listener on
127.0.0.1: once with this machine's resolver, once in its own mount namespace whose /etc/resolv.conf names a
local UDP port that takes queries and never answers."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sparkforge.run.cluster.reach import RDNS_CAP_S, reverse_lookups, slow_resolvers
from sparkforge.run.jobs import Job, Outcome, sanity_script
from sparkforge.run.nodes import NodeEngine, parse_nodes

SILENT_DNS = "127.0.0.77"  # a loopback address of its own: the silent name server binds its port 53


def _listener(host: str) -> socket.socket:
    server = socket.socket()
    server.bind((host, 0))
    server.listen(4)
    return server


def _connect(target: str, prefix: list[str] | None = None) -> list[dict]:
    argv = [*(prefix or []), sys.executable, "-c", sanity_script(), "connect", target, "--timeout", "2"]
    done = subprocess.run([*argv, "--rdns-cap", str(RDNS_CAP_S)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _outcome(events: list[dict], where: Path) -> Outcome:
    sock = socket.socket(socket.AF_UNIX)  # node addresses are checked when parsed: a real socket file
    sock.bind(str(where / "node.sock"))
    try:
        engine = NodeEngine(parse_nodes(f"unix://{where}/node.sock")[0])
    finally:
        sock.close()
    return Outcome(Job(engine, ("connect",)), "test", events=events)


def test_a_resolver_that_answers_gives_no_warning(tmp_path: Path) -> None:
    server = _listener("127.0.0.1")
    try:
        events = _connect(f"127.0.0.1:{server.getsockname()[1]}")
    finally:
        server.close()
    assert [e["event"] for e in events if e["event"] != "df"] == ["reached", "rdns", "connected"], events
    (lookup,) = (e for e in events if e["event"] == "rdns")
    assert lookup["answered"] is True and lookup["seconds"] < RDNS_CAP_S, lookup
    lookups = reverse_lookups([_outcome(events, tmp_path)])
    assert list(lookups) == ["node0 -> 127.0.0.1"] and slow_resolvers(lookups) == []


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) to give the helper a resolv.conf of its own (a mount namespace)",
)
def test_a_silent_resolver_is_named_with_the_fix(tmp_path: Path) -> None:
    dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dns.bind((SILENT_DNS, 53))  # takes every query, answers none
    resolv = tmp_path / "resolv.conf"
    resolv.write_text(f"nameserver {SILENT_DNS}\noptions timeout:5 attempts:1\n")
    host = "127.0.0.9"  # a loopback address no hosts file names: its reverse lookup goes to the name server
    server = _listener(host)
    script = f'mount --bind {resolv} /etc/resolv.conf && exec "$@"'
    try:
        events = _connect(f"{host}:{server.getsockname()[1]}", ["unshare", "-m", "sh", "-c", script, "sh"])
        asked = dns.recvfrom(512, socket.MSG_DONTWAIT)  # the lookup did reach the silent name server
    finally:
        server.close()
        dns.close()
    assert asked[0], asked
    (lookup,) = (e for e in events if e["event"] == "rdns")
    assert lookup["answered"] is False and lookup["seconds"] >= RDNS_CAP_S, lookup
    assert any(e["event"] == "reached" for e in events)  # the dial itself is unaffected
    warnings = slow_resolvers(reverse_lookups([_outcome(events, tmp_path)]))
    assert len(warnings) == 1 and warnings[0].startswith(
        f"node0's resolver did not answer a reverse lookup of {host}"
    )
    assert "c10d" in warnings[0] and "fix: a name server node0 reaches in its /etc/resolv.conf" in warnings[0]
