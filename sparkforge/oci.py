"""Ground floor for image names and platforms: ONE platform table, the local-registry test. Pure, no I/O."""

from __future__ import annotations

import platform as _platform
from dataclasses import dataclass

from sparkforge.errors import SparkforgeError


@dataclass(frozen=True)
class Platform:
    """One platform sparkforge builds for: as Docker names it, as indexes record it, as Python/PyPI name it."""

    name: str  # linux/arm64
    os: str
    architecture: str  # Docker/OCI: arm64, amd64
    variant: str | None  # what the engine and buildx record in an index (arm64: v8)
    machine: str  # uname -m / wheel tags: aarch64, x86_64
    machines: tuple[str, ...]  # every uname -m spelling of it
    runner: str  # GitHub-hosted runner that builds it natively

    @property
    def index_name(self) -> str:
        """'os/arch/variant' as an index lists it (linux/arm64/v8)."""
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


PLATFORMS: dict[str, Platform] = {
    "linux/amd64": Platform(
        "linux/amd64", "linux", "amd64", None, "x86_64", ("x86_64", "amd64"), "ubuntu-24.04"
    ),
    "linux/arm64": Platform(
        "linux/arm64", "linux", "arm64", "v8", "aarch64", ("aarch64", "arm64"), "ubuntu-24.04-arm"
    ),
}
LOCAL_HOSTS = ("localhost", "127.0.0.1")


def get(name: str) -> Platform:
    if name not in PLATFORMS:
        raise SparkforgeError(f"unknown platform {name!r}; fix: use one of {', '.join(PLATFORMS)}")
    return PLATFORMS[name]


def arch(name: str) -> str:
    """'linux/arm64' -> 'arm64' (tag and file-name suffixes)."""
    return name.split("/")[1] if name.count("/") >= 1 else name


def canonical(os_name: str, architecture: str, variant: str | None = None) -> str:
    """An index entry's platform -> sparkforge's name: linux/arm64/v8 and linux/arm64 are both linux/arm64."""
    for known in PLATFORMS.values():
        if (known.os, known.architecture) == (os_name, architecture) and variant in (None, "", known.variant):
            return known.name
    return "/".join(p for p in (os_name, architecture, variant) if p)


def machine_of(name: str) -> str:
    """'linux/arm64' -> 'aarch64' (wheel platform tags, uname -m)."""
    return get(name).machine


def host_platform(machine: str | None = None) -> str:
    """This machine's platform (from uname -m)."""
    found = (machine or _platform.machine()).lower()
    for known in PLATFORMS.values():
        if found in known.machines:
            return known.name
    raise SparkforgeError(f"unknown machine type {found!r}; fix: pass --platform linux/arm64 or linux/amd64")


def is_local_registry(repository: str) -> bool:
    """Registries on this machine speak plain HTTP (Docker treats them as insecure without being told)."""
    host = repository.split("/", 1)[0]
    return host.startswith("[::1]") or host.rsplit(":", 1)[0] in LOCAL_HOSTS
