"""Parallel layouts against the shipped Qwen3.5 checkpoint configs (profiles/checkpoints): which TP x PP over N Sparks
vLLM can load, refused before launch with the reason and the layouts that do split; a TP across a switchless ring."""

from __future__ import annotations

import pytest

from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.recipe.profile import load_profile
from sparkforge.run.cluster.parallel import Parallel, check_parallel, parallel_of, relayout
from sparkforge.run.memory.checkpoint import load_architecture
from sparkforge.run.memory.guard import plan_profile
from sparkforge.run.memory.weightbytes import pp_ranges

CHECKPOINTS = REPO_ROOT / "profiles" / "checkpoints"
A3B = load_architecture(CHECKPOINTS / "Qwen" / "Qwen3.5-35B-A3B-FP8" / "unpinned.json")
A3B_FP4 = load_architecture(CHECKPOINTS / "nvidia" / "Qwen3.5-35B-A3B-NVFP4" / "unpinned.json")
A10B = load_architecture(CHECKPOINTS / "Qwen" / "Qwen3.5-122B-A10B-FP8" / "unpinned.json")


@pytest.mark.parametrize(
    ("arch", "tp", "pp", "fits"),
    [
        (A3B, 2, 1, True),
        (A3B, 4, 1, True),
        (A3B, 3, 1, False),  # 16 attention heads
        (A3B, 1, 3, True),
        (A3B, 8, 1, False),  # 512 / 8 = 64: not whole FP8 blocks of 128
        (A3B_FP4, 8, 1, True),  # NVFP4 has no 128-wide blocks
        (A10B, 2, 1, True),
        (A10B, 8, 1, True),  # 1024 / 8 = 128
        (A10B, 3, 1, False),
        (A10B, 2, 2, True),
    ],
)
def test_layouts_against_the_shipped_configs(arch, tp: int, pp: int, fits: bool) -> None:
    found = check_parallel(arch, Parallel(tp, pp), tp * pp)
    assert found.fits is fits, found.problems


def test_tp3_refused_with_the_reason_and_the_layouts_that_split() -> None:
    found = check_parallel(A3B, Parallel(3, 1), 3, "mesh3")
    (problem,) = found.problems
    assert problem.startswith(
        "tensor-parallel-size 3 does not split the model: it does not divide the 16 attention"
    )
    assert problem.endswith("fix: over 3 nodes use TP=1 x PP=3")


def test_fp8_block_split_names_vllms_error_and_expert_parallel_lifts_it() -> None:
    (problem,) = check_parallel(A3B, Parallel(8, 1), 8).problems
    assert "512 into 64, not whole FP8 blocks of 128" in problem and "enable-expert-parallel" in problem
    assert problem.endswith("fix: over 8 nodes use TP=1 x PP=8 or TP=2 x PP=4 or TP=4 x PP=2")
    assert check_parallel(A3B, Parallel(8, 1, expert_parallel=True), 8).fits  # 256 experts / 8


def test_pipeline_split_follows_vllms_get_pp_indices() -> None:
    """vLLM's own split (its log says "Hidden layers were unevenly partitioned: [2,2,1]" for 5 layers over 3)."""
    assert pp_ranges(40, 3) == [(0, 13), (13, 27), (27, 40)]
    assert pp_ranges(5, 3) == [(0, 2), (2, 4), (4, 5)]
    assert pp_ranges(4, 3) == [(0, 1), (1, 3), (3, 4)]
    assert pp_ranges(6, 4) == [(0, 1), (1, 3), (3, 5), (5, 6)]  # remainder <= pp - 2: the middle stages
    assert pp_ranges(7, 4) == [(0, 2), (2, 4), (4, 6), (6, 7)]
    assert pp_ranges(6, 3, (1, 2, 3)) == [(0, 1), (1, 3), (3, 6)]
    assert check_parallel(A10B, Parallel(1, 3), 3).stages == [(0, 16), (16, 32), (32, 48)]
    assert (
        check_parallel(A3B, Parallel(1, 41), 41).problems[-1].startswith("pipeline-parallel-size 41 exceeds")
    )


def test_node_count_and_dp_and_ring() -> None:
    assert check_parallel(A3B, Parallel(2, 1), 3).problems[0].startswith("TP=2 x PP=1 = 2 GPUs, but 3 nodes")
    assert check_parallel(A3B, Parallel(2, 1, 2), 4).fits  # 512 / (TP x DP = 4) = 128: one FP8 block each
    ring = check_parallel(A10B, Parallel(4, 1), 4, "ring")
    assert ring.problems[0].startswith(
        "tensor-parallel-size 4 spans 4 nodes of a switchless ring: stock NCCL"
    )
    assert check_parallel(A10B, Parallel(4, 1), 4, "ring", ring_only_nccl=True).fits
    assert check_parallel(A10B, Parallel(4, 1), 4, "switch").fits
    assert check_parallel(A10B, Parallel(2, 2), 4, "ring").fits  # TP on neighbours, PP along the ring


def test_relayout_gives_the_memory_plan_per_node() -> None:
    profile = load_profile("qwen35-122b-a10b-fp8-tp2")
    assert parallel_of(profile) == Parallel(2, 1)
    three = relayout(profile, Parallel(1, 3))
    assert three.model.nodes == 3 and parallel_of(three) == Parallel(1, 3)
    assert "--pipeline-parallel-size" in three.serve_args() and "--tensor-parallel-size" in three.serve_args()
    plan = plan_profile(three, None)
    assert [n.stage for n in plan.nodes] == [0, 1, 2]
    two = plan_profile(profile, None)
    assert (
        max(n.parts["weights"] for n in plan.nodes) < two.nodes[0].parts["weights"]
    )  # a third of the layers each
    four = relayout(profile, Parallel(2, 1, 2))
    assert four.model.nodes == 4 and parallel_of(four) == Parallel(2, 1, 2)
    assert plan_profile(four, None).nodes[0].parts["weights"] == two.nodes[0].parts["weights"]  # per replica
    with pytest.raises(ValueError, match="x data-parallel-size 2 = 4 GPUs, but nodes 3 x gpus_per_node 1"):
        four.model.model_validate({**four.model.model_dump(), "nodes": 3})  # the profile's own rule counts DP


TINY = load_architecture(REPO_ROOT / "tests" / "fixtures" / "tiny-qwen35moe" / "config.json")


def test_a_stage_lacking_a_layer_kind_is_refused_with_the_splits_that_work() -> None:
    """The tiny hybrid model (layers L F L F) over three stages (1,2,1): stage 0 holds a gated-delta-net layer
    only, stage 2 a full-attention one, and vLLM fails after loading (seen for real: benchmarks/cluster-three.md)."""
    (problem,) = check_parallel(TINY, Parallel(1, 3), 3).problems
    assert "stage 0 (layers 0-0), stage 2 (layers 3-3) lack(s)" in problem
    assert "Workers disagree on supported KV cache layouts" in problem and "no mamba layers" in problem
    assert "(1, 2 for its layers LFLF)" in problem
    assert check_parallel(TINY, Parallel(1, 2), 2).fits


def test_the_profiles_layer_partition_moves_the_boundaries_and_is_checked() -> None:
    assert check_parallel(A10B, Parallel(1, 3, partition=(12, 20, 16)), 3).stages == [
        (0, 12),
        (12, 32),
        (32, 48),
    ]
    (problem,) = check_parallel(A10B, Parallel(1, 3, partition=(12, 20)), 3).problems
    assert problem.startswith("VLLM_PP_LAYER_PARTITION 12,20 gives 2 stages of 32 layers")
    (bare,) = check_parallel(A10B, Parallel(1, 3, partition=(3, 29, 16)), 3).problems
    assert "stage 0 (layers 0-2) lack(s)" in bare


@pytest.mark.parametrize("arch", [A3B, A10B])
@pytest.mark.parametrize("pp", range(1, 9))
def test_every_stage_of_the_shipped_models_up_to_eight_sparks_holds_full_attention(arch, pp: int) -> None:
    assert check_parallel(arch, Parallel(1, pp), pp).fits
