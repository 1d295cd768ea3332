"""Ground floor for image names and platforms: ONE platform table, ONE grammar for references, tags and digests
(checked before any engine or registry call), the local-registry test. Pure, no I/O."""

from __future__ import annotations

import platform as _platform
import re
from dataclasses import dataclass

from sparkforge.errors import InputError, SparkforgeError


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


# The OCI distribution spec's tag grammar.
OCI_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# OCI distribution reference: [registry[:port]/]name(/name)*[:tag]; the registry part may hold '.', ':' and capitals.
# Registry: dot-separated DNS labels (or a bracketed IPv6 address) with an optional port, as Docker's grammar has it.
_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:]+\])"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REF_NAME = re.compile(rf"(?:{_DOMAIN}(?::[0-9]{{1,5}})?/)?{_COMPONENT}(?:/{_COMPONENT})*")


def is_digest(text: object) -> bool:
    """sha256: and 64 lowercase hex digits."""
    return isinstance(text, str) and DIGEST.fullmatch(text) is not None


def is_reference(ref: str, *, need_digest: bool = False) -> bool:
    """NAME[:TAG][@sha256:...] by the OCI grammar (lowercase repository path, at most 255 characters)."""
    name, at, digest = ref.partition("@")
    tag = ""
    if ":" in name.rsplit("/", 1)[-1]:
        name, _, tag = name.rpartition(":")
    if need_digest and not at:
        return False
    return (
        bool(_REF_NAME.fullmatch(name))
        and len(name) <= 255
        and (not at or is_digest(digest))
        and (not tag or bool(OCI_TAG.fullmatch(tag)))
    )


def check_reference(option: str, ref: str, *, need_digest: bool = False) -> str:
    """An image reference from the command line, or InputError before any engine or registry call."""
    if not is_reference(ref, need_digest=need_digest):
        form = "NAME@sha256:<64 hex>" if need_digest else "NAME[:TAG] or NAME@sha256:<64 hex>"
        raise InputError(
            f"{option} {ref[:120]!r} is not an image reference; fix: use {form} with a lowercase name (e.g. "
            "ghcr.io/org/vllm-qwen35:0.31.0) and a tag of letters, digits, _ . - (at most 128)"
        )
    return ref


def check_tag(option: str, tag: str) -> str:
    """A tag alone (no repository): the OCI tag grammar."""
    if not OCI_TAG.fullmatch(tag):
        raise InputError(
            f"{option} {tag[:80]!r} is not a tag; fix: use letters, digits, _ . - (at most 128, not starting "
            "with . or -), e.g. 0.31.0-cu130"
        )
    return tag


def check_digest(option: str, digest: str) -> str:
    if not is_digest(digest):
        raise InputError(
            f"{option} {digest[:80]!r} is not a digest; fix: use sha256: and 64 lowercase hex digits (as 'invoke "
            "history' prints them)"
        )
    return digest


def check_platform(option: str, name: str) -> str:
    """A platform sparkforge builds (the PLATFORMS table)."""
    if name not in PLATFORMS:
        raise InputError(
            f"{option} {name[:80]!r} is not a platform sparkforge builds; fix: use one of {', '.join(PLATFORMS)}"
        )
    return name
