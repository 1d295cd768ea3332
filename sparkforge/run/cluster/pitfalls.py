"""Known-bad combinations for several nodes, named before launch: each entry is data (what it matches, what
happens, the public source, the fix), judged against the facts known at that point (the recipe's NCCL pin or the
libnccl the doctor read, the layout, the parallel sizes, the backend, the host kernel).

Entries leave only when the fixed release is what the images carry; a refusal stops the launch, a warning is
printed beside the plan. The layout's own rule (TP across a switchless ring with stock NCCL) lives in
parallel.py, where the split is judged.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ClusterFacts:
    """What a rule may look at; None: not known yet (a rule needing it does not match)."""

    nodes: int
    tp: int = 1
    pp: int = 1
    nccl: str | None = None  # the NCCL version the ranks load (the recipe's pin, or the doctor's reading)
    cuda_graphs: bool = True  # false with enforce-eager
    backend: str = "mp"
    layout: str | None = None
    kernels: tuple[str, ...] = ()  # each node's host kernel release
    dp: int = 1
    moe: bool | None = None  # None: no checkpoint config known
    device: str = "cuda"  # the recipe's vLLM platform (cpu: the CPU twin)


def version(text: str | None) -> tuple[int, ...] | None:
    """'2.30.4' (or 'NCCL 2.30.4+cuda13.0') -> (2, 30, 4); None when no version is in it."""
    found = re.findall(r"\d+", text or "")[:3]
    return tuple(int(p) for p in found) if len(found) == 3 else None


@dataclass(frozen=True)
class ClusterKnownBad:
    id: str
    action: Literal["refuse", "warn"]
    what: str
    fix: str
    sources: tuple[str, ...]
    matches: Callable[[ClusterFacts], bool]

    def message(self, facts: ClusterFacts) -> str:
        return f"{self.id}: {self.what} (sources: {', '.join(self.sources)}); fix: {self.fix}"


def _nccl_in(low: tuple[int, ...], high: tuple[int, ...]) -> Callable[[ClusterFacts], bool]:
    def check(f: ClusterFacts) -> bool:
        found = version(f.nccl)
        return found is not None and low <= found < high

    return check


KNOWN_BAD: tuple[ClusterKnownBad, ...] = (
    ClusterKnownBad(
        "nccl-2.30.4-tp-hang-on-sparks",
        "refuse",
        "NCCL 2.30.4 hangs tensor parallelism across two Sparks at init, where a 2.30.6 pre-release works",
        "pin an NCCL >= 2.30.6 in the recipe (nccl.version and nccl.sha256) and rebuild, or run the nodes' own "
        "(--nccl host) where it is another version",
        ("https://github.com/NVIDIA/nccl/issues/2167",),
        lambda f: _nccl_in((2, 30, 4), (2, 30, 5))(f) and f.nodes > 1 and f.tp > 1,
    ),
    ClusterKnownBad(
        "nccl-cuda-graph-deadlock-across-nodes",
        "refuse",
        "NCCL before 2.30.4 (2.28.9 reported) deadlocks in CUDA-graph replay across nodes",
        "an NCCL >= 2.30.6 (2.30.4 itself hangs TP on Sparks), or enforce-eager: true in the profile (no graphs)",
        ("https://github.com/vllm-project/vllm/issues/52504",),
        lambda f: _nccl_in((2, 0, 0), (2, 30, 4))(f) and f.nodes > 1 and f.cuda_graphs,
    ),
    ClusterKnownBad(
        "nccl-before-2.29.3-on-aarch64",
        "warn",
        "NCCL older than 2.29.3 is reported to hang on aarch64 (seen on GB200)",
        "an NCCL >= 2.30.6 in the recipe",
        ("https://github.com/vllm-project/vllm/issues/41725",),
        lambda f: _nccl_in((2, 0, 0), (2, 29, 3))(f) and f.nodes > 1,
    ),
    ClusterKnownBad(
        "ray-pack-placement-on-one-gpu-nodes",
        "warn",
        "with Ray, vLLM creates a PACK placement group of one-GPU bundles with the first pinned to "
        "node:<VLLM_HOST_IP> (vllm/v1/executor/ray_utils.py): when Ray's node IP is another address (a multi-NIC "
        "Spark's LAN pick) the group never forms ('No available node types can fulfill resource request')",
        "the default --backend mp (vLLM's own multi-node backend); with --backend ray, cluster.up starts each "
        "node's Ray with --node-ip-address and RAY_NODE_IP_ADDRESS = its VLLM_HOST_IP on the fabric",
        ("https://github.com/eugr/spark-vllm-docker/issues/227",),
        lambda f: f.backend == "ray" and f.nodes > 1,
    ),
    ClusterKnownBad(
        "vllm-cpu-moe-data-parallel",
        "refuse",
        "vLLM's CPU build gathers a MoE's tokens over the data-parallel group with all_gatherv (its "
        "allgather_reducescatter manager, the only one it allows), which the CPU communicator lacks: the DP group "
        "forms over the nodes, then the first forward pass raises NotImplementedError and the engine dies "
        "(measured on vLLM 0.32.0's CPU build over two nodes: benchmarks/cluster-dp.md)",
        "data parallelism on GPUs (the CUDA communicator has all_gatherv), or TP/PP over these nodes",
        (
            "https://github.com/vllm-project/vllm/blob/main/vllm/distributed/device_communicators/"
            "base_device_communicator.py",
            "https://github.com/vllm-project/vllm/blob/main/vllm/distributed/device_communicators/cpu_communicator.py",
        ),
        lambda f: f.device == "cpu" and f.dp > 1 and f.moe is True,
    ),
    ClusterKnownBad(
        "kernel-7.0.0-1019-nvidia-roce",
        "refuse",
        "host kernel 7.0.0-1019-nvidia breaks NCCL over RoCE (ibv_reg_mr fails with ENOMEM); 6.17.0-1032-nvidia works",
        "boot 6.17.0-1032-nvidia (or a later kernel reported good) on every node",
        (
            "https://forums.developer.nvidia.com/t/383023",
            "https://github.com/eugr/spark-vllm-docker/issues/389",
        ),
        lambda f: "7.0.0-1019-nvidia" in f.kernels,
    ),
)


def judge(facts: ClusterFacts) -> tuple[list[str], list[str]]:
    """(refusals, warnings): the message of every entry the facts match."""
    matched = [k for k in KNOWN_BAD if k.matches(facts)]
    return (
        [k.message(facts) for k in matched if k.action == "refuse"],
        [k.message(facts) for k in matched if k.action == "warn"],
    )
