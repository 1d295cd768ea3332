"""Make a working engine where none runs: Docker from the distribution, qemu binfmt, offline Debian bases."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sparkforge.commands import Command, Runner
from sparkforge.errors import EngineError

DOCKER_LOG = Path("/var/log/sparkforge-dockerd.log")
BASE_PACKAGES = ("python3", "python3-pip", "python3-venv", "ca-certificates", "git", "bash")
DEFAULT_SUITE = "bookworm"
ARCH_OF_PLATFORM = {"linux/amd64": "amd64", "linux/arm64": "arm64"}


@dataclass(frozen=True)
class SetupStep:
    name: str
    done: str


def _docker_ready(docker: str) -> bool:
    if not Path(docker).exists():
        return False
    return subprocess.run([docker, "info"], capture_output=True).returncode == 0


def _docker_cli() -> str:
    # Debian's docker.io CLI (20.10) can build with the engine's BuildKit; a newer CLI without buildx cannot.
    for path in ("/usr/bin/docker", shutil.which("docker")):
        if path and Path(path).exists():
            return path
    return "/usr/bin/docker"


def engine_up(runner: Runner, *, qemu: bool = False, wait_s: int = 60) -> list[SetupStep]:
    """Install and start Docker if none runs (Debian-like hosts); register qemu for arm64 when asked."""
    steps: list[SetupStep] = []
    docker = _docker_cli()
    if not _docker_ready(docker):
        if not shutil.which("dockerd"):
            if not shutil.which("apt-get"):
                raise EngineError(
                    "no Docker engine and no apt-get to install one; fix: install Docker for your system "
                    "(https://docs.docker.com/engine/install/) and start it"
                )
            runner.run(Command.of("apt-get", "update", "-q"), "apt-update")
            runner.run(
                Command.of(
                    "apt-get", "install", "-y", "-q", "docker.io", env={"DEBIAN_FRONTEND": "noninteractive"}
                ),
                "apt-install-docker",
            )
            steps.append(SetupStep("install", "installed docker.io from the distribution"))
        if runner.dry:
            runner.echo(f"setsid dockerd >{DOCKER_LOG} 2>&1 &")
        else:
            with DOCKER_LOG.open("ab") as log:
                subprocess.Popen(["dockerd"], stdout=log, stderr=log, start_new_session=True)
            deadline = time.monotonic() + wait_s
            while not _docker_ready(docker):
                if time.monotonic() > deadline:
                    tail = DOCKER_LOG.read_text(errors="replace")[-1500:]
                    raise EngineError(
                        f"dockerd did not come up in {wait_s}s; its log ({DOCKER_LOG}) ends:\n{tail}"
                    )
                time.sleep(0.5)
        steps.append(SetupStep("daemon", f"started dockerd (log: {DOCKER_LOG})"))
    else:
        steps.append(SetupStep("daemon", "a Docker engine already runs"))
    if qemu:
        steps.append(register_qemu(runner))
    return steps


def register_qemu(runner: Runner) -> SetupStep:
    """Let arm64 binaries run under emulation (binfmt_misc + qemu-user-static)."""
    entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    if entry.exists() and "enabled" in entry.read_text():
        return SetupStep("qemu", "qemu-aarch64 binfmt already enabled")
    if not shutil.which("qemu-aarch64-static") or not shutil.which("update-binfmts"):
        runner.run(
            Command.of(
                "apt-get",
                "install",
                "-y",
                "-q",
                "qemu-user-static",
                "binfmt-support",
                env={"DEBIAN_FRONTEND": "noninteractive"},
            ),
            "apt-install-qemu",
        )
    if not Path("/proc/sys/fs/binfmt_misc/register").exists():
        runner.run(
            Command.of("mount", "-t", "binfmt_misc", "binfmt_misc", "/proc/sys/fs/binfmt_misc"),
            "binfmt-mount",
        )
    runner.run(Command.of("update-binfmts", "--enable", "qemu-aarch64"), "binfmt-enable")
    return SetupStep("qemu", "registered qemu-aarch64 with binfmt_misc")


def debian_mirror() -> str:
    """The Debian mirror this host's apt uses (bases come from the same place)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        if not path.is_file():
            continue
        for match in re.finditer(r"(?:URIs:|^deb)\s+(\S*?/debian)/?\s", path.read_text(), re.MULTILINE):
            if "security" not in match.group(1):
                return match.group(1)
    return "http://deb.debian.org/debian"


def base_image_name(platform: str, suite: str = DEFAULT_SUITE) -> str:
    return f"sparkforge-base/debian-{suite}:{ARCH_OF_PLATFORM[platform]}"


def build_base(
    runner: Runner, platform: str, *, suite: str = DEFAULT_SUITE, force: bool = False
) -> SetupStep:
    """A Debian base with Python made by debootstrap and imported with the platform's metadata."""
    if platform not in ARCH_OF_PLATFORM:
        raise EngineError(f"no offline base for {platform}; fix: use one of {', '.join(ARCH_OF_PLATFORM)}")
    name = base_image_name(platform, suite)
    docker = _docker_cli()
    if not force and subprocess.run([docker, "image", "inspect", name], capture_output=True).returncode == 0:
        return SetupStep(f"base-{ARCH_OF_PLATFORM[platform]}", f"{name} already exists")
    arch = ARCH_OF_PLATFORM[platform]
    if arch != "amd64" and os.uname().machine == "x86_64":
        register_qemu(runner)
    if not shutil.which("debootstrap"):
        runner.run(
            Command.of(
                "apt-get", "install", "-y", "-q", "debootstrap", env={"DEBIAN_FRONTEND": "noninteractive"}
            ),
            "apt-install-debootstrap",
        )
    with tempfile.TemporaryDirectory(prefix="sparkforge-base-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        runner.run(
            Command.of(
                "debootstrap",
                "--variant=minbase",
                f"--arch={arch}",
                f"--include={','.join(BASE_PACKAGES)}",
                suite,
                str(rootfs),
                debian_mirror(),
            ),
            f"debootstrap-{arch}",
        )
        # The image's apt must not point at the host's mirror by a path that only exists here.
        runner.run(
            Command.of("tar", "-C", str(rootfs), "-cf", str(Path(tmp) / "rootfs.tar"), "."), f"tar-{arch}"
        )
        shutil.rmtree(rootfs, ignore_errors=True)
        (Path(tmp) / "Dockerfile").write_text('FROM scratch\nADD rootfs.tar /\nCMD ["/bin/bash"]\n')
        runner.run(
            Command.of(
                docker, "build", "--platform", platform, "--tag", name, tmp, env={"DOCKER_BUILDKIT": "1"}
            ),
            f"import-{arch}",
        )
    return SetupStep(f"base-{arch}", f"built {name} from Debian {suite} ({platform})")
