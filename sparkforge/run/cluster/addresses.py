"""The doctor's addresses stage: a probe container listens on every node (vLLM's own get_ip(), the node's sysfs
fabric facts, the paths asked for), and each node's launch address and env are chosen from those facts (the fabric
choice when --interface is not given). With the sanity run asked for, the ranks start here, held at their gate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sparkforge.report import Check
from sparkforge.run.cluster.doctorflow import DoctorPlan, Found
from sparkforge.run.cluster.fabric import FabricChoice, choose_all, parse_node
from sparkforge.run.cluster.fabricstate import drift, state_dir
from sparkforge.run.cluster.ranks import HeldRanks, rank_problem
from sparkforge.run.facts import DoctorOptions, NodeFacts
from sparkforge.run.jobs import Job, Outcome, first_event, probe_mounts, remove_jobs, run_jobs
from sparkforge.run.nodes import NodeEngine

# docker's refusal of a --mount whose source the node lacks (docker names the first one it meets).
_MISSING_SOURCE = re.compile(r"bind source path does not exist: (\S+)")


class Probes:
    """The listening probe containers, one per node: the paths and reach stages read them; removed once (after
    the reach stage, or when the doctor ends)."""

    def __init__(self, outcomes: list[Outcome]) -> None:
        self.outcomes = tuple(outcomes)
        self._removed = False

    def remove(self) -> None:
        if not self._removed:
            self._removed = True
            remove_jobs(self.outcomes)


@dataclass(frozen=True)
class Addresses:
    """Each node's facts with its launch address and env, the probes still listening, the ranks held early."""

    facts: tuple[NodeFacts, ...]
    probes: Probes
    ranks: HeldRanks | None = None

    def onto(self, facts: tuple[NodeFacts, ...]) -> tuple[NodeFacts, ...]:
        return self.facts  # the first facts of the run: what the later stages add goes onto these

    def release(self) -> None:
        if self.ranks:
            self.ranks.remove()  # never opened when a cheap stage failed
        self.probes.remove()


def addresses_stage(check: Check, plan: DoctorPlan, found: Found) -> Addresses:
    probes = Probes(_probe_paths(plan.engines, plan.options))
    try:
        facts = _addresses(check, plan.engines, plan.options, probes.outcomes)
    except BaseException:
        probes.remove()
        raise
    held = (
        check.status == "passed" and plan.held
    )  # their torch import hides behind the rest of the cheap stages
    return Addresses(tuple(facts), probes, HeldRanks(plan.engines, facts, plan.options) if held else None)


def _probe_paths(engines: tuple[NodeEngine, ...], options: DoctorOptions) -> list[Outcome]:
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
    check: Check, engines: tuple[NodeEngine, ...], options: DoctorOptions, outcomes: tuple[Outcome, ...]
) -> list[NodeFacts]:
    facts: list[NodeFacts] = []
    problems: list[str] = []
    for outcome in outcomes:
        node = outcome.job.engine.node
        event = first_event(outcome, "probe")
        if outcome.node_lost or event is None or "ip" not in event:
            problems.append(rank_problem(outcome, "probe", options.deadlines.addresses))
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
    declared = [_declared_address(engines, f) for f in facts]
    nodes = [parse_node(f.label, f.fabric) for f in facts]
    choices = choose_all(nodes, options.interface, declared, options.gid_index)
    for fact, choice in zip(facts, choices, strict=False):
        problem = _choose_address(fact, choice)
        if problem:
            problems.append(problem)
    problems += [p for f in facts if (p := verbs_problem(f))]
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


def verbs_problem(fact: NodeFacts) -> str | None:
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


def _declared_address(engines: tuple[NodeEngine, ...], fact: NodeFacts) -> str | None:
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
