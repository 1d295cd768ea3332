"""The doctor's flow: stages in order behind the first failure, --quick, and per-node calls run at once.

Real threads and real processes: each_node runs `sleep` processes; the doctor is pointed at real unix sockets
where no engine answers, through the real docker CLI."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.errors import RunError
from sparkforge.extensions import Entry, Registry
from sparkforge.report import Check, Report
from sparkforge.run.cluster.doctor import STAGES, run_doctor
from sparkforge.run.cluster.doctorflow import DoctorPlan, DoctorStage, Found, check_order, run_stages
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


@dataclass(frozen=True)
class Seen:
    """A test stage's typed result: which stage gave it and the results it read."""

    by: str
    read: tuple[str, ...] = ()


@dataclass(frozen=True)
class Later:
    by: str


def _call(name: str, log: list[str], status: str, error: str, needs: tuple[type, ...], gives: type | None):
    def run(check: Check, plan: DoctorPlan, found: Found) -> object:
        read = tuple(found[kind].by for kind in needs)  # only what it declared: anything else is a KeyError
        log.append(name)
        if error:
            raise RunError(error)
        check.status, check.reason = status, f"{name} {status}"
        return gives(name, read) if gives is Seen else (gives(name) if gives else None)

    return run


def _registry(*rows: tuple[str, dict]) -> Registry:
    log: list[str] = []
    entries = []
    for name, spec in rows:
        needs, gives = spec.get("needs", ()), spec.get("gives")
        call = _call(name, log, spec.get("status", "passed"), spec.get("error", ""), needs, gives)
        entries.append(
            Entry(name, f"test stage {name}", DoctorStage(call, gives, needs, spec.get("expensive", False)))
        )
    registry = Registry("doctor", "cluster.doctor", entries, RunError)
    registry.log = log  # type: ignore[attr-defined]
    return registry


QUIET = Session(echo=lambda _: None, runner=Runner())


def _plan(**options: object) -> DoctorPlan:
    return DoctorPlan((), DoctorOptions(image="test:1", **options))  # type: ignore[arg-type]


def test_stages_run_in_the_registrys_order_and_the_first_failure_skips_the_rest() -> None:
    echoed: list[str] = []
    registry = _registry(
        ("engines", {"gives": Seen}),
        ("reach", {"needs": (Seen,), "gives": Later}),
        ("mtu", {"needs": (Later,), "status": "failed"}),
        ("host", {}),
        ("sanity", {"expensive": True}),
    )
    report = Report(command="cluster.doctor", subject="test")
    found = run_stages(Session(echo=echoed.append, runner=Runner()), report, _plan(), registry)
    assert registry.log == list(registry.names())[:3]  # type: ignore[attr-defined]
    assert [c.name for c in report.checks] == list(registry.names())
    assert [c.status for c in report.checks] == ["passed", "passed", "failed", "skipped", "skipped"]
    assert report.checks[-1].reason == "not run: stage 'mtu' failed"
    assert found.results() == (Seen("engines"), Later("reach"))  # typed results, each from its stage
    count = len(registry)
    assert [line.split(" (")[0] for line in echoed] == [
        f"doctor: 1/{count} engines ...", "doctor: engines passed",
        f"doctor: 2/{count} reach ...", "doctor: reach passed",
        f"doctor: 3/{count} mtu ...", "doctor: mtu failed",
    ]  # fmt: skip


@pytest.fixture
def dead_engines(tmp_path: Path) -> Iterator[tuple[NodeEngine, ...]]:
    """Two nodes whose engine sockets exist but where no engine answers: refused at once."""
    sockets = []
    for name in ("a", "b"):
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(tmp_path / f"{name}.sock"))
        sockets.append(sock)
    try:
        yield tuple(NodeEngine(n) for n in parse_nodes(f"unix://{tmp_path}/a.sock,unix://{tmp_path}/b.sock"))
    finally:
        for sock in sockets:
            sock.close()


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI on this machine")
def test_a_stage_registered_beside_the_real_ones_runs_in_its_place_with_what_it_needs(
    dead_engines: tuple[NodeEngine, ...],
) -> None:
    """Adding a stage is one registry line: here one is put first in the real registry and run against two nodes
    whose engines do not answer: it runs in its place, before the engines stage, which then fails the rest."""
    ran: list[tuple[str, ...]] = []

    def ping(check: Check, plan: DoctorPlan, found: Found) -> Later:
        ran.append(tuple(e.node.label for e in plan.engines))
        check.reason = "pinged"
        return Later("ping")

    entries = list(STAGES)
    entries.insert(0, Entry("ping", "a stage added in a test", DoctorStage(ping, Later)))
    registry = Registry("doctor", "cluster.doctor", entries, RunError)
    report = Report(command="cluster.doctor", subject="test")
    nodes = dead_engines
    plan = DoctorPlan(nodes, DoctorOptions(image="none:none", deadlines=Deadlines(engines=10)))
    found = run_stages(QUIET, report, plan, registry)
    assert [c.name for c in report.checks] == list(registry.names())
    assert ran == [tuple(e.node.label for e in nodes)] and found.results() == (Later("ping"),)
    statuses = {c.name: c.status for c in report.checks}
    assert statuses["ping"] == "passed" and statuses[registry.names()[1]] == "failed"  # the engines stage


def test_a_node_lost_mid_stage_fails_that_stage_and_quick_reports_the_expensive_ones_as_not_run() -> None:
    registry = _registry(
        ("engines", {}),
        ("addresses", {"error": "node1: engine gone"}),
        ("sanity", {"expensive": True}),
        ("transport", {"expensive": True}),
    )
    report = Report(command="cluster.doctor", subject="test")
    run_stages(QUIET, report, _plan(quick=True), registry)
    assert [(c.name, c.status) for c in report.checks] == [
        ("engines", "passed"), ("addresses", "failed"), ("sanity", "skipped"), ("transport", "skipped"),
    ]  # fmt: skip
    assert report.checks[1].reason == "node1: engine gone"
    assert report.checks[2].reason == "not run: stage 'addresses' failed"
    cheap = [e.name for e in registry if not e.run.expensive]
    passed = Report(command="cluster.doctor", subject="test")
    run_stages(QUIET, passed, _plan(quick=True), _registry(("engines", {}), ("sanity", {"expensive": True})))
    assert passed.checks[-1].reason == "not run: --quick stops after the cheap stages (engines to engines)"
    assert cheap == ["engines", "addresses"]
    without = Report(command="cluster.doctor", subject="test")
    run_stages(QUIET, without, _plan(sanity=False), registry)
    assert [
        c.name for c in without.checks
    ] == cheap  # no sanity run asked for: the expensive ones are not shown


def test_a_stage_that_needs_what_no_earlier_stage_gives_is_refused_before_anything_runs() -> None:
    later = _registry(("mtu", {"needs": (Later,)}), ("reach", {"gives": Later}))
    with pytest.raises(ValueError, match="'mtu' needs Later, which no earlier stage gives"):
        run_stages(QUIET, Report(command="t", subject="t"), _plan(), later)
    assert later.log == []  # type: ignore[attr-defined]
    cheap = _registry(("sanity", {"gives": Later, "expensive": True}), ("mtu", {"needs": (Later,)}))
    with pytest.raises(ValueError, match="'mtu' is cheap but needs Later of the expensive 'sanity'"):
        check_order(cheap)


def test_results_that_hold_containers_are_released_whatever_happened() -> None:
    released: list[str] = []

    @dataclass(frozen=True)
    class Held:
        by: str

        def release(self) -> None:
            released.append(self.by)

    def holds(name: str, error: str = ""):
        kind = type(f"Held{name}", (Held,), {})  # one result type per stage

        def run(check: Check, plan: DoctorPlan, found: Found) -> Held:
            if error:
                raise KeyboardInterrupt  # the user stopped the doctor mid-stage
            return kind(name)

        return DoctorStage(run, kind)

    entries = [Entry("a", "a", holds("a")), Entry("b", "b", holds("b")), Entry("c", "c", holds("c", "stop"))]
    with pytest.raises(KeyboardInterrupt):
        run_stages(
            QUIET,
            Report(command="t", subject="t"),
            _plan(),
            Registry("doctor", "x", entries, RunError),
        )
    assert released == ["b", "a"]  # the latest first, though the run was interrupted


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI on this machine")
@pytest.mark.parametrize("quick", [False, True])
def test_the_doctor_names_engines_that_do_not_answer_and_runs_nothing_else(
    dead_engines: tuple[NodeEngine, ...], quick: bool
) -> None:
    options = DoctorOptions(image="none:none", deadlines=Deadlines(engines=10), quick=quick)
    result = run_doctor(Session(echo=lambda _: None, runner=Runner()), DoctorPlan(dead_engines, options))
    nodes = [e.node for e in dead_engines]
    checks = {c.name: c for c in result.report.checks}
    assert list(checks) == list(STAGES.names())  # the report's names and order are the registry's
    first = STAGES.names()[0]
    assert checks[first].status == "failed"
    assert all(label in checks[first].reason for label in (nodes[0].label, nodes[1].label))  # both named
    assert all(c.status == "skipped" for name, c in checks.items() if name != first)
    assert not result.facts


def test_the_doctor_registry_holds_its_order_and_the_expensive_stages_run_last() -> None:
    check_order(
        STAGES
    )  # every stage's needs are given by an earlier one; no cheap stage needs an expensive one
    expensive = [e.run.expensive for e in STAGES]
    assert any(expensive) and expensive == sorted(expensive)  # --quick leaves out a tail: nothing cheap after
    table = STAGES.markdown_table()
    assert table.count("\n") == len(STAGES) + 1 and all(f"| `{name}` |" in table for name in STAGES.names())
    with pytest.raises(
        RunError, match=rf"unknown doctor row 'ping'.*choose from {', '.join(STAGES.names())}"
    ):
        STAGES.parse("ping")
