"""`cluster.up` for real across three namespaced nodes on one switch: vLLM's own multi-node backend on the CPU
twin, pipeline parallel 3. Each node (a network namespace with its own dockerd, tests/engine/cluster.py) runs one
rank; the middle rank receives and sends intermediate tensors, which two nodes never exercise.

The four-layer trained model (L F L F) splits over three stages as 1/2/1, two of them lacking a layer kind, and
vLLM then fails after loading (seen for real, benchmarks/cluster-three.md): sparkforge refuses it before anything
starts. Padded with two layers that compute nothing (tests/engine/tiny_padded.py: L F L F L F), the doctor passes
(topology: switch), every rank loads its part (their logs say so), the head answers all 16 numbers of the
progression right through the three stages, and cluster.down leaves nothing. Then `invoke conform --nodes A,B,C`
over the same three ranks: conform's 120 known answers as chats and a 256-token decode exact to the last token,
through all three stages, and nothing left running."""

# ruff: noqa: F811 - fixtures are imported by name and requested as arguments
from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import PREFIX, TestCluster
from cluster_real_fixtures import twin_cluster
from conform_fixtures import conform
from real_fixtures import REAL_TIMINGS, TWIN_RECIPE, TWIN_REF, cpu_twin, trained_model  # noqa: F401
from test_cluster_real import LOADED
from test_serve_real import invoke
from tiny_padded import pad

from sparkforge.recipe.loader import REPO_ROOT

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow(
        cost_s=960,
        rank=40,
        reason="the twin streamed into three namespaced nodes (186 s), PP=3 serving (235 s), teardown (204 s), "
        "conform's known answers and long decode over the three (~300 s)",
    ),
]
PROFILE = "cpu-tiny-qwen35moe-pp3"
PROFILE_PATH = str(REPO_ROOT / "tests" / "profiles" / f"{PROFILE}.yaml")
ANSWER = "answer: 44 46 48 50 52 54 56 58 60 62 64 66 68 70 72 74\n"


@pytest.fixture(scope="module")
def trio(cpu_twin: str) -> Iterator[TestCluster]:
    with twin_cluster(cpu_twin, 3, f"{PREFIX}3{os.getpid()}") as cluster:
        yield cluster


def _up(trio: TestCluster, model: Path, tmp_path: Path) -> tuple[int, str, float]:
    return invoke(
        "cluster.up", "--recipe", TWIN_RECIPE, "--image", TWIN_REF, "--profile", PROFILE_PATH, "--nodes",
        ",".join(n.url for n in trio.nodes), "--gpus", "none", "--model-dir", str(model), "--cache-dir",
        str(tmp_path / "cache"), "--port", "18473", "--master-port", "29513", "--ulimit", "nofile=16384",
        "--health-timeout", "1200", "--interface", "fabric0",
    )  # fmt: skip


def test_a_stage_without_full_attention_is_refused_before_anything_starts(
    trio: TestCluster, trained_model: Path, tmp_path: Path
) -> None:
    code, out, _ = _up(trio, trained_model, tmp_path)
    assert code == 1, out[-3000:]
    refusal = "stage 0 (layers 0-0), stage 2 (layers 3-3) lack(s) full-attention or gated-delta-net"
    assert refusal in out, out[-3000:]
    assert "docker run" not in out and "started sparkforge-serve" not in out
    assert {n.name: n.containers() for n in trio.nodes} == {n.name: [] for n in trio.nodes}


def test_cluster_up_serves_pipeline_parallel_three_with_every_rank_holding_part_of_the_model(
    trio: TestCluster, trained_model: Path, tmp_path: Path
) -> None:
    nodes = ",".join(n.url for n in trio.nodes)
    code, out, seconds = _up(trio, pad(trained_model, tmp_path / "padded"), tmp_path)
    REAL_TIMINGS["cluster_up_pp3_s"] = round(seconds, 1)
    try:
        logs = {}
        for rank, node in enumerate(trio.nodes):
            got = node.docker("logs", f"sparkforge-serve-{PROFILE}-{rank}", check=False)
            logs[node.name] = got.stdout + got.stderr
            print(f"---- rank {rank} (node {node.name}) ----\n", logs[node.name][-4000:])
        assert code == 0, out[-4000:]
        head = trio.nodes[0].fabric_ip
        for rank in (1, 2):
            assert f"--nnodes 3 --node-rank {rank} --master-addr {head} --master-port 29513 --headless" in out
        assert "topology" in out and "switch" in out, out[-4000:]
        assert f"healthy: http://{head}:18473/v1" in out
        assert ANSWER in out, out[-3000:]
        for name, log in logs.items():
            assert LOADED.search(log), f"the rank on node {name} did not log loading its weights"
            assert "world_size=3" in log, f"the rank on node {name} was not one of three"
    finally:
        down, text, _ = invoke("cluster.down", "--nodes", nodes)
    assert down == 0 and "removed 1 container(s)" in text
    assert {n.name: n.containers() for n in trio.nodes} == {n.name: [] for n in trio.nodes}
    print(f"real cluster timings: {REAL_TIMINGS}")


def test_conform_known_answers_and_the_long_decode_hold_on_pipeline_parallel_three(
    trio: TestCluster, trained_model: Path, tmp_path: Path
) -> None:
    report = tmp_path / "pp3.json"
    code, out, seconds = conform(
        PROFILE_PATH, "--image", TWIN_REF, "--nodes", ",".join(n.url for n in trio.nodes), "--interface", "fabric0",
        "--gpus", "none", "--model-dir", str(pad(trained_model, tmp_path / "padded")), "--cache-dir",
        str(tmp_path / "cache"), "--port", "18473", "--master-port", "29513", "--ulimit", "nofile=16384",
        "--health-timeout", "1200", "--json", str(report),
    )  # fmt: skip
    REAL_TIMINGS["conform_pp3_s"] = round(seconds, 1)
    doc = json.loads(report.read_text()) if report.is_file() else {}
    rows = {c["name"]: c for c in doc.get("checks", [])}
    print(
        json.dumps({n: (r["status"], round(r["duration_s"], 1), r["reason"][:300]) for n, r in rows.items()})
    )
    assert code == 0, out[-5000:]
    assert [s["config"] for s in doc["servers"]] == ["as profiled, 3 nodes"]
    answers = rows["known-answers"]
    assert answers["status"] == "passed" and "120/120 right" in answers["reason"], answers["reason"]
    long = rows["long-decode"]["details"]
    assert rows["long-decode"]["status"] == "passed" and long["right"] == long["answer_tokens"] == 256, long
    assert {n.name: n.containers() for n in trio.nodes} == {n.name: [] for n in trio.nodes}
