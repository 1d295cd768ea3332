"""`cluster.up --nodes A,B,C --tp/--pp`: the split judged before any engine is contacted (--dry: nothing is); a layout
the model cannot split is refused with the layouts that do; one that fits plans vLLM's own multi-node backend."""

from __future__ import annotations

import subprocess
import sys

from sparkforge.recipe.loader import REPO_ROOT

NODES = "ssh://u@spark1=10.0.12.1,ssh://u@spark2=10.0.12.2,ssh://u@spark3=10.0.13.3"


def _up(*extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "invoke", "cluster.up", "--recipe", "vllm-qwen35", "--profile"]
    argv += [
        "qwen35-122b-a10b-fp8-tp2",
        "--nodes",
        NODES,
        "--dry",
        "--no-preflight",
        "--allow-unpinned-model",
        *extra,
    ]
    return subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


def test_tp3_over_three_nodes_refused_before_anything() -> None:
    proc = _up("--tp", "3")
    assert proc.returncode == 1
    assert (
        "as TP=3 x PP=1 over 3 nodes cannot run: tensor-parallel-size 3 does not split the model"
        in proc.stderr
    )
    assert "fix: over 3 nodes use TP=1 x PP=3; nothing was started" in proc.stderr
    assert "docker run" not in proc.stdout  # no plan, no memory plan: refused first
    assert "memory plan" not in proc.stdout


def test_pp3_over_a_mesh_plans_vllms_multinode_backend() -> None:
    proc = _up("--tp", "1", "--pp", "3", "--layout", "mesh3")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "layout: TP=1 x PP=3 over 3 nodes cabled as mesh3" in out
    assert "stage 2: layers 32-47 on node2" in out
    assert out.count("--pipeline-parallel-size 3") == 3 and out.count("--headless") == 2
    for rank in range(3):
        assert f"--nnodes 3 --node-rank {rank} --master-addr 10.0.12.1" in out
    assert "node 2 (stage 2): budget" in out  # the memory plan per node for this layout


def test_profile_node_count_and_layout_names_checked() -> None:
    proc = _up()  # the profile's TP=2 over three nodes
    assert proc.returncode == 1 and "TP=2 x PP=1 = 2 GPUs, but 3 nodes were given" in proc.stderr
    proc = _up("--pp", "3", "--tp", "1", "--layout", "torus")
    assert (
        proc.returncode == 1
        and "--layout 'torus' is not a known layout (pair, mesh3, ring, switch, ring4)" in proc.stderr
    )
    proc = _up("--pp", "3", "--tp", "1", "--layout", "ring")
    assert proc.returncode == 1 and "--layout ring is cabled for 4-8 nodes, not 3" in proc.stderr
