"""The launch plan: the exact container (argv and environment) each node runs, from a profile and the doctor's facts.

vLLM's own multi-node machinery only: the multiprocessing backend (`--nnodes/--node-rank/--master-addr/
--master-port`, `--headless` on every node but the head; workers start first), or Ray on request (a Ray
container per node, then `vllm serve --distributed-executor-backend ray` on the head).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sparkforge.errors import RunError
from sparkforge.recipe.profile import Profile
from sparkforge.run.jobs import RDMA_DEVICES
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


@dataclass(frozen=True)
class NodeLaunch:
    rank: int
    container: ContainerSpec
    exec_argv: tuple[str, ...] = ()  # Ray: the serve command run inside the head container once Ray is up

    def docker_argv(self) -> list[str]:
        return run_argv(self.container)


@dataclass(frozen=True)
class LaunchPlan:
    profile: str
    nodes: tuple[NodeLaunch, ...]
    head_address: str
    port: int
    notes: tuple[str, ...] = field(default_factory=tuple)

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


def _mounts(options: LaunchOptions) -> tuple[str, ...]:
    mounts = [f"{options.cache_dir.rstrip('/')}/{name}:{target}" for name, target in CACHES.items()]
    if options.model_dir is not None:
        mounts.append(f"{options.model_dir}:{MODEL_MOUNT}:ro")
    if options.hf_token_file is not None:
        mounts.append(f"{options.hf_token_file}:{TOKEN_MOUNT}:ro")
    return tuple(mounts)


def plan_launch(
    profile: Profile,
    addresses: Sequence[str],
    node_env: Sequence[Mapping[str, str]],
    options: LaunchOptions,
    node_rdma: Sequence[bool] = (),
    node_mounts: Sequence[
        Sequence[str]
    ] = (),  # per node, e.g. the host's libnccl over the image's (--nccl host)
) -> LaunchPlan:
    """One container per node (rank = position in --nodes, the head first), fully spelled out.

    A node with RDMA devices (`node_rdma`) also gets /dev/infiniband; IPC_LOCK and memlock=-1 every node has.
    """
    count = len(addresses)
    if count != profile.model.nodes:
        raise RunError(
            f"profile {profile.name} runs on {profile.model.nodes} node(s) but {count} were given; "
            f"fix: pass {profile.model.nodes} nodes in --nodes, or use a profile for {count}"
        )
    model, model_extra = _model_arg(profile, options)
    head = addresses[0]
    launches = []
    for rank in range(count):
        env = {**profile.model.env, **node_env[rank]}
        if options.hf_token_file is not None:
            env["HF_TOKEN_PATH"] = TOKEN_MOUNT
        if options.backend == "ray":
            env.update(
                {"RAY_NODE_IP_ADDRESS": addresses[rank], "RAY_OVERRIDE_NODE_IP_ADDRESS": addresses[rank]}
            )
        serve = ["serve", model, *profile.serve_args(), *model_extra]
        serve += ["--trust-remote-code"] if options.trust_remote_code else []
        exec_argv: tuple[str, ...] = ()
        if options.backend == "mp":
            if count > 1:
                serve += [
                    "--nnodes",
                    str(count),
                    "--node-rank",
                    str(rank),
                    "--master-addr",
                    head,
                    "--master-port",
                    str(options.master_port),
                ]
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
            labels={LABEL: "serve", f"{LABEL}.profile": profile.name, f"{LABEL}.rank": str(rank)},
            host_network=True,
            ipc_host=True,
            gpus=options.gpus,
            ulimits=_ulimits(options.ulimits, rank < len(node_rdma) and node_rdma[rank]),
            cap_add=("IPC_LOCK",),
            mounts=(*_mounts(options), *(node_mounts[rank] if rank < len(node_mounts) else ())),
            devices=RDMA_DEVICES if rank < len(node_rdma) and node_rdma[rank] else (),
        )
        launches.append(NodeLaunch(rank, container, exec_argv))
    notes = (
        () if options.gpus else ("--gpus none: the containers see no GPU; vLLM stops at device detection",)
    )
    return LaunchPlan(profile.name, tuple(launches), head, options.port, notes)


def describe_plan(plan: LaunchPlan, labels: Sequence[str]) -> list[str]:
    """Human lines: per node, the exact docker argv (shell-quoted) and its environment."""
    import shlex

    lines = []
    for launch in plan.start_order():
        lines.append(f"# {labels[launch.rank]} (rank {launch.rank}{', head' if launch.rank == 0 else ''})")
        lines.append("docker " + shlex.join(launch.docker_argv()))
        if launch.exec_argv:
            lines.append(f"docker exec {launch.container.name} " + shlex.join(launch.exec_argv))
    lines += [f"# note: {n}" for n in plan.notes]
    return lines
