"""The command-line values of serve and cluster tasks, checked before any engine is contacted (pure, no I/O)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from sparkforge.errors import RunError

# Linux interface names: at most 15 bytes (IFNAMSIZ 16 with the NUL), no '/', no whitespace, not '.' or '..'.
_IFACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}")
_ULIMIT = re.compile(r"[a-z]+=-?[0-9]{1,20}(:-?[0-9]{1,20})?")
# A host path that becomes part of a `docker --volume SRC:DST[:ro]` value: ':' or ',' would add mounts or options.
_HOST_PATH = re.compile(r"/[A-Za-z0-9_./+@%-]*")


def check_port(option: str, value: object) -> int:
    """A TCP port from the command line: a whole number from 1 to 65535."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise RunError(f"{option} {value!r} is not a port; fix: use a whole number from 1 to 65535")
    return value


def check_interface(value: str) -> str:
    """`--interface`: a Linux network interface name (empty: none given)."""
    if value and (not _IFACE.fullmatch(value) or value in (".", "..")):
        raise RunError(
            f"--interface {value!r} is not a network interface name; fix: use the cluster link's name as "
            "'ip -br link' shows it (at most 15 letters, digits, _ . : -), e.g. --interface enp1s0f1np1"
        )
    return value


def check_choice(option: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise RunError(f"{option} {value!r} is not one of {', '.join(choices)}; fix: use one of them")
    return value


def check_positive(option: str, value: object, most: int = 10**7) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise RunError(f"{option} {value!r} is out of range; fix: use a whole number from 1 to {most}")
    return value


def check_host_path(option: str, value: str) -> str:
    """A host path mounted into containers (empty: not given): absolute, no ':' or ',' or whitespace."""
    if value and not _HOST_PATH.fullmatch(value.rstrip("/") or "/"):
        raise RunError(
            f"{option} {value!r} is not a plain absolute path (it becomes part of a docker --volume value, where "
            "':' and ',' add mounts or options); fix: use an absolute path of letters, digits and _ . / + @ % -"
        )
    if value and any(part == ".." for part in value.split("/")):
        raise RunError(f"{option} {value!r} holds '..'; fix: use the path without '..'")
    return value


def check_ulimits(values: Sequence[str]) -> tuple[str, ...]:
    for value in values:
        if not _ULIMIT.fullmatch(value):
            raise RunError(
                f"--ulimit {value!r} is not NAME=SOFT[:HARD]; fix: e.g. --ulimit memlock=-1 --ulimit nofile=1048576"
            )
    return tuple(values)
