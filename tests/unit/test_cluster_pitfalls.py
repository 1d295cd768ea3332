"""Known-bad multi-node combinations, named before launch with their source and fix."""

from __future__ import annotations

from sparkforge.run.cluster.pitfalls import KNOWN_BAD, ClusterFacts, judge, version


def _ids(messages: list[str]) -> list[str]:
    return [m.split(":", 1)[0] for m in messages]


def test_nccl_2_30_4_refused_for_tp_across_nodes_only() -> None:
    refused, _ = judge(ClusterFacts(nodes=2, tp=2, nccl="2.30.4"))
    assert _ids(refused) == ["nccl-2.30.4-tp-hang-on-sparks"]
    assert (
        "https://github.com/NVIDIA/nccl/issues/2167" in refused[0]
        and "fix: pin an NCCL >= 2.30.6" in refused[0]
    )
    assert judge(ClusterFacts(nodes=2, tp=1, pp=2, nccl="2.30.4")) == ([], [])
    assert judge(ClusterFacts(nodes=1, tp=1, nccl="2.30.4")) == ([], [])


def test_graph_deadlock_unless_eager_and_old_nccl_warned() -> None:
    refused, warned = judge(ClusterFacts(nodes=3, pp=3, nccl="NCCL 2.28.9+cuda13.0"))
    assert _ids(refused) == ["nccl-cuda-graph-deadlock-across-nodes"]
    assert _ids(warned) == ["nccl-before-2.29.3-on-aarch64"]
    refused, _ = judge(ClusterFacts(nodes=3, pp=3, nccl="2.28.9", cuda_graphs=False))
    assert refused == []
    assert judge(ClusterFacts(nodes=4, tp=4, nccl="2.30.7")) == ([], [])
    assert judge(ClusterFacts(nodes=4, tp=4, nccl=None)) == ([], [])  # unknown: nothing matches


def test_ray_and_kernel() -> None:
    _, warned = judge(ClusterFacts(nodes=2, tp=2, backend="ray"))
    assert _ids(warned) == ["ray-pack-placement-on-one-gpu-nodes"]
    refused, _ = judge(ClusterFacts(nodes=2, kernels=("6.17.0-1032-nvidia", "7.0.0-1019-nvidia")))
    assert _ids(refused) == ["kernel-7.0.0-1019-nvidia-roce"] and "ibv_reg_mr" in refused[0]


def test_every_entry_names_a_source_and_a_fix() -> None:
    assert all(k.sources and all(s.startswith("https://") for s in k.sources) and k.fix for k in KNOWN_BAD)
    assert version("2.30.6") == (2, 30, 6) and version("none") is None
