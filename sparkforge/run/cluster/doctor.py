"""`cluster.doctor`: staged checks of several nodes before anything is launched, each under its own deadline.

engines -> image -> addresses (vLLM's own get_ip() in the image, per node; the fabric choice from each node's
sysfs when --interface is not given) -> topology -> paths (token, model, caches on each node) -> reach (every peer
dials the address each node would advertise, on the launch port; a don't-fragment full-MTU datagram each way) ->
mtu -> host (drivers, RemoveIPC) -> memory (MemAvailable, swap, page cache against the profile's memory plan) ->
versions -> nccl-library (what each image really loads) -> sanity (Gloo all-reduce, NCCL where GPUs exist with
NCCL_DEBUG=INFO, vLLM's MessageQueue with a remote reader) -> transport (NET/IB or NET/Socket, bus bandwidth
floor). A stage that fails makes the later ones skip.

The cheap stages name the usual causes of a hang in seconds; the expensive ones (a torch import per node, then
the ranks) run only after every cheap one passed, and `--quick` leaves them out. Every stage asks all nodes at
once. The sanity ranks' containers start as soon as the addresses stage chose each node's address (ranks.py):
they import torch, report the libnccl it loads (the nccl-library stage's answer) and wait at a gate the sanity
stage opens, so their imports hide behind the rest of the cheap stages and no rank dials before those passed.
With --nccl host (the ranks need the node's library mounted) the image's library is probed in the background
from the image stage on, and the ranks start in the sanity stage.

The stages are declared once, in `STAGES` at the end of this module: name, one-line help, and a `DoctorStage`
(its function, the typed result it gives, the results it needs, whether it is expensive). The order, the report's
check names, `--quick` and the docs table come from it (doctorflow.py runs it). A new stage is its module and
one `Entry` line.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sparkforge.context import Session
from sparkforge.errors import RunError
from sparkforge.extensions import Entry, Registry
from sparkforge.report import Check, Report
from sparkforge.run.cluster import stages
from sparkforge.run.cluster.addresses import Addresses, addresses_stage
from sparkforge.run.cluster.doctorflow import DoctorPlan, DoctorStage, Found, Stages, run_stages
from sparkforge.run.cluster.fabric import network_env, parse_node
from sparkforge.run.cluster.parallel import ring_problem
from sparkforge.run.cluster.ranks import Sanity, sanity
from sparkforge.run.cluster.reach import diagnose_reach
from sparkforge.run.cluster.topology import Topology, node_environment, read_topology, route_hints
from sparkforge.run.facts import NodeFacts
from sparkforge.run.jobs import Background, each_node
from sparkforge.run.memory.hoststage import memory_stage
from sparkforge.run.nodes import NodeEngine

__all__ = ["STAGES", "DoctorPlan", "DoctorResult", "network_env", "run_doctor"]


@dataclass(frozen=True)
class DoctorResult:
    report: Report
    facts: tuple[NodeFacts, ...]  # each node as the launch will use it (address, env, mounts)
    topology: Topology | None = None  # the layout the topology stage read (None: it did not run)


def run_doctor(session: Session, plan: DoctorPlan, stages: Stages | None = None) -> DoctorResult:
    """Every stage of `stages` (default: the registry) lands in the report; none raises for a cluster problem
    (RunError only for bad input). Progress goes to the session's echo."""
    report = Report(
        command="cluster.doctor", subject=f"{len(plan.engines)} nodes, image {plan.options.image}"
    )
    found = run_stages(session, report, plan, STAGES if stages is None else stages)
    layout = next((r for r in found.results() if isinstance(r, LayoutFound)), None)
    return DoctorResult(report, found.facts(), layout.topology if layout else None)


# ---- stages ---------------------------------------------------------------------------------------


def _engines(check: Check, plan: DoctorPlan, found: Found) -> None:
    def version(node: NodeEngine) -> str | RunError:
        try:
            return node.server_version(timeout=plan.options.deadlines.engines)
        except RunError as exc:
            return exc

    problems = []
    for node, answer in zip(plan.engines, each_node(version, plan.engines), strict=True):
        if isinstance(answer, RunError):
            problems.append(str(answer))
        else:
            check.details[node.node.label] = answer
    if problems:
        check.status, check.reason = "failed", "; ".join(problems)
    else:
        versions = ", ".join(sorted(set(check.details.values())))
        check.reason = f"{len(plan.engines)} engines answer ({versions})"


@dataclass(frozen=True)
class ImageFound:
    """One image ID on every node; with --nccl host and the sanity run asked for, the image's libnccl is probed
    in the background from here on (the ranks need the node's library mounted, so they start later)."""

    ids: dict[str, str | None]
    early: Background | None = None

    def release(self) -> None:
        if self.early:
            self.early.stop()  # a cheap stage failed first: its probes are removed, not waited for


def _image(check: Check, plan: DoctorPlan, found: Found) -> ImageFound:
    options, engines = plan.options, plan.engines
    answers = each_node(lambda e: e.image_id(options.image, timeout=options.deadlines.image), engines)
    ids = {e.node.label: image_id for e, image_id in zip(engines, answers, strict=True)}
    check.details = {"image": options.image, "ids": ids}
    missing = [label for label, found in ids.items() if found is None]
    distinct = sorted({i for i in ids.values() if i})
    if missing:
        check.status = "failed"
        check.reason = (
            f"{options.image} is not on {', '.join(missing)}; fix: 'invoke cluster.up --distribute' (or "
            "'docker save | docker load' / a registry pull on those nodes)"
        )
    elif len(distinct) > 1:
        listing = ", ".join(f"{label} {found[:19]}" for label, found in ids.items() if found)
        check.status = "failed"
        check.reason = (
            f"{options.image} is a different image on different nodes ({listing}): mixed vLLM/NCCL builds hang "
            "or crash at init; fix: distribute one image ('invoke cluster.up --distribute' streams the local "
            "one to the nodes that differ)"
        )
    else:
        check.reason = f"same image ID on every node ({distinct[0][:19]})"
    if check.status != "passed" or not plan.expensive or plan.held:
        return ImageFound(ids)
    # --nccl host: the ranks need the node's library mounted (known after the nccl-library stage), so they
    # start there; the image's library is probed here, in the background, behind the cheap stages.
    return ImageFound(ids, Background(lambda cancel: stages.nccl_probe(engines, options, {}, cancel=cancel)))


@dataclass(frozen=True)
class LayoutFound:
    """The layout the cabling shows, and what each node's launch env gains on it (by position in --nodes)."""

    topology: Topology
    env: dict[int, dict[str, str]]

    def onto(self, facts: tuple[NodeFacts, ...]) -> tuple[NodeFacts, ...]:
        return tuple(replace(f, env={**f.env, **self.env.get(i, {})}) for i, f in enumerate(facts))


def _topology(check: Check, plan: DoctorPlan, found: Found) -> LayoutFound | None:
    """The layout every node's fabric facts show (checked against --layout), or each miswiring named; on a layout
    with two cables per node, each node's launch env gains every fabric interface and NCCL's layout settings."""
    options, facts = plan.options, found.facts()
    nodes = [parse_node(f.label, f.fabric) for f in facts]
    try:
        topo = read_topology(nodes, options.layout)
    except RunError as exc:
        check.status, check.reason = "failed", str(exc)
        return None
    check.details = topo.to_dict()
    variant = str((options.nccl_pin or {}).get("variant") or "stock")
    # two nodes: the mtu stage judges the link's MTU, with its don't-fragment probes as proof
    problems = [p for p in topo.problems if len(nodes) > 2 or not p.startswith("MTU mismatch")]
    ring = ring_problem(options.parallel[0], topo.layout, variant == "switchless")
    problems += [ring] if ring else []
    if problems:
        check.status, check.reason = "failed", "; ".join(problems)
        return LayoutFound(topo, {})
    env = {i: added for i in range(len(facts)) if (added := node_environment(topo, i))}
    if env:
        check.details["env"] = {facts[i].label: added for i, added in env.items()}
    warnings = list(topo.warnings)
    routes = route_hints(topo, [f.address for f in facts])
    if routes:
        check.details["routes"] = routes
        warnings.append(
            "a node's advertised address is on no subnet some peer shares (vLLM's rendezvous and message queue "
            "dial it; the reach stage proves it); fix: these routes, in each node's netplan file (routes:): "
            + "; ".join(routes)
        )
    check.reason = topo.reason() + ("; warning: " + "; ".join(warnings) if warnings else "")
    return LayoutFound(topo, env)


@dataclass(frozen=True)
class Reach:
    """The don't-fragment probes the reach stage sent, per direction (the mtu stage judges them)."""

    df: dict[str, Any]


def _reach(check: Check, plan: DoctorPlan, found: Found) -> Reach:
    addresses, topo = found[Addresses], found[LayoutFound].topology
    facts = found.facts()
    try:  # dialled from inside the probe containers, which end with this stage
        diagnosis = diagnose_reach(plan.engines, facts, plan.options, addresses.probes.outcomes)
    finally:
        addresses.probes.remove()
    check.details = diagnosis.details
    if diagnosis.problem:
        check.status, check.reason = "failed", diagnosis.problem
        hints = route_hints(topo, [f.address for f in facts])
        if hints:
            check.reason += (
                f" On this {topo.layout} layout the advertised addresses need routes "
                "(the topology stage's): " + "; ".join(hints)
            )
    else:
        check.reason = diagnosis.summary
        if diagnosis.warnings:
            check.reason += "; warning: " + "; ".join(diagnosis.warnings)
    return Reach(dict(diagnosis.details.get("dont_fragment", {})))


def _versions(check: Check, plan: DoctorPlan, found: Found) -> None:
    facts = found.facts()
    keys = ("python", "torch", "cuda", "nccl", "vllm")
    check.details = {f.label: {k: f.versions.get(k) for k in keys} for f in facts}
    differ = [k for k in keys if len({str(f.versions.get(k)) for f in facts}) > 1]
    if differ:
        check.status = "failed"
        check.reason = f"{', '.join(differ)} differ across nodes; fix: run the same image everywhere"
    else:
        first = facts[0].versions if facts else {}
        check.reason = ", ".join(f"{k} {first.get(k)}" for k in ("torch", "nccl", "vllm"))


@dataclass(frozen=True)
class NcclLibrary:
    """Each node's extra launch mounts the nccl-library stage decided (--nccl host: the node's libnccl)."""

    mounts: dict[int, list[str]]

    def onto(self, facts: tuple[NodeFacts, ...]) -> tuple[NodeFacts, ...]:
        return tuple(replace(f, mounts=self.mounts.get(f.rank, f.mounts)) for f in facts)


def _nccl_library(check: Check, plan: DoctorPlan, found: Found) -> NcclLibrary:
    ranks, early = found[Addresses].ranks, found[ImageFound].early
    probed = ranks.library() if ranks else (early.result() if early else None)
    return NcclLibrary(stages.nccl_library(check, plan.engines, plan.options, found.facts(), probed))


def _sanity(check: Check, plan: DoctorPlan, found: Found) -> Sanity:
    return sanity(check, plan.engines, found.facts(), plan.options, found[Addresses].ranks)


# ---- the registry: each stage declared once, in the order it runs (report names and docs come from here) ----

AT = (Addresses,)  # most stages read only the facts the addresses stage found
STAGES: Stages = Registry(
    "doctor",
    "cluster.doctor",
    [
        Entry("engines", "every node's container engine answers (its version)", DoctorStage(_engines)),
        Entry(
            "image",
            "the image is on every node, with one image ID everywhere",
            DoctorStage(_image, ImageFound),
        ),
        Entry(
            "addresses",
            "the address vLLM would advertise on each node; the fabric interface chosen",
            DoctorStage(addresses_stage, Addresses),
        ),
        Entry(
            "topology",
            "the layout the cabling shows (pair, mesh3, ring, switch) or what is miswired",
            DoctorStage(_topology, LayoutFound, AT),
        ),
        Entry(
            "paths",
            "the token file, model and cache directories given are there on every node",
            DoctorStage(
                lambda c, p, f: stages.paths(c, f.facts(), f[Addresses].probes.outcomes, p.options), needs=AT
            ),
        ),
        Entry(
            "reach",
            "every peer dials the address each node would advertise, on the launch port",
            DoctorStage(_reach, Reach, (Addresses, LayoutFound)),
        ),
        Entry(
            "mtu",
            "one MTU on the link; a full-MTU don't-fragment packet gets through both ways",
            DoctorStage(lambda c, p, f: stages.mtu(c, f.facts(), f[Reach].df), needs=(Addresses, Reach)),
        ),
        Entry(
            "host",
            "host driver versions alike on every node; logind's RemoveIPC",
            DoctorStage(lambda c, p, f: stages.host(c, f.facts()), needs=AT),
        ),
        Entry(
            "memory",
            "free memory, swap and page cache against the profile's memory plan",
            DoctorStage(lambda c, p, f: memory_stage(c, f.facts(), p.options.memory_plan), needs=AT),
        ),
        Entry(
            "versions",
            "Python, torch, CUDA, NCCL and vLLM are the same on every node",
            DoctorStage(_versions, needs=AT),
        ),
        Entry(
            "nccl-library",
            "path, version and sha256 of the libnccl each node's image really loads",
            DoctorStage(_nccl_library, NcclLibrary, (Addresses, ImageFound), expensive=True),
        ),
        Entry(
            "sanity",
            "one rank per node: Gloo all-reduce, NCCL with GPUs, vLLM's MessageQueue",
            DoctorStage(_sanity, Sanity, (Addresses, LayoutFound, NcclLibrary), expensive=True),
        ),
        Entry(
            "transport",
            "the transport NCCL chose (NET/IB or sockets) and its bus bandwidth floor",
            DoctorStage(
                lambda c, p, f: stages.transport(c, f.facts(), f[Sanity].details, p.options),
                needs=(Addresses, Sanity),
                expensive=True,
            ),
        ),
    ],
    RunError,
)
