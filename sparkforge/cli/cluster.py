"""Invoke tasks for several nodes: `cluster.doctor|fabric|up|down|logs` (thin: the work is in sparkforge.run)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from invoke import Collection, Context
from invoke.exceptions import Exit

from sparkforge.cli import Whole, echo, finish_report, session, task, user_errors
from sparkforge.cli.memory import FORCE_HELP, memory_check
from sparkforge.cli.run import (
    COMMON_HELP,
    IFACE_HELP,
    NODES_HELP,
    RECIPE_HELP,
    NodeFlags,
    doctor_options,
    image_ref,
    known_bad_guard,
    launch_options,
    node_engines,
    preflight_profile,
)

if TYPE_CHECKING:
    from sparkforge.run.memory.memoryplan import MemoryPlan


def _gid_index(text: str) -> int | None:
    """--gid-index: empty (NCCL chooses) or a whole number 0..255 (the GID table's range)."""
    from sparkforge.boundary import ascii_number

    if not text:
        return None
    value = ascii_number(text, integer=True)  # ASCII digits only: '²'.isdigit() is True, and int('²') fails
    if value is None or not 0 <= value <= 255:
        raise Exit(
            f"sparkforge: --gid-index {text[:40]!r} is not a GID table index 0..255; fix: leave it out (NCCL "
            "picks the RoCE v2 IPv4 GID itself) or give one index 'invoke cluster.fabric' lists",
            code=2,
        )
    return int(value)


def _nccl(text: str) -> Literal["image", "host"]:
    from sparkforge.run.inputs import check_choice

    return "host" if check_choice("--nccl", text, ("image", "host")) == "host" else "image"


def _floor(text: str) -> float | None:
    """--min-busbw: empty (80 % of the port rate), 0 (off) or GB/s."""
    from sparkforge.boundary import ascii_number

    if not text:
        return None
    value = ascii_number(text, integer=False)  # float() takes '1_8' (18), '٣' (3) and 'nan'
    if value is None or not 0 <= value < 10_000:
        raise Exit(
            f"sparkforge: --min-busbw {text!r} is not a bandwidth in GB/s; fix: e.g. 18, or 0 to disable",
            code=2,
        )
    return value


LAYOUT_HELP = "the cabling: pair, mesh3, ring (ring4), switch (checked against what each node's sysfs shows)"


def _layout_name(text: str) -> str | None:
    from sparkforge.run.cluster.topology import layout

    return layout(text).name if text else None


def _cluster_layout(
    recipe: str, profile, count: int, sizes: tuple[int, int], layout: str, backend: str, model_dir: str
):
    """--tp/--pp applied to the profile, then the split judged against the model, the cabling and the known-bad
    list before any engine is contacted; returns the profile, the verdict and the recipe's NCCL pin."""
    from pathlib import Path

    from sparkforge.console import warn
    from sparkforge.errors import RunError
    from sparkforge.recipe.checkpoints import checkpoint_path, pinned_revision
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.recipe.profile import PROFILES_DIR
    from sparkforge.run.cluster.parallel import Parallel, check_layout, relayout
    from sparkforge.run.inputs import check_positive
    from sparkforge.run.memory.checkpoint import load_architecture

    tp, pp = sizes
    for name, value in (("--tp", tp), ("--pp", pp)):
        if value:
            check_positive(name, value)
    if tp or pp:
        profile = relayout(profile, Parallel(tp or 1, pp or 1))
    try:
        revision = pinned_revision(profile.model.args)
        where = Path(model_dir) if model_dir else None
        arch = load_architecture(checkpoint_path(profile.model.model, revision, PROFILES_DIR, where))
    except RunError:
        arch = None
    pin = load_recipe(recipe).model.runtime.nccl
    nccl = pin.model_dump(mode="json") if pin else None
    plan = check_layout(profile, arch, count, _layout_name(layout), nccl=nccl, backend=backend)
    for line in plan.lines():
        echo(line)
    for line in plan.warnings:
        warn(f"warning: {line}")
    return profile, plan, nccl


def _pick(*keys: str, **extra: str) -> dict[str, str]:
    return {**{k: COMMON_HELP[k] for k in keys}, **extra}


@task(
    help=_pick(
        "recipe",
        "profile",
        "image",
        "no_preflight",
        nodes=NODES_HELP,
        interface=IFACE_HELP,
        json="write the JSON report here",
        master_port="the rendezvous port the launch uses (checked for reachability)",
        gpus="all: give the sanity ranks the GPUs (NCCL all-reduce too); none (default): Gloo and vLLM's queue only",
        min_busbw="GB/s: NCCL's all-reduce bus bandwidth below it fails the transport stage (default: 80 % of "
        "the port rate sysfs reports; 0 disables)",
        gid_index="pin NCCL_IB_GID_INDEX (default: NCCL picks the RoCE v2 IPv4 GID itself; checked against the table)",
        nccl="image (default): the image's libnccl; host: bind-mount each node's own libnccl over it (ABI checked)",
        model_dir="a model directory to look for on every node (config.json)",
        hf_token_file="a token file to look for on every node",
        cache_dir="a cache directory to look for on every node",
        quick="only the cheap stages (engines to versions: advertised address, interface, MTU, GID...), stopping "
        "at the first cause named; no NCCL probe or sanity run",
        layout=LAYOUT_HELP,
    )
)
@user_errors
def doctor(
    c: Context,
    nodes: str,
    recipe: str = "",
    profile: str = "",
    image: str = "",
    interface: str = "",
    json: str = "",
    master_port: int = Whole(29501),
    gpus: str = "none",
    no_preflight: bool = False,
    min_busbw: str = "",
    model_dir: str = "",
    hf_token_file: str = "",
    cache_dir: str = "",
    gid_index: str = "",
    nccl: str = "image",
    quick: bool = False,
    layout: str = "",
) -> None:
    """Checks before a multi-node launch: engines, image identity, advertised addresses, reach, MTU, versions, sanity run."""
    from sparkforge.recipe.profile import load_profile
    from sparkforge.run.cluster.doctor import DoctorPlan, run_doctor

    if not (recipe or image):
        raise Exit("sparkforge: cluster.doctor needs --recipe R (or --image REF)", code=2)
    from sparkforge.boundary import check_output

    check_output(json, "--json")  # the boundary: the report's path, before any node is contacted
    engines = node_engines(nodes)  # every input checked before the network or an engine is contacted
    # dry: with nothing built or pulled the doctor's own image stage names what each node lacks
    flags = NodeFlags.of(image_ref(recipe, image, dry=True), locals())
    options = doctor_options(flags)
    options = replace(
        options,
        min_busbw=_floor(min_busbw),
        gid_index=_gid_index(gid_index),
        nccl_source=_nccl(nccl),
        quick=quick,
        layout=_layout_name(layout),
    )
    if profile and recipe:
        served = load_profile(profile)
        served, split, pin = _cluster_layout(recipe, served, len(engines), (0, 0), layout, "mp", model_dir)
        options = replace(
            options,
            parallel=(split.parallel.tp, split.parallel.pp),
            nccl_pin=pin,
            cuda_graphs=split.cuda_graphs,
        )
        planned = memory_check(recipe, served, model_dir, True)
        options = replace(options, memory_plan=_gpu_plan(planned, gpus))
        preflight_profile(recipe, served, no_preflight)
    result = run_doctor(session(), DoctorPlan(tuple(engines), options))
    finish_report(result.report, json, hint="the table above names the stage, the node and the fix")


@task(
    iterable=["ulimit"],
    help={
        **COMMON_HELP,
        "nodes": NODES_HELP,
        "interface": IFACE_HELP,
        "backend": "mp (vLLM's multiprocessing multi-node, default) or ray",
        "master_port": "rendezvous port (--master-port)",
        "distribute": "stream the local image to nodes whose image ID differs",
        "health_timeout": "seconds to wait for /health, counted from when the weights are on disk",
        "gid_index": "pin NCCL_IB_GID_INDEX (default: NCCL picks the RoCE v2 IPv4 GID itself)",
        "nccl": "image (default) or host: each node's own libnccl bind-mounted over the image's (ABI checked)",
        "down_on_fail": "remove the deployment when the answer check fails (default: keep the healthy deployment)",
        "force": FORCE_HELP,
        "tp": "tensor-parallel-size over the nodes (default: the profile's); checked against the model's heads, "
        "experts and the cabling before anything starts",
        "pp": "pipeline-parallel-size over the nodes (default: the profile's); TP x PP is the node count",
        "layout": LAYOUT_HELP,
    },
)
@user_errors
def up(
    c: Context,
    recipe: str,
    profile: str,
    nodes: str,
    interface: str = "",
    image: str = "",
    port: int = Whole(8000),
    master_port: int = Whole(29501),
    backend: str = "mp",
    model_dir: str = "",
    hf_token_file: str = "",
    cache_dir: str = "/var/cache/sparkforge",
    gpus: str = "all",
    distribute: bool = False,
    health_timeout: int = Whole(1800),
    no_preflight: bool = False,
    dry: bool = False,
    ulimit: list[str] | None = None,
    trust_remote_code: bool = False,
    weights: str = "each",
    gid_index: str = "",
    nccl: str = "image",
    down_on_fail: bool = False,
    hf_endpoint: str = "",
    allow_unpinned_model: bool = False,
    force: bool = False,
    allow_unverified: bool = False,
    tp: int = Whole(0),
    pp: int = Whole(0),
    layout: str = "",
) -> None:
    """Doctor, then vLLM on every node (workers first, then the head), then wait for health."""
    from sparkforge.recipe.profile import load_profile
    from sparkforge.run.cluster.cluster import UpOptions, cluster_up, ensure_image
    from sparkforge.run.inputs import check_positive
    from sparkforge.run.serve.start import cluster_down

    engines = node_engines(nodes)  # every input checked before the network or an engine is contacted
    loaded = load_profile(profile)
    loaded, split, pin = _cluster_layout(recipe, loaded, len(engines), (tp, pp), layout, backend, model_dir)
    ref = image_ref(recipe, image, allow_unverified, dry)
    flags = NodeFlags.of(ref, locals())
    launch = launch_options(flags)
    doctor_settings = doctor_options(flags)
    doctor_settings = replace(
        doctor_settings,
        gid_index=_gid_index(gid_index),
        nccl_source=_nccl(nccl),
        layout=_layout_name(layout),
        parallel=(split.parallel.tp, split.parallel.pp),
        cuda_graphs=split.cuda_graphs,
        nccl_pin=pin,
    )
    check_positive("--health-timeout", health_timeout)
    planned = memory_check(recipe, loaded, model_dir, force)  # before the network, any engine or a download
    doctor_settings = replace(doctor_settings, memory_plan=_gpu_plan(planned, gpus))
    preflight_profile(recipe, loaded, no_preflight)
    known_bad_guard(recipe, loaded)
    one = session()
    if not dry:  # --dry contacts no engine: no image check, no doctor probe
        ensure_image(one, engines, ref, distribute=distribute)
    up_options = UpOptions(launch, doctor_settings, health_timeout, dry)
    up_result = cluster_up(one, engines, loaded, up_options)
    if not dry:
        from sparkforge.errors import RunError
        from sparkforge.run.serve.serve import ask, keep_or_remove

        try:
            ask(one, engines[0], up_result.plan.head.container.name, port, loaded)
        except RunError:
            keep_or_remove(one, engines, loaded.name, down_on_fail)
            raise
        except BaseException:
            cluster_down(engines, loaded.name)
            raise


@task(
    help={
        "nodes": NODES_HELP + "; default: this machine (or the sysfs tree SPARKFORGE_SYSFS names)",
        "recipe": RECIPE_HELP + " (with --nodes: the image whose helper reads each node's sysfs)",
        "image": "image to read each node's sysfs with (default: the recipe's candidate tag)",
        "interface": IFACE_HELP + " (checked: exists, up, an IPv4 RoCE v2 GID)",
        "json": "write the JSON report here",
        "gid_index": "pin NCCL_IB_GID_INDEX (default: NCCL picks; checked against every chosen device's table)",
        "test": "run perftest's ib_write_bw across every cabled twin pair at once (needs --nodes and perftest)",
        "nccl": "image (default) or host: report the node's own libnccl a launch bind-mounts over the image's, "
        "and its ABI check (the image's side needs --nodes)",
        "layout": LAYOUT_HELP,
    }
)
@user_errors
def fabric(
    c: Context,
    nodes: str = "",
    recipe: str = "",
    image: str = "",
    interface: str = "",
    json: str = "",
    gid_index: str = "",
    test: bool = False,
    nccl: str = "image",
    layout: str = "",
) -> None:
    """Each node's RDMA devices, ports, twins, GID index, the chosen interface and the env a launch would set."""
    from sparkforge.boundary import check_output
    from sparkforge.console import warn
    from sparkforge.oci import check_reference
    from sparkforge.run.cluster.inventory import (
        describe_choices,
        fabric_report,
        local_facts,
        local_nccl,
        nccl_sources,
        remote_facts,
        remote_nccl,
    )
    from sparkforge.run.inputs import check_interface

    check_interface(interface)  # the boundary: before any engine or sysfs is read
    if image:
        check_reference("--image", image)
    check_output(json, "--json")
    source = _nccl(nccl)
    gid = _gid_index(gid_index)

    if nodes:
        if not (recipe or image):
            raise Exit(
                "sparkforge: cluster.fabric --nodes needs --recipe R (or --image REF) to read sysfs", code=2
            )
        engines = node_engines(nodes)
        ref = image_ref(recipe, image, dry=True)
        labels, raws = [e.node.label for e in engines], remote_facts(engines, ref)
    else:
        engines, labels, raws, ref = [], ["local"], [local_facts()], ""
    libraries = (remote_nccl(engines, ref) if nodes else [local_nccl()]) if source == "host" else []
    sources = nccl_sources(labels, source, libraries)
    declared = [e.node.address for e in engines]  # `--nodes URL=ADDR`: the same decision as a discovered node
    report, choices = fabric_report(
        labels, raws, interface or None, gid, declared, sources, _layout_name(layout)
    )
    describe_choices(session(), choices, sources)
    if test:
        from sparkforge.run.cluster.fabric import parse_node
        from sparkforge.run.cluster.linktest import link_check

        with report.timed("link-test") as check:
            parsed = [parse_node(label, raw) for label, raw in zip(labels, raws, strict=True)]
            link_check(check, engines, parsed, choices, raws, ref if nodes else "")
        echo(f"link-test {check.status}: {check.reason}")
    finish_report(report, json, hint="the table above names the device and the fix")


@task(name="down", help={"nodes": NODES_HELP, "profile": "only this profile's containers"})
@user_errors
def cluster_down_task(c: Context, nodes: str, profile: str = "") -> None:
    """Stop and remove every serve container sparkforge started on the nodes."""
    from sparkforge.run.serve.start import cluster_down

    for label, count in cluster_down(node_engines(nodes), profile or None).items():
        echo(f"{label}: removed {count} container(s)")


@task(help={"nodes": NODES_HELP, "tail": "lines per container"})
@user_errors
def logs(c: Context, nodes: str, tail: int = Whole(100)) -> None:
    """The last log lines of every serve container on every node."""
    from sparkforge.run.cluster.cluster import cluster_logs
    from sparkforge.run.inputs import check_positive

    check_positive("--tail", tail)
    for where, text in cluster_logs(node_engines(nodes), tail).items():
        echo(f"==> {where} <==")
        echo(text.rstrip())


cluster_ns = Collection("cluster")
cluster_ns.add_task(doctor, "doctor")
cluster_ns.add_task(fabric, "fabric")
cluster_ns.add_task(up, "up")
cluster_ns.add_task(cluster_down_task, "down")
cluster_ns.add_task(logs, "logs")


def _gpu_plan(planned: MemoryPlan | None, gpus: str) -> dict[str, Any] | None:
    """The memory plan the doctor's memory stage holds each node's free memory to: none for a launch without
    GPUs (--gpus none), whose vLLM allocates no gpu-memory-utilization share (the stage then only reports)."""
    return planned.to_dict() if planned is not None and gpus != "none" else None
