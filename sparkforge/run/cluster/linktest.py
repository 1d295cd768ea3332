"""`cluster.fabric --test`: perftest's `ib_write_bw` across every cabled twin pair at once, one JSON entry per link.

Per twin pair (matched by subnet: twin A with twin A), a throwaway container of the image on the peer serves
(`ib_write_bw -d DEV -x GID`) and one on the head connects to the peer twin's address; all pairs run together, as
NCCL drives them. The figures come from perftest's own table (`#bytes #iterations BW peak BW average MsgRate`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkforge.errors import RunError
from sparkforge.report import Check
from sparkforge.run.cluster.fabric import FabricChoice
from sparkforge.run.cluster.rdma import NodeFabric
from sparkforge.run.nodes import LABEL, ContainerSpec, NodeEngine

BASE_PORT = 18515  # perftest's default port; each pair takes the next one
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$")
_UNITS = re.compile(r"BW peak\[([^\]]+)\]")


def parse_perftest(text: str) -> dict[str, Any]:
    """perftest's result table -> {bytes, iterations, peak_gbps, average_gbps, msg_rate_mpps, device, gid_index};
    MB/sec figures (no --report_gbits) are converted to Gb/s. RunError when the output holds no result row."""
    units = _UNITS.search(text)
    scale = 1.0 if units and units.group(1).startswith("Gb") else 8 / 1000  # MB/sec (without --report_gbits)
    rows = [m for line in text.splitlines() if (m := _ROW.match(line))]
    if not rows:
        tail = " | ".join(text.strip().splitlines()[-4:])
        raise RunError(f"ib_write_bw printed no result row ({tail[-300:]})")
    size, iterations, peak, average, rate = rows[-1].groups()
    device = re.search(r"Device\s*:\s*(\S+)", text)
    gid = re.search(r"GID index\s*:\s*(\d+)", text)
    return {
        "bytes": int(size),
        "iterations": int(iterations),
        "peak_gbps": round(float(peak) * scale, 2),
        "average_gbps": round(float(average) * scale, 2),
        "msg_rate_mpps": float(rate),
        "device": device.group(1) if device else None,
        "gid_index": int(gid.group(1)) if gid else None,
    }


@dataclass(frozen=True)
class Link:
    """One twin pair: the head's device and the peer's, the peer twin's address, the port."""

    client: str
    client_gid: int | None
    server: str
    server_gid: int | None
    address: str
    port: int


@dataclass
class LinkPlan:
    peer: int  # the index of the serving node
    links: list[Link] = field(default_factory=list)


def plan_links(nodes: Sequence[NodeFabric], choices: Sequence[FabricChoice]) -> list[LinkPlan]:
    """The head's chosen twins against each peer's twin on the same subnet."""
    plans = []
    port = BASE_PORT
    head, head_choice = nodes[0], choices[0]
    for i in range(1, len(nodes)):
        plan = LinkPlan(i)
        for device in head_choice.hcas:
            mine = head.interface(next(p.netdev for p in head.ports if p.device == device))
            for other in choices[i].hcas:
                port_other = next(p for p in nodes[i].ports if p.device == other)
                theirs = nodes[i].interface(port_other.netdev)
                if mine and theirs and theirs.ipv4 and mine.subnet == theirs.subnet:
                    plan.links.append(
                        Link(
                            device,
                            head_choice.gid.get(device),
                            other,
                            choices[i].gid.get(other),
                            theirs.ipv4,
                            port,
                        )
                    )
                    port += 1
                    break
        plans.append(plan)
    return plans


def _perftest(name: str, image: str, args: Sequence[str]) -> ContainerSpec:
    return ContainerSpec(
        name=name,
        image=image,
        entrypoint="ib_write_bw",
        args=tuple(args),
        labels={LABEL: "linktest"},
        devices=("/dev/infiniband",),
        cap_add=("IPC_LOCK",),
        ulimits=("memlock=-1",),
    )


def _args(device: str, gid: int | None, port: int, seconds: int) -> list[str]:
    return ["-d", device, *(["-x", str(gid)] if gid is not None else []), "-p", str(port), "-F", "--report_gbits",
            "-D", str(seconds), "-q", "4"]  # fmt: skip


def run_links(
    engines: Sequence[NodeEngine], plans: Sequence[LinkPlan], image: str, seconds: int = 5
) -> list[dict[str, Any]]:
    """Every planned pair at once; one result per link (figures, or the error with the last lines)."""
    started: list[tuple[NodeEngine, str]] = []
    pairs: list[tuple[Link, NodeEngine, str, NodeEngine, str]] = []
    try:
        for plan in plans:
            for k, link in enumerate(plan.links):
                server, client = (
                    f"sparkforge-linktest-s{plan.peer}-{k}",
                    f"sparkforge-linktest-c{plan.peer}-{k}",
                )
                engine = engines[plan.peer]
                engine.remove([server])
                engine.start(
                    _perftest(server, image, _args(link.server, link.server_gid, link.port, seconds))
                )
                started.append((engine, server))
                pairs.append((link, engines[0], client, engine, server))
        time.sleep(2)  # the servers listen before the clients dial
        for link, head, client, _, _ in pairs:
            head.remove([client])
            args = [*_args(link.client, link.client_gid, link.port, seconds), link.address]
            head.start(_perftest(client, image, args))
            started.append((head, client))
        results = []
        for link, head, client, peer, server in pairs:
            deadline = time.monotonic() + seconds + 60
            while head.state(client).status == "running" and time.monotonic() < deadline:
                time.sleep(1)
            entry: dict[str, Any] = {"head": link.client, "peer": link.server, "address": link.address}
            try:
                entry.update(parse_perftest(head.logs(client)))
            except RunError as exc:
                entry["error"] = f"{exc}; server said: {peer.logs(server, tail=4).strip()[-300:]}"
            results.append(entry)
        return results
    finally:
        for engine, name in started:
            engine.remove([name])


def link_check(
    check: Check,
    engines: Sequence[NodeEngine],
    nodes: Sequence[NodeFabric],
    choices: Sequence[FabricChoice],
    raws: Sequence[dict[str, Any]],
    image: str,
) -> None:
    """The `--test` check: skipped without RDMA (with that reason), refused without perftest, else per link."""
    bare = [c.label for c in choices if not c.hcas]
    if len(nodes) < 2 or bare:
        check.status = "skipped"
        check.reason = (
            "the link test needs two nodes"
            if len(nodes) < 2
            else f"no RDMA devices in use on {', '.join(bare)}"
        )
        return
    lacking = [
        f"{c.label} (devices {', '.join(c.hcas)})"
        for c, raw in zip(choices, raws, strict=False)
        if not (raw.get("verbs") or {}).get("perftest")
    ]
    if lacking:
        raise RunError(
            f"{'; '.join(lacking)}: {image} has no ib_write_bw (perftest), so --test cannot run there; fix: add "
            "runtime.rdma.link_test (perftest=VERSION, as recipes/_gb10.yaml does) to the recipe and rebuild"
        )
    plans = plan_links(nodes, choices)
    results = run_links(engines, plans, image)
    check.details = {"links": results}
    failed = [r for r in results if "error" in r]
    if failed or not results:
        check.status = "failed"
        check.reason = "; ".join(
            f"{r['head']} -> {r['peer']} {r['address']}: {r['error']}" for r in failed
        ) or ("no twin pair shares a subnet; fix: 'invoke cluster.fabric' names the layout problem")
        return
    total = sum(r["average_gbps"] for r in results)
    check.reason = f"{len(results)} links, {total:.1f} Gb/s together: " + ", ".join(
        f"{r['head']}->{r['peer']} {r['average_gbps']} Gb/s" for r in results
    )
