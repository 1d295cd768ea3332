"""Invoke tasks that run images: `serve`, `serve.down`, `cluster.doctor|up|down|logs` (thin: the work is in sparkforge.run)."""

from __future__ import annotations

from pathlib import Path

from invoke import Collection, Context, task
from invoke.exceptions import Exit

from sparkforge.cli import echo, finish_report, user_errors, warn

RECIPE_HELP = "recipe name in recipes/ or path to a recipe file (its image and pinned vLLM)"
PROFILE_HELP = "serve profile name in profiles/ or path to a profile file"
NODES_HELP = (
    "nodes, head first: unix://, tcp://, ssh://user@host or a docker context, each optionally =LINK_ADDRESS"
)
IFACE_HELP = "the cluster-link interface on every node (sets VLLM_HOST_IP, NCCL/GLOO_SOCKET_IFNAME, ...)"


def _image(recipe: str, image: str) -> str:
    from sparkforge.recipe import plan

    if image:
        return plan.check_reference("--image", image)
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
    """Every node checked (and plain tcp:// warned) before any engine is contacted."""
    import os

    from sparkforge.run.nodes import NodeEngine, node_warnings, parse_nodes

    parsed = parse_nodes(nodes)
    for line in node_warnings(parsed, os.environ):
        warn(f"warning: {line}")
    return [NodeEngine(n) for n in parsed]


def _engine(node: str):
    """One node's engine for `serve` (default: the local one)."""
    import os

    from sparkforge.run.nodes import LOCAL, NodeEngine, node_warnings, parse_node

    parsed = parse_node(node) if node else LOCAL
    for line in node_warnings([parsed], os.environ):
        warn(f"warning: {line}")
    return NodeEngine(parsed)


def _trust_remote_code(allowed: bool) -> bool:
    """The one way to let vLLM run the model repository's code: said on the command line, printed loudly."""
    if allowed:
        warn(
            "warning: --trust-remote-code: vLLM will run Python code from the model's repository inside a "
            "container with host network, host IPC and the GPU; use it only for a model repository you trust"
        )
    return allowed


def _doctor_options(image: str, interface: str, master_port: int, gpus: str, sanity: bool = True):
    from sparkforge.run.facts import DoctorOptions
    from sparkforge.run.inputs import check_choice, check_interface, check_port

    check_interface(interface)
    check_port("--master-port", master_port)
    check_choice("--gpus", gpus, ("all", "none"))
    return DoctorOptions(
        image=image, interface=interface or None, master_port=master_port, sanity=sanity, gpus=gpus == "all"
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
    trust_remote_code: bool = False,
):
    from sparkforge.run import inputs
    from sparkforge.run.launch import GB10_ULIMITS, LaunchOptions

    model_path = Path(model_dir).resolve() if model_dir else None
    token_path = Path(hf_token_file).resolve() if hf_token_file else None
    inputs.check_port("--port", port)
    inputs.check_port("--master-port", master_port)
    inputs.check_choice("--backend", backend, ("mp", "ray"))
    inputs.check_choice("--gpus", gpus, ("all", "none"))
    inputs.check_host_path("--model-dir", str(model_path or ""))
    inputs.check_host_path("--hf-token-file", str(token_path or ""))
    inputs.check_host_path("--cache-dir", cache_dir)
    return LaunchOptions(
        image=image,
        port=port,
        master_port=master_port,
        backend=backend,  # type: ignore[arg-type]
        gpus=gpus != "none",
        model_dir=model_path,
        hf_token_file=token_path,
        cache_dir=cache_dir,
        ulimits=inputs.check_ulimits(ulimit) if ulimit else GB10_ULIMITS,
        trust_remote_code=_trust_remote_code(trust_remote_code),
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
    "ulimit": "container ulimits instead of GB10's (memlock=-1, stack=67108864, nofile=1048576); repeatable",
    "trust_remote_code": "let vLLM run Python code from the model's repository (never from a profile; printed)",
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
    trust_remote_code: bool = False,
) -> None:
    """Serve a profile on one node: GPU, host IPC, caches mounted, health wait, one chat completion."""
    from sparkforge.recipe.profile import load_profile
    from sparkforge.run.serve import serve_up

    engine = _engine(node)  # every input checked before the network or an engine is contacted
    loaded = load_profile(profile)
    options = _launch_options(
        _image(recipe, image), port, 29501, "mp", gpus, model_dir, hf_token_file, cache_dir, ulimit,
        trust_remote_code,
    )  # fmt: skip
    _preflight(recipe, profile, no_preflight)
    serve_up(engine, loaded, options, echo=echo, chat=not no_chat, dry=dry)


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
) -> None:
    """Checks before a multi-node launch: engines, image identity, advertised addresses, reach, MTU, versions, sanity run."""
    from sparkforge.run.doctor import run_doctor

    if not (recipe or image):
        raise Exit("sparkforge: cluster.doctor needs --recipe R (or --image REF)", code=2)
    engines = _engines(nodes)  # every input checked before the network or an engine is contacted
    options = _doctor_options(_image(recipe, image), interface, master_port, gpus)
    if profile and recipe:
        _preflight(recipe, profile, no_preflight)
    result = run_doctor(engines, options, echo=echo)
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
        "health_timeout": "seconds to wait for /health",
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
    trust_remote_code: bool = False,
) -> None:
    """Doctor, then vLLM on every node (workers first, then the head), then wait for health."""
    from sparkforge.recipe.profile import load_profile
    from sparkforge.run.cluster import cluster_down, cluster_up, ensure_image
    from sparkforge.run.inputs import check_positive

    engines = _engines(nodes)  # every input checked before the network or an engine is contacted
    loaded = load_profile(profile)
    ref = _image(recipe, image)
    launch = _launch_options(
        ref, port, master_port, backend, gpus, model_dir, hf_token_file, cache_dir, ulimit, trust_remote_code
    )
    doctor_options = _doctor_options(ref, interface, master_port, gpus, sanity=True)
    check_positive("--health-timeout", health_timeout)
    _preflight(recipe, profile, no_preflight)
    if not dry:  # --dry contacts no engine: no image check, no doctor probe
        ensure_image(engines, ref, echo, distribute=distribute)
    up_result = cluster_up(
        engines,
        loaded,
        launch,
        doctor_options,
        echo=echo,
        health_timeout_s=health_timeout,
        dry=dry,
    )
    if not dry:
        from sparkforge.run.serve import ask

        try:
            ask(engines[0], up_result.plan.head.container.name, port, loaded, echo=echo)
        except BaseException:
            removed = cluster_down(engines, loaded.name)
            echo(f"removed {sum(removed.values())} container(s) after the failed answer")
            raise


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
    from sparkforge.run.inputs import check_positive

    check_positive("--tail", tail)
    for where, text in cluster_logs(_engines(nodes), tail).items():
        echo(f"==> {where} <==")
        echo(text.rstrip())


serve_ns = Collection("serve")
serve_ns.add_task(serve, "serve", default=True)
serve_ns.add_task(serve_down, "down")

cluster_ns = Collection("cluster")
cluster_ns.add_task(doctor, "doctor")
cluster_ns.add_task(up, "up")
cluster_ns.add_task(cluster_down_task, "down")
cluster_ns.add_task(logs, "logs")
