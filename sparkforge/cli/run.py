"""Invoke tasks that run images: `serve`, `serve.down`, `cluster.doctor|up|down|logs` (thin: the work is in sparkforge.run)."""

from __future__ import annotations

from pathlib import Path

from invoke import Collection, Context, task
from invoke.exceptions import Exit

from sparkforge.cli import echo, finish_report, user_errors

RECIPE_HELP = "recipe name in recipes/ or path to a recipe file (its image and pinned vLLM)"
PROFILE_HELP = "serve profile name in profiles/ or path to a profile file"
NODES_HELP = (
    "nodes, head first: unix://, tcp://, ssh://user@host or a docker context, each optionally =LINK_ADDRESS"
)
IFACE_HELP = "the cluster-link interface on every node (sets VLLM_HOST_IP, NCCL/GLOO_SOCKET_IFNAME, ...)"


def _image(recipe: str, image: str) -> str:
    if image:
        return image
    from sparkforge.recipe import plan
    from sparkforge.recipe.loader import load_recipe

    loaded = load_recipe(recipe)
    return plan.candidate_tag(loaded, loaded.model.platforms[0])


def _preflight(recipe: str, profile_ref: str, skip: bool) -> None:
    """The profile's flags and parsers against the recipe's pinned vLLM: fails in seconds, not at launch."""
    if skip:
        return
    from sparkforge.preflight.fetch import make_fetcher
    from sparkforge.preflight.serveflags import check_serve_profiles, recipe_surface
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.recipe.profile import load_profile
    from sparkforge.report import Report, print_report

    loaded = load_recipe(recipe)
    report = Report(command="preflight", subject=f"profile {profile_ref}", recipe=loaded.name)
    check_serve_profiles(
        report, loaded, [load_profile(profile_ref)], lambda: recipe_surface(loaded, make_fetcher())
    )
    if report.status != "passed":
        print_report(report, echo)
        raise Exit(f"sparkforge: serve flags failed preflight: {report.failed[0].reason}", code=1)


def _engines(nodes: str) -> list:
    from sparkforge.run.nodes import NodeEngine, parse_nodes

    return [NodeEngine(n) for n in parse_nodes(nodes)]


def _engine(node: str):
    """One node's engine for `serve` (default: the local one)."""
    from sparkforge.run.nodes import LOCAL, NodeEngine, parse_node

    return NodeEngine(parse_node(node) if node else LOCAL)


def _doctor_options(
    image: str,
    interface: str,
    master_port: int,
    gpus: str,
    sanity: bool = True,
    *,
    min_busbw: float = 0.0,
    model_dir: str = "",
    hf_token_file: str = "",
    cache_dir: str = "",
):
    from sparkforge.run.facts import DoctorOptions

    paths = (("hf-token-file", hf_token_file), ("model-dir", model_dir), ("cache-dir", cache_dir))
    return DoctorOptions(
        image=image,
        interface=interface or None,
        master_port=master_port,
        sanity=sanity,
        gpus=gpus == "all",
        min_busbw=min_busbw,
        paths=tuple((kind, str(Path(p).absolute())) for kind, p in paths if p),
    )


def _launch_options(
    image: str,
    port: int,
    master_port: int,
    backend: str,
    gpus: str,
    model_dir: str,
    hf_token_file: str,
    cache_dir: str,
    ulimit: list[str] | None = None,
    weights: str = "each",
):
    from sparkforge.run.launch import GB10_ULIMITS, LaunchOptions

    return LaunchOptions(
        image=image,
        port=port,
        master_port=master_port,
        backend=backend,  # type: ignore[arg-type]
        gpus=gpus != "none",
        model_dir=Path(model_dir) if model_dir else None,
        hf_token_file=Path(hf_token_file).resolve() if hf_token_file else None,
        cache_dir=cache_dir,
        ulimits=tuple(ulimit) if ulimit else GB10_ULIMITS,
        weights=weights,  # type: ignore[arg-type]
    )


COMMON_HELP = {
    "recipe": RECIPE_HELP,
    "profile": PROFILE_HELP,
    "image": "image reference to run (default: the recipe's candidate tag)",
    "port": "the OpenAI API port on the head (default 8000)",
    "model_dir": "a directory holding the model (the same path on every node), mounted read-only; default: the HF cache",
    "hf_token_file": "file holding a Hugging Face token, mounted read-only (never on a command line or in docker inspect)",
    "cache_dir": "host directory (on every node) for the HF, vLLM, FlashInfer and Triton caches",
    "gpus": "all (default) or none (no GPU: vLLM stops at device detection; for testing the launch)",
    "no_preflight": "skip checking the profile's flags against the pinned vLLM",
    "dry": "print the exact plan (docker argv and env per node), start nothing",
    "weights": "each (default): download the weights on every node before the health wait; shared: once, on the head (the cache dir is shared storage); skip: leave it to vLLM",
    "ulimit": "container ulimits instead of GB10's (memlock=-1, stack=67108864, nofile=1048576); repeatable",
}


@task(
    iterable=["ulimit"],
    help={
        **COMMON_HELP,
        "node": "the engine to run on (default: the local one)",
        "no_chat": "skip the chat completion",
    },
)
@user_errors
def serve(
    c: Context,
    recipe: str,
    profile: str,
    image: str = "",
    port: int = 8000,
    model_dir: str = "",
    hf_token_file: str = "",
    cache_dir: str = "/var/cache/sparkforge",
    gpus: str = "all",
    node: str = "",
    no_preflight: bool = False,
    no_chat: bool = False,
    dry: bool = False,
    ulimit: list[str] | None = None,
    weights: str = "each",
) -> None:
    """Serve a profile on one node: GPU, host IPC, caches mounted, health wait, one chat completion."""
    from sparkforge.recipe.profile import load_profile
    from sparkforge.run.serve import serve_up

    _preflight(recipe, profile, no_preflight)
    engine = _engine(node)
    options = _launch_options(
        _image(recipe, image), port, 29501, "mp", gpus, model_dir, hf_token_file, cache_dir, ulimit, weights
    )
    serve_up(engine, load_profile(profile), options, echo=echo, chat=not no_chat, dry=dry)


@task(
    name="down",
    help={"node": "the engine (default: the local one)", "profile": "only this profile's container"},
)
@user_errors
def serve_down(c: Context, node: str = "", profile: str = "") -> None:
    """Stop and remove what `serve` started on this node."""
    from sparkforge.run.serve import serve_down as down

    echo(f"removed {down(_engine(node), profile or None)} container(s)")


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
        min_busbw="GB/s: NCCL's all-reduce bus bandwidth below it fails the transport stage (one CX-7 port: ~19-24)",
        model_dir="a model directory to look for on every node (config.json)",
        hf_token_file="a token file to look for on every node",
        cache_dir="a cache directory to look for on every node",
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
    master_port: int = 29501,
    gpus: str = "none",
    no_preflight: bool = False,
    min_busbw: float = 0.0,
    model_dir: str = "",
    hf_token_file: str = "",
    cache_dir: str = "",
) -> None:
    """Checks before a multi-node launch: engines, image identity, advertised addresses, reach, MTU, versions, sanity run."""
    from sparkforge.run.doctor import run_doctor

    if not (recipe or image):
        raise Exit("sparkforge: cluster.doctor needs --recipe R (or --image REF)", code=2)
    if profile and recipe:
        _preflight(recipe, profile, no_preflight)
    result = run_doctor(
        _engines(nodes),
        _doctor_options(
            _image(recipe, image),
            interface,
            master_port,
            gpus,
            min_busbw=min_busbw,
            model_dir=model_dir,
            hf_token_file=hf_token_file,
            cache_dir=cache_dir,
        ),
        echo=echo,
    )
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
    port: int = 8000,
    master_port: int = 29501,
    backend: str = "mp",
    model_dir: str = "",
    hf_token_file: str = "",
    cache_dir: str = "/var/cache/sparkforge",
    gpus: str = "all",
    distribute: bool = False,
    health_timeout: int = 1800,
    no_preflight: bool = False,
    dry: bool = False,
    ulimit: list[str] | None = None,
    weights: str = "each",
) -> None:
    """Doctor, then vLLM on every node (workers first, then the head), then wait for health."""
    from sparkforge.recipe.profile import load_profile
    from sparkforge.run.cluster import cluster_up, ensure_image

    _preflight(recipe, profile, no_preflight)
    ref = _image(recipe, image)
    engines = _engines(nodes)
    ensure_image(engines, ref, echo, distribute=distribute)
    launch = _launch_options(
        ref, port, master_port, backend, gpus, model_dir, hf_token_file, cache_dir, ulimit, weights
    )
    doctor_options = _doctor_options(
        ref,
        interface,
        master_port,
        gpus,
        model_dir=model_dir,
        hf_token_file=hf_token_file,
        cache_dir=cache_dir,
    )
    cluster_up(
        engines,
        load_profile(profile),
        launch,
        doctor_options,
        echo=echo,
        health_timeout_s=health_timeout,
        dry=dry,
    )


@task(
    help={
        "nodes": NODES_HELP + "; default: this machine (or the sysfs tree SPARKFORGE_SYSFS names)",
        "recipe": RECIPE_HELP + " (with --nodes: the image whose helper reads each node's sysfs)",
        "image": "image to read each node's sysfs with (default: the recipe's candidate tag)",
        "interface": IFACE_HELP + " (checked: exists, up, an IPv4 RoCE v2 GID)",
        "json": "write the JSON report here",
    }
)
@user_errors
def fabric(
    c: Context, nodes: str = "", recipe: str = "", image: str = "", interface: str = "", json: str = ""
) -> None:
    """Each node's RDMA devices, ports, twins, GID index, the chosen interface and the env a launch would set."""
    from sparkforge.console import warn
    from sparkforge.run.inventory import describe_choices, fabric_report, local_facts, remote_facts

    if nodes:
        if not (recipe or image):
            raise Exit(
                "sparkforge: cluster.fabric --nodes needs --recipe R (or --image REF) to read sysfs", code=2
            )
        engines = _engines(nodes)
        labels, raws = [e.node.label for e in engines], remote_facts(engines, _image(recipe, image))
    else:
        labels, raws = ["local"], [local_facts()]
    report, choices = fabric_report(labels, raws, interface or None)
    describe_choices(choices, echo, warn)
    finish_report(report, json, hint="the table above names the device and the fix")


@task(name="down", help={"nodes": NODES_HELP, "profile": "only this profile's containers"})
@user_errors
def cluster_down_task(c: Context, nodes: str, profile: str = "") -> None:
    """Stop and remove every serve container sparkforge started on the nodes."""
    from sparkforge.run.cluster import cluster_down

    for label, count in cluster_down(_engines(nodes), profile or None).items():
        echo(f"{label}: removed {count} container(s)")


@task(help={"nodes": NODES_HELP, "tail": "lines per container"})
@user_errors
def logs(c: Context, nodes: str, tail: int = 100) -> None:
    """The last log lines of every serve container on every node."""
    from sparkforge.run.cluster import cluster_logs

    for where, text in cluster_logs(_engines(nodes), tail).items():
        echo(f"==> {where} <==")
        echo(text.rstrip())


serve_ns = Collection("serve")
serve_ns.add_task(serve, "serve", default=True)
serve_ns.add_task(serve_down, "down")

cluster_ns = Collection("cluster")
cluster_ns.add_task(doctor, "doctor")
cluster_ns.add_task(fabric, "fabric")
cluster_ns.add_task(up, "up")
cluster_ns.add_task(cluster_down_task, "down")
cluster_ns.add_task(logs, "logs")
