"""Data parallel over nodes: the layout judged against the model (DP joins TP in the experts' split), the refusals
named before anything starts, and each node's argv on vLLM 0.32's own DP handshake (run/multinode.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sparkforge.errors import RunError
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.recipe.profile import load_profile
from sparkforge.run.cluster.clusterplan import every_replica
from sparkforge.run.cluster.parallel import (
    DP_PLANNED,
    LayoutPlan,
    Parallel,
    check_layout,
    check_parallel,
    dp_problems,
    relayout,
)
from sparkforge.run.cluster.pitfalls import ClusterFacts, judge
from sparkforge.run.launch import LaunchOptions, plan_launch
from sparkforge.run.memory.checkpoint import load_architecture
from sparkforge.run.multinode import Rendezvous

CHECKPOINTS = REPO_ROOT / "profiles" / "checkpoints"
A3B = load_architecture(CHECKPOINTS / "Qwen" / "Qwen3.5-35B-A3B-FP8" / "unpinned.json")
A10B = load_architecture(CHECKPOINTS / "Qwen" / "Qwen3.5-122B-A10B-FP8" / "unpinned.json")
TINY = load_architecture(REPO_ROOT / "tests" / "fixtures" / "tiny-qwen35moe" / "config.json")
HEAD = "10.0.12.1"


def _serve(argv: list[str]) -> list[str]:
    """The argv after the image's `serve MODEL` and the profile's own args: what the plan adds per node."""
    return argv[argv.index("--tensor-parallel-size") + 2 :]


def test_dp2_head_runs_the_api_and_rank_0_the_other_node_rank_1_headless() -> None:
    meet = Rendezvous(2, HEAD, 29501, dp=2)
    common = [
        "--data-parallel-size-local",
        "1",
        "--data-parallel-address",
        HEAD,
        "--data-parallel-rpc-port",
        "29502",
    ]
    assert meet.flags(0) == common
    assert meet.flags(1) == [*common, "--data-parallel-start-rank", "1"]
    assert meet.width == 1 and [meet.replica(r) for r in range(2)] == [0, 1]


def test_dp3_each_node_its_own_start_rank() -> None:
    meet = Rendezvous(3, HEAD, 29513, dp=3)
    starts = [f[f.index("--data-parallel-start-rank") + 1] for f in map(meet.flags, (1, 2))]
    assert starts == ["1", "2"] and "--data-parallel-start-rank" not in meet.flags(0)
    assert all(
        "--nnodes" not in meet.flags(r) for r in range(3)
    )  # one node per replica: no torch.distributed
    assert all(
        meet.flags(r)[meet.flags(r).index("--data-parallel-rpc-port") + 1] == "29514" for r in range(3)
    )


def test_pp2_x_dp2_over_four_nodes_spans_both_rendezvous() -> None:
    """A replica of two pipeline stages: vLLM places a node in its replica by --node-rank (node_rank_within_dp =
    node_rank % 2) and the start rank names the replica: nodes 0, 1 are DP rank 0, nodes 2, 3 DP rank 1."""
    meet = Rendezvous(4, HEAD, 29501, dp=2)
    for rank in range(4):
        flags = meet.flags(rank)
        assert flags[:8] == [
            "--nnodes", "4", "--node-rank", str(rank), "--master-addr", HEAD, "--master-port", "29501",
        ]  # fmt: skip
        start = flags[flags.index("--data-parallel-start-rank") + 1] if rank else "0"
        assert start == str(rank // 2)
    assert "--data-parallel-start-rank" not in meet.flags(0)  # on the head it would switch vLLM to hybrid LB


def test_one_replica_over_nodes_keeps_todays_flags() -> None:
    meet = Rendezvous(3, HEAD, 29501)
    assert meet.flags(2) == [
        "--nnodes",
        "3",
        "--node-rank",
        "2",
        "--master-addr",
        HEAD,
        "--master-port",
        "29501",
    ]
    assert not any("data-parallel" in line for line in meet.listens())


def test_rendezvous_refusals() -> None:
    with pytest.raises(RunError, match="data-parallel-size 2 does not divide the 3 nodes"):
        Rendezvous(3, HEAD, 29501, dp=2)
    with pytest.raises(RunError, match="takes the next port, 65536, past 65535; fix: a lower --master-port"):
        Rendezvous(2, HEAD, 65535, dp=2)


def test_the_launch_plan_renders_each_nodes_argv_from_the_split_profile() -> None:
    profile = relayout(load_profile("qwen35-35b-a3b-fp8"), Parallel(1, 1, 3))
    assert profile.model.nodes == 3
    addresses = [HEAD, "10.0.12.2", "10.0.13.3"]
    plan = plan_launch(profile, addresses, [{}] * 3, LaunchOptions(image="img:1", master_port=29511))
    tails = [_serve(list(n.container.args)) for n in plan.nodes]
    common = ["--data-parallel-size", "3", "--data-parallel-size-local", "1"]
    common += ["--data-parallel-address", HEAD, "--data-parallel-rpc-port", "29512"]
    assert tails[0] == [*common, "--host", "0.0.0.0", "--port", "8000"]
    for rank in (1, 2):
        assert tails[rank] == [*common, "--data-parallel-start-rank", str(rank), "--headless"]
    assert any(line.startswith(f"vLLM data parallel: handshake {HEAD}:29512") for line in plan.listens)


def test_tp2_x_dp2_plan_and_its_lines() -> None:
    profile = relayout(load_profile("qwen35-122b-a10b-fp8-tp2"), Parallel(2, 1, 2))
    plan = plan_launch(profile, [f"10.0.12.{i}" for i in range(1, 5)], [{}] * 4, LaunchOptions(image="i:1"))
    worker = list(plan.nodes[3].container.args)
    assert worker[worker.index("--node-rank") + 1] == "3" and worker[-3:] == [
        "--data-parallel-start-rank",
        "1",
        "--headless",
    ]
    found = check_layout(profile, A10B, 4, "switch")
    assert found.lines()[:3] == [
        "layout: TP=2 x PP=1 x DP=2 over 4 nodes cabled as switch",
        "  DP rank 0 (the API, its engine): node0, node1",
        "  DP rank 1 (headless engine): node2, node3",
    ]


def test_pp_stages_are_listed_per_replica() -> None:
    lines = LayoutPlan(Parallel(1, 2, 2), 4, None, ((0, 24), (24, 48)), ()).lines()
    assert "    stage 1: layers 24-47 on node3" in lines and "    stage 0: layers 0-23 on node2" in lines


@pytest.mark.parametrize(
    ("arch", "par", "fits"),
    [
        (A3B, Parallel(1, 1, 2), True),  # 512 / 2 = 256: two FP8 blocks of 128 per rank
        (A3B, Parallel(1, 1, 4), True),  # 128
        (A3B, Parallel(2, 1, 4), False),  # TP x DP = 8: 64, not a whole block
        (A3B, Parallel(2, 1, 4, expert_parallel=True), True),  # 256 experts over 8 ranks, each whole
        (A3B, Parallel(1, 1, 3), False),  # 170.67 rows
        (A3B, Parallel(1, 1, 3, expert_parallel=True), False),  # 256 experts over 3
        (A10B, Parallel(2, 1, 4), True),  # 1024 / 8 = 128
        (A10B, Parallel(1, 2, 2), True),
        (TINY, Parallel(1, 1, 2), True),  # the engine test's layout: 64 / 2 = 32 rows
        (TINY, Parallel(1, 1, 3), False),
    ],
)
def test_dp_joins_tp_in_the_experts_split(arch, par: Parallel, fits: bool) -> None:
    found = check_parallel(arch, par, par.world)
    assert found.fits is fits, found.problems


def test_the_experts_refusal_names_tp_x_dp_and_the_fix() -> None:
    (problem,) = check_parallel(A3B, Parallel(1, 1, 3), 3).problems
    assert problem.startswith(
        "TP=1 x PP=1 x DP=3 does not split the model: it splits each expert's intermediate"
    )
    assert "size 512 over TP x DP = 3 ranks into 170.667" in problem
    assert problem.endswith("fix: enable-expert-parallel, or another TP x DP")
    (problem,) = check_parallel(TINY, Parallel(1, 1, 3, expert_parallel=True), 3).problems
    assert problem.startswith("enable-expert-parallel: the 4 experts do not divide over TP x DP = 3 ranks")


def test_ray_and_profile_set_dp_flags_are_refused_with_the_reason() -> None:
    par = Parallel(1, 1, 2)
    assert dp_problems(Parallel(2, 1), {"data-parallel-rpc-port": 1}, "ray") == []  # DP=1: nothing to plan
    (ray,) = dp_problems(par, {}, "ray")
    assert ray.startswith("data-parallel-size 2 with --backend ray:") and ray.endswith("fix: --backend mp")
    (given,) = dp_problems(par, {flag: 1 for flag in DP_PLANNED[:2]}, "mp")
    assert given.startswith("the profile sets --data-parallel-size-local, --data-parallel-start-rank, which")
    profile = relayout(load_profile("qwen35-35b-a3b-fp8"), par)
    with pytest.raises(RunError, match=r"with --backend ray: .* nothing was started"):
        check_layout(profile, A3B, 2, backend="ray")


def test_the_memory_plan_covers_every_replicas_nodes() -> None:
    one = {"verdict": "fits", "nodes": [{"node": 0, "budget_gib": 90.0}, {"node": 1, "budget_gib": 91.0}]}
    assert every_replica(one, 1) is one
    got = every_replica(one, 2)
    assert [(n["node"], n["budget_gib"]) for n in got["nodes"]] == [
        (0, 90.0),
        (1, 91.0),
        (2, 90.0),
        (3, 91.0),
    ]
    assert got["verdict"] == "fits" and len(one["nodes"]) == 2


def _up(*extra: str) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable,
        "-m",
        "invoke",
        "cluster.up",
        "--recipe",
        "vllm-qwen35",
        "--dry",
        "--no-preflight",
    ]
    argv += ["--allow-unpinned-model", *extra]
    return subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


NODES2 = "ssh://u@spark1=10.0.12.1,ssh://u@spark2=10.0.12.2"


def test_cluster_up_dry_dp2_prints_the_layout_and_each_nodes_rendezvous() -> None:
    proc = _up("--profile", "qwen35-35b-a3b-fp8", "--nodes", NODES2, "--dp", "2")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "layout: TP=1 x PP=1 x DP=2 over 2 nodes\n  DP rank 0 (the API, its engine): node0\n" in out
    assert (
        "--data-parallel-address 10.0.12.1 --data-parallel-rpc-port 29502 --data-parallel-start-rank 1 --headless"
        in out
    )
    assert "--data-parallel-rpc-port 29502 --host 0.0.0.0 --port 8000" in out
    assert "verdict: fits" in out  # the memory plan of one replica: the whole model on one Spark


def test_cluster_up_dry_refuses_what_does_not_fit_a_replica_or_split() -> None:
    proc = _up("--profile", "qwen35-122b-a10b-fp8-tp2", "--nodes", NODES2, "--tp", "1", "--dp", "2")
    assert (
        proc.returncode == 1 and "does not fit: node 0: weights 119.0 GiB" in proc.stderr
    )  # a replica per Spark
    nodes3 = NODES2 + ",ssh://u@spark3=10.0.13.3"
    proc = _up("--profile", "qwen35-35b-a3b-fp8", "--nodes", nodes3, "--dp", "3")
    assert proc.returncode == 1 and "TP=1 x PP=1 x DP=3 does not split the model" in proc.stderr
    assert "docker run" not in proc.stdout


def test_a_moe_with_dp_on_vllms_cpu_build_is_refused_before_launch_and_on_gpus_planned() -> None:
    # Measured on the CPU twin: vLLM 0.32's CPU communicator has no all_gatherv, which a MoE under DP needs.
    profile = relayout(
        load_profile(REPO_ROOT / "tests" / "profiles" / "cpu-tiny-qwen35moe-dp2.yaml"), Parallel(1, 1, 2)
    )
    with pytest.raises(RunError, match=r"vllm-cpu-moe-data-parallel: vLLM's CPU build .* all_gatherv"):
        check_layout(profile, TINY, 2, device="cpu")
    assert check_layout(profile, TINY, 2, device="cuda").parallel.dp == 2
    # A dense model's replicas are independent in vLLM (no all-gather): not refused on a CPU build.
    assert judge(ClusterFacts(2, dp=2, moe=False, device="cpu")) == ([], [])
    assert judge(ClusterFacts(2, dp=1, moe=True, device="cpu")) == ([], [])
    assert len(judge(ClusterFacts(2, dp=2, moe=True, device="cpu"))[0]) == 1
