"""The launch plan: the exact container (argv and environment) each node runs, from a profile and the doctor's facts.

vLLM's own multi-node machinery only: the multiprocessing backend (`--nnodes/--node-rank/--master-addr/
--master-port`, and vLLM's data-parallel handshake for DP replicas: run/multinode.py; `--headless` on every node
but the head; workers start first), or Ray on request (a Ray container per node, then `vllm serve
--distributed-executor-backend ray` on the head).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sparkforge.errors import RunError
from sparkforge.recipe.checkpoints import pinned_revision
from sparkforge.recipe.profile import Profile
from sparkforge.recipe.serveargs import norm_flag
from sparkforge.run.jobs import RDMA_DEVICES
from sparkforge.run.multinode import Rendezvous
from sparkforge.run.nodes import LABEL, ContainerSpec, run_argv

MODEL_MOUNT = "/models"
TOKEN_MOUNT = "/run/secrets/hf_token"  # the token file, mounted read-only; only its path is in the env
RAY_PORT = 6379
# What GB10 containers need: the GPU, the host's IPC (NCCL, shared memory), pinned memory, many files.
GB10_ULIMITS = ("memlock=-1", "stack=67108864", "nofile=1048576")
CACHES = {
    "huggingface": "/root/.cache/huggingface",
    "vllm": "/root/.cache/vllm",
    "flashinfer": "/root/.cache/flashinfer",
    "triton": "/root/.triton",
}
HUB_CACHE = f"{CACHES['huggingface']}/hub"  # where the download phase puts each repository's pinned snapshot


# Runs in the image: is the model class in the image's own vLLM registry? (No model, no download, no device.)
_ARCH = """
import sys
from vllm.model_executor.models.registry import ModelRegistry
archs = ModelRegistry.get_supported_archs()
print(f"registered={len(archs)}")
sys.exit(0 if sys.argv[1] in archs else 3)
"""


@dataclass(frozen=True)
class LaunchOptions:
    image: str
    port: int = 8000
    master_port: int = 29501
    backend: Literal["mp", "ray"] = "mp"
    gpus: bool = True
    model_dir: Path | None = None  # on every node: the same path holding the model (else the HF cache)
    hf_token_file: Path | None = None
    cache_dir: str = "/var/cache/sparkforge"  # on every node: HF, vLLM, FlashInfer and Triton caches
    ulimits: tuple[str, ...] = GB10_ULIMITS
    trust_remote_code: bool = (
        False  # only from the command line (never a profile): runs the model repo's code
    )
    # The download phase: on every node, once on the head (the cache dir is shared storage), or left to vLLM.
    weights: Literal["each", "shared", "skip"] = "each"
    # The hub the token may go to: the owner's (their environment's HF_ENDPOINT or --hf-endpoint), never a profile's.
    hf_endpoint: str | None = None
    # Serve a model without a pinned revision (the hub's `main` at download time); said on the command line.
    allow_unpinned_model: bool = False


@dataclass(frozen=True)
class NodeLaunch:
    rank: int
    container: ContainerSpec
    exec_argv: tuple[str, ...] = ()  # Ray: the serve command run inside the head container once Ray is up

    def docker_argv(self) -> list[str]:
        return run_argv(self.container)


@dataclass(frozen=True)
class ContainerPlan:
    """The containers of one launch: per node, the exact argv, environment, mounts and ports."""

    profile: str
    nodes: tuple[NodeLaunch, ...]
    head_address: str
    port: int
    notes: tuple[str, ...] = field(default_factory=tuple)
    listens: tuple[str, ...] = field(
        default_factory=tuple
    )  # what listens where (printed by --dry and every run)
    warnings: tuple[str, ...] = field(
        default_factory=tuple
    )  # e.g. an API open to every interface without a key

    @property
    def head(self) -> NodeLaunch:
        return self.nodes[0]

    def start_order(self) -> list[NodeLaunch]:
        """Workers first, the head last (the head's rendezvous then finds everyone)."""
        return [*self.nodes[1:], self.nodes[0]]


def _model_arg(profile: Profile, options: LaunchOptions) -> tuple[str, list[str]]:
    if options.model_dir is None:
        return profile.model.model, []
    extra = [] if profile.model.served_model_name else ["--served-model-name", profile.model.model]
    return MODEL_MOUNT, extra


def _ulimits(given: tuple[str, ...], rdma: bool) -> tuple[str, ...]:
    """RDMA needs unlimited locked memory whatever other limits were asked for."""
    if rdma and not any(u.startswith("memlock=") for u in given):
        return (*given, "memlock=-1")
    return given


def downloads_first(options: LaunchOptions) -> bool:
    """Whether the download phase puts the weights on disk before vLLM starts (sparkforge/run/weights/weights.py)."""
    return options.model_dir is None and options.weights != "skip" and options.gpus


def serve_sees_token(options: LaunchOptions) -> bool:
    """Only when no download phase ran (--weights skip; --gpus none): otherwise the weights are on disk and the
    serving container, which runs what the profile names, gets no token and stays off the hub."""
    return options.hf_token_file is not None and options.model_dir is None and not downloads_first(options)


def _mounts(options: LaunchOptions) -> tuple[str, ...]:
    mounts = [f"{options.cache_dir.rstrip('/')}/{name}:{target}" for name, target in CACHES.items()]
    if options.model_dir is not None:
        mounts.append(f"{options.model_dir}:{MODEL_MOUNT}:ro")
    if serve_sees_token(options):
        mounts.append(f"{options.hf_token_file}:{TOKEN_MOUNT}:ro")
    return tuple(mounts)


def model_revision(profile: Profile) -> str | None:
    """The profile's pinned model commit (`args.revision`, 40 hex: what import writes from model_revision)."""
    return pinned_revision(profile.model.args)


def check_model_pin(profile: Profile, options: LaunchOptions) -> list[str]:
    """A model from the hub is served at a pinned commit, or the command line says it may not be (RunError
    otherwise, before any container starts); the lines to say: one per opt-in past the allow-list."""
    said = list(profile.opt_ins())
    check_token_reach(profile, options)
    check_repository_pins(profile, options)
    if options.model_dir is not None or model_revision(profile) or options.allow_unpinned_model:
        return said
    given = profile.model.args.get("revision")
    raise RunError(
        f"profile {profile.name}: the model {profile.model.model} is not pinned to a commit"
        + (f" (revision {given!r} is a name that can move)" if given else "")
        + "; whatever the hub serves at download time would run, tokenizer and code included; fix: add "
        f"'revision: <40-hex commit>' under args in {profile.path} (import writes a recipe's model_revision there), "
        "pass --model-dir, or --allow-unpinned-model to accept the hub's current files"
    )


def check_repository_pins(profile: Profile, options: LaunchOptions) -> None:
    """Every other repository the profile reaches has its commit, and a download phase fetches it at that commit
    (RunError before any container starts): --allow-unpinned-model covers the model alone."""
    from sparkforge.recipe.pins import PIN_FIX, unpinned

    waiting = unpinned(profile.model.repositories)
    if waiting:
        raise RunError(
            f"profile {profile.name}: {', '.join(waiting)} (reached by its args) has no pinned commit; nothing was "
            f"started; fix: {PIN_FIX.format(repo=waiting[0])} in {profile.path}"
        )
    if profile.model.repositories and options.gpus and options.weights == "skip":
        raise RunError(
            f"profile {profile.name}: {', '.join(profile.model.repositories)} are served from the snapshots the "
            "download phase fetches at their pins, which --weights skip leaves out; nothing was started; fix: drop "
            "--weights skip"
        )


def check_token_reach(profile: Profile, options: LaunchOptions) -> None:
    """The token never reaches a container that runs code the recipe chose: with no download phase (--weights
    skip, --gpus none) vLLM fetches with the token itself, which is refused when the profile opts in past the
    allow-list (an `allow:` entry may load a plugin, a module or a library) or --trust-remote-code runs the model
    repository's code. Checked before any container starts."""
    if not serve_sees_token(options):
        return
    reasons = [f"its opt-ins ({', '.join(sorted(profile.model.allow))})"] if profile.model.allow else []
    reasons += ["--trust-remote-code (the model repository's code)"] if options.trust_remote_code else []
    if reasons:
        why = "--weights skip" if options.gpus else "--gpus none"
        raise RunError(
            f"profile {profile.name}: with {why} vLLM would download with your token in the serving container, "
            f"which runs code the recipe chose: {' and '.join(reasons)}; nothing was started; fix: let the "
            "download phase fetch the weights (drop --weights skip; it is the only container that sees the token), "
            "serve from --model-dir, or drop --hf-token-file for a public model"
        )


def _revision_args(profile: Profile, options: LaunchOptions) -> list[str]:
    """--revision alone pins the weights, not the tokenizer or code (vLLM GHSA-3ww4-5jv9-j5gm): pin all three."""
    revision = model_revision(profile)
    if revision is None or options.model_dir is not None:
        return []
    out = []
    for flag in ("tokenizer-revision", "code-revision"):
        if flag not in profile.model.args:
            out += [f"--{flag}", revision]
    return out


def _listens(
    profile: Profile, addresses: Sequence[str], options: LaunchOptions
) -> tuple[list[str], list[str]]:
    """What listens where (host network: every port is the node's), and the warning an open API deserves."""
    head = addresses[0]
    listens = [f"OpenAI API: 0.0.0.0:{options.port} on the head (every interface of {head}; host network)"]
    warnings = [
        f"warning: the OpenAI API listens on all interfaces of the head on port {options.port} without an API key: "
        "anyone who reaches the host can use the model; fix: firewall the port or serve on a trusted network"
    ]
    if len(addresses) > 1 and options.backend == "mp":
        listens += rendezvous_of(profile, addresses, options).listens()
    if len(addresses) > 1 and options.backend == "ray":
        listens.append(f"Ray: {head}:{RAY_PORT} (GCS) and each node's --node-ip-address (its link address)")
    if options.weights == "shared" and len(addresses) > 1 and options.model_dir is None:
        listens.append(
            f"weights server (download phase only): {head}:29531, a per-launch secret in a header, peers verify "
            "every file against the head's manifest"
        )
    return listens, warnings


def rendezvous_of(profile: Profile, addresses: Sequence[str], options: LaunchOptions) -> Rendezvous:
    """Where the nodes meet: the head's link address, the master port, the profile's data-parallel size."""
    args = {norm_flag(k): v for k, v in profile.model.args.items()}
    dp = int(args.get("data-parallel-size", args.get("dp", 1)))  # type: ignore[arg-type]
    return Rendezvous(len(addresses), addresses[0], options.master_port, dp)


def plan_launch(
    profile: Profile,
    addresses: Sequence[str],
    node_env: Sequence[Mapping[str, str]],
    options: LaunchOptions,
    node_rdma: Sequence[bool] = (),
    node_mounts: Sequence[
        Sequence[str]
    ] = (),  # per node, e.g. the host's libnccl over the image's (--nccl host)
) -> ContainerPlan:
    """One container per node (rank = position in --nodes, the head first), fully spelled out.

    A node with RDMA devices (`node_rdma`) also gets /dev/infiniband; IPC_LOCK and memlock=-1 every node has.
    """
    count = len(addresses)
    if count != profile.model.nodes:
        raise RunError(
            f"profile {profile.name} runs on {profile.model.nodes} node(s) but {count} were given; "
            f"fix: pass {profile.model.nodes} nodes in --nodes, or use a profile for {count}"
        )
    if profile.files and count > 1:
        raise RunError(
            f"profile {profile.name}: {', '.join(f.path.name for f in profile.files)} beside the profile is on this "
            "machine only, and the other nodes' engines would mount their own disk's path; fix: give the template "
            "inline, or bake the file into the image"
        )
    model, model_extra = _model_arg(profile, options)
    head = addresses[0]
    meet = rendezvous_of(profile, addresses, options) if options.backend == "mp" and count > 1 else None
    files_label = ",".join(f"{f.path.name}@sha256:{f.sha256}" for f in profile.files)
    launches = []
    for rank in range(count):
        env = {**profile.model.env, **node_env[rank]}
        if options.model_dir is None and not downloads_first(
            options
        ):  # vLLM itself downloads: the owner's hub
            env.update({"HF_ENDPOINT": options.hf_endpoint} if options.hf_endpoint else {})
            env.update({"HF_TOKEN_PATH": TOKEN_MOUNT} if serve_sees_token(options) else {})
        elif downloads_first(options):
            env["HF_HUB_OFFLINE"] = (
                "1"  # the download phase fetched the pinned files: vLLM reads the cache only
            )
        if options.backend == "ray":
            env.update(
                {"RAY_NODE_IP_ADDRESS": addresses[rank], "RAY_OVERRIDE_NODE_IP_ADDRESS": addresses[rank]}
            )
        serve = [
            "serve",
            model,
            *profile.serve_args(HUB_CACHE),
            *_revision_args(profile, options),
            *model_extra,
        ]
        serve += ["--trust-remote-code"] if options.trust_remote_code else []
        exec_argv: tuple[str, ...] = ()
        if options.backend == "mp":
            serve += meet.flags(rank) if meet else []
            serve += ["--headless"] if rank > 0 else ["--host", "0.0.0.0", "--port", str(options.port)]
            entrypoint, args = "vllm", tuple(serve)
        else:
            ray = ["start", "--block", f"--node-ip-address={addresses[rank]}"]
            ray += ["--head", f"--port={RAY_PORT}"] if rank == 0 else [f"--address={head}:{RAY_PORT}"]
            entrypoint, args = "ray", tuple(ray)
            if rank == 0:
                exec_argv = (
                    "vllm",
                    *serve,
                    "--distributed-executor-backend",
                    "ray",
                    "--host",
                    "0.0.0.0",
                    "--port",
                    str(options.port),
                )
        container = ContainerSpec(
            name=f"sparkforge-serve-{profile.name}-{rank}",
            image=options.image,
            entrypoint=entrypoint,
            args=args,
            env=env,
            labels={
                LABEL: "serve",
                f"{LABEL}.profile": profile.name,
                f"{LABEL}.rank": str(rank),
                **({f"{LABEL}.files": files_label} if files_label else {}),
            },
            host_network=True,
            ipc_host=True,
            gpus=options.gpus,
            ulimits=_ulimits(options.ulimits, rank < len(node_rdma) and node_rdma[rank]),
            cap_add=("IPC_LOCK",),
            mounts=(
                *_mounts(options),
                *(f"{f.path}:{f.target}:ro" for f in profile.files),
                *(node_mounts[rank] if rank < len(node_mounts) else ()),
            ),
            devices=RDMA_DEVICES if rank < len(node_rdma) and node_rdma[rank] else (),
        )
        launches.append(NodeLaunch(rank, container, exec_argv))
    notes = (
        () if options.gpus else ("--gpus none: the containers see no GPU; vLLM stops at device detection",)
    ) + tuple(
        f"--{f.flag}: {f.path} (sha256 {f.sha256}) mounted read-only at {f.target}" for f in profile.files
    )
    listens, warnings = _listens(profile, addresses, options)
    return ContainerPlan(
        profile.name, tuple(launches), head, options.port, notes, tuple(listens), tuple(warnings)
    )


def model_architecture(profile: Profile, model_dir: Path | None) -> str | None:
    """The model class to serve: the profile's `architecture`, else the model directory's config.json."""
    if profile.model.architecture:
        return profile.model.architecture
    config = model_dir / "config.json" if model_dir else None
    if config is None or not config.is_file():
        return None
    from sparkforge.boundary import read_json
    from sparkforge.errors import SparkforgeError

    try:
        doc = read_json(config, "--model-dir config.json")
    except SparkforgeError:
        return None
    archs = doc.get("architectures") if isinstance(doc, dict) else None
    return str(archs[0]) if isinstance(archs, list) and archs else None


def architecture_argv(profile: Profile, options: LaunchOptions) -> list[str] | None:
    """The docker argv of the architecture check (the image with the profile's environment, no network, no
    mounts), or None when the model class is unknown before the download."""
    arch = model_architecture(profile, options.model_dir)
    if arch is None:
        return None
    return ["run", "--rm", "--network", "none", "--entrypoint", "python3", *_env_flags(profile), options.image,
            "-c", _ARCH, arch]  # fmt: skip


def _env_flags(profile: Profile) -> list[str]:
    return [flag for key, value in sorted(profile.model.env.items()) for flag in ("--env", f"{key}={value}")]


def shown_argv(argv: Sequence[str], secrets: Sequence[str] = ()) -> str:
    """A docker argv as `--dry` prints it: inline programs (`-c SCRIPT`) by size and sha256, the values given in
    `secrets` and the values of secret-named variables masked (`***`)."""
    import hashlib
    import shlex

    from sparkforge.recipe.serveargs import is_secret_name

    out = []
    for index, word in enumerate(argv):
        if index and argv[index - 1] == "-c" and "\n" in word:
            word = f"<program: {len(word)} bytes, sha256 {hashlib.sha256(word.encode()).hexdigest()[:16]}>"
        elif word in secrets:
            word = "***"
        elif (
            index
            and argv[index - 1] in ("--env", "-e")
            and "=" in word
            and is_secret_name(word.split("=")[0])
        ):
            word = word.split("=", 1)[0] + "=***"
        out.append(word)
    return shlex.join(out)


def describe_plan(plan: ContainerPlan, labels: Sequence[str]) -> list[str]:
    """Human lines: per node, the exact docker argv (shell-quoted) and its environment."""
    import shlex

    lines = []
    for launch in plan.start_order():
        lines.append(f"# {labels[launch.rank]} (rank {launch.rank}{', head' if launch.rank == 0 else ''})")
        lines.append("docker " + shlex.join(launch.docker_argv()))
        if launch.exec_argv:
            lines.append(f"docker exec {launch.container.name} " + shlex.join(launch.exec_argv))
    lines += [f"# note: {n}" for n in plan.notes]
    lines += [f"# listens: {n}" for n in plan.listens]
    lines += [f"# {w}" for w in plan.warnings]
    return lines
