"""One launch, planned once: `serve`, `conform`, `bench` and `cluster.up` each make ONE `LaunchPlan` from the
command line's launch flags. The recipe and the profile are loaded here, once; every flag is checked here, once,
before any engine, download or network; the image, the nodes, the containers' argv, ports and mounts and the
memory plan are decided here. `--dry` prints `plan_lines(plan)`; an executor (sparkforge/run/launchrun.py) runs
the plan with the session. Tests assert on plans without an engine.

The one reach outside pure data: without `--image`, the recipe's local build is looked up in this host's engine
(registry/pulled.resolve), as every task that runs an image does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sparkforge.errors import InputError, RunError
from sparkforge.run import inputs
from sparkforge.run.launch import (
    GB10_ULIMITS,
    ContainerPlan,
    LaunchOptions,
    architecture_argv,
    check_model_pin,
    describe_plan,
    plan_launch,
    shown_argv,
)
from sparkforge.run.memory.guard import plan_or_refuse
from sparkforge.run.nodes import LOCAL, Node, node_warnings, parse_node, parse_nodes

if TYPE_CHECKING:
    from sparkforge.recipe.loader import Recipe
    from sparkforge.recipe.profile import Profile
    from sparkforge.run.facts import DoctorOptions
    from sparkforge.run.memory.memoryplan import MemoryPlan


class FlagError(InputError):
    """A launch flag refused as a usage error (exit 2, as Invoke's own parse errors)."""

    exit_code = 2


@dataclass(frozen=True)
class LaunchFlags:
    """The launch flags as the command line gave them (serve, conform, bench, cluster.up): unchecked words and
    numbers; `plan_task` checks each once. A task that lacks a flag leaves its default."""

    image: str = ""  # --image REF (default: the recipe's local build, else the digest 'invoke pull' verified)
    allow_unverified: bool = False
    node: str = ""  # --node E: one engine (default: the local one)
    nodes: str = ""  # --nodes A,B: several engines, head first (wins over `node`)
    port: int = 8000
    master_port: int = 29501
    backend: str = "mp"
    gpus: str = "all"
    model_dir: str = ""
    hf_token_file: str = ""
    cache_dir: str = "/var/cache/sparkforge"
    interface: str = ""
    ulimit: tuple[str, ...] = ()
    trust_remote_code: bool = False
    weights: str = "each"
    hf_endpoint: str = ""
    allow_unpinned_model: bool = False
    force: bool = False  # start although the memory plan says it does not fit
    no_preflight: bool = False  # skip the profile's flags against the pinned vLLM


@dataclass(frozen=True)
class LaunchPlan:
    """Everything one launch task decided before it contacts anything: the loaded recipe and profile, the image,
    the nodes, the checked launch and doctor options, the memory plan and, on one node, the containers."""

    recipe: Recipe
    profile: Profile
    flags: LaunchFlags
    image: str
    image_why: str  # why this image (printed as `sparkforge: image REF: WHY`)
    nodes: tuple[Node, ...]  # head first
    launch: LaunchOptions
    doctor: DoctorOptions | None  # several nodes: cluster.up's doctor before the launch (one node: None)
    memory: MemoryPlan | None  # None: no countable config (the CPU twin, or --force); said in `warnings`
    containers: ContainerPlan | None  # one node: every argv decided; several: after the doctor's addresses
    warnings: tuple[str, ...] = field(default_factory=tuple)  # said (stderr) before anything starts
    notes: tuple[str, ...] = field(default_factory=tuple)  # the profile's opt-ins past the allow-list, said
    memory_refusal: str = ""  # why no memory plan shows it fits (judge_memory raises it)
    pin_refusal: str = (
        ""  # the model is not pinned (or the token would reach the recipe's code): opt_ins raises it
    )
    starts: bool = True  # False: a server already runs (bench, conform --attach): no image resolved, no start

    @property
    def device(self) -> str:
        return self.recipe.model.device

    @property
    def vllm(self) -> str:
        return self.recipe.model.components.vllm.version


def plan_task(
    recipe: str,
    profile: str,
    flags: LaunchFlags,
    env: Mapping[str, str],
    *,
    dry: bool = False,
    starts: bool = True,
) -> LaunchPlan:
    """The launch of `profile` with `recipe`'s image on the flags' nodes: recipe and profile loaded once, every
    flag checked (RunError/InputError naming the flag and the fix) before any engine or download. `env`: the
    user's environment (HF_ENDPOINT, DOCKER_* for the node warnings). `dry`: with nothing built or pulled, the
    local build's tag. `starts=False` (bench, conform --attach: a server already runs): the image as named, not
    resolved, and no containers."""
    from sparkforge.recipe.loader import load_recipe
    from sparkforge.recipe.profile import load_profile

    nodes, warnings = plan_nodes(flags, env)
    if flags.image:
        from sparkforge.recipe import plan

        plan.check_reference("--image", flags.image)  # the boundary: before the recipe or the engine
    loaded_profile = load_profile(profile)
    loaded = load_recipe(recipe)
    image, why, said = resolve_image(loaded, flags, dry=dry) if starts else (flags.image, "as named", [])
    warnings += said
    launch = launch_options(image, flags, env)
    warnings += flag_warnings(flags)
    doctor = doctor_options(image, flags) if len(nodes) > 1 else None  # several nodes: cluster.up's doctor
    try:
        memory, memory_said = plan_or_refuse(
            loaded_profile, launch.model_dir, loaded.model.device, flags.force
        )
        refusal = ""
    except RunError as exc:  # refused by judge_memory, where the task judges memory at all
        memory, memory_said, refusal = None, [], str(exc)
    containers, notes, unpinned = None, [], ""
    one_node = (
        len(nodes) == 1 and loaded_profile.model.nodes == 1
    )  # several: cluster_up plans after the doctor
    if starts and one_node:
        try:
            notes = check_model_pin(loaded_profile, launch)
        except RunError as exc:  # said after the memory plan and the profile's checks, as a start would
            notes, unpinned = list(loaded_profile.opt_ins()), str(exc)
        containers = plan_launch(loaded_profile, ["127.0.0.1"], [{}], launch)
    return LaunchPlan(
        loaded,
        loaded_profile,
        flags,
        image,
        why,
        nodes,
        launch,
        doctor,
        memory,
        containers,
        (*warnings, *memory_said),
        tuple(notes),
        refusal,
        unpinned,
        starts,
    )


def plan_nodes(flags: LaunchFlags, env: Mapping[str, str]) -> tuple[tuple[Node, ...], list[str]]:
    """--nodes (head first), else --node, else the local engine; each checked, plain tcp:// warned."""
    nodes = parse_nodes(flags.nodes) if flags.nodes else (parse_node(flags.node) if flags.node else LOCAL,)
    return nodes, [f"warning: {line}" for line in node_warnings(nodes, env)]


def resolve_image(recipe: Recipe, flags: LaunchFlags, *, dry: bool) -> tuple[str, str, list[str]]:
    """The image through the one resolver (registry/pulled.py): (reference, why, warnings said)."""
    from sparkforge.registry.pulled import resolve

    said: list[str] = []
    found = resolve(recipe, flags.image, allow_unverified=flags.allow_unverified, dry=dry, warn=said.append)
    return found.image, found.why, said


def launch_options(image: str, flags: LaunchFlags, env: Mapping[str, str]) -> LaunchOptions:
    """The launch options from the flags, each checked before any engine or download (ports, --gpus, paths)."""
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
        image=image,
        port=flags.port,
        master_port=flags.master_port,
        backend=flags.backend,  # type: ignore[arg-type]
        gpus=flags.gpus != "none",
        model_dir=model_path,
        hf_token_file=token_path,
        cache_dir=flags.cache_dir,
        ulimits=inputs.check_ulimits(list(flags.ulimit)) if flags.ulimit else GB10_ULIMITS,
        trust_remote_code=flags.trust_remote_code,
        weights=inputs.check_choice("--weights", flags.weights, ("each", "shared", "skip")),  # type: ignore[arg-type]
        hf_endpoint=hub(flags.hf_endpoint, env),
        allow_unpinned_model=flags.allow_unpinned_model,
    )


def flag_warnings(flags: LaunchFlags) -> list[str]:
    """The owner's opt-ins on the command line, said loudly before anything starts."""
    said = []
    if flags.trust_remote_code:
        said.append(
            "warning: --trust-remote-code: vLLM will run Python code from the model's repository inside a "
            "container with host network, host IPC and the GPU; use it only for a model repository you trust"
        )
    if flags.allow_unpinned_model:
        said.append(
            "warning: --allow-unpinned-model: the model is served from whatever the hub holds at download time "
            "(weights, tokenizer and configs not pinned to a commit)"
        )
    return said


def doctor_options(image: str, flags: LaunchFlags, sanity: bool = True) -> DoctorOptions:
    """The doctor's options from the flags, each checked (interface, port, --gpus, paths made absolute)."""
    from sparkforge.run.facts import DoctorOptions

    inputs.check_interface(flags.interface)
    inputs.check_port("--master-port", flags.master_port)
    inputs.check_choice("--gpus", flags.gpus, ("all", "none"))
    paths = (
        ("hf-token-file", flags.hf_token_file),
        ("model-dir", flags.model_dir),
        ("cache-dir", flags.cache_dir),
    )
    return DoctorOptions(
        image=image,
        interface=flags.interface or None,
        master_port=flags.master_port,
        sanity=sanity,
        gpus=flags.gpus == "all",
        paths=tuple((kind, str(Path(p).absolute())) for kind, p in paths if p),
    )


def hub(given: str, env: Mapping[str, str]) -> str | None:
    """The hub the token may go to: --hf-endpoint, else the user's own HF_ENDPOINT, else none (the default hub)."""
    from urllib.parse import urlsplit

    value = given or env.get("HF_ENDPOINT", "")
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
        raise FlagError(f"{where} {value[:100]!r} is not a hub URL; fix: e.g. https://huggingface.co")
    return value.rstrip("/")


def plan_lines(plan: LaunchPlan) -> list[str]:
    """`--dry`: what would start, as the user reads it: the architecture check, the download phase and, per node,
    the exact docker argv and environment (the image, the memory plan and the profile's opt-ins are said by the
    checks before it)."""
    from sparkforge.run.weights.weights import download_lines

    if plan.containers is None:
        return [
            f"# {len(plan.nodes)} nodes: the containers are planned after the doctor reads each node's address"
        ]
    lines = []
    argv = architecture_argv(plan.profile, plan.launch)
    if argv is not None:
        lines.append(
            f"# container: the architecture check (the profile's environment, no network): docker {shown_argv(argv)}"
        )
    labels = {n.rank: n.label for n in plan.nodes}
    lines += download_lines(plan.profile, plan.launch, labels, dry=True)
    return [*lines, *describe_plan(plan.containers, [n.label for n in plan.nodes])]
