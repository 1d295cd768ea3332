"""`cluster.doctor`: staged checks of several nodes before anything is launched, each under its own deadline.

engines -> image -> addresses (vLLM's own get_ip() in the image, per node; the fabric choice from each node's
sysfs when --interface is not given) -> paths (token, model, caches on each node) -> reach (every peer dials the
address each node would advertise, on the launch port; a don't-fragment full-MTU datagram each way) -> mtu ->
host (drivers, RemoveIPC) -> memory (MemAvailable, swap, page cache against the profile's memory plan) -> versions -> nccl-library (what each image really loads) -> sanity (Gloo all-reduce,
NCCL where GPUs exist with NCCL_DEBUG=INFO, vLLM's MessageQueue with a remote reader) -> transport (NET/IB or
NET/Socket, bus bandwidth floor). A stage that fails makes the later ones skip.

The cheap stages (engines to versions) name the usual causes of a hang in seconds; the expensive ones (a torch
import per node, then the ranks) run only after every cheap one passed, and `--quick` leaves them out. Every
stage asks all nodes at once. The sanity ranks' containers start as soon as the addresses stage chose each
node's address (ranks.py): they import torch, report the libnccl it loads (the nccl-library stage's answer) and
wait at a gate the sanity stage opens, so their imports hide behind the rest of the cheap stages and no rank dials
before those passed. With --nccl host (the ranks need the node's library mounted) the image's library is probed
in the background from the image stage on, and the ranks start in the sanity stage.

The stages are declared once, in `STAGES` at the end of this module (name, one-line help, function, in order):
the report's check names and the docs table come from it. A new stage is its function and one `Entry` line.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkforge.errors import RunError
from sparkforge.extensions import Entry, Registry
from sparkforge.report import Check, Report
from sparkforge.run.cluster import stages
from sparkforge.run.cluster.doctorflow import EXPENSIVE, Stage, run_stages
from sparkforge.run.cluster.fabric import FabricChoice, choose_all, network_env, parse_node
from sparkforge.run.cluster.fabricstate import drift, state_dir
from sparkforge.run.cluster.parallel import ring_problem
from sparkforge.run.cluster.ranks import POLL_S, HeldRanks, sanity_jobs
from sparkforge.run.cluster.reach import diagnose_reach
from sparkforge.run.cluster.topology import Topology, node_environment, read_topology, route_hints
from sparkforge.run.facts import DoctorOptions, NodeFacts
from sparkforge.run.jobs import (
    Background,
    Job,
    Outcome,
    each_node,
    first_event,
    probe_mounts,
    remove_jobs,
    run_jobs,
)
from sparkforge.run.memory.hoststage import memory_stage
from sparkforge.run.nodes import NodeEngine

__all__ = ["DoctorResult", "network_env", "run_doctor"]


@dataclass
class DoctorResult:
    report: Report
    facts: list[NodeFacts]
    topology: Topology | None = None  # the layout the topology stage read (None: it did not run)


@dataclass
class DoctorRun:
    """What one doctor run's stages share: the nodes, the options, and what the earlier stages found."""

    engines: Sequence[NodeEngine]
    options: DoctorOptions
    facts: list[NodeFacts] = field(default_factory=list)
    probes: list[Outcome] = field(default_factory=list)  # one listening probe per node, until reach ends
    df: dict[str, Any] = field(default_factory=dict)  # the reach stage's don't-fragment probes, judged by mtu
    sanity: dict[str, Any] = field(default_factory=dict)
    early: list[Background] = field(default_factory=list)  # the NCCL library probe, from the image stage on
    ranks: HeldRanks | None = None  # the sanity ranks, from the addresses stage on, held at their gate
    topology: Topology | None = None  # the layout read from every node's fabric facts (topology stage)

    @property
    def expensive(self) -> bool:
        return self.options.sanity and not self.options.quick

    @property
    def held(self) -> bool:
        """The sanity ranks start early and report the image's libnccl themselves (one torch import per node)."""
        return self.expensive and self.options.nccl_source == "image"


DoctorStage = Callable[[Check, DoctorRun], None]


def run_doctor(
    engines: Sequence[NodeEngine], options: DoctorOptions, echo: Callable[[str], None] = lambda _: None
) -> DoctorResult:
    """Every stage lands in the report; none raises for a cluster problem (RunError only for bad input)."""
    report = Report(command="cluster.doctor", subject=f"{len(engines)} nodes, image {options.image}")
    run = DoctorRun(engines, options)
    steps = [
        Stage(entry.name, lambda check, stage=entry.run: stage(check, run))
        for entry in STAGES
        if run.expensive or entry.name not in EXPENSIVE
    ]
    quick = (
        (EXPENSIVE, "--quick stops after the cheap stages (engines to versions)") if options.quick else None
    )
    try:
        run_stages(report, steps, echo, after={"reach": lambda: remove_jobs(run.probes)}, left_out=quick)
    finally:
        for background in run.early:
            background.stop()  # a cheap stage failed first: its probes are removed, not waited for
        if run.ranks:
            run.ranks.remove()  # never opened when a cheap stage failed
        remove_jobs(run.probes)
    return DoctorResult(report, run.facts, run.topology)


# ---- stages ---------------------------------------------------------------------------------------


def _engines(check: Check, engines: Sequence[NodeEngine], options: DoctorOptions) -> None:
    def version(engine: NodeEngine) -> str | RunError:
        try:
            return engine.server_version(timeout=options.deadlines.engines)
        except RunError as exc:
            return exc

    problems = []
    for engine, answer in zip(engines, each_node(version, engines), strict=True):
        if isinstance(answer, RunError):
            problems.append(str(answer))
        else:
            check.details[engine.node.label] = answer
    if problems:
        check.status, check.reason = "failed", "; ".join(problems)
    else:
        check.reason = f"{len(engines)} engines answer ({', '.join(sorted(set(check.details.values())))})"


def _image(check: Check, engines: Sequence[NodeEngine], options: DoctorOptions) -> None:
    found = each_node(lambda e: e.image_id(options.image, timeout=options.deadlines.image), engines)
    ids = {e.node.label: image_id for e, image_id in zip(engines, found, strict=True)}
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


# docker's refusal of a --mount whose source the node lacks (docker names the first one it meets).
_MISSING_SOURCE = re.compile(r"bind source path does not exist: (\S+)")


def _probe_paths(engines: Sequence[NodeEngine], options: DoctorOptions) -> list[Outcome]:
    """The probe containers, listening, with each --path entry mounted read-only where the node has it.

    Only what the probe reads is mounted, so a path the node lacks is docker's refusal to start the container:
    that path is left out of that node's mounts and the probe started again (at most once per path), and the
    paths stage then reports it as missing on that node."""
    path_args = [a for kind, path in options.paths for a in ("--path", f"{kind}={path}")]
    wanted = [path for _, path in options.paths]
    missing: list[set[str]] = [set() for _ in engines]

    def listening(outcomes: list[Outcome]) -> bool:
        return all(
            o.exit_code is not None or first_event(o, "listening") or first_event(o, "listen-failed")
            for o in outcomes
        )

    for _ in range(len(wanted) + 1):
        jobs = [
            Job(
                engine,
                ("probe", "--listen", str(options.master_port), *path_args),
                mounts=probe_mounts([p for p in wanted if p not in gone]),
            )
            for engine, gone in zip(engines, missing, strict=True)
        ]
        outcomes = run_jobs(
            jobs, options.image, "probe", options.deadlines.addresses, until=listening, keep=True
        )
        again = False
        for outcome, gone in zip(outcomes, missing, strict=True):
            found = _MISSING_SOURCE.search(outcome.node_lost or "")
            path = found.group(1).rstrip(".") if found else None
            if path in wanted and path not in gone:
                gone.add(path)
                again = True
        if not again:
            return outcomes
        remove_jobs(outcomes)  # the nodes that started listen again with the others
    return outcomes


def _addresses(
    check: Check, engines: Sequence[NodeEngine], options: DoctorOptions, keep: list[Outcome]
) -> list[NodeFacts]:
    outcomes = _probe_paths(engines, options)
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
            fabric=dict(event.get("fabric", {})),
            host=dict(event.get("host", {})),
        )
        facts.append(fact)
    declared = [fact_node_address(engines, f) for f in facts]
    nodes = [parse_node(f.label, f.fabric) for f in facts]
    choices = choose_all(nodes, options.interface, declared, options.gid_index)
    for fact, choice in zip(facts, choices, strict=False):
        problem = _choose_address(fact, choice)
        if problem:
            problems.append(problem)
    problems += [p for f in facts if (p := _verbs_problem(f))]
    root = Path(options.state_dir) if options.state_dir else state_dir()
    keys = [next(e.node.key or e.node.target for e in engines if e.node.rank == f.rank) for f in facts]
    drifted = drift(keys, nodes, choices, root, save=not problems)
    if facts and drifted:
        facts[0].warnings.extend(drifted)
    check.details = {
        f.label: {
            "vllm_would_advertise": f.auto_ip,
            "source": f.ip_source,
            "default_route_interface": f.default_interface(),
            "launch_address": f.address,
            "interface": f.interface,
            "env": f.env,
            "rdma": f.rdma,
            "fabric": choice.to_dict(),
            "warnings": f.warnings,
        }
        for f, choice in zip(facts, choices, strict=False)
    }
    warnings = [w for f in facts for w in f.warnings]
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
        if warnings:
            check.reason += "; warning: " + "; ".join(warnings)
    return facts


def _verbs_problem(fact: NodeFacts) -> str | None:
    """RDMA devices on the node but no verbs library in the image: NCCL would silently use TCP sockets."""
    found = fact.fabric.get("verbs")
    if not fact.rdma or not isinstance(found, dict) or (found.get("libibverbs") and found.get("mlx5")):
        return None
    what = (
        "libibverbs.so.1 does not load"
        if not found.get("libibverbs")
        else "the mlx5 verbs provider is missing"
    )
    return (
        f"{fact.label}: the node has RDMA devices ({', '.join(sorted(fact.fabric.get('rdma', {})))}) but in the "
        f"image {what} ({found.get('error') or 'ibverbs-providers not installed'}): NCCL would log 'Failed to open "
        "libibverbs' and run over TCP sockets; fix: pin the RDMA userspace in the recipe (runtime.rdma, as "
        "recipes/_gb10.yaml does) and rebuild the image"
    )


def fact_node_address(engines: Sequence[NodeEngine], fact: NodeFacts) -> str | None:
    return next((e.node.address for e in engines if e.node.rank == fact.rank), None)


def _choose_address(fact: NodeFacts, choice: FabricChoice) -> str | None:
    """The launch address and env: the fabric's choice (--interface, a declared address, the CX-7 port, a shared
    subnet), else vLLM's own pick. A declared `host=ADDR` goes through the same decision as a discovered node."""
    fact.warnings = list(choice.warnings)
    if choice.error:
        return choice.error
    if choice.interface:
        fact.address, fact.interface, fact.env = str(choice.address), choice.interface, dict(choice.env)
        return None
    fact.address = fact.auto_ip
    found = fact.interface_of(fact.auto_ip)
    fact.interface = str(found["name"]) if found else None
    return None


def _reach(
    check: Check,
    engines: Sequence[NodeEngine],
    facts: Sequence[NodeFacts],
    options: DoctorOptions,
    probes: Sequence[Outcome],
) -> dict[str, Any]:
    diagnosis = diagnose_reach(engines, facts, options, probes)  # dialled from inside the probe containers
    check.details = diagnosis.details
    if diagnosis.problem:
        check.status, check.reason = "failed", diagnosis.problem
    else:
        check.reason = diagnosis.summary
        if diagnosis.warnings:
            check.reason += "; warning: " + "; ".join(diagnosis.warnings)
    return dict(diagnosis.details.get("dont_fragment", {}))


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
    check: Check,
    engines: Sequence[NodeEngine],
    facts: Sequence[NodeFacts],
    options: DoctorOptions,
    held: HeldRanks | None = None,
) -> dict[str, Any]:
    """`held`: the ranks already started (imported, waiting at their gate): opened here; else started here."""
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
        _rank_problem(o, "sanity", options.deadlines.sanity)
        for o in (lost or outcomes)  # a lost node explains the others' stop: name it alone
        if o.node_lost or o.exit_code != 0 or first_event(o, "finished") is None
    ]
    if problems:
        check.status = "failed"
        check.reason = " ".join(problems)
        return check.details
    done = sorted({str(e["stage"]) for o in outcomes for e in o.events if e.get("event") == "done"})
    world = len(engines)
    check.reason = f"{world} ranks passed {', '.join(done)} in {check.details['wall_s']} s"
    return check.details


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


# ---- the registry: each stage declared once, in the order it runs (report names and docs come from here) ----


def _image_stage(check: Check, run: DoctorRun) -> None:
    _image(check, run.engines, run.options)
    if check.status == "passed" and run.expensive and not run.held:
        # --nccl host: the ranks need the node's library mounted (known after the nccl-library stage), so they
        # start there; the image's library is probed here, in the background, behind the cheap stages.
        engines, options = run.engines, run.options
        run.early.append(Background(lambda cancel: stages.nccl_probe(engines, options, {}, cancel=cancel)))


def _addresses_stage(check: Check, run: DoctorRun) -> None:
    run.facts.extend(_addresses(check, run.engines, run.options, run.probes))
    if check.status == "passed" and run.held:  # their torch import hides behind the rest of the cheap stages
        run.ranks = HeldRanks(run.engines, run.facts, run.options)


def _reach_stage(check: Check, run: DoctorRun) -> None:
    run.df.update(_reach(check, run.engines, run.facts, run.options, run.probes))
    topo = run.topology
    hints = route_hints(topo, [f.address for f in run.facts]) if topo else []
    if check.status == "failed" and topo and hints:
        check.reason += (
            f" On this {topo.layout} layout the advertised addresses need routes "
            "(the topology stage's): " + "; ".join(hints)
        )


def _topology(check: Check, run: DoctorRun) -> None:
    """The layout every node's fabric facts show (checked against --layout), or each miswiring named; on a layout
    with two cables per node, each node's launch env gains every fabric interface and NCCL's layout settings."""
    options = run.options
    nodes = [parse_node(f.label, f.fabric) for f in run.facts]
    try:
        topo = read_topology(nodes, options.layout)
    except RunError as exc:
        check.status, check.reason = "failed", str(exc)
        return
    run.topology = topo
    check.details = topo.to_dict()
    variant = str((options.nccl_pin or {}).get("variant") or "stock")
    # two nodes: the mtu stage judges the link's MTU, with its don't-fragment probes as proof
    problems = [p for p in topo.problems if len(nodes) > 2 or not p.startswith("MTU mismatch")]
    ring = ring_problem(options.parallel[0], topo.layout, variant == "switchless")
    problems += [ring] if ring else []
    if problems:
        check.status, check.reason = "failed", "; ".join(problems)
        return
    for i, fact in enumerate(run.facts):
        added = node_environment(topo, i)
        fact.env.update(added)
        if added:
            check.details.setdefault("env", {})[fact.label] = added
    warnings = list(topo.warnings)
    routes = route_hints(topo, [f.address for f in run.facts])
    if routes:
        check.details["routes"] = routes
        warnings.append(
            "a node's advertised address is on no subnet some peer shares (vLLM's rendezvous and message queue "
            "dial it; the reach stage proves it); fix: these routes, in each node's netplan file (routes:): "
            + "; ".join(routes)
        )
    check.reason = topo.reason() + ("; warning: " + "; ".join(warnings) if warnings else "")


def _nccl_library(check: Check, run: DoctorRun) -> None:
    probed = run.ranks.library() if run.ranks else (run.early[0].result() if run.early else None)
    stages.nccl_library(check, run.engines, run.options, run.facts, probed)


STAGES: Registry[DoctorStage] = Registry(
    "doctor",
    "cluster.doctor",
    [
        Entry(
            "engines",
            "every node's container engine answers (its version)",
            lambda c, r: _engines(c, r.engines, r.options),
        ),
        Entry("image", "the image is on every node, with one image ID everywhere", _image_stage),
        Entry(
            "addresses",
            "the address vLLM would advertise on each node; the fabric interface chosen",
            _addresses_stage,
        ),
        Entry(
            "topology",
            "the layout the cabling shows (pair, mesh3, ring, switch) or what is miswired",
            _topology,
        ),
        Entry(
            "paths",
            "the token file, model and cache directories given are there on every node",
            lambda c, r: stages.paths(c, r.facts, r.probes, r.options),
        ),
        Entry(
            "reach",
            "every peer dials the address each node would advertise, on the launch port",
            _reach_stage,
        ),
        Entry(
            "mtu",
            "one MTU on the link; a full-MTU don't-fragment packet gets through both ways",
            lambda c, r: stages.mtu(c, r.facts, r.df),
        ),
        Entry(
            "host",
            "host driver versions alike on every node; logind's RemoveIPC",
            lambda c, r: stages.host(c, r.facts),
        ),
        Entry(
            "memory",
            "free memory, swap and page cache against the profile's memory plan",
            lambda c, r: memory_stage(c, r.facts, r.options.memory_plan),
        ),
        Entry(
            "versions",
            "Python, torch, CUDA, NCCL and vLLM are the same on every node",
            lambda c, r: _versions(c, r.facts),
        ),
        Entry(
            "nccl-library",
            "path, version and sha256 of the libnccl each node's image really loads",
            _nccl_library,
        ),
        Entry(
            "sanity",
            "one rank per node: Gloo all-reduce, NCCL with GPUs, vLLM's MessageQueue",
            lambda c, r: r.sanity.update(_sanity(c, r.engines, r.facts, r.options, r.ranks)),
        ),
        Entry(
            "transport",
            "the transport NCCL chose (NET/IB or sockets) and its bus bandwidth floor",
            lambda c, r: stages.transport(c, r.facts, r.sanity, r.options),
        ),
    ],
    RunError,
)
