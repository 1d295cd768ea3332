"""`cluster.fabric`: each node's RDMA devices, ports, twins, GID choice and the environment a launch would set.

The facts come from the doctor's in-image readers (`fabric()` in tests/image/cluster_facts.py): in a probe
container on each node (the container's own /sys: with host networking it shows the node's devices), or, without
--nodes, run here on this machine's /sys or on the tree SPARKFORGE_SYSFS names (its `proc/net/route` beside it).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from sparkforge.console import cell
from sparkforge.errors import RunError
from sparkforge.report import Check, Report
from sparkforge.run.fabric import FabricChoice, choose_all, describe_ports, parse_node, twins
from sparkforge.run.jobs import FACTS_SCRIPT, Job, first_event, run_jobs
from sparkforge.run.nodes import NodeEngine

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
) -> tuple[Report, list[FabricChoice]]:
    """One check per node: the chosen interface and why (failed with the fix on bad input); warnings in details."""
    report = Report(command="cluster.fabric", subject=", ".join(labels))
    nodes = [parse_node(label, raw) for label, raw in zip(labels, raws, strict=False)]
    choices = choose_all(nodes, interface, addresses, gid_index)
    for label, raw, choice in zip(labels, raws, choices, strict=False):
        details = node_details(label, raw, choice)
        if choice.error:
            report.add(Check(label, "failed", choice.error, details))
            continue
        chosen = f"{choice.interface} {choice.address}" if choice.interface else "no fabric interface"
        report.add(Check(label, "passed", f"{chosen}: {choice.reason}", details))
    return report, choices


def describe_choices(
    choices: Sequence[FabricChoice], say: Callable[[str], None], warn: Callable[[str], None]
) -> None:
    """Human lines: per node the environment it will set, then every warning."""
    for choice in choices:
        if choice.error:
            continue
        # Names come from sysfs or a node's probe: escaped, a line break in one would forge lines.
        say(f"{cell(choice.label)}: {cell(choice.interface or '-')} ({cell(choice.reason)})")
        for key, value in sorted(choice.env.items()):
            say(f"  {cell(key)}={cell(value)}")
        for line in choice.warnings:
            warn(f"warning: {cell(line)}")
