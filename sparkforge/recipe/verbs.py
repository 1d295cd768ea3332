"""The RDMA userspace a recipe's runtime carries: what NCCL needs to use RoCE instead of TCP sockets.

NCCL dlopens `libibverbs.so` then `libibverbs.so.1` at run time and needs a verbs provider for the CX-7 (mlx5, in
`ibverbs-providers`); without them it logs "Failed to open libibverbs" and silently uses NET/Socket. Every package
is pinned to one Debian/Ubuntu version, so two builds of a recipe install the same bytes.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

_NAME = re.compile(r"[a-z0-9][a-z0-9.+-]+")
_VERSION = re.compile(r"(?:[0-9]+:)?[0-9][A-Za-z0-9.+~-]*")  # Debian policy: [epoch:]upstream[-revision]
# What fabric.verbs (sparkforge/verify/inimage/checks_fabric.py) proves in the image: NCCL's verbs library and the mlx5 provider.
REQUIRED = ("libibverbs", "ibverbs-providers")


def _pins(field: str, value: list[str]) -> list[str]:
    for pin in value:
        name, eq, version = pin.partition("=")
        if not eq:
            raise ValueError(
                f"runtime.rdma.{field}: {pin!r} has no version; fix: write NAME=VERSION, e.g. libibverbs1=50.0-2build2"
            )
        if not _NAME.fullmatch(name):
            raise ValueError(
                f"runtime.rdma.{field}: {name!r} is not a Debian/Ubuntu package name; fix: e.g. libibverbs1"
            )
        if not _VERSION.fullmatch(version):
            raise ValueError(
                f"runtime.rdma.{field}.{name}: {version!r} is not one exact package version; fix: pin what "
                "'apt-cache madison NAME' lists for the runtime base, e.g. '50.0-2build2'"
            )
    return value


class RdmaUserspace(BaseModel):
    """Pinned Debian/Ubuntu packages: the verbs library, the mlx5 provider, librdmacm; perftest for the link test."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # Lists of NAME=VERSION, not mappings: a recipe that `extends` another replaces the whole list (another base).
    packages: list[StrictStr] = Field(
        description="NAME=VERSION: libibverbs1, ibverbs-providers (the mlx5 provider), librdmacm (NCCL, UCX)"
    )
    link_test: list[StrictStr] = Field(
        default_factory=list,
        description="NAME=VERSION of the link test's tools (perftest: ib_write_bw for "
        "'invoke cluster.fabric --test'); empty: no link test from this image",
    )

    @field_validator("packages")
    @classmethod
    def _check_packages(cls, value: list[str]) -> list[str]:
        _pins("packages", value)
        missing = [want for want in REQUIRED if not any(pin.startswith(want) for pin in value)]
        if missing:
            raise ValueError(
                f"runtime.rdma.packages lacks {', '.join(missing)}: NCCL would fall back to TCP sockets; fix: pin "
                "libibverbs1 and ibverbs-providers (the mlx5 provider), and librdmacm"
            )
        return value

    @field_validator("link_test")
    @classmethod
    def _check_link_test(cls, value: list[str]) -> list[str]:
        return _pins("link_test", value)

    def pinned(self) -> dict[str, str]:
        """Package -> version, the link test's tools included (what fabric.verbs compares with dpkg's record)."""
        return dict(pin.partition("=")[::2] for pin in (*self.packages, *self.link_test))  # type: ignore[misc]
