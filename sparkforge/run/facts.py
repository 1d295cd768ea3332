"""What the cluster doctor knows of each node and how it was asked: shared by its stages (doctor, reach)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Deadlines:
    engines: float = 20
    image: float = 30
    addresses: float = 60
    reach: float = 30
    sanity: float = 60


@dataclass(frozen=True)
class DoctorOptions:
    image: str
    interface: str | None = None
    master_port: int = 29501
    deadlines: Deadlines = Deadlines()
    sanity: bool = True
    quick: bool = False  # only the cheap stages (engines to versions): the first named cause, in seconds
    nccl: Literal["auto", "yes", "no"] = "auto"
    gpus: bool = False
    min_busbw: float | None = (
        None  # GB/s floor of NCCL's all-reduce bus bandwidth; None: 80 % of the port rate
    )
    gid_index: int | None = (
        None  # --gid-index N pins NCCL_IB_GID_INDEX; None lets NCCL choose (AF_INET, RoCE v2)
    )
    state_dir: str | None = None  # where each node's GID indices and MTU of the last run are kept
    nccl_source: Literal["image", "host"] = (
        "image"  # host: bind-mount the node's own libnccl over the image's
    )
    paths: tuple[tuple[str, str], ...] = ()  # (kind, path) to find on every node before a launch
    memory_plan: dict[str, Any] | None = (
        None  # the profile's memory plan (run/memory), judged by the memory stage
    )
    layout: str | None = None  # the declared cabling (topology.LAYOUTS); None: whatever the fabric shows
    parallel: tuple[int, int] = (1, 1)  # the launch's TP and PP (the topology and known-bad rules judge them)
    cuda_graphs: bool = True  # false when the profile sets enforce-eager
    nccl_pin: dict[str, Any] | None = (
        None  # the recipe's nccl pin (version, sha256, variant): checked on every rank
    )


@dataclass
class NodeFacts:
    """What the probe found on one node, and the address/env the launch will use there."""

    rank: int
    label: str
    auto_ip: str
    ip_source: str
    interfaces: list[dict[str, Any]]
    infiniband: dict[str, list[str]]
    versions: dict[str, Any]
    address: str = ""
    interface: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    fabric: dict[str, Any] = field(
        default_factory=dict
    )  # the helper's raw sysfs facts (run/cluster/fabric.py)
    host: dict[str, Any] = field(default_factory=dict)  # host driver versions, RemoveIPC, the host's NCCL
    mounts: list[str] = field(default_factory=list)  # extra per-node mounts of the sanity run and launch
    warnings: list[str] = field(default_factory=list)

    @property
    def rdma(self) -> bool:
        """The node has RDMA devices: its containers get /dev/infiniband, IPC_LOCK and unlimited memlock."""
        return bool(self.fabric.get("rdma"))

    def interface_of(self, address: str) -> dict[str, Any] | None:
        return next((i for i in self.interfaces if i.get("ipv4") == address), None)

    def named(self, name: str) -> dict[str, Any] | None:
        return next((i for i in self.interfaces if i.get("name") == name), None)

    def default_interface(self) -> str | None:
        return next((str(i["name"]) for i in self.interfaces if i.get("default_route")), None)
