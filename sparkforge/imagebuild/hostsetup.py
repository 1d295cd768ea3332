"""Make a working engine where none runs: Docker from the distribution, qemu binfmt, offline Debian bases."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sparkforge import engine
from sparkforge.boundary import read_tail, read_text, write_output
from sparkforge.commands import Command
from sparkforge.context import Session
from sparkforge.errors import EngineError

DOCKER_LOG = Path("/var/log/sparkforge-dockerd.log")
BASE_PACKAGES = ("python3", "python3-pip", "python3-venv", "ca-certificates", "git", "bash")
DEFAULT_SUITE = "bookworm"
ARCH_OF_PLATFORM = {"linux/amd64": "amd64", "linux/arm64": "arm64"}
BASE_DOCKERFILE = 'FROM scratch\nADD rootfs.tar /\nLABEL {label}="{inputs}"\nCMD ["/bin/bash"]\n'
BASE_INPUTS_LABEL = "dev.sparkforge.base.inputs"


def base_inputs(platform: str, suite: str = DEFAULT_SUITE) -> str:
    """What makes an offline base (suite, architecture, packages, how it is imported): a base whose label says
    otherwise is made again. The mirror is not an input: every Debian mirror serves the same archive."""
    made = json.dumps([suite, ARCH_OF_PLATFORM[platform], BASE_PACKAGES, BASE_DOCKERFILE, "minbase"])
    return hashlib.sha256(made.encode()).hexdigest()[:16]


def _base_label(session: Session, name: str) -> str | None:
    """The inputs label of the engine's image `name` ("" when it has none), or None when there is no such image."""
    template = f'{{{{ index .Config.Labels "{BASE_INPUTS_LABEL}" }}}}'
    inspect = Command.of(engine.docker_cli(), "image", "inspect", "--format", template, name)
    found = session.runner.capture(inspect, "image-inspect", check=False)
    if found.returncode != 0:
        return None
    label = found.output.strip()
    return "" if label == "<no value>" else label


@dataclass(frozen=True)
class SetupStep:
    name: str
    done: str


def engine_up(session: Session, *, qemu: bool = False, wait_s: int = 60) -> list[SetupStep]:
    """Install and start Docker if none runs (Debian-like hosts); register qemu for arm64 when asked."""
    steps: list[SetupStep] = []
    if not engine.daemon_ready(session.runner):
        if not shutil.which("dockerd"):
            if not shutil.which("apt-get"):
                raise EngineError(
                    "no Docker engine and no apt-get to install one; fix: install Docker for your system "
                    "(https://docs.docker.com/engine/install/) and start it"
                )
            session.runner.run(Command.of("apt-get", "update", "-q"), "apt-update")
            session.runner.run(
                Command.of(
                    "apt-get", "install", "-y", "-q", "docker.io", env={"DEBIAN_FRONTEND": "noninteractive"}
                ),
                "apt-install-docker",
            )
            steps.append(SetupStep("install", "installed docker.io from the distribution"))
        session.runner.start(Command.of("dockerd"), DOCKER_LOG)
        if not session.runner.dry:
            deadline = time.monotonic() + wait_s
            while not engine.daemon_ready(session.runner):
                if time.monotonic() > deadline:
                    tail = read_tail(DOCKER_LOG, "dockerd log", 1500)
                    raise EngineError(
                        f"dockerd did not come up in {wait_s}s; its log ({DOCKER_LOG}) ends:\n{tail}"
                    )
                time.sleep(0.5)
        steps.append(SetupStep("daemon", f"started dockerd (log: {DOCKER_LOG})"))
    else:
        steps.append(SetupStep("daemon", "a Docker engine already runs"))
    if qemu:
        steps.append(register_qemu(session))
    return steps


def register_qemu(session: Session) -> SetupStep:
    """Let arm64 binaries run under emulation (binfmt_misc + qemu-user-static)."""
    entry = Path("/proc/sys/fs/binfmt_misc/qemu-aarch64")
    if entry.exists() and "enabled" in read_text(entry, "binfmt_misc", 4096):
        return SetupStep("qemu", "qemu-aarch64 binfmt already enabled")
    if not shutil.which("qemu-aarch64-static") or not shutil.which("update-binfmts"):
        session.runner.run(
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
        session.runner.run(
            Command.of("mount", "-t", "binfmt_misc", "binfmt_misc", "/proc/sys/fs/binfmt_misc"),
            "binfmt-mount",
        )
    session.runner.run(Command.of("update-binfmts", "--enable", "qemu-aarch64"), "binfmt-enable")
    return SetupStep("qemu", "registered qemu-aarch64 with binfmt_misc")


def debian_mirror() -> str:
    """The Debian mirror this host's apt uses (bases come from the same place)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        if not path.is_file():
            continue
        for match in re.finditer(
            r"(?:URIs:|^deb)\s+(\S*?/debian)/?\s", read_text(path, "apt sources", 1 << 20), re.MULTILINE
        ):
            if "security" not in match.group(1):
                return match.group(1)
    return "http://deb.debian.org/debian"


def base_image_name(platform: str, suite: str = DEFAULT_SUITE) -> str:
    return f"sparkforge-base/debian-{suite}:{ARCH_OF_PLATFORM[platform]}"


def build_base(
    session: Session, platform: str, *, suite: str = DEFAULT_SUITE, force: bool = False
) -> SetupStep:
    """A Debian base with Python made by debootstrap and imported with the platform's metadata."""
    if platform not in ARCH_OF_PLATFORM:
        raise EngineError(f"no offline base for {platform}; fix: use one of {', '.join(ARCH_OF_PLATFORM)}")
    name = base_image_name(platform, suite)
    arch = ARCH_OF_PLATFORM[platform]
    inputs = base_inputs(platform, suite)
    label = None if force else _base_label(session, name)
    if label == inputs:
        return SetupStep(f"base-{arch}", f"{name} already exists (inputs {inputs})")
    if label == "":
        # Made before bases recorded their inputs: kept (its dependents' caches stay valid); --force remakes it.
        return SetupStep(
            f"base-{arch}", f"{name} already exists (inputs not recorded; --force makes it again)"
        )
    if arch != "amd64" and os.uname().machine == "x86_64":
        register_qemu(session)
    _ensure_debootstrap(session)
    with tempfile.TemporaryDirectory(prefix="sparkforge-base-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        session.runner.run(
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
        session.runner.run(
            Command.of("tar", "-C", str(rootfs), "-cf", str(Path(tmp) / "rootfs.tar"), "."), f"tar-{arch}"
        )
        shutil.rmtree(rootfs, ignore_errors=True)
        write_output(Path(tmp) / "Dockerfile", BASE_DOCKERFILE.format(label=BASE_INPUTS_LABEL, inputs=inputs))
        # The CLI the engine's rule picks for builds (one with BuildKit), like every other build.
        docker = session.container_engine.docker
        session.runner.run(
            Command.of(
                docker, "build", "--platform", platform, "--tag", name, tmp, env={"DOCKER_BUILDKIT": "1"}
            ),
            f"import-{arch}",
        )
    why = "" if label is None or force else f", its inputs changed ({label} -> {inputs})"
    return SetupStep(f"base-{arch}", f"built {name} from Debian {suite} ({platform}{why})")


def _ensure_debootstrap(session: Session) -> None:
    if not shutil.which("debootstrap"):
        session.runner.run(
            Command.of(
                "apt-get", "install", "-y", "-q", "debootstrap", env={"DEBIAN_FRONTEND": "noninteractive"}
            ),
            "apt-install-debootstrap",
        )


def build_bases(session: Session, platforms: list[str], *, force: bool = False) -> list[SetupStep]:
    """Every platform's base at once: the native one waits on the network while the emulated one's packages
    configure under qemu (one of two cores each). The first failure is raised once all have ended."""
    unknown = [p for p in platforms if p not in ARCH_OF_PLATFORM]
    if unknown:
        raise EngineError(
            f"no offline base for {', '.join(unknown)}; fix: use one of {', '.join(ARCH_OF_PLATFORM)}"
        )
    _ensure_debootstrap(session)  # once, before the threads: two apt-get runs would fight over dpkg's lock
    with ThreadPoolExecutor(max_workers=len(platforms) or 1) as pool:  # leaving the block waits for all
        futures = [pool.submit(build_base, session, platform, force=force) for platform in platforms]
    return [future.result() for future in futures]


# ---- buildx: Debian's next release, side by side with the host's engine ---------------------------

# Pinned: Debian trixie's builds (their only dependency is libc6 >= 2.34; bookworm has 2.36). The system is
# not upgraded: the .debs are downloaded with a one-off apt configuration and unpacked under BUILDX_ROOT.
BUILDX_SUITE = "trixie"
BUILDX_DEBS = {
    "docker-buildx": "0.13.1+ds1-3",
    "docker.io": "26.1.5+dfsg1-9+deb13u1+b1",
    "containerd": "1.7.24~ds1-6+deb13u1",
}
BUILDX_ROOT = Path("/opt/sparkforge/buildx")
BUILDX_STATE = Path("/var/lib/sparkforge-buildx")
BUILDX_RUN = Path("/run/sparkforge-buildx")
BUILDX_HOST = f"unix://{BUILDX_RUN / 'docker.sock'}"
BUILDX_CONFIG = BUILDX_ROOT / "config"  # DOCKER_CONFIG: cli-plugins/docker-buildx
BUILDX_LOG = Path("/var/log/sparkforge-buildx-dockerd.log")
BUILDX_BRIDGE = ("sparkforge0", "172.31.250.1/24")  # its own bridge: the host engine keeps docker0
BUILDX_FILES = {
    "docker.io": ("usr/sbin/dockerd", "usr/sbin/docker-proxy"),
    "containerd": ("usr/bin/containerd", "usr/bin/containerd-shim-runc-v2"),
    "docker-buildx": ("usr/libexec/docker/cli-plugins/docker-buildx",),
}


def buildx_env() -> dict[str, str]:
    """The environment that points a docker CLI (and the Docker SDK) at the buildx engine."""
    return {"DOCKER_HOST": BUILDX_HOST, "DOCKER_CONFIG": str(BUILDX_CONFIG)}


def _apt_options(tmp: Path) -> list[str]:
    # A private apt state: the host's sources, lists and cache are left as they are.
    for sub in ("parts", "lists/partial", "cache/archives/partial"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    write_output(
        tmp / "parts" / f"sparkforge-{BUILDX_SUITE}.sources",
        f"Types: deb\nURIs: {debian_mirror()}\nSuites: {BUILDX_SUITE}\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n",
    )
    pairs = {
        "Dir::Etc::SourceList": "/dev/null",
        "Dir::Etc::SourceParts": str(tmp / "parts"),
        "Dir::State::Lists": str(tmp / "lists"),
        "Dir::Cache": str(tmp / "cache"),
        "APT::Sandbox::User": "root",
    }
    return [arg for key, value in pairs.items() for arg in ("-o", f"{key}={value}")]


def install_buildx(session: Session) -> SetupStep:
    """docker-buildx, dockerd and containerd from Debian trixie (pinned), unpacked under BUILDX_ROOT."""
    stamp = BUILDX_ROOT / "versions.txt"
    wanted = "".join(f"{name}={version}\n" for name, version in sorted(BUILDX_DEBS.items()))
    if stamp.is_file() and read_text(stamp, "buildx stamp", 1 << 16) == wanted:
        return SetupStep("buildx-install", f"buildx and dockerd from {BUILDX_SUITE} already in {BUILDX_ROOT}")
    with tempfile.TemporaryDirectory(prefix="sparkforge-apt-") as tmp_name:
        tmp = Path(tmp_name)
        options = _apt_options(tmp)
        session.runner.run(Command.of("apt-get", *options, "update", "-q"), "apt-update-trixie")
        pins = [f"{name}={version}" for name, version in sorted(BUILDX_DEBS.items())]
        download = session.runner.run(
            Command.of("apt-get", *options, "download", *pins, cwd=tmp), "apt-download-buildx", check=False
        )
        if download.returncode != 0 and not session.runner.dry:
            raise EngineError(
                f"cannot download {', '.join(pins)} from Debian {BUILDX_SUITE} ({debian_mirror()}): "
                f"{download.output.strip()[-400:]}; fix: a newer point release replaced a pinned version, so "
                "update BUILDX_DEBS in sparkforge/hostsetup.py to the versions 'apt-cache policy' lists"
            )
        (BUILDX_ROOT / "bin").mkdir(parents=True, exist_ok=True)
        (BUILDX_CONFIG / "cli-plugins").mkdir(parents=True, exist_ok=True)
        for name, files in BUILDX_FILES.items():
            deb = next(iter(sorted(tmp.glob(f"{name}_*.deb"))), None)
            unpacked = tmp / "x" / name
            unpacked.mkdir(parents=True, exist_ok=True)
            session.runner.run(
                Command.of("dpkg-deb", "-x", str(deb or f"{name}.deb"), str(unpacked)), f"unpack-{name}"
            )
            for file in files:
                target = BUILDX_CONFIG / "cli-plugins" if "cli-plugins" in file else BUILDX_ROOT / "bin"
                if not session.runner.dry:
                    shutil.copy2(unpacked / file, target / Path(file).name)
    if not session.runner.dry:
        write_output(stamp, wanted, "buildx stamp")
    return SetupStep("buildx-install", f"{', '.join(pins)} unpacked in {BUILDX_ROOT} (system not upgraded)")


def start_buildx_engine(session: Session, wait_s: int = 60) -> SetupStep:
    """A second dockerd (trixie's, containerd image store) on its own socket, bridge and data root.

    The host's engine keeps running untouched; its images are not visible here (bases are copied over).
    """
    if engine.daemon_ready(session.runner, buildx_env()):
        return SetupStep("buildx-daemon", f"the buildx engine already runs ({BUILDX_HOST})")
    name, address = BUILDX_BRIDGE
    if not Path(f"/sys/class/net/{name}").exists():
        session.runner.run(Command.of("ip", "link", "add", name, "type", "bridge"), "bridge-add")
        session.runner.run(Command.of("ip", "addr", "add", address, "dev", name), "bridge-addr")
    session.runner.run(Command.of("ip", "link", "set", name, "up"), "bridge-up")
    config = {
        "features": {"containerd-snapshotter": True},
        # Where a system containerd already runs (GitHub's runners), dockerd uses it: keep out of the host's.
        "containerd-namespace": "sparkforge-buildx",
        "containerd-plugins-namespace": "sparkforge-buildx-plugins",
        "bridge": name,
        # No iptables rules: the host engine owns them. Builds here need no network (offline bases).
        "iptables": False,
        "ip-masq": False,
    }
    dockerd = Command.of(
        str(BUILDX_ROOT / "bin" / "dockerd"),
        "--config-file",
        str(BUILDX_ROOT / "daemon.json"),
        "--data-root",
        str(BUILDX_STATE),
        "--exec-root",
        str(BUILDX_RUN / "exec"),
        "--pidfile",
        str(BUILDX_RUN / "dockerd.pid"),
        "--host",
        BUILDX_HOST,
        env={"PATH": f"{BUILDX_ROOT / 'bin'}:{os.environ.get('PATH', '')}"},
    )
    if session.runner.dry:
        session.runner.start(dockerd, BUILDX_LOG)
        return SetupStep("buildx-daemon", "would start the buildx engine")
    BUILDX_RUN.mkdir(parents=True, exist_ok=True)
    write_output(BUILDX_ROOT / "daemon.json", json.dumps(config, indent=2) + "\n", "daemon config")
    # A long-running daemon, not a step: started detached, like the host engine in engine_up.
    session.runner.start(dockerd, BUILDX_LOG)
    deadline = time.monotonic() + wait_s
    while not engine.daemon_ready(session.runner, buildx_env()):
        if time.monotonic() > deadline:
            tail = read_tail(BUILDX_LOG, "dockerd log", 1500)
            raise EngineError(f"the buildx dockerd did not come up in {wait_s}s; {BUILDX_LOG} ends:\n{tail}")
        time.sleep(0.5)
    return SetupStep("buildx-daemon", f"started the buildx engine on {BUILDX_HOST} (log: {BUILDX_LOG})")


def copy_bases(session: Session) -> list[SetupStep]:
    """The host engine's offline bases, copied into the buildx engine (its image store is separate)."""
    steps = []
    docker = engine.docker_cli()
    for platform in ARCH_OF_PLATFORM:
        name = base_image_name(platform)
        if not engine.cli_has_image(session.runner, name) or engine.cli_has_image(
            session.runner, name, buildx_env()
        ):
            continue
        with tempfile.TemporaryDirectory(prefix="sparkforge-base-") as tmp:
            archive = str(Path(tmp) / "base.tar")
            session.runner.run(Command.of(docker, "save", "--output", archive, name), "base-save")
            session.runner.run(Command.of(docker, "load", "--input", archive, env=buildx_env()), "base-load")
        steps.append(
            SetupStep(f"buildx-{ARCH_OF_PLATFORM[platform]}", f"copied {name} into the buildx engine")
        )
    return steps


def buildx_up(session: Session) -> list[SetupStep]:
    """buildx with a BuildKit that can push, export registry cache and attest: install, start, copy bases."""
    steps = [install_buildx(session), start_buildx_engine(session)]
    if not session.runner.dry:
        steps += copy_bases(session)
    exports = " ".join(f"{k}={v}" for k, v in buildx_env().items())
    steps.append(SetupStep("buildx-env", f"use it with: export {exports}"))
    return steps
