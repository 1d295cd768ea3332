"""Nodes: a Docker engine reached the way Docker reaches it (unix://, tcp://, ssh://, a context), plus its link address.

Every call goes through the command seam (`commands.Runner`) as `docker --host URL ...` / `docker --context NAME ...`,
so ssh:// nodes use the user's own ssh set-up exactly as the docker CLI does.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sparkforge.commands import Command, Runner, engine_lost, engine_stopped_message, run_pipeline
from sparkforge.engine import docker_cli
from sparkforge.errors import CommandError, RunError

LABEL = (
    "dev.sparkforge.run"  # every container sparkforge starts on a node carries it (value: what started it)
)
NODE_FORMS = "unix:///path/docker.sock, tcp://host:2376, ssh://user@host[:port] or a docker context name"
_CONTEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}")
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_SSH_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
_PORT = re.compile(r"[0-9]{1,5}")
MAX_NODES = 64  # a profile's `nodes` is at most 64
_DEFAULT_PORTS = {
    "ssh": 22,
    "tcp": 2375,
}  # what the docker CLI uses when a URL names none (tcp: 2376 with TLS)


@dataclass(frozen=True)
class Node:
    """One node: how to reach its engine, and (optionally) its address on the cluster link."""

    spec: str
    kind: Literal["unix", "tcp", "ssh", "context", "local"]  # local: the docker CLI's own default engine
    target: str  # the engine URL, or the context name
    address: str | None = None
    rank: int = 0
    key: str = ""  # the engine after normalisation (lowercase host, default port, resolved socket path)

    @property
    def label(self) -> str:
        return f"node{self.rank} ({self.target})"

    def engine_flags(self) -> tuple[str, ...]:
        if self.kind == "local":
            return ()  # DOCKER_HOST or the current context, as plain `docker` would use
        return ("--context", self.target) if self.kind == "context" else ("--host", self.target)


LOCAL = Node("local", "local", "local")


def _refuse(spec: str, what: str) -> RunError:
    return RunError(f"node {spec!r}: {what}; fix: use {NODE_FORMS}, optionally =LINK_ADDRESS")


def _host_port(spec: str, scheme: str, rest: str) -> tuple[str, int | None]:
    """`host[:port]` (IPv6 in brackets) -> (lowercase host, port or None); RunError for anything else."""
    if rest.startswith("["):
        host, bracket, tail = rest[1:].partition("]")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _refuse(spec, f"[{host}] is not an IPv6 address") from None
        if not bracket or (tail and not tail.startswith(":")):
            raise _refuse(spec, f"{rest!r} is not [IPv6]:port")
        port_text = tail[1:] if tail else None
    else:
        host, colon, port_text_or_empty = rest.partition(":")
        port_text = port_text_or_empty if colon else None
        labels = host.split(".")
        if not host or len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
            raise _refuse(spec, f"{host!r} is not a host name or IP address")
    port = None
    if port_text is not None:
        if not _PORT.fullmatch(port_text) or not 1 <= int(port_text) <= 65535:
            raise _refuse(spec, f"port {port_text!r} is not a whole number from 1 to 65535")
        port = int(port_text)
    return host.lower(), port


def _check_url(spec: str, scheme: str, rest: str) -> str:
    """Validate the part after SCHEME:// -> a normalised key that two spellings of one engine share."""
    if scheme == "unix":
        path = Path(rest)
        if not path.is_absolute():
            raise _refuse(
                spec, f"unix://{rest} is not an absolute path (unix:///run/docker.sock has three slashes)"
            )
        try:
            is_socket = stat.S_ISSOCK(path.stat().st_mode)
        except OSError as exc:
            raise _refuse(spec, f"{path} cannot be read ({exc.strerror})") from None
        if not is_socket:
            raise _refuse(spec, f"{path} is not a socket (an engine listens on a socket file)")
        return f"unix://{os.path.realpath(path)}"
    authority = rest.removesuffix("/")
    if "/" in authority or "?" in authority or "#" in authority:
        raise _refuse(spec, f"{scheme}:// takes host[:port] only, no path or query")
    user = ""
    if "@" in authority:
        if scheme != "ssh":
            raise _refuse(spec, "tcp:// takes no user (credentials never go in a node URL)")
        user, _, authority = authority.rpartition("@")
        if not _SSH_USER.fullmatch(user):
            raise _refuse(
                spec, f"{user!r} is not an ssh user name (letters, digits, _ . -; never starting with '-')"
            )
    host, port = _host_port(spec, scheme, authority)
    return f"{scheme}://{user + '@' if user else ''}{host}:{port or _DEFAULT_PORTS[scheme]}"


def parse_node(spec: str, rank: int = 0) -> Node:
    """`URL_OR_CONTEXT[=ADDRESS]` -> Node; errors say which form was expected. Only the local file system is read."""
    text = spec.strip(" ")
    if not text:
        raise RunError(
            f"node {rank} is empty; fix: list the nodes, head first ({NODE_FORMS}), separated by commas"
        )
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in text):
        raise _refuse(text, "holds whitespace or a control character")
    target, _, address = text.partition("=")
    if address:
        try:
            link = ipaddress.ip_address(address)
            if link.is_unspecified or link.is_multicast:
                raise ValueError(address)
        except ValueError:
            raise RunError(
                f"node {spec!r}: {address!r} after '=' is not an IP address (of one node: not 0.0.0.0, :: or multicast); "
                "fix: write the node's address on "
                "the cluster link, e.g. ssh://me@spark2=192.168.100.2"
            ) from None
    elif "=" in text:
        raise _refuse(text, "nothing after '='")
    scheme = target.split("://", 1)[0] if "://" in target else ""
    if scheme in ("unix", "tcp", "ssh"):
        rest = target.split("://", 1)[1]
        if not rest:
            raise RunError(f"node {spec!r}: nothing after {scheme}://; fix: use {NODE_FORMS}")
        key = _check_url(text, scheme, rest)
        return Node(text, scheme, target, address or None, rank, key)  # type: ignore[arg-type]
    if scheme:
        raise RunError(f"node {spec!r}: Docker does not take {scheme}:// engines; fix: use {NODE_FORMS}")
    if not _CONTEXT.fullmatch(target):
        raise RunError(f"node {spec!r} is neither an engine URL nor a context name; fix: use {NODE_FORMS}")
    return Node(text, "context", target, address or None, rank, f"context:{target}")


def parse_nodes(text: str) -> tuple[Node, ...]:
    """`A,B[,...]` (the head first) -> nodes ranked in that order; empty entries and duplicates are refused."""
    parts = text.split(",")
    if len(parts) > MAX_NODES:
        raise RunError(
            f"--nodes lists {len(parts)} nodes, more than a profile can use ({MAX_NODES}); fix: list the nodes the profile runs on"
        )
    if not text.strip(" "):
        raise RunError(
            f"--nodes is empty; fix: list the nodes, head first ({NODE_FORMS}), separated by commas"
        )
    nodes = tuple(parse_node(s, i) for i, s in enumerate(parts))
    seen: dict[str, int] = {}
    addresses: dict[str, int] = {}
    for node in nodes:
        if node.key in seen:
            raise RunError(
                f"--nodes names {node.target} twice (ranks {seen[node.key]} and {node.rank}, both {node.key}); "
                "fix: list each once"
            )
        seen[node.key] = node.rank
        if node.address and node.address in addresses:
            raise RunError(
                f"--nodes gives link address {node.address} to ranks {addresses[node.address]} and {node.rank}; "
                "fix: give each node its own address on the cluster link"
            )
        if node.address:
            addresses[node.address] = node.rank
    return nodes


def node_warnings(nodes: Sequence[Node], env: Mapping[str, str]) -> list[str]:
    """Accepted but risky: a plain tcp:// engine (no TLS) gives root on that node to anyone on the network."""
    if env.get("DOCKER_TLS_VERIFY"):
        return []
    return [
        f"{n.label}: {n.target} is plain tcp:// without TLS: anyone who reaches that port has root on the node; "
        "fix: use ssh://user@host, or set DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH for a TLS engine (port 2376)"
        for n in nodes
        if n.kind == "tcp"
    ]


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
    mounts: tuple[
        str, ...
    ] = ()  # docker --volume values (/models:/models:ro), or --mount ones (type=bind,...)
    cap_add: tuple[str, ...] = ()
    workdir: str | None = None
    devices: tuple[str, ...] = ()  # docker --device values (a directory adds every device under it)
    dns: tuple[str, ...] = ()  # docker --dns values: the container's resolv.conf (host network: its own copy)


def run_argv(spec: ContainerSpec) -> list[str]:
    """`docker run --detach ...` arguments (after the engine flags) for a container spec; `--pull never`: the
    image was resolved and checked before (registry/pulled.py), the engine never fetches a tag by itself."""
    argv = ["run", "--detach", "--pull", "never", "--name", spec.name]
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
    for server in spec.dns:
        argv += ["--dns", server]
    for mount in spec.mounts:  # "type=bind,..." is a --mount (no source created), else a --volume
        argv += ["--mount" if mount.startswith("type=") else "--volume", mount]
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


# The docker CLI's words when its ssh:// transport fails: ssh (or the remote shell) exited before the engine
# answered, its stderr quoted after `stderr=`.
_SSH_FAILED = re.compile(r"command \[ssh [^\]]*\] has exited with exit status (\d+).*?stderr=(.*)", re.DOTALL)
# What ssh said -> the fix (first match wins); ssh's own text is always quoted as it came.
_SSH_FIXES: tuple[tuple[str, str], ...] = (
    (
        "Could not resolve hostname",
        "the name does not resolve from this machine: use the node's IP address (ssh://{user}@ADDRESS) or add "
        "{host} to DNS or /etc/hosts",
    ),
    (
        "Connection refused",
        "nothing accepts ssh at {host} port {port}: start the ssh server there (sudo systemctl enable --now ssh) "
        "or name the port it listens on (ssh://{user}@{host}:PORT)",
    ),
    (
        "timed out",
        "{host} does not answer: check that it is powered on and on a network this machine reaches "
        "(ping {host})",
    ),
    ("No route to host", "{host} is not reachable from this machine: check the cable, address and routes"),
    (
        "Permission denied",
        "{user} may not log in with this machine's keys: ssh-copy-id -p {port} {user}@{host}, then try "
        "ssh -p {port} {user}@{host} true",
    ),
    (
        "Host key verification failed",
        "{host}'s host key is not known here (or changed): connect once by hand (ssh -p {port} {user}@{host}) "
        "and check the fingerprint",
    ),
    (
        "command not found",
        "the docker CLI is not on {user}'s PATH on {host}: install Docker there (invoke engine.up on that node)",
    ),
    (
        "permission denied while trying to connect",
        "{user} may not use the engine on {host}: add them to the docker group there (sudo usermod -aG docker "
        "{user}, then log in again)",
    ),
)


def ssh_failure(node: Node, output: str) -> str | None:
    """For a failed docker command on an ssh:// node: the transport's failure in one paragraph (host, user, port,
    ssh's own message, the fix), or None when ssh itself got through."""
    if node.kind != "ssh":
        return None
    match = _SSH_FAILED.search(output)
    if not match:
        return None
    said = " ".join(match.group(2).split()).rstrip(".")[:400] or f"exit status {match.group(1)}"
    rest = node.target.removeprefix("ssh://")
    user, at, hostport = rest.rpartition("@")
    user = user if at else os.environ.get("USER", "you")
    host, port = _host_port(node.spec, "ssh", hostport)
    values = {"user": user, "host": host, "port": port or _DEFAULT_PORTS["ssh"]}
    fix = next(
        (text for needle, text in _SSH_FIXES if needle.lower() in said.lower()),
        "run ssh -p {port} {user}@{host} docker version by hand: it says the same, with -v the detail",
    )
    return (
        f"{node.label}: ssh to {user}@{host} port {values['port']} failed before the engine answered: "
        f"ssh said {said!r}; fix: {fix.format(**values)}"
    )


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
            transport = ssh_failure(self.node, result.output)
            if transport:
                raise RunError(transport)
            lost = engine_lost(self.command(*args), result.output)
            if lost:
                raise RunError(
                    f"{self.node.label}: {engine_stopped_message(lost, f'docker {args[0]} ({step})')}"
                )
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
            transport = ssh_failure(self.node, result.output)
            if transport:
                raise RunError(transport)
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
            transport = ssh_failure(self.node, result.output)
            if transport:
                raise RunError(transport)
            raise RunError(
                f"{self.node.label}: {engine_stopped_message(self.node.target, f'the wait for {name}')} "
                f"({result.output.strip()[-300:]})"
            )
        status, _, code = result.output.strip().partition(" ")
        return ContainerState(status, int(code) if code.strip().lstrip("-").isdigit() else None)

    def exec(self, name: str, args: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str]:
        """Run `args` in the running container `name`: (exit code, output); RunError when the node does not
        answer within `timeout`."""
        flags = [a for k, v in sorted(env.items()) for a in ("--env", f"{k}={v}")]
        try:
            result = self.runner.capture(
                self.command("exec", *flags, name, *args), "exec", check=False, timeout=timeout
            )
        except CommandError as exc:
            raise RunError(
                f"{self.node.label}: {exc}; fix: check that the node is up and its engine answers"
            ) from None
        return result.returncode, result.output

    def logs(self, name: str, tail: int | None = None, timeout: float = 20) -> str:
        args = ["logs", *(["--tail", str(tail)] if tail else []), name]
        result = self.runner.capture(self.command(*args), "logs", check=False, timeout=timeout)
        return result.output

    def remove(self, names: Sequence[str], timeout: float = 60) -> None:
        if names:
            self.runner.capture(self.command("rm", "--force", *names), "rm", check=False, timeout=timeout)

    def containers(self, label: str, *, timeout: float = 20) -> list[str]:
        """Names of containers (running or not) carrying label `label` (KEY or KEY=VALUE)."""
        return self.call(
            "ps", "ps", "--all", "--filter", f"label={label}", "--format", "{{.Names}}", timeout=timeout
        ).split()


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
