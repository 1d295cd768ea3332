"""Invoke tasks that run images: `serve`, `serve.down`, `cluster.doctor|up|down|logs` (thin: the work is in sparkforge.run)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from invoke import Collection, Context
from invoke.exceptions import Exit

from sparkforge.cli import Whole, echo, session, task, user_errors, warn
from sparkforge.cli.memory import (
    FLOOR_HELP,
    FORCE_HELP,
    WATCHDOG_HELP,
    memory_check,
    serve_watchdog,
    watchdog_options,
)

RECIPE_HELP = "recipe name in recipes/ or path to a recipe file (its image and pinned vLLM)"
PROFILE_HELP = "serve profile name in profiles/ or path to a profile file"
NODES_HELP = (
    "nodes, head first: unix://, tcp://, ssh://user@host or a docker context, each optionally =LINK_ADDRESS"
)
IFACE_HELP = "the cluster-link interface on every node (sets VLLM_HOST_IP, NCCL/GLOO_SOCKET_IFNAME, ...)"


def image_ref(recipe: str, image: str, allow_unverified: bool = False, dry: bool = False) -> str:
    """The image a node task runs, through the one resolver (registry/pulled.py), said with the reason."""
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.registry.pulled import resolve

    if image:
        from sparkforge.recipe import plan

        plan.check_reference("--image", image)  # the boundary: before the recipe or the engine
        if not recipe:  # cluster.doctor/fabric without a recipe: the image as named (run with --pull never)
            return image
    found = resolve(load_recipe(recipe), image, allow_unverified=allow_unverified, dry=dry, warn=warn)
    echo(f"sparkforge: image {found.image}: {found.why}")
    return found.image


def preflight_profile(recipe: str, profile, skip: bool) -> None:
    """The (loaded) profile's flags and parsers against the recipe's pinned vLLM: fails in seconds, not at launch."""
    if skip:
        return
    from sparkforge.preflight.fetch import make_fetcher
    from sparkforge.preflight.serveflags import check_serve_profiles, recipe_surface
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.report import Report, print_report

    loaded = load_recipe(recipe)
    report = Report(command="preflight", subject=f"profile {profile.name}", recipe=loaded.name)
    check_serve_profiles(report, loaded, [profile], lambda: recipe_surface(loaded, make_fetcher()))
    if report.status != "passed":
        print_report(report, echo)
        raise Exit(f"sparkforge: serve flags failed preflight: {report.failed[0].reason}", code=1)


def known_bad_guard(recipe: str, profile) -> None:
    """A profile on a vLLM with a public report of silent wrong output: refused (or warned) before anything starts."""
    from sparkforge.preflight.knownbad import guard
    from sparkforge.recipe.loader import load_recipe

    guard(profile, load_recipe(recipe).model.components.vllm.version, warn)


def node_engines(nodes: str) -> list:
    """Every node checked (and plain tcp:// warned) before any engine is contacted."""
    import os

    from sparkforge.run.nodes import NodeEngine, node_warnings, parse_nodes

    parsed = parse_nodes(nodes)
    for line in node_warnings(parsed, os.environ):
        warn(f"warning: {line}")
    return [NodeEngine(n) for n in parsed]


def node_engine(node: str):
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


@dataclass(frozen=True)
class NodeFlags:
    """The flags the node tasks share (serve, conform, cluster.up, cluster.doctor) as typed; `doctor_options`
    and `launch_options` check them and build the library's options."""

    image: str  # the image reference (image_ref: --image, else the recipe's candidate)
    port: int = 8000
    master_port: int = 29501
    backend: str = "mp"
    gpus: str = "all"
    model_dir: str = ""
    hf_token_file: str = ""
    cache_dir: str = ""
    interface: str = ""
    ulimit: tuple[str, ...] = ()
    trust_remote_code: bool = False
    weights: str = "each"
    hf_endpoint: str = ""
    allow_unpinned_model: bool = False

    @classmethod
    def of(cls, image: str, options: Mapping[str, Any]) -> NodeFlags:
        """The flags a task was given, by name (a task passes `locals()`: its parameters are the command line's
        options, named as these fields); a flag the task does not have keeps its default."""
        given = {f.name: options[f.name] for f in fields(cls) if f.name != "image" and f.name in options}
        if "ulimit" in given:
            given["ulimit"] = tuple(given["ulimit"] or ())
        return cls(image, **given)


def doctor_options(flags: NodeFlags, sanity: bool = True):
    """The doctor's options from the flags, each checked (interface, port, --gpus, paths made absolute)."""
    from sparkforge.run.facts import DoctorOptions
    from sparkforge.run.inputs import check_choice, check_interface, check_port

    check_interface(flags.interface)
    check_port("--master-port", flags.master_port)
    check_choice("--gpus", flags.gpus, ("all", "none"))
    paths = (
        ("hf-token-file", flags.hf_token_file),
        ("model-dir", flags.model_dir),
        ("cache-dir", flags.cache_dir),
    )
    return DoctorOptions(
        image=flags.image,
        interface=flags.interface or None,
        master_port=flags.master_port,
        sanity=sanity,
        gpus=flags.gpus == "all",
        paths=tuple((kind, str(Path(p).absolute())) for kind, p in paths if p),
    )


def launch_options(flags: NodeFlags):
    """The launch options from the flags, each checked before any engine or download (ports, --gpus, paths)."""
    from sparkforge.run import inputs
    from sparkforge.run.launch import GB10_ULIMITS, LaunchOptions

    model_path = Path(flags.model_dir).resolve() if flags.model_dir else None
    token_path = Path(flags.hf_token_file).resolve() if flags.hf_token_file else None
    inputs.check_port("--port", flags.port)
    inputs.check_port("--master-port", flags.master_port)
    inputs.check_choice("--backend", flags.backend, ("mp", "ray"))
    inputs.check_choice("--gpus", flags.gpus, ("all", "none"))
    inputs.check_host_path("--model-dir", str(model_path or ""))
    inputs.check_host_path("--hf-token-file", str(token_path or ""))
    inputs.check_host_path("--cache-dir", flags.cache_dir)
    return LaunchOptions(
        image=flags.image,
        port=flags.port,
        master_port=flags.master_port,
        backend=flags.backend,  # type: ignore[arg-type]
        gpus=flags.gpus != "none",
        model_dir=model_path,
        hf_token_file=token_path,
        cache_dir=flags.cache_dir,
        ulimits=inputs.check_ulimits(list(flags.ulimit)) if flags.ulimit else GB10_ULIMITS,
        trust_remote_code=_trust_remote_code(flags.trust_remote_code),
        weights=inputs.check_choice("--weights", flags.weights, ("each", "shared", "skip")),  # type: ignore[arg-type]
        hf_endpoint=_hub(flags.hf_endpoint),
        allow_unpinned_model=_unpinned(flags.allow_unpinned_model),
    )


def _hub(given: str) -> str | None:
    """The hub the token may go to: --hf-endpoint, else the user's own HF_ENDPOINT, else none (the default hub)."""
    import os
    from urllib.parse import urlsplit

    value = given or os.environ.get("HF_ENDPOINT", "")
    if not value:
        return None
    where = "--hf-endpoint" if given else "HF_ENDPOINT (your environment)"
    try:
        parts = urlsplit(value)
        ok = (
            parts.scheme in ("https", "http")
            and bool(parts.hostname)
            and (parts.port is None or parts.port > 0)
        )
    except ValueError:
        ok = False
    if not ok or any(c.isspace() or ord(c) < 32 for c in value) or parts.query or parts.fragment:
        raise Exit(
            f"sparkforge: {where} {value[:100]!r} is not a hub URL; fix: e.g. https://huggingface.co", code=2
        )
    return value.rstrip("/")


def _unpinned(allowed: bool) -> bool:
    if allowed:
        warn(
            "warning: --allow-unpinned-model: the model is served from whatever the hub holds at download time "
            "(weights, tokenizer and configs not pinned to a commit)"
        )
    return allowed


COMMON_HELP = {
    "recipe": RECIPE_HELP,
    "profile": PROFILE_HELP,
    "image": "image reference to run (default: the recipe's local build, else the digest 'invoke pull' verified)",
    "allow_unverified": "run an --image of a registry that 'invoke pull' did not verify (a loud warning)",
    "port": "the OpenAI API port on the head (default 8000)",
    "model_dir": "a directory holding the model (the same path on every node), mounted read-only; default: the HF cache",
    "hf_token_file": "file holding a Hugging Face token, mounted read-only (never on a command line or in docker inspect)",
    "cache_dir": "host directory (on every node) for the HF, vLLM, FlashInfer and Triton caches",
    "gpus": "all (default) or none (no GPU: vLLM stops at device detection; for testing the launch)",
    "no_preflight": "skip checking the profile's flags against the pinned vLLM",
    "dry": "print the exact plan (docker argv and env per node), start nothing",
    "weights": "each (default): download the weights on every node before the health wait; shared: once, on the head, then streamed to the peers over the fabric link (resumable); skip: leave it to vLLM",
    "ulimit": "container ulimits instead of GB10's (memlock=-1, stack=67108864, nofile=1048576); repeatable",
    "trust_remote_code": "let vLLM run Python code from the model's repository (never from a profile; printed)",
    "hf_endpoint": "the hub the download phase (and its token) talks to (default: your HF_ENDPOINT, else the Hugging Face hub; never a profile's)",
    "allow_unpinned_model": "serve a profile whose model has no pinned revision (args.revision, 40 hex): the hub's current files",
}


@task(
    iterable=["ulimit"],
    help={
        **COMMON_HELP,
        "node": "the engine to run on (default: the local one)",
        "no_chat": "skip the chat completion",
        "down_on_fail": "remove the deployment when the answer check fails (default: keep the healthy deployment)",
        "force": FORCE_HELP,
        "watchdog": WATCHDOG_HELP,
        "watchdog_floor": FLOOR_HELP,
    },
)
@user_errors
def serve(
    c: Context,
    recipe: str,
    profile: str,
    image: str = "",
    port: int = Whole(8000),
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
    weights: str = "each",
    down_on_fail: bool = False,
    hf_endpoint: str = "",
    allow_unpinned_model: bool = False,
    force: bool = False,
    watchdog: str = "auto",
    watchdog_floor: float = 4.0,
    allow_unverified: bool = False,
) -> None:
    """Serve a profile on one node: GPU, host IPC, caches mounted, health wait, one chat completion."""
    from sparkforge.recipe.profile import load_profile
    from sparkforge.run.serve.serve import ServeOptions, serve_up

    engine = node_engine(node)  # every input checked before the network or an engine is contacted
    loaded = load_profile(profile)
    flags = NodeFlags.of(image_ref(recipe, image, allow_unverified, dry), locals())
    options = launch_options(flags)
    guard = watchdog_options(watchdog, watchdog_floor)
    memory_check(recipe, loaded, model_dir, force)  # before the network, any engine or a download
    preflight_profile(recipe, loaded, no_preflight)
    known_bad_guard(recipe, loaded)
    serving = ServeOptions(options, chat=not no_chat, dry=dry, down_on_fail=down_on_fail)
    plan, _ = serve_up(session(), engine, loaded, serving)
    if not dry:
        serve_watchdog(recipe, engine, plan.head.container.name, guard, gpus)


@task(
    name="down",
    help={"node": "the engine (default: the local one)", "profile": "only this profile's container"},
)
@user_errors
def serve_down(c: Context, node: str = "", profile: str = "") -> None:
    """Stop and remove what `serve` started on this node."""
    from sparkforge.run.serve.serve import serve_down as down

    echo(f"removed {down(node_engine(node), profile or None)} container(s)")


serve_ns = Collection("serve")
serve_ns.add_task(serve, "serve", default=True)
serve_ns.add_task(serve_down, "down")
