"""The doctor's flow: stages in order behind the first failure, --quick, and per-node calls run at once.

Real threads and real processes: each_node runs `sleep` processes; the doctor is pointed at real unix sockets
where no engine answers, through the real docker CLI."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sparkforge.errors import RunError
from sparkforge.report import Check, Report
from sparkforge.run.cluster.doctor import STAGES, run_doctor
from sparkforge.run.cluster.doctorflow import EXPENSIVE, Stage, run_stages
from sparkforge.run.facts import Deadlines, DoctorOptions
from sparkforge.run.jobs import Background, each_node
from sparkforge.run.nodes import NodeEngine, parse_nodes


def _sleep(seconds: float, log: list[tuple[str, float, float]], name: str) -> str:
    start = time.monotonic()
    subprocess.run(["sleep", str(seconds)], check=True)
    log.append((name, start, time.monotonic()))
    return name


def test_each_node_runs_every_call_at_once_and_keeps_the_order() -> None:
    log: list[tuple[str, float, float]] = []
    items = [("a", 0.6), ("b", 0.4), ("c", 0.2)]
    answers = each_node(lambda item: _sleep(item[1], log, item[0]), items)
    assert answers == ["a", "b", "c"]  # input order, though c finished first
    assert [name for name, _, _ in log] == ["c", "b", "a"]
    first_end = min(end for _, _, end in log)
    assert all(start < first_end for _, start, _ in log)  # every process started before any ended


def test_each_node_raises_only_after_every_call_ended() -> None:
    log: list[tuple[str, float, float]] = []

    def call(name: str) -> str:
        if name == "bad":
            raise RunError("node bad: no answer")
        return _sleep(0.3, log, name)

    with pytest.raises(RunError, match="node bad"):
        each_node(call, ["bad", "good"])
    assert [name for name, _, _ in log] == ["good"]  # not left running behind the error


def test_background_runs_beside_the_caller_and_stops_when_asked() -> None:
    log: list[tuple[str, float, float]] = []
    slow = Background(lambda cancel: _sleep(0.5, log, "background"))
    _sleep(0.1, log, "caller")
    assert [name for name, _, _ in log] == ["caller"]  # the caller went on while the background call ran
    assert slow.result() == "background"
    seen: list[bool] = []

    def waits(cancel: threading.Event) -> None:
        seen.append(cancel.wait(30))  # a probe polling its containers until told to stop

    stopped = Background(waits)
    stopped.stop()
    assert seen == [True]  # stop() set the event and waited for the call to end


def _stage(name: str, log: list[str], status: str = "passed", error: str = "") -> Stage:
    def run(check: Check) -> None:
        log.append(name)
        if error:
            raise RunError(error)
        check.status, check.reason = status, f"{name} {status}"

    return Stage(name, run)


def test_stages_run_in_order_and_the_first_failure_skips_the_rest() -> None:
    log: list[str] = []
    echoed: list[str] = []
    ended: list[str] = []
    report = Report(command="cluster.doctor", subject="test")
    steps = [
        _stage("engines", log),
        _stage("reach", log),
        _stage("mtu", log, "failed"),
        _stage("host", log),
        _stage("sanity", log),
    ]
    blocked = run_stages(report, steps, echoed.append, after={"reach": lambda: ended.append("reach")})
    assert blocked == "mtu" and log == ["engines", "reach", "mtu"] and ended == ["reach"]
    assert [(c.name, c.status) for c in report.checks] == [
        ("engines", "passed"),
        ("reach", "passed"),
        ("mtu", "failed"),
        ("host", "skipped"),
        ("sanity", "skipped"),
    ]
    assert report.checks[-1].reason == "not run: stage 'mtu' failed"
    assert [line.split(" (")[0] for line in echoed] == [
        "doctor: 1/5 engines ...", "doctor: engines passed",
        "doctor: 2/5 reach ...", "doctor: reach passed",
        "doctor: 3/5 mtu ...", "doctor: mtu failed",
    ]  # fmt: skip


def test_a_node_lost_mid_stage_fails_that_stage_and_quick_lists_what_it_left_out() -> None:
    log: list[str] = []
    report = Report(command="cluster.doctor", subject="test")
    run_stages(report, [_stage("engines", log), _stage("addresses", log, error="node1: engine gone")],
               lambda _: None, left_out=(EXPENSIVE, "--quick"))  # fmt: skip
    assert [(c.name, c.status) for c in report.checks] == [
        ("engines", "passed"),
        ("addresses", "failed"),
        ("nccl-library", "skipped"),
        ("sanity", "skipped"),
        ("transport", "skipped"),
    ]
    assert report.checks[1].reason == "node1: engine gone"
    assert report.checks[2].reason == "not run: stage 'addresses' failed"
    passed = Report(command="cluster.doctor", subject="test")
    assert (
        run_stages(passed, [_stage("engines", [])], lambda _: None, left_out=(EXPENSIVE, "--quick")) is None
    )
    assert [c.reason for c in passed.checks[1:]] == ["not run: --quick"] * 3


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI on this machine")
@pytest.mark.parametrize("quick", [False, True])
def test_the_doctor_names_engines_that_do_not_answer_and_runs_nothing_else(
    tmp_path: Path, quick: bool
) -> None:
    sockets = []
    for name in ("a", "b"):
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(tmp_path / f"{name}.sock"))  # a socket file no engine listens on: refused at once
        sockets.append(sock)
    try:
        nodes = parse_nodes(f"unix://{tmp_path}/a.sock,unix://{tmp_path}/b.sock")
        engines = [NodeEngine(node) for node in nodes]
        options = DoctorOptions(image="none:none", deadlines=Deadlines(engines=10), quick=quick)
        result = run_doctor(engines, options)
    finally:
        for sock in sockets:
            sock.close()
    checks = {c.name: c for c in result.report.checks}
    assert list(checks) == list(STAGES.names())  # the report's names and order are the registry's
    assert list(checks)[:2] == ["engines", "image"] and list(checks)[-3:] == list(EXPENSIVE)
    assert checks["engines"].status == "failed"
    assert all(label in checks["engines"].reason for label in (nodes[0].label, nodes[1].label))  # both named
    assert all(c.status == "skipped" for name, c in checks.items() if name != "engines")
    assert not result.facts


def test_the_doctor_stages_are_declared_once_with_the_expensive_ones_last() -> None:
    names = STAGES.names()
    assert names[-len(EXPENSIVE) :] == EXPENSIVE  # --quick leaves out a tail: nothing cheap after them
    assert names[:3] == ("engines", "image", "addresses") and len(names) == 13
    table = STAGES.markdown_table()
    assert table.count("\n") == len(names) + 1 and "| `nccl-library` |" in table
    with pytest.raises(RunError, match=r"unknown doctor row 'ping'.*choose from engines, image"):
        STAGES.parse("ping")
