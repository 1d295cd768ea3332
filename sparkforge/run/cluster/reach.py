"""The doctor's reach stage: can every peer open a TCP connection to the address each node would advertise?

Each node listens on all of its IPv4 addresses at the launch port; every other node dials all of them. The
address vLLM would advertise (VLLM_HOST_IP, else its own default-route pick) must be reachable from every
peer, or vLLM's message queue waits forever after NCCL came up. The other addresses tell the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkforge.run.jobs import Job, Outcome, exec_jobs, run_jobs
from sparkforge.run.nodes import NodeEngine

if TYPE_CHECKING:
    from sparkforge.run.facts import DoctorOptions, NodeFacts

ENV_FIX = "(it sets VLLM_HOST_IP, NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME on each node)"
# How long a node's reverse lookup of a peer address may take before the doctor warns: torch's c10d rendezvous
# (vLLM's start on every node) reverse-resolves each peer socket, and a resolver that does not answer makes each
# lookup wait out its timeout (6-9 s a rendezvous on the namespaced cluster, benchmarks/cluster.md).
RDNS_CAP_S = 1.5


@dataclass
class ReachDiagnosis:
    problem: str | None = None
    summary: str = ""
    warnings: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


def _addresses(fact: NodeFacts) -> list[tuple[str, str]]:
    return [(str(i["name"]), str(i["ipv4"])) for i in fact.interfaces if i.get("ipv4") and i["name"] != "lo"]


def diagnose_reach(
    engines: Sequence[NodeEngine],
    facts: Sequence[NodeFacts],
    options: DoctorOptions,
    probes: Sequence[Outcome] = (),
) -> ReachDiagnosis:
    """Dial every peer's addresses (the probes listen on them); name each advertised address a peer cannot reach.

    With `probes` (the running probe containers, one per node), each node dials from inside its own probe
    container; otherwise a dial container is started per node."""
    port = options.master_port
    result = ReachDiagnosis()
    by_rank = {f.rank: f for f in facts}
    dial_jobs = [
        Job(
            engine,
            (
                "connect",
                "--timeout",
                "4",
                *(f"{ip}:{port}" for f in facts if f.rank != engine.node.rank for _, ip in _addresses(f)),
                *_df_args(by_rank.get(engine.node.rank), facts, port),
                "--rdns-cap",
                str(RDNS_CAP_S),
            ),
        )
        for engine in engines
    ]
    if probes:
        outcomes = exec_jobs(dial_jobs, probes, options.deadlines.reach)
    else:
        outcomes = run_jobs(dial_jobs, options.image, "dial", options.deadlines.reach)
    lost = [o for o in outcomes if o.node_lost]
    if lost:
        result.problem = "; ".join(str(o.node_lost) for o in lost)
        return result
    # reached[(from_rank, ip)] = True/False
    reached: dict[tuple[int, str], bool] = {}
    errors: dict[tuple[int, str], str] = {}
    df: dict[str, dict[str, Any]] = {}
    ranks_at = {f.address: f.rank for f in facts}
    for outcome in outcomes:
        for event in outcome.events:
            if event.get("event") == "df":
                ip = str(event["target"]).rpartition(":")[0]
                way = f"node{outcome.job.engine.node.rank} -> node{ranks_at.get(ip)} {ip}"
                df[way] = {k: event.get(k) for k in ("ok", "size", "error") if k in event}
            if event.get("event") in ("reached", "unreachable"):
                ip = str(event["target"]).rpartition(":")[0]
                reached[(outcome.job.engine.node.rank, ip)] = event["event"] == "reached"
                if event["event"] == "unreachable":
                    errors[(outcome.job.engine.node.rank, ip)] = str(event.get("error"))
    matrix: dict[str, dict[str, str]] = {}
    for fact in facts:
        for name, ip in _addresses(fact):
            matrix[f"node{fact.rank} {name} {ip}"] = {
                f"from node{peer.rank}": (
                    "reached" if reached.get((peer.rank, ip)) else errors.get((peer.rank, ip), "no answer")
                )
                for peer in facts
                if peer.rank != fact.rank
            }
    seconds = {o.job.engine.node.label: o.seconds for o in outcomes}
    lookups = reverse_lookups(outcomes)
    result.details = {
        "port": port,
        "matrix": matrix,
        "dont_fragment": df,
        "reverse_dns": lookups,
        "node_seconds": seconds,
    }
    result.warnings = slow_resolvers(lookups)
    problems = []
    reachable = []
    for fact in facts:
        peers = [p for p in facts if p.rank != fact.rank]
        good = [(n, ip) for n, ip in _addresses(fact) if all(reached.get((p.rank, ip)) for p in peers)]
        if good:
            reachable.append(f"node{fact.rank} {good[0][1]} on {good[0][0]}")
        blind = [p for p in peers if not reached.get((p.rank, fact.address))]
        if not blind:
            continue
        why = errors.get((blind[0].rank, fact.address), "no answer").split(": ", 1)[-1]
        how = f"auto-picked: {fact.interface} holds the default route" if not fact.env else "its VLLM_HOST_IP"
        problems.append(
            f"node{fact.rank} {fact.address} ({how}), unreachable from "
            f"{', '.join(f'node{p.rank}' for p in blind)} ({why})"
        )
    if problems:
        result.problem = (
            "vLLM would advertise "
            + "; ".join(problems)
            + ". Launched like this, the ranks pass NCCL init and then wait forever in vLLM's message queue "
            "(shm_broadcast wait_until_ready)."
            + (f" The nodes do reach each other at {', '.join(reachable)}." if reachable else "")
            + " Fix: "
            + _fix(facts, reached)
            + "."
        )
    else:
        result.summary = "every peer reaches " + ", ".join(f"node{f.rank} {f.address}:{port}" for f in facts)
    return result


def reverse_lookups(outcomes: Sequence[Outcome]) -> dict[str, dict[str, Any]]:
    """Each node's reverse lookup of each peer address: seconds, answered within the cap, the name or error."""
    found: dict[str, dict[str, Any]] = {}
    for outcome in outcomes:
        for event in outcome.events:
            if event.get("event") == "rdns":
                way = f"node{outcome.job.engine.node.rank} -> {event.get('host')}"
                keys = ("answered", "seconds", "name", "error")
                found[way] = {k: event.get(k) for k in keys if event.get(k) is not None}
    return found


def slow_resolvers(lookups: dict[str, dict[str, Any]]) -> list[str]:
    """One warning per node whose resolver did not answer a reverse lookup within the cap."""
    slow: dict[str, list[str]] = {}
    for way, seen in lookups.items():
        if not seen.get("answered"):
            node, _, host = way.partition(" -> ")
            slow.setdefault(node, []).append(host)
    return [
        f"{node}'s resolver did not answer a reverse lookup of {', '.join(hosts)} within {RDNS_CAP_S} s: torch's "
        "c10d rendezvous (every vLLM start) reverse-resolves each peer and waits out the resolver's timeout; "
        f"fix: a name server {node} reaches in its /etc/resolv.conf, or none (a lookup then fails at once; c10d looks "
        "up the peers' IPv6-mapped socket addresses, so /etc/hosts entries do not help)"
        for node, hosts in sorted(slow.items())
    ]


def _df_args(fact: NodeFacts | None, facts: Sequence[NodeFacts], port: int) -> list[str]:
    """A don't-fragment datagram of MTU-28 bytes (this node's link MTU) to every peer's launch address."""
    found = fact.interface_of(fact.address) if fact else None
    if fact is None or not found or not found.get("mtu"):
        return []
    size = int(found["mtu"]) - 28
    return [a for f in facts if f.rank != fact.rank for a in ("--df", f"{f.address}:{port}:{size}")]


def _fix(facts: Sequence[NodeFacts], reached: dict[tuple[int, str], bool]) -> str:
    """--interface NAME when one interface name is reachable on every node, else per-node addresses."""
    good: dict[int, list[tuple[str, str]]] = {}
    for fact in facts:
        peers = [p for p in facts if p.rank != fact.rank]
        good[fact.rank] = [
            (n, ip) for n, ip in _addresses(fact) if all(reached.get((p.rank, ip)) for p in peers)
        ]
    common = set.intersection(*(set(n for n, _ in pairs) for pairs in good.values())) if good else set()
    if common:
        name = sorted(common)[0]
        return f"pass --interface {name} {ENV_FIX}"
    if all(good.values()):
        listing = ",".join(f"NODE{rank}={pairs[0][1]}" for rank, pairs in sorted(good.items()))
        return f"give each node its link address in --nodes ({listing}) {ENV_FIX}"
    return "connect the nodes on one link (e.g. the ConnectX-7 cable) and give it addresses on one subnet"
