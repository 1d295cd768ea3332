"""The doctor's sanity ranks, started before they are needed: one container per node imports torch, reports the
libnccl it loads (the nccl-library stage's answer) and vLLM's queue module while the cheap stages run, then
waits at a gate; the sanity stage opens it once every cheap stage passed, so no rank dials anyone before the
stages that name a wrong address, interface or MTU have (a cheap stage that fails removes them unopened).

The ranks' resolver answers no at once (`NO_DNS`): they dial IP addresses only, but torch's c10d formats each
socket's peer with a reverse lookup (getnameinfo), and a node whose DNS server does not answer waits out its
timeout per connection (6-9 s of the rendezvous on the namespaced test cluster, whose nodes cannot reach the
machine's DNS server), though nothing the ranks check depends on a name.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sparkforge.report import Check
from sparkforge.run.cluster.stages import NCCL_DEBUG_ENV, NcclFound, library_answers
from sparkforge.run.facts import DoctorOptions, NodeFacts
from sparkforge.run.jobs import (
    Background,
    Job,
    Outcome,
    first_event,
    open_gate,
    remove_jobs,
    run_jobs,
    start_jobs,
    wait_jobs,
)
from sparkforge.run.nodes import NodeEngine

GATE = "/tmp/sparkforge-gate"  # inside each rank's container: the file the sanity stage creates
NO_DNS = ("127.0.0.1",)  # no name server there: a lookup is refused at once instead of timing out
POLL_S = 0.2  # how often the stages look at the ranks (docker inspect per node)


def sanity_jobs(
    engines: Sequence[NodeEngine], facts: Sequence[NodeFacts], options: DoctorOptions, *, gated: bool
) -> list[Job]:
    """One rank per node on the launch addresses and env the addresses stage chose; `gated`: it imports first
    (reporting its libnccl) and waits for the gate before the rendezvous."""
    by_rank = {f.rank: f for f in facts}
    master = f"{by_rank[0].address}:{options.master_port}"
    timeout = max(options.deadlines.sanity - 5, 5)
    # The gate stays shut through the cheap stages after addresses (reach's deadline) and the nccl-library wait;
    # the doctor removes the ranks itself, so the rank's own limit only ends a container the doctor left behind.
    gate_timeout = options.deadlines.reach + 2 * options.deadlines.sanity
    held = ("--gate", GATE, "--library", "--gate-timeout", f"{gate_timeout:g}") if gated else ()
    return [
        Job(
            engine,
            (
                "sanity",
                "--rank",
                str(engine.node.rank),
                "--world",
                str(len(engines)),
                "--master",
                master,
                "--timeout",
                str(timeout),
                "--nccl",
                options.nccl,
                *held,
            ),
            {**by_rank[engine.node.rank].env, **(NCCL_DEBUG_ENV if options.gpus else {})},
            gpus=options.gpus,
            rdma=by_rank[engine.node.rank].rdma,
            mounts=tuple(by_rank[engine.node.rank].mounts),
            dns=NO_DNS,
        )
        for engine in engines
    ]


class HeldRanks:
    """The ranks started in the background (`start`), read for their libnccl (`library`), then let through the
    gate and waited for (`run`); `remove` whatever happened."""

    def __init__(
        self, engines: Sequence[NodeEngine], facts: Sequence[NodeFacts], options: DoctorOptions
    ) -> None:
        self.options = options
        jobs = sanity_jobs(engines, facts, options, gated=True)
        self._started = Background(lambda _cancel: start_jobs(jobs, options.image, "sanity"))
        self._outcomes: list[Outcome] | None = None
        self._removed = False

    def outcomes(self) -> list[Outcome]:
        """The started ranks (waiting for their start, which raises what it raised)."""
        if self._outcomes is None:
            self._outcomes = self._started.result()
        return self._outcomes

    def library(self) -> NcclFound:
        """Each rank's libnccl report (it comes after the torch import), within the sanity deadline."""
        outcomes = self.outcomes()

        def answered(found: list[Outcome]) -> bool:
            return all(
                o.node_lost or o.exit_code is not None or first_event(o, "nccl-library") for o in found
            )

        if not answered(outcomes):
            wait_jobs(outcomes, self.options.deadlines.sanity, until=answered, poll_s=POLL_S)
        return library_answers(outcomes)

    def run(self) -> tuple[list[Outcome], dict[str, Any]]:
        """Open the gate on every node and wait for the ranks to end (the sanity deadline); then remove them.
        Also where the stage's time went: opening the gate, the ranks' run until their exit was seen, the
        removal; per rank its head start, its imports before the gate, its wait there and its run after it."""
        outcomes = self.outcomes()
        times: dict[str, float] = {}
        try:
            opened = time.monotonic()
            open_gate(outcomes, GATE)
            times["open_s"] = round(time.monotonic() - opened, 2)
            wait_jobs(outcomes, self.options.deadlines.sanity, poll_s=POLL_S)
            times["ran_s"] = round(time.monotonic() - opened - times["open_s"], 2)
        finally:
            removing = time.monotonic()
            self.remove()
            times["remove_s"] = round(time.monotonic() - removing, 2)
        ranks = {
            o.job.engine.node.label: {
                "started_before_s": round(opened - o.started, 2),  # the rank's head start
                "ready_s": (first_event(o, "gated") or {}).get("seconds"),  # its imports, before the gate
                "waited_s": (first_event(o, "opened") or {}).get("waited_s"),  # then at the gate
                "after_gate_s": _between(first_event(o, "opened"), first_event(o, "finished")),
            }
            for o in outcomes
        }
        return outcomes, {**times, "ranks": ranks}

    def remove(self) -> None:
        """Remove the ranks on every node that answers (a cheap stage failed, or they ran)."""
        if self._removed:
            return
        self._removed = True
        try:
            outcomes = self.outcomes()
        except Exception:  # the start itself failed: start_jobs removed what it had started
            return
        remove_jobs(outcomes)


def _between(first: dict[str, Any] | None, last: dict[str, Any] | None) -> float | None:
    """Seconds between two of a rank's events (its own clock), None when either is missing."""
    if not first or not last:
        return None
    return round(float(last["t"]) - float(first["t"]), 3)


@dataclass(frozen=True)
class Sanity:
    """The sanity stage's record: the master, each rank's stages and NCCL lines (the transport stage reads them)."""

    details: dict[str, Any]


def sanity(
    check: Check,
    engines: Sequence[NodeEngine],
    facts: Sequence[NodeFacts],
    options: DoctorOptions,
    held: HeldRanks | None = None,
) -> Sanity:
    """One rank per node: Gloo all-reduce, NCCL with GPUs, vLLM's MessageQueue. `held`: the ranks already
    started (imported, waiting at their gate): opened here; else started here."""
    start = time.monotonic()
    if held is not None:
        outcomes, gate = held.run()
    else:
        jobs = sanity_jobs(engines, facts, options, gated=False)
        outcomes, gate = (
            run_jobs(jobs, options.image, "sanity", options.deadlines.sanity, poll_s=POLL_S),
            None,
        )
    by_rank = {f.rank: f for f in facts}
    check.details = {
        "master": f"{by_rank[0].address}:{options.master_port}",
        "ranks": {o.job.engine.node.label: _rank_summary(o) for o in outcomes},
        "wall_s": round(time.monotonic() - start, 2),
        **({"gate": gate} if gate else {}),
    }
    lost = [o for o in outcomes if o.node_lost]
    problems = [
        rank_problem(o, "sanity", options.deadlines.sanity)
        for o in (lost or outcomes)  # a lost node explains the others' stop: name it alone
        if o.node_lost or o.exit_code != 0 or first_event(o, "finished") is None
    ]
    if problems:
        check.status = "failed"
        check.reason = " ".join(problems)
        return Sanity(check.details)
    done = sorted({str(e["stage"]) for o in outcomes for e in o.events if e.get("event") == "done"})
    check.reason = f"{len(engines)} ranks passed {', '.join(done)} in {check.details['wall_s']} s"
    return Sanity(check.details)


def _rank_summary(outcome: Outcome) -> dict[str, Any]:
    return {
        "exit_code": outcome.exit_code,
        "seconds": outcome.seconds,
        "node_lost": outcome.node_lost,
        "stages": [e for e in outcome.events if e.get("event") in ("done", "skipped", "failed")],
        "open_stage": outcome.open_stage(),
        "last_lines": outcome.last_lines,
        "nccl_lines": [
            line
            for line in outcome.lines
            if "NCCL INFO" in line and any(k in line for k in ("NET/", "Using network", "libibverbs"))
        ][:20],
    }


def rank_problem(outcome: Outcome, what: str, deadline: float) -> str:
    """One paragraph on a rank (or probe) that was lost, stuck or failed: the node, the stage, the last lines."""
    node = outcome.job.engine.node
    who = f"rank {node.rank} ({node.label})"
    if outcome.node_lost:
        return (
            f"{who} was lost during the {what}: {outcome.node_lost}. Its containers on the other nodes were "
            "removed; fix: bring the node back (engine, power, network) and rerun the doctor."
        )
    stage = outcome.open_stage()
    tail = outcome.last_lines.replace("\n", " | ")[-600:]
    if outcome.exit_code is None:
        where = f"stuck in stage '{stage}'" if stage else "never reported a stage (slow start or import)"
        return f"{who} did not finish the {what} within {deadline:g} s: {where}. Last lines: {tail}"
    where = f" in stage '{stage}'" if stage else ""
    return f"{who} failed the {what}{where} (exit {outcome.exit_code}). Last lines: {tail}"
