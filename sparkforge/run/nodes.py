"""Nodes: a Docker engine reached the way Docker reaches it (unix://, tcp://, ssh://, a context), plus its link address.

Every call goes through the command seam (`commands.Runner`) as `docker --host URL ...` / `docker --context NAME ...`,
so ssh:// nodes use the user's own ssh set-up exactly as the docker CLI does.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from sparkforge.commands import Command, Runner, run_pipeline
from sparkforge.engine import docker_cli
from sparkforge.errors import CommandError, RunError

LABEL = (
    "dev.sparkforge.run"  # every container sparkforge starts on a node carries it (value: what started it)
)
NODE_FORMS = "unix:///path/docker.sock, tcp://host:2376, ssh://user@host[:port] or a docker context name"
_CONTEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")


@dataclass(frozen=True)
class Node:
    """One node: how to reach its engine, and (optionally) its address on the cluster link."""

    spec: str
    kind: Literal["unix", "tcp", "ssh", "context", "local"]  # local: the docker CLI's own default engine
    target: str  # the engine URL, or the context name
    address: str | None = None
    rank: int = 0

    @property
    def label(self) -> str:
        return f"node{self.rank} ({self.target})"

    def engine_flags(self) -> tuple[str, ...]:
        if self.kind == "local":
            return ()  # DOCKER_HOST or the current context, as plain `docker` would use
        return ("--context", self.target) if self.kind == "context" else ("--host", self.target)


LOCAL = Node("local", "local", "local")


def parse_node(spec: str, rank: int = 0) -> Node:
    """`URL_OR_CONTEXT[=ADDRESS]` -> Node; errors say which form was expected."""
    text = spec.strip()
    target, _, address = text.partition("=")
    if address:
        try:
            ipaddress.ip_address(address)
        except ValueError:
            raise RunError(
                f"node {spec!r}: {address!r} after '=' is not an IP address; fix: write the node's address on "
                "the cluster link, e.g. ssh://me@spark2=192.168.100.2"
            ) from None
    scheme = target.split("://", 1)[0] if "://" in target else ""
    if scheme in ("unix", "tcp", "ssh"):
        rest = target.split("://", 1)[1]
        if not rest:
            raise RunError(f"node {spec!r}: nothing after {scheme}://; fix: use {NODE_FORMS}")
        return Node(text, scheme, target, address or None, rank)  # type: ignore[arg-type]
    if scheme:
        raise RunError(f"node {spec!r}: Docker does not take {scheme}:// engines; fix: use {NODE_FORMS}")
    if not _CONTEXT.fullmatch(target):
        raise RunError(f"node {spec!r} is neither an engine URL nor a context name; fix: use {NODE_FORMS}")
    return Node(text, "context", target, address or None, rank)


def parse_nodes(text: str) -> tuple[Node, ...]:
    """`A,B[,...]` (the head first) -> nodes ranked in that order."""
    specs = [s for s in (p.strip() for p in text.split(",")) if s]
    if not specs:
        raise RunError(
            f"--nodes is empty; fix: list the nodes, head first ({NODE_FORMS}), separated by commas"
        )
    nodes = tuple(parse_node(s, i) for i, s in enumerate(specs))
    seen: dict[str, int] = {}
    for node in nodes:
        if node.target in seen:
            raise RunError(
                f"--nodes names {node.target} twice (ranks {seen[node.target]} and {node.rank}); fix: list each once"
            )
        seen[node.target] = node.rank
    return nodes


@dataclass(frozen=True)
class ContainerSpec:
    """A container to start on a node, described completely: `run_argv` turns it into the exact docker argv."""

    name: str
    image: str
    args: tuple[str, ...] = ()
    entrypoint: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    host_network: bool = True
    ipc_host: bool = False
    gpus: bool = False
    shm_size: str | None = None
    ulimits: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ()  # docker --volume values, e.g. /models:/models:ro
    cap_add: tuple[str, ...] = ()
    workdir: str | None = None
    devices: tuple[str, ...] = ()  # docker --device values (a directory adds every device under it)


def run_argv(spec: ContainerSpec) -> list[str]:
    """`docker run --detach ...` arguments (after the engine flags) for a container spec."""
    argv = ["run", "--detach", "--name", spec.name]
    for key, value in sorted(spec.labels.items()):
        argv += ["--label", f"{key}={value}"]
    if spec.host_network:
        argv += ["--network", "host"]
    if spec.ipc_host:
        argv += ["--ipc", "host"]
    if spec.shm_size:
        argv += ["--shm-size", spec.shm_size]
    if spec.gpus:
        argv += ["--gpus", "all"]
    for ulimit in spec.ulimits:
        argv += ["--ulimit", ulimit]
    for cap in spec.cap_add:
        argv += ["--cap-add", cap]
    for device in spec.devices:
        argv += ["--device", device]
    for mount in spec.mounts:
        argv += ["--volume", mount]
    for key, value in sorted(spec.env.items()):
        argv += ["--env", f"{key}={value}"]
    if spec.workdir:
        argv += ["--workdir", spec.workdir]
    if spec.entrypoint is not None:
        argv += ["--entrypoint", spec.entrypoint]
    argv.append(spec.image)
    argv += list(spec.args)
    return argv


@dataclass(frozen=True)
class ContainerState:
    status: str  # created, running, exited, dead, missing
    exit_code: int | None


class NodeEngine:
    """A node's Docker engine through the docker CLI and the command seam."""

    def __init__(self, node: Node, runner: Runner | None = None, docker: str | None = None) -> None:
        self.node = node
        self.runner = runner or Runner(stream=False)
        self.docker = docker or docker_cli()

    def command(self, *args: str) -> Command:
        return Command((self.docker, *self.node.engine_flags(), *args))

    def call(self, step: str, *args: str, timeout: float = 60) -> str:
        """Run a docker subcommand on the node; RunError naming the node when it fails or hangs."""
        try:
            result = self.runner.capture(self.command(*args), step, check=False, timeout=timeout)
        except CommandError as exc:
            raise RunError(
                f"{self.node.label}: {exc}; fix: check that the node is up and its engine answers"
            ) from None
        if result.returncode != 0:
            raise RunError(f"{self.node.label}: docker {args[0]} failed: {result.output.strip()[-600:]}")
        return result.output

    def server_version(self, timeout: float = 20) -> str:
        return self.call(
            "engine-version", "version", "--format", "{{.Server.Version}}", timeout=timeout
        ).strip()

    def image_id(self, ref: str, timeout: float = 30) -> str | None:
        result = self.runner.capture(
            self.command("image", "inspect", "--format", "{{.Id}}", ref),
            "image-id",
            check=False,
            timeout=timeout,
        )
        if result.returncode != 0:
            if "No such image" in result.output or "no such image" in result.output.lower():
                return None
            raise RunError(f"{self.node.label}: cannot inspect image {ref}: {result.output.strip()[-400:]}")
        return result.output.strip().splitlines()[-1]

    def start(self, spec: ContainerSpec, timeout: float = 60) -> str:
        return self.call("run", *run_argv(spec), timeout=timeout).strip()

    def state(self, name: str, timeout: float = 20) -> ContainerState:
        result = self.runner.capture(
            self.command("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name),
            "inspect",
            check=False,
            timeout=timeout,
        )
        if result.returncode != 0:
            if "No such" in result.output:
                return ContainerState("missing", None)
            raise RunError(f"{self.node.label}: the engine stopped answering: {result.output.strip()[-300:]}")
        status, _, code = result.output.strip().partition(" ")
        return ContainerState(status, int(code) if code.strip().lstrip("-").isdigit() else None)

    def logs(self, name: str, tail: int | None = None, timeout: float = 20) -> str:
        args = ["logs", *(["--tail", str(tail)] if tail else []), name]
        result = self.runner.capture(self.command(*args), "logs", check=False, timeout=timeout)
        return result.output

    def remove(self, names: Sequence[str], timeout: float = 60) -> None:
        if names:
            self.runner.capture(self.command("rm", "--force", *names), "rm", check=False, timeout=timeout)

    def containers(self, label: str, *, running_only: bool = False, timeout: float = 20) -> list[str]:
        """Names of containers carrying label `label` (KEY or KEY=VALUE)."""
        args = ["ps", "--filter", f"label={label}", "--format", "{{.Names}}"]
        if not running_only:
            args.insert(1, "--all")
        return self.call("ps", *args, timeout=timeout).split()


def distribute_image(
    source: Command, ref: str, targets: Sequence[NodeEngine], runner: Runner | None = None
) -> int:
    """Copy image `ref` to every target engine in one streamed `docker save` (no registry, no temp file)."""
    local_image_id(source, ref, runner)  # a clear error when the image is not here to send
    sinks = [t.command("load", "--quiet") for t in targets]
    try:
        return run_pipeline(Command((*source.argv, "save", ref), source.env), sinks, "distribute")
    except CommandError as exc:
        raise RunError(
            f"distributing {ref} failed: {exc}; fix: check disk space on the nodes and retry"
        ) from None


def local_image_id(source: Command, ref: str, runner: Runner | None = None) -> str:
    """The image ID of `ref` in the engine `source` (a docker CLI command prefix) talks to."""
    result = (runner or Runner(stream=False)).capture(
        Command((*source.argv, "image", "inspect", "--format", "{{.Id}}", ref), source.env),
        "image-id",
        check=False,
        timeout=60,
    )
    if result.returncode != 0:
        raise RunError(
            f"{ref} is not in the local engine, nothing to distribute; fix: build or pull it here first"
        )
    return result.output.strip().splitlines()[-1]
