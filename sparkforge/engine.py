"""The one place that talks to the container engine: BuildKit builds, runs, inspects, tags, pushes, exports."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import shutil
import tarfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from sparkforge.commands import Command, Runner, engine_stopped_message
from sparkforge.errors import CommandError, EngineError

NO_ENGINE_FIX = (
    "start one with 'invoke engine.up' (installs Docker from the distribution's packages on Debian/Ubuntu and "
    "starts the daemon), or 'sudo systemctl start docker'"
)


@dataclass(frozen=True)
class Engine:
    """A docker CLI that can run BuildKit builds: through buildx, or the engine's built-in BuildKit."""

    docker: str
    mode: Literal["buildx", "buildkit"]
    server_version: str
    # buildx's driver for the builder in use: "docker" (the engine's own BuildKit) cannot push by digest only.
    driver: str = ""

    @property
    def env(self) -> dict[str, str]:
        return {"DOCKER_BUILDKIT": "1"} if self.mode == "buildkit" else {}


def docker_candidates() -> list[str]:
    """The docker CLIs on this machine, in the order every caller tries them: PATH's first."""
    found = [shutil.which("docker"), "/usr/bin/docker", "/usr/local/bin/docker"]
    return list(dict.fromkeys(p for p in found if p and Path(p).exists()))


def daemon_ready(runner: Runner, env: Mapping[str, str] | None = None) -> bool:
    """Whether a docker CLI here reaches a daemon (`env` may point it at another one, e.g. DOCKER_HOST)."""
    return any(
        runner.capture(Command.of(docker, "info", env=env), "engine-ready", check=False).returncode == 0
        for docker in docker_candidates()
    )


def cli_has_image(runner: Runner, ref: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether the engine a docker CLI reaches (with `env`, e.g. DOCKER_HOST) holds image `ref`."""
    argv = (docker_cli(), "image", "inspect", ref)
    return runner.capture(Command(argv, dict(env or {})), "image-inspect", check=False).returncode == 0


def detect_engine(runner: Runner | None = None) -> Engine:
    """Find a docker CLI with BuildKit and a reachable daemon, or raise EngineError saying how to get one."""
    runner = runner or Runner(stream=False)
    candidates = docker_candidates()
    if not candidates:
        raise EngineError(f"no docker CLI found on this machine; {NO_ENGINE_FIX}")
    reasons = []
    for docker in candidates:
        info = runner.capture(
            Command.of(docker, "version", "--format", "{{.Server.Version}}"), "engine", check=False
        )
        if info.returncode != 0:
            reasons.append(f"{docker}: daemon not reachable ({info.output.strip().splitlines()[-1:]})")
            continue
        server = info.output.strip().splitlines()[0]
        if runner.capture(Command.of(docker, "buildx", "version"), "engine", check=False).returncode == 0:
            return Engine(docker, "buildx", server)
        client = runner.capture(
            Command.of(docker, "version", "--format", "{{.Client.Version}}"), "engine", check=False
        )
        major = client.output.strip().split(".")[0]
        if major.isdigit() and int(major) < 23:
            return Engine(docker, "buildkit", server)
        reasons.append(
            f"{docker}: client {client.output.strip()} has no buildx plugin and cannot use BuildKit"
        )
    raise EngineError("no usable container engine: " + "; ".join(reasons) + f". Fix: {NO_ENGINE_FIX}")


def buildx_driver(runner: Runner, engine: Engine, builder: str | None = None) -> Engine:
    """The engine with the buildx driver of `builder` (default: the current one); unchanged without buildx."""
    if engine.mode != "buildx":
        return engine
    argv = [engine.docker, "buildx", "inspect", *([builder] if builder else [])]
    result = runner.capture(Command(tuple(argv), engine.env), "buildx-inspect", check=False)
    if result.returncode != 0:
        raise EngineError(
            f"buildx builder {builder or '(current)'} is not usable: {result.output.strip()[-300:]}; fix: "
            "'docker buildx ls' lists the builders ('docker buildx create' makes one), or drop --builder"
        )
    found = re.search(r"^Driver:\s*(\S+)", result.output, re.MULTILINE)
    return dataclasses.replace(engine, driver=found.group(1) if found else "")


# ---- engine API through the Docker SDK ----------------------------------------------------------


@cache
def _client() -> Any:
    import docker  # imported lazily: no engine work at import time

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except Exception as exc:  # the SDK raises several unrelated types for "no daemon"
        raise EngineError(
            f"cannot reach the Docker engine ({exc.__class__.__name__}); {NO_ENGINE_FIX}"
        ) from None
    return client


@contextlib.contextmanager
def sdk_errors(what: str) -> Iterator[None]:
    """Translate the Docker SDK's errors (APIError, connection errors) into one EngineError naming the step."""
    import docker.errors

    from sparkforge.urlfetch import ConnectionFailure

    try:
        yield
    except docker.errors.ImageNotFound as exc:
        raise EngineError(
            f"{what}: image not found ({exc.explanation or exc}); fix: build it ('invoke build') or pull it"
        ) from None
    except docker.errors.APIError as exc:
        raise EngineError(
            f"{what}: the Docker engine refused ({exc.status_code}: {exc.explanation or exc}); fix: check the "
            "image reference and the engine's log ('journalctl -u docker' or /var/log/dockerd.log)"
        ) from None
    except (docker.errors.DockerException, ConnectionFailure) as exc:
        raise EngineError(
            f"{what}: {engine_stopped_message(_sdk_address(), what)} ({exc.__class__.__name__})"
        ) from None


def _sdk_address() -> str:
    """The engine the Docker SDK talks to (docker.from_env): DOCKER_HOST, else the default socket."""
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def image_exists(ref: str) -> bool:
    import docker.errors

    try:
        _client().images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


def inspect_image(ref: str) -> dict[str, Any]:
    """The engine's inspect data for a local image, or EngineError naming the image."""
    import docker.errors

    with sdk_errors(f"inspect {ref}"):
        try:
            return dict(_client().images.get(ref).attrs)
        except docker.errors.ImageNotFound:
            raise EngineError(
                f"image {ref} is not in the local engine; fix: build it ('invoke build') or pull it ('invoke pull')"
            ) from None


def registry_digest(ref: str) -> str:
    """The digest of the manifest or index `ref` names in its registry, read through the engine's API."""
    with sdk_errors(f"read the digest of {ref} from its registry"):
        return str(_client().images.get_registry_data(ref).id)


def image_labels(ref: str) -> dict[str, str]:
    return dict((inspect_image(ref).get("Config") or {}).get("Labels") or {})


def image_platform(ref: str) -> str:
    attrs = inspect_image(ref)
    return f"{attrs.get('Os', 'linux')}/{attrs.get('Architecture', 'unknown')}"


def gpu_runtime_available() -> bool:
    """True when the engine has the NVIDIA runtime (GPU device requests can work)."""
    info = _client().info()
    runtimes = info.get("Runtimes") or {}
    return "nvidia" in runtimes or bool(info.get("CDISpecDirs"))


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    stdout: str
    stderr: str


def run_container(
    image: str,
    command: Sequence[str],
    *,
    entrypoint: Sequence[str] | None = None,
    gpus: bool = False,
    environment: Mapping[str, str] | None = None,
    platform: str | None = None,
    timeout_s: int = 1800,
    volumes: Mapping[str, str] | None = None,
    on_stderr_line: Callable[[str], None] | None = None,
) -> RunResult:
    """Run a throwaway container and collect its exit code and output; `on_stderr_line` sees each line the
    container writes to stderr as it comes (progress), from a follower thread."""
    import docker.types

    client = _client()
    kwargs: dict[str, Any] = {
        "entrypoint": list(entrypoint) if entrypoint is not None else None,
        "command": list(command),
        "environment": dict(environment or {}),
        "detach": True,
        "network_disabled": False,
    }
    if platform:
        kwargs["platform"] = platform
    if volumes:
        kwargs["volumes"] = {host: {"bind": target, "mode": "ro"} for host, target in volumes.items()}
    if gpus:
        kwargs["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    with sdk_errors(f"run {image}"):
        container = client.containers.create(image, **{k: v for k, v in kwargs.items() if k != "detach"})
    try:
        with sdk_errors(f"run {image}"):  # a start that fails (no GPU driver) still removes it below
            container.start()
        follower = _follow_stderr(container, on_stderr_line) if on_stderr_line is not None else None
        try:
            result = container.wait(timeout=timeout_s)
            if follower is not None:
                follower.join(timeout=5)  # the stream ends with the container
        except Exception as exc:  # the SDK raises a requests timeout/connection error when the wait runs out
            # Over a unix socket the wait's read timeout arrives as a ConnectionError too: ask the engine itself.
            if not _answers():
                raise EngineError(engine_stopped_message(_sdk_address(), f"the run of {image}")) from None
            container.kill()
            logs = container.logs().decode(errors="replace")
            return RunResult(124, logs, f"timed out after {timeout_s} s ({exc.__class__.__name__})")
        with sdk_errors(f"reading the output of {image}"):
            stdout = container.logs(stdout=True, stderr=False).decode(errors="replace")
            stderr = container.logs(stdout=False, stderr=True).decode(errors="replace")
        return RunResult(int(result.get("StatusCode", 1)), stdout, stderr)
    finally:
        with contextlib.suppress(Exception):  # an engine that went away takes its containers with it
            container.remove(force=True)


def _follow_stderr(container: Any, on_line: Callable[[str], None]) -> threading.Thread:
    """A daemon thread handing each stderr line of a running container to `on_line` until the stream ends."""

    def follow() -> None:
        pending = b""
        with contextlib.suppress(Exception):  # the engine or the container going away ends the stream
            for chunk in container.logs(stream=True, follow=True, stdout=False, stderr=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    on_line(line.decode(errors="replace"))

    thread = threading.Thread(target=follow, name="container-stderr", daemon=True)
    thread.start()
    return thread


def _answers() -> bool:
    try:
        _client().ping()
    except Exception:  # any failure to ping is "not answering"
        return False
    return True


class _ChunkReader(io.RawIOBase):
    """A file object over an iterator of byte chunks (the engine's export stream)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, target: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(target), len(self._buffer))
        target[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size


class ExportedFilesystem:
    """Context manager yielding a readable tar stream of an image's filesystem (a created, never started container)."""

    def __init__(self, image: str) -> None:
        self.image = image
        self._container: Any = None

    def __enter__(self) -> io.BufferedReader:
        inspect_image(self.image)
        with sdk_errors(f"export {self.image}"):
            self._container = _client().containers.create(self.image, entrypoint=["/bin/true"], command=[])
        return io.BufferedReader(_ChunkReader(iter(self._container.export(chunk_size=1 << 20))), 1 << 20)

    def __exit__(self, *exc: object) -> None:
        if self._container is not None:
            self._container.remove(force=True)


def read_image_file(image: str, path: str) -> bytes | None:
    """One file from an image's filesystem, from a created (never started) container; None when absent."""
    import docker.errors

    with sdk_errors(f"read {path} from {image}"):
        container = _client().containers.create(image, entrypoint=["/bin/true"], command=[])
    try:
        try:
            chunks, _ = container.get_archive(path)
        except docker.errors.NotFound:
            return None
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as archive:
            member = archive.next()
            handle = archive.extractfile(member) if member else None
            return handle.read() if handle else None
    finally:
        container.remove(force=True)


def read_image_files(image: str, paths: Sequence[str]) -> dict[str, bytes | None]:
    """Several files from one created (never started) container: path -> bytes, None when absent."""
    import docker.errors

    with sdk_errors(f"read {len(paths)} file(s) from {image}"):
        container = _client().containers.create(image, entrypoint=["/bin/true"], command=[])
    out: dict[str, bytes | None] = {}
    try:
        for path in paths:
            try:
                chunks, _ = container.get_archive(path)
            except docker.errors.NotFound:
                out[path] = None
                continue
            with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as archive:
                member = archive.next()
                handle = archive.extractfile(member) if member and member.isfile() else None
                out[path] = handle.read() if handle else None
    finally:
        container.remove(force=True)
    return out


def image_layer_dirs(ref: str) -> tuple[Path, ...] | None:
    """The image's layer directories in the engine's own store, bottom to top, when this host can read them.

    Only the overlay2 store keeps each layer as a plain directory; None for any other store, a remote engine or
    a user without read access, and callers then fall back to exporting the filesystem.
    """
    driver = inspect_image(ref).get("GraphDriver") or {}
    data = driver.get("Data") or {}
    if driver.get("Name") != "overlay2" or not data.get("UpperDir"):
        return None
    lower = [Path(p) for p in str(data.get("LowerDir") or "").split(":") if p]
    layers = (*reversed(lower), Path(data["UpperDir"]))
    if not all(layer.is_dir() and os.access(layer, os.R_OK | os.X_OK) for layer in layers):
        return None
    return layers


def image_history(ref: str) -> list[dict[str, Any]]:
    """The engine's history of an image, newest first: `created_by` and layer `size` of each step."""
    return [
        {"created_by": str(e.get("CreatedBy") or ""), "size": int(e.get("Size") or 0)}
        for e in _client().api.history(ref)
    ]


def tag_image(source: str, target: str) -> None:
    repository, _, tag = (
        target.rpartition(":") if ":" in target.rsplit("/", 1)[-1] else (target, "", "latest")
    )
    with sdk_errors(f"tag {source} as {target}"):
        tagged = _client().images.get(source).tag(repository, tag)
    if not tagged:
        raise EngineError(f"the engine refused to tag {source} as {target}")


def remove_image(ref: str) -> None:
    import docker.errors

    with contextlib.suppress(docker.errors.ImageNotFound):
        _client().images.remove(ref, force=True)


def run_cli(runner: Runner, engine: Engine, step: str, *args: str, check: bool = True) -> str:
    """Run a docker CLI subcommand through the command seam; returns its output."""
    try:
        return runner.run(Command((engine.docker, *args), engine.env), step, check=check).output
    except CommandError as exc:
        raise EngineError(str(exc)) from None


def docker_cli() -> str:
    """A docker CLI for talking to other engines (nodes); BuildKit is not needed for that."""
    candidates = docker_candidates()
    if not candidates:
        raise EngineError(f"no docker CLI found on this machine; {NO_ENGINE_FIX}")
    return candidates[0]
