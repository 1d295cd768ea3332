"""Invoke tasks for several nodes: `cluster.doctor|fabric|up|down|logs` (thin: one ClusterPlan,
sparkforge/run/cluster/clusterplan.py, then its executor, run/cluster/clusterrun.py). Each option is declared once,
in an option family: the launch's in cli/launchflags.py, the cluster link's and the cluster tasks' own here."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING

from invoke import Collection, Context

from sparkforge.cli import Whole, task, user_errors
from sparkforge.cli.families import DRY, JSON_REPORT, NETWORK, Family, Option, Outputs
from sparkforge.cli.launchflags import (
    FORCE,
    IMAGE,
    ITERABLE,
    LAUNCH_HELP,
    MOUNTS,
    NODES,
    NODES_HELP,
    RECIPE_HELP,
    SERVER,
    START,
    launch,
)
from sparkforge.context import Session

if TYPE_CHECKING:
    from sparkforge.run.cluster.clusterflags import Bringing, ClusterFlags
    from sparkforge.run.launchplan import LaunchFlags

LAYOUT_HELP = "the cabling: pair, mesh3, ring (ring4), switch (checked against what each node's sysfs shows)"
FABRIC = Family(
    "fabric",
    (
        Option(
            "gid_index",
            "",
            "pin NCCL_IB_GID_INDEX (default: NCCL picks the RoCE v2 IPv4 GID itself; checked against every chosen device's GID table)",
        ),
        Option(
            "nccl",
            "image",
            "image (default): the image's libnccl; host: each node's own libnccl bind-mounted over it (ABI checked)",
        ),
        Option("layout", "", LAYOUT_HELP),
    ),
)
BUSBW = Family(
    "busbw",
    (
        Option(
            "min_busbw",
            "",
            "GB/s: NCCL's all-reduce bus bandwidth below it fails the transport stage (default: 80 % of the port rate sysfs reports; 0 disables)",
        ),
    ),
)
BACKEND = Family(
    "backend", (Option("backend", "mp", "mp (vLLM's multiprocessing multi-node, default) or ray"),)
)
LOOKED_FOR = Family(  # what cluster.doctor looks for on every node: nothing unless given; no GPUs unless asked
    "looked-for",
    (
        Option(
            "image",
            "",
            "image to check (default: the recipe's local build, else the digest 'invoke pull' verified)",
        ),
        Option(
            "gpus",
            "none",
            "all: give the sanity ranks the GPUs (NCCL all-reduce too); none (default): Gloo and vLLM's queue only",
        ),
        Option("model_dir", "", "a model directory to look for on every node (config.json)"),
        Option("hf_token_file", "", "a token file to look for on every node"),
        Option("cache_dir", "", "a cache directory to look for on every node"),
        Option("no_preflight", False, "skip checking the profile's flags against the pinned vLLM"),
    ),
)
READ = Family(  # what cluster.fabric reads: the nodes (default: this machine) with an image's helper
    "read",
    (
        Option(
            "nodes", "", NODES_HELP + "; default: this machine (or the sysfs tree SPARKFORGE_SYSFS names)"
        ),
        Option("image", "", "image to read each node's sysfs with (default: the recipe's candidate tag)"),
        NODES.options[1],  # --interface
    ),
)
QUICK = Family(
    "quick",
    (
        Option(
            "quick",
            False,
            "only the cheap stages (engines to versions: advertised address, interface, MTU, GID...), stopping at the first cause named; no NCCL probe or sanity run",
        ),
    ),
)
SPLIT = Family(
    "split",
    (
        Option(
            "tp",
            Whole(0),
            "tensor-parallel-size over the nodes (default: the profile's); checked against the model's heads, experts and the cabling before anything starts",
        ),
        Option(
            "pp",
            Whole(0),
            "pipeline-parallel-size over the nodes (default: the profile's); TP x PP x DP is the node count",
        ),
        Option(
            "dp",
            Whole(0),
            "data-parallel-size: replicas of TP x PP nodes each behind the head's API, on vLLM's own DP handshake (default: the profile's)",
        ),
    ),
)
UP = Family(
    "bringing",
    (
        Option("distribute", False, "stream the local image to nodes whose image ID differs"),
        Option(
            "health_timeout",
            Whole(1800),
            "seconds to wait for /health, counted from when the weights are on disk",
        ),
        Option(
            "down_on_fail",
            False,
            "remove the deployment when the answer check fails (default: keep the healthy deployment)",
        ),
    ),
    "bringing",
    lambda **given: _flags("Bringing", given),
)
UP_LAUNCH = (IMAGE, NODES, MOUNTS, SERVER, START, FORCE, BACKEND)


def cluster(*groups: Family) -> Family:
    """The cluster flags a task takes, as one value: the body's `cluster` (a ClusterFlags; a flag the task does
    not take keeps its default)."""
    options = tuple(o for g in groups for o in g.options)
    return Family("cluster", options, "cluster", lambda **given: _flags("ClusterFlags", given))


def _flags(kind: str, given: dict[str, object]) -> Bringing | ClusterFlags:
    """The cluster tasks' flag values, imported when a task runs (loading tasks.py imports no library module)."""
    from sparkforge.run.cluster import clusterflags

    return getattr(clusterflags, kind)(**given)


@task(
    families=(launch(NODES, LOOKED_FOR), cluster(FABRIC, BUSBW, QUICK), JSON_REPORT), help=dict(LAUNCH_HELP)
)
@user_errors
def doctor(
    c: Context,
    session: Session,
    flags: LaunchFlags,
    cluster: ClusterFlags,
    outputs: Outputs,
    recipe: str = "",
    profile: str = "",
) -> None:
    """Checks before a multi-node launch: engines, image identity, advertised addresses, reach, MTU, versions, sanity run."""
    from sparkforge.run.cluster import clusterrun
    from sparkforge.run.cluster.clusterplan import plan_cluster
    from sparkforge.run.launchplan import FlagError

    if not (recipe or flags.image):
        raise FlagError("cluster.doctor needs --recipe R (or --image REF)")
    from sparkforge.boundary import check_exclusive

    check_exclusive(quick=cluster.quick, gpus=flags.gpus == "all")  # --quick leaves out the ranks with GPUs
    looked_for = replace(flags, force=True)  # the memory plan is reported, never refused here
    plan = plan_cluster(recipe, profile if recipe else "", looked_for, cluster, os.environ, dry=True)
    result = clusterrun.doctor(session, plan)
    outputs.finish(session, result.report, hint="the table above names the stage, the node and the fix")


@task(
    families=(NETWORK, DRY, launch(*UP_LAUNCH), cluster(FABRIC, SPLIT), UP),
    iterable=ITERABLE,
    help=dict(LAUNCH_HELP),
)
@user_errors
def up(
    c: Context,
    session: Session,
    recipe: str,
    profile: str,
    flags: LaunchFlags,
    cluster: ClusterFlags,
    bringing: Bringing,
) -> None:
    """Doctor, then vLLM on every node (workers first, then the head), then wait for health."""
    from sparkforge.run.cluster import clusterrun
    from sparkforge.run.cluster.clusterplan import plan_cluster

    plan = plan_cluster(recipe, profile, flags, cluster, os.environ, dry=session.runner.dry)
    clusterrun.up(session, plan, bringing)


@task(
    families=(launch(READ), cluster(FABRIC), JSON_REPORT),
    help={
        "recipe": RECIPE_HELP + " (with --nodes: the image whose helper reads each node's sysfs)",
        "test": "run perftest's ib_write_bw across every cabled twin pair at once (needs --nodes and perftest)",
    },
)
@user_errors
def fabric(
    c: Context,
    session: Session,
    flags: LaunchFlags,
    cluster: ClusterFlags,
    outputs: Outputs,
    recipe: str = "",
    test: bool = False,
) -> None:
    """Each node's RDMA devices, ports, twins, GID index, the chosen interface and the env a launch would set."""
    from sparkforge.run.cluster.clusterplan import fabric_settings, plan_cluster
    from sparkforge.run.cluster.inventory import read_fabric
    from sparkforge.run.inputs import check_interface
    from sparkforge.run.launchplan import FlagError

    check_interface(flags.interface)  # the boundary: before any engine or sysfs is read
    settings = fabric_settings(cluster)
    if flags.nodes and not (recipe or flags.image):
        raise FlagError("cluster.fabric --nodes needs --recipe R (or --image REF) to read sysfs")
    plan = plan_cluster(recipe, "", flags, cluster, os.environ, dry=True) if flags.nodes else None
    report = read_fabric(session, plan, flags.interface, settings, test)
    outputs.finish(session, report, hint="the table above names the device and the fix")


@task(name="down", help={"nodes": NODES_HELP, "profile": "only this profile's containers"})
@user_errors
def cluster_down_task(c: Context, session: Session, nodes: str, profile: str = "") -> None:
    """Stop and remove every serve container sparkforge started on the nodes."""
    from sparkforge.run.serve.start import cluster_down

    for label, count in cluster_down(_engines(session, nodes), profile or None).items():
        session.out(f"{label}: removed {count} container(s)")


@task(help={"nodes": NODES_HELP, "tail": "lines per container"})
@user_errors
def logs(c: Context, session: Session, nodes: str, tail: int = Whole(100)) -> None:
    """The last log lines of every serve container on every node."""
    from sparkforge.run.cluster.cluster import cluster_logs
    from sparkforge.run.inputs import check_positive

    check_positive("--tail", tail)
    for where, text in cluster_logs(_engines(session, nodes), tail).items():
        session.out(f"==> {where} <==")
        session.out(text.rstrip())


def _engines(session: Session, nodes: str) -> list:
    """Every node checked (and plain tcp:// warned) before any engine is contacted."""
    from sparkforge.run.launchplan import LaunchFlags, plan_nodes
    from sparkforge.run.nodes import NodeEngine

    parsed, said = plan_nodes(LaunchFlags(nodes=nodes), os.environ)
    for line in said:
        session.warn(line)
    return [NodeEngine(n) for n in parsed]


cluster_ns = Collection("cluster")
cluster_ns.add_task(doctor, "doctor")
cluster_ns.add_task(fabric, "fabric")
cluster_ns.add_task(up, "up")
cluster_ns.add_task(cluster_down_task, "down")
cluster_ns.add_task(logs, "logs")
