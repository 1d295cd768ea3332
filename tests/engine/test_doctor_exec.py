"""The doctor's probes run inside one container per node: a helper exec'd into a running container answers as a
container of its own would, on the real engine, with the offline base image (python3, no vLLM)."""

from __future__ import annotations

import socket

import pytest

from sparkforge.run.jobs import Job, exec_jobs, first_event, remove_jobs, run_jobs
from sparkforge.run.nodes import LOCAL, NodeEngine

pytestmark = pytest.mark.engine


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_dial_exec_in_the_listener_container_reaches_it_and_starts_nothing(base_amd64: str) -> None:
    engine = NodeEngine(LOCAL)
    port = _free_port()
    listeners = run_jobs([Job(engine, ("listen", f"127.0.0.1:{port}"))], base_amd64, "probe", 60, keep=True,
                         until=lambda found: all(first_event(o, "listening") or o.exit_code is not None for o in found))  # fmt: skip
    try:
        assert first_event(listeners[0], "listening"), listeners[0].last_lines
        before = set(engine.containers("dev.sparkforge.run=doctor"))
        dial = Job(engine, ("connect", "--timeout", "3", f"127.0.0.1:{port}", f"127.0.0.1:{_free_port()}"))
        (inside,) = exec_jobs([dial], listeners, 30)
        assert set(engine.containers("dev.sparkforge.run=doctor")) == before  # no container started or left
        (alone,) = run_jobs([dial], base_amd64, "dial", 60)  # the old way: a dial container of its own
        for outcome in (inside, alone):
            assert outcome.exit_code == 0 and outcome.node_lost is None, outcome.last_lines
            kinds = sorted((e["event"], e.get("target")) for e in outcome.events if e["event"] != "connected")
            assert kinds == [
                ("reached", f"127.0.0.1:{port}"),
                ("unreachable", dial.args[4]),
            ]  # dialled at once
        remove_jobs(listeners)
        (gone,) = exec_jobs([dial], [], 30)  # no running probe on the node: named, not guessed
        assert gone.node_lost == f"{LOCAL.label}: no running probe container to run connect in"
    finally:
        remove_jobs(listeners)
