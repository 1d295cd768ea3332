"""The doctor against ssh:// nodes that cannot be reached: the engines stage names ssh, the user, the host, the
port, ssh's own message and the fix (not "the engine stopped answering ... start docker").

Real: the docker CLI dials through the real ssh client; one host name cannot resolve (.invalid, RFC 6761), one
127.0.0.x port has nothing listening (bound, then closed)."""

from __future__ import annotations

import shutil
import socket

import pytest

from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.run.cluster.doctor import DoctorPlan, run_doctor
from sparkforge.run.facts import Deadlines, DoctorOptions
from sparkforge.run.nodes import NodeEngine, parse_nodes

pytestmark = pytest.mark.skipif(
    not (shutil.which("ssh") and shutil.which("docker")), reason="needs the docker CLI and the ssh client"
)


def _closed_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]  # closed on leaving: nothing listens there now


def _engines_reason(nodes: str) -> str:
    engines = [NodeEngine(node) for node in parse_nodes(nodes)]
    options = DoctorOptions(image="none:none", deadlines=Deadlines(engines=20), quick=True)
    result = run_doctor(Session(echo=lambda _: None, runner=Runner()), DoctorPlan(tuple(engines), options))
    checks = {c.name: c for c in result.report.checks}
    assert checks["engines"].status == "failed"
    return checks["engines"].reason


def test_a_host_that_does_not_resolve_is_said_as_ssh_with_the_fix() -> None:
    reason = _engines_reason("ssh://sparkuser@spark2.invalid")
    assert "ssh to sparkuser@spark2.invalid port 22 failed" in reason, reason
    assert "Could not resolve hostname spark2.invalid" in reason, reason  # ssh's own words
    assert "fix: the name does not resolve" in reason and "/etc/hosts" in reason, reason
    assert "stopped answering" not in reason and "systemctl start docker" not in reason, reason


def test_a_port_that_refuses_is_said_as_ssh_with_the_fix() -> None:
    port = _closed_port("127.0.0.9")
    reason = _engines_reason(f"ssh://sparkuser@127.0.0.9:{port}")
    assert f"ssh to sparkuser@127.0.0.9 port {port} failed" in reason, reason
    assert "Connection refused" in reason, reason
    assert "fix: nothing accepts ssh at 127.0.0.9" in reason and "ssh://sparkuser@127.0.0.9:PORT" in reason, (
        reason
    )
    assert "stopped answering" not in reason, reason
