"""`cluster.doctor`: staged checks of several nodes before anything is launched, each under its own deadline.

engines -> image -> addresses (vLLM's own get_ip() in the image, per node) -> reach (every peer dials the
address each node would advertise, on the launch port) -> mtu -> versions -> sanity (Gloo all-reduce, NCCL
where GPUs exist, vLLM's MessageQueue with a remote reader). A stage that fails makes the later ones skip.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sparkforge.errors import RunError
from sparkforge.report import Check, Report
from sparkforge.run.facts import DoctorOptions, NodeFacts
from sparkforge.run.jobs import Job, Outcome, first_event, remove_jobs, run_jobs
from sparkforge.run.nodes import NodeEngine
from sparkforge.run.reach import diagnose_reach


def network_env(interface: str | None, address: str, hcas: Sequence[str] = ()) -> dict[str, str]:
    """The per-node variables that make vLLM, NCCL, Gloo, UCX and Open MPI use the cluster link."""
    env = {"VLLM_HOST_IP": address}
    if interface:
        for key in (
            "NCCL_SOCKET_IFNAME",
            "GLOO_SOCKET_IFNAME",
            "TP_SOCKET_IFNAME",
            "UCX_NET_DEVICES",
            "OMPI_MCA_btl_tcp_if_include",
        ):
            env[key] = interface
    if hcas:
        env["NCCL_IB_HCA"] = ",".join(hcas)
    return env


@dataclass
class DoctorResult:
    report: Report
    facts: list[NodeFacts]


def run_doctor(
    engines: Sequence[NodeEngine], options: DoctorOptions, echo: Callable[[str], None] = lambda _: None
) -> DoctorResult:
    """Every stage lands in the report; none raises for a cluster problem (RunError only for bad input)."""
    report = Report(command="cluster.doctor", subject=f"{len(engines)} nodes, image {options.image}")
    facts: list[NodeFacts] = []
    probes: list[Outcome] = []  # the probe containers stay up as reach listeners until the reach stage ends
    stages: list[tuple[str, Callable[[Check], None]]] = [
        ("engines", lambda c: _engines(c, engines, options)),
        ("image", lambda c: _image(c, engines, options)),
        ("addresses", lambda c: facts.extend(_addresses(c, engines, options, probes))),
        ("reach", lambda c: _reach(c, engines, facts, options)),
        ("mtu", lambda c: _mtu(c, facts)),
        ("versions", lambda c: _versions(c, facts)),
    ]
    if options.sanity:
        stages.append(("sanity", lambda c: _sanity(c, engines, facts, options)))
    blocked: str | None = None
    try:
        for name, stage in stages:
            if blocked:
                report.add(Check(name, "skipped", f"not run: stage '{blocked}' failed"))
                continue
            echo(f"doctor: {name} ...")
            with report.timed(name) as check:
                try:
                    stage(check)
                except RunError as exc:  # a node that stops answering mid-stage fails the stage, named
                    check.status, check.reason = "failed", str(exc)
            echo(f"doctor: {name} {check.status} ({check.duration_s:.1f}s) {check.reason}")
            if name == "reach":
                remove_jobs(probes)
            if check.status == "failed":
                blocked = name
    finally:
        remove_jobs(probes)
    return DoctorResult(report, facts)


# ---- stages ---------------------------------------------------------------------------------------


def _engines(check: Check, engines: Sequence[NodeEngine], options: DoctorOptions) -> None:
    problems = []
    for engine in engines:
        try:
            check.details[engine.node.label] = engine.server_version(timeout=options.deadlines.engines)
        except RunError as exc:
            problems.append(str(exc))
    if problems:
        check.status, check.reason = "failed", "; ".join(problems)
    else:
        check.reason = f"{len(engines)} engines answer ({', '.join(sorted(set(check.details.values())))})"


def _image(check: Check, engines: Sequence[NodeEngine], options: DoctorOptions) -> None:
    ids = {e.node.label: e.image_id(options.image, timeout=options.deadlines.image) for e in engines}
    check.details = {"image": options.image, "ids": ids}
    missing = [label for label, found in ids.items() if found is None]
    if missing:
        check.status = "failed"
        check.reason = (
            f"{options.image} is not on {', '.join(missing)}; fix: 'invoke cluster.up --distribute' (or "
            "'docker save | docker load' / a registry pull on those nodes)"
        )
        return
    distinct = sorted(set(ids.values()))
    if len(distinct) > 1:
        listing = ", ".join(f"{label} {found[:19]}" for label, found in ids.items())
        check.status = "failed"
        check.reason = (
            f"{options.image} is a different image on different nodes ({listing}): mixed vLLM/NCCL builds hang "
            "or crash at init; fix: distribute one image ('invoke cluster.up --distribute' streams the local "
            "one to the nodes that differ)"
        )
        return
    check.reason = f"same image ID on every node ({distinct[0][:19]})"


def _addresses(
    check: Check, engines: Sequence[NodeEngine], options: DoctorOptions, keep: list[Outcome]
) -> list[NodeFacts]:
    jobs = [Job(engine, ("probe", "--listen", str(options.master_port)), {}) for engine in engines]

    def listening(outcomes: list[Outcome]) -> bool:
        return all(
            o.exit_code is not None or first_event(o, "listening") or first_event(o, "listen-failed")
            for o in outcomes
        )

    outcomes = run_jobs(jobs, options.image, "probe", options.deadlines.addresses, until=listening, keep=True)
    keep.extend(outcomes)
    facts: list[NodeFacts] = []
    problems: list[str] = []
    for outcome in outcomes:
        node = outcome.job.engine.node
        event = first_event(outcome, "probe")
        if outcome.node_lost or event is None or "ip" not in event:
            problems.append(_rank_problem(outcome, "probe", options.deadlines.addresses))
            continue
        failed = first_event(outcome, "listen-failed")
        if failed:
            problems.append(
                f"{node.label}: port {options.master_port} is taken on {failed.get('address')} ({failed.get('error')}); "
                "fix: stop what holds it (an earlier launch? 'invoke cluster.down') or pass another --master-port"
            )
        fact = NodeFacts(
            rank=node.rank,
            label=node.label,
            auto_ip=str(event["ip"]),
            ip_source=str(event["ip_source"]),
            interfaces=list(event.get("interfaces", [])),
            infiniband=dict(event.get("infiniband", {})),
            versions=dict(event.get("versions", {})),
        )
        problem = _choose_address(fact, node.address, options.interface)
        if problem:
            problems.append(problem)
        facts.append(fact)
    check.details = {
        f.label: {
            "vllm_would_advertise": f.auto_ip,
            "source": f.ip_source,
            "default_route_interface": f.default_interface(),
            "launch_address": f.address,
            "interface": f.interface,
            "env": f.env,
        }
        for f in facts
    }
    if problems:
        check.status, check.reason = "failed", "; ".join(problems)
    else:
        check.reason = "; ".join(
            f"node{f.rank}: {f.address} on {f.interface or '?'}"
            + (
                " (vLLM's own pick: default route)"
                if not f.env
                else f" (VLLM_HOST_IP; auto-pick was {f.auto_ip})"
            )
            for f in facts
        )
    return facts


def _choose_address(fact: NodeFacts, declared: str | None, interface: str | None) -> str | None:
    names = ", ".join(f"{i['name']} {i.get('ipv4') or '-'}" for i in fact.interfaces if i["name"] != "lo")
    if interface:
        found = fact.named(interface)
        if found is None or not found.get("ipv4"):
            return (
                f"{fact.label} has no IPv4 address on interface {interface} (it has: {names}); "
                "fix: name the cluster-link interface that exists on every node"
            )
        if declared and declared != found["ipv4"]:
            return f"{fact.label}: --nodes says {declared} but {interface} holds {found['ipv4']}; fix: make them agree"
        fact.address, fact.interface = str(found["ipv4"]), interface
    elif declared:
        found = fact.interface_of(declared)
        if found is None:
            return f"{fact.label}: no interface holds the declared address {declared} (it has: {names}); fix: correct it"
        fact.address, fact.interface = declared, str(found["name"])
    else:
        fact.address = fact.auto_ip
        found = fact.interface_of(fact.auto_ip)
        fact.interface = str(found["name"]) if found else None
        return None
    hcas = [hca for hca, nets in fact.infiniband.items() if fact.interface in nets]
    fact.env = network_env(fact.interface, fact.address, hcas)
    return None


def _reach(
    check: Check, engines: Sequence[NodeEngine], facts: Sequence[NodeFacts], options: DoctorOptions
) -> None:
    diagnosis = diagnose_reach(engines, facts, options)
    check.details = diagnosis.details
    if diagnosis.problem:
        check.status, check.reason = "failed", diagnosis.problem
    else:
        check.reason = diagnosis.summary


def _mtu(check: Check, facts: Sequence[NodeFacts]) -> None:
    mtus = {}
    for fact in facts:
        found = fact.interface_of(fact.address)
        mtus[fact.label] = {"interface": fact.interface, "mtu": found.get("mtu") if found else None}
    check.details = mtus
    values = {v["mtu"] for v in mtus.values()}
    if len(values) > 1:
        listing = ", ".join(f"{label} {v['interface']} {v['mtu']}" for label, v in mtus.items())
        check.status = "failed"
        check.reason = (
            f"MTU differs across the link ({listing}): large transfers stall or fail (IBV_WC_RETRY_EXC_ERR); "
            "fix: set the same MTU on every node's link interface (e.g. 'ip link set IF mtu 9000')"
        )
    else:
        check.reason = f"MTU {values.pop()} on every node's link interface"


def _versions(check: Check, facts: Sequence[NodeFacts]) -> None:
    keys = ("python", "torch", "cuda", "nccl", "vllm")
    check.details = {f.label: {k: f.versions.get(k) for k in keys} for f in facts}
    differ = [k for k in keys if len({str(f.versions.get(k)) for f in facts}) > 1]
    if differ:
        check.status = "failed"
        check.reason = f"{', '.join(differ)} differ across nodes; fix: run the same image everywhere"
    else:
        first = facts[0].versions if facts else {}
        check.reason = ", ".join(f"{k} {first.get(k)}" for k in ("torch", "nccl", "vllm"))


def _sanity(
    check: Check, engines: Sequence[NodeEngine], facts: Sequence[NodeFacts], options: DoctorOptions
) -> None:
    by_rank = {f.rank: f for f in facts}
    master = f"{by_rank[0].address}:{options.master_port}"
    world = len(engines)
    timeout = max(options.deadlines.sanity - 5, 5)
    jobs = [
        Job(
            engine,
            (
                "sanity",
                "--rank",
                str(engine.node.rank),
                "--world",
                str(world),
                "--master",
                master,
                "--timeout",
                str(timeout),
                "--nccl",
                options.nccl,
            ),
            by_rank[engine.node.rank].env,
            gpus=options.gpus,
        )
        for engine in engines
    ]
    start = time.monotonic()
    outcomes = run_jobs(jobs, options.image, "sanity", options.deadlines.sanity)
    check.details = {
        "master": master,
        "ranks": {o.job.engine.node.label: _rank_summary(o) for o in outcomes},
        "wall_s": round(time.monotonic() - start, 2),
    }
    lost = [o for o in outcomes if o.node_lost]
    problems = [
        _rank_problem(o, "sanity", options.deadlines.sanity)
        for o in (lost or outcomes)  # a lost node explains the others' stop: name it alone
        if o.node_lost or o.exit_code != 0 or first_event(o, "finished") is None
    ]
    if problems:
        check.status = "failed"
        check.reason = " ".join(problems)
        return
    stages = sorted({str(e["stage"]) for o in outcomes for e in o.events if e.get("event") == "done"})
    check.reason = f"{world} ranks passed {', '.join(stages)} in {check.details['wall_s']} s"


def _rank_summary(outcome: Outcome) -> dict[str, Any]:
    return {
        "exit_code": outcome.exit_code,
        "node_lost": outcome.node_lost,
        "stages": [e for e in outcome.events if e.get("event") in ("done", "skipped", "failed")],
        "open_stage": outcome.open_stage(),
        "last_lines": outcome.last_lines,
    }


def _rank_problem(outcome: Outcome, what: str, deadline: float) -> str:
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
