"""`cluster.fabric`: each node's RDMA devices, ports, twins, GID choice and the environment a launch would set.

The facts come from the doctor's in-image readers (`fabric()` in tests/image/cluster_facts.py): in a probe
container on each node (the container's own /sys: with host networking it shows the node's devices), or, without
--nodes, run here on this machine's /sys or on the tree SPARKFORGE_SYSFS names (its `proc/net/route` beside it).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from sparkforge.console import cell
from sparkforge.context import Session
from sparkforge.errors import RunError
from sparkforge.report import Check, Report
from sparkforge.run.cluster.fabric import FabricChoice, choose_all, describe_ports, parse_node, twins
from sparkforge.run.cluster.rdma import NodeFabric
from sparkforge.run.cluster.stages import NcclSource, host_source, nccl_probe
from sparkforge.run.cluster.topology import nccl_environment, read_topology
from sparkforge.run.facts import DoctorOptions
from sparkforge.run.jobs import FACTS_SCRIPT, Job, first_event, run_jobs
from sparkforge.run.nodes import NodeEngine

if TYPE_CHECKING:
    from sparkforge.run.cluster.clusterplan import ClusterPlan, FabricSettings

SYSFS_ENV = "SPARKFORGE_SYSFS"


def _helper() -> ModuleType:
    """The in-image readers as a module: the same code reads here and in every probe container."""
    spec = importlib.util.spec_from_file_location("sparkforge_cluster_facts", FACTS_SCRIPT)
    if spec is None or spec.loader is None:
        raise RunError(f"{FACTS_SCRIPT}: cannot load the doctor's in-image readers")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def local_facts(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """This machine's raw facts, or the tree's when SPARKFORGE_SYSFS is set (then every address is a GID's)."""
    root = (environ if environ is not None else os.environ).get(SYSFS_ENV)
    if not root:
        return dict(_helper().fabric())
    path = Path(root)
    if not (path / "class").is_dir():
        raise RunError(
            f"{SYSFS_ENV}={root} is not a sysfs tree (no class/ under it); fix: point it at a directory laid out "
            "like /sys (class/infiniband, class/net), with proc/net/route beside it, or unset it"
        )
    return dict(_helper().fabric(str(path), str(path.parent / "proc"), False))


def remote_facts(engines: Sequence[NodeEngine], image: str, deadline_s: float = 60) -> list[dict[str, Any]]:
    """Each node's raw facts, read by the helper in a short-lived container of `image` on that node."""
    outcomes = run_jobs([Job(e, ("fabric",)) for e in engines], image, "fabric", deadline_s)
    found = []
    for outcome in outcomes:
        event = first_event(outcome, "fabric")
        if outcome.node_lost or event is None:
            why = outcome.node_lost or outcome.last_lines.replace("\n", " | ")[-400:]
            raise RunError(
                f"{outcome.job.engine.node.label}: the fabric probe gave no answer ({why}); fix: check that the "
                f"node's engine answers and holds {image} ('invoke cluster.doctor' names the stage)"
            )
        found.append(dict(event["facts"]))
    return found


def local_nccl() -> dict[str, Any]:
    """--nccl host here: this machine's own libnccl (the tree's, under SPARKFORGE_SYSFS's parent: the node's /);
    no image is read without --nodes, so `image` is None (its ABI check is skipped)."""
    root = os.environ.get(SYSFS_ENV)
    return {"host": _helper().host_nccl(str(Path(root).parent) if root else "/"), "image": None}


def remote_nccl(engines: Sequence[NodeEngine], image: str) -> list[dict[str, Any]]:
    """--nccl host on each node: the doctor's nccl-library probe, with the node's / mounted to read its own."""
    found, problems = nccl_probe(engines, DoctorOptions(image=image), {}, host_root=True)
    if problems:
        raise RunError(
            "; ".join(problems) + f"; fix: check that each node's engine answers and holds {image} "
            "('invoke cluster.doctor --nccl host' names the stage)"
        )
    return [{"host": found[e.node.label].get("host"), "image": found[e.node.label]} for e in engines]


def nccl_sources(
    labels: Sequence[str], source: str, libraries: Sequence[Mapping[str, Any]] = ()
) -> list[NcclSource]:
    """Per node, what a launch with `--nccl source` loads (the doctor's and cluster.up's decision, host_source);
    `libraries`: local_nccl's or remote_nccl's answer per node (used with "host" only)."""
    if source != "host":
        why = "the image's own libnccl (--nccl image): nothing is mounted"
        return [NcclSource("image", reason=why) for _ in labels]
    return [
        host_source(label, found.get("host"), found.get("image"))
        for label, found in zip(labels, libraries, strict=True)
    ]


def node_details(label: str, raw: Mapping[str, Any], choice: FabricChoice) -> dict[str, Any]:
    node = parse_node(label, raw)
    groups, tie = twins(node)
    return {
        "root": raw.get("root"),
        "rdma_devices": describe_ports(node),
        "twins": [[p.device for p in g] for g in groups if len(g) > 1],
        "twins_tied": tie,
        "default_route": node.default_route,
        "choice": choice.to_dict(),
    }


def fabric_report(
    labels: Sequence[str],
    raws: Sequence[Mapping[str, Any]],
    interface: str | None = None,
    gid_index: int | None = None,
    addresses: Sequence[str | None] = (),
    sources: Sequence[NcclSource] = (),
    layout: str | None = None,
) -> tuple[Report, list[FabricChoice]]:
    """One check per node: the chosen interface and why (failed with the fix on bad input); warnings in details.
    `sources` (nccl_sources; default: the image's libnccl) says which libnccl each node loads: a refused
    --nccl host fails that node's check, as the doctor's nccl-library stage refuses the launch. With three
    nodes or more (or a declared layout), a `topology` check: the layout the cabling shows (checked against `layout` when given) or what is
    miswired."""
    report = Report(command="cluster.fabric", subject=", ".join(labels))
    nodes = [parse_node(label, raw) for label, raw in zip(labels, raws, strict=False)]
    choices = choose_all(nodes, interface, addresses, gid_index)
    libraries = list(sources) or nccl_sources(labels, "image")
    for label, raw, choice, library in zip(labels, raws, choices, libraries, strict=False):
        details = {**node_details(label, raw, choice), "nccl": library.to_dict()}
        problems = [p for p in (choice.error, library.reason if library.status == "failed" else None) if p]
        problems += _tree_faults(raw)
        if problems:
            report.add(Check(label, "failed", "; ".join(problems), details))
            continue
        chosen = f"{choice.interface} {choice.address}" if choice.interface else "no fabric interface"
        loads = f"; NCCL: {library.reason}" if library.source == "host" else ""
        report.add(Check(label, "passed", f"{chosen}: {choice.reason}{loads}", details))
    if len(nodes) > 2 or layout:  # two nodes: the pair, judged by the node checks as before
        report.add(topology_check(nodes, layout))
    return report, choices


def topology_check(nodes: Sequence[NodeFabric], layout: str | None = None) -> Check:
    """The `topology` check: the layout found (passed), or each miswiring named (failed); warnings in details."""
    topo = read_topology(nodes, layout)
    details = {**topo.to_dict(), "nccl_env": nccl_environment(topo)}
    return Check("topology", "failed" if topo.problems else "passed", topo.reason(), details)


def _tree_faults(raw: Mapping[str, Any]) -> list[str]:
    """What the reader refused in a node's tree (values no kernel writes), and a tree with no net device at all."""
    refused = [str(r)[:200] for r in raw.get("refused") or []][:5]
    faults = (
        [f"sysfs holds values no kernel writes ({'; '.join(refused)}); fix: check {raw.get('root')}"]
        if refused
        else []
    )
    if not raw.get("net"):
        faults.append(
            f"no network device under {raw.get('root')}/class/net (an empty or unreadable tree); fix: "
            f"point {SYSFS_ENV} at a tree laid out like /sys, or unset it"
        )
    return faults


def describe_choices(
    session: Session, choices: Sequence[FabricChoice], sources: Sequence[NcclSource] = ()
) -> None:
    """Human lines: per node the environment it will set, then every warning; with --nccl host, the libnccl each
    node loads, its bind mount and the ABI check."""
    say, warn = session.out, session.warn
    for i, choice in enumerate(choices):
        if choice.error:
            continue
        # Names come from sysfs or a node's probe: escaped, a line break in one would forge lines.
        say(f"{cell(choice.label)}: {cell(choice.interface or '-')} ({cell(choice.reason)})")
        for key, value in sorted(choice.env.items()):
            say(f"  {cell(key)}={cell(value)}")
        library = sources[i] if i < len(sources) else None
        if library and library.source == "host":
            if library.host:
                found = f"{library.host.get('path')}, NCCL {library.host.get('version')}"
                say(f"  libnccl: the node's own {cell(found)} (--nccl host)")
            if library.mount:
                say(f"  mount {cell(library.mount)}")
            say(f"  ABI check {library.status}: {cell(library.reason)}")
        for line in choice.warnings:
            warn(f"warning: {cell(line)}")


def read_fabric(
    session: Session, plan: ClusterPlan | None, interface: str, settings: FabricSettings, test: bool
) -> Report:
    """`cluster.fabric`: each node's facts (the plan's nodes, each read by its image's helper; None: this machine
    or the SPARKFORGE_SYSFS tree), the choice and env per node said, and with `test` the link test; the report."""
    if plan is not None:
        for line in plan.warnings:
            session.warn(line)
        for line in plan.notes:
            session.echo(line)
        engines, ref = [NodeEngine(n) for n in plan.nodes], plan.doctor.image
        labels, raws = [e.node.label for e in engines], remote_facts(engines, ref)
    else:
        engines, labels, raws, ref = [], ["local"], [local_facts()], ""
    libraries = (remote_nccl(engines, ref) if engines else [local_nccl()]) if settings.nccl == "host" else []
    sources = nccl_sources(labels, settings.nccl, libraries)
    declared = [e.node.address for e in engines]  # `--nodes URL=ADDR`: the same decision as a discovered node
    report, choices = fabric_report(
        labels, raws, interface or None, settings.gid_index, declared, sources, settings.layout
    )
    describe_choices(session, choices, sources)
    if test:
        from sparkforge.run.cluster.linktest import link_check

        with report.timed("link-test") as check:
            parsed = [parse_node(label, raw) for label, raw in zip(labels, raws, strict=True)]
            link_check(check, engines, parsed, choices, raws, ref)
        session.out(f"link-test {check.status}: {check.reason}")
    return report
