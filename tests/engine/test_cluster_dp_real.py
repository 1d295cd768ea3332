"""`cluster.up` for real with data parallel 2 over the two namespaced nodes: vLLM's own DP handshake on the CPU twin.

Node a runs the API and DP rank 0, node b DP rank 1 headless with `--data-parallel-start-rank 1`, both meeting at
the head's link address (`--data-parallel-address 10.77.0.1 --data-parallel-rpc-port <master port + 1>`). Each
node holds the whole tiny trained Qwen3.5-MoE (a MoE: vLLM keeps the two ranks in step and shards each expert over
them, gathered over Gloo). The doctor passes, both ranks load the model (their logs say so), node b's rank says it
joined the head's handshake, and each DP rank answers right: requests pinned to a rank by vLLM's own
`X-data-parallel-rank` header, every continuation checked number by number, and the head's /metrics counting each
rank's finished requests (its `engine` label). Then `invoke conform --nodes A,B`: conform's 120 known answers and
a 256-token decode exact through the head's API, which spreads them over both ranks. cluster.down leaves nothing.
"""

# ruff: noqa: F811 - fixtures are imported by name and requested as arguments
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conform_fixtures import conform
from real_fixtures import REAL_TIMINGS, TWIN_RECIPE, TWIN_REF, cpu_twin, trained_model  # noqa: F401
from test_cluster_real import LOADED
from test_serve_real import invoke

from sparkforge.recipe.loader import REPO_ROOT

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow(
        cost_s=700,
        rank=42,
        reason="DP=2 serving over the two twin nodes (as PP=2: ~200 s), each rank asked, teardown; conform's "
        "known answers and long decode through the head (~300 s)",
    ),
]
PROFILE = "cpu-tiny-qwen35moe-dp2"
PROFILE_PATH = str(REPO_ROOT / "tests" / "profiles" / f"{PROFILE}.yaml")
PORT, MASTER_PORT = "18477", "29517"  # the DP handshake then listens on 29518
ANSWER = "answer: 44 46 48 50 52 54 56 58 60 62 64 66 68 70 72 74\n"
PROMPTS = ("40 42", "0 1", "93 96", "17 18")  # the trained progression, modulo 100
REQUESTS_PER_RANK = len(PROMPTS)

# Runs in the head container: each prompt sent to each DP rank (vLLM routes a request carrying X-data-parallel-rank
# to that rank, entrypoints/generate/base/serving.py), one JSON line per answer, then the head's metrics.
_PER_RANK = """
import json, sys, urllib.request
port, model, ranks, prompts = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
base = f"http://127.0.0.1:{port}"
for rank in range(ranks):
    for prompt in prompts:
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 16}
        req = urllib.request.Request(f"{base}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json", "X-data-parallel-rank": str(rank)})
        reply = json.loads(urllib.request.urlopen(req, timeout=600).read())
        print(json.dumps({"rank": rank, "prompt": prompt, "answer": reply["choices"][0]["message"]["content"]}))
for line in urllib.request.urlopen(f"{base}/metrics", timeout=60).read().decode().splitlines():
    if line.startswith("vllm:request_success_total"):
        print(line)
"""
_SUCCESS = re.compile(r"^vllm:request_success_total\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.e+]+)$")


def progression(prompt: str, count: int = 16) -> str:
    """What the trained model continues `prompt` with: the next `count` terms, modulo 100."""
    a, b = (int(n) for n in prompt.split()[-2:])
    return " ".join(str((b + (b - a) * i) % 100) for i in range(1, count + 1))


def per_engine(lines: list[str]) -> dict[str, float]:
    """The head's finished requests per DP rank (the `engine` label), summed over finish reasons."""
    counts: dict[str, float] = {}
    for line in lines:
        found = _SUCCESS.match(line)
        if not found:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', found["labels"]))
        counts[labels["engine"]] = counts.get(labels["engine"], 0) + float(found["value"])
    return counts


def _nodes(cluster) -> str:
    return ",".join(n.url for n in cluster.nodes)


def _launch(model: Path, tmp_path: Path) -> tuple[str, ...]:
    return (
        "--image", TWIN_REF, "--gpus", "none", "--model-dir", str(model), "--cache-dir", str(tmp_path / "cache"),
        "--port", PORT, "--master-port", MASTER_PORT, "--ulimit", "nofile=16384", "--health-timeout", "1200",
        "--interface", "fabric0",
    )  # fmt: skip


def test_the_progression_helper_is_the_trained_answer() -> None:
    assert f"answer: {progression('40 42')}\n" == ANSWER
    assert progression("93 96", 3) == "99 2 5"


def test_cluster_up_serves_data_parallel_two_with_each_rank_answering(
    twin_nodes, trained_model: Path, tmp_path: Path
) -> None:
    a = twin_nodes.nodes[0]
    code, out, seconds = invoke(
        "cluster.up", "--recipe", TWIN_RECIPE, "--profile", PROFILE_PATH, "--nodes", _nodes(twin_nodes),
        *_launch(trained_model, tmp_path),
    )  # fmt: skip
    REAL_TIMINGS["cluster_up_dp2_s"] = round(seconds, 1)
    try:
        logs = {}
        for rank, node in enumerate(twin_nodes.nodes):
            got = node.docker("logs", f"sparkforge-serve-{PROFILE}-{rank}", check=False)
            logs[node.name] = got.stdout + got.stderr
            print(f"---- DP rank {rank} (node {node.name}) ----\n", logs[node.name][-5000:])
        assert code == 0, out[-4000:]
        assert "layout: TP=1 x PP=1 x DP=2 over 2 nodes" in out
        rpc = str(int(MASTER_PORT) + 1)
        head_flags = f"--data-parallel-size-local 1 --data-parallel-address {a.fabric_ip} --data-parallel-rpc-port {rpc}"
        assert f"{head_flags} --host 0.0.0.0 --port {PORT}" in out
        assert f"{head_flags} --data-parallel-start-rank 1 --headless" in out
        serving = [line for line in out.splitlines() if "--data-parallel-size 2" in line]
        assert len(serving) == 2 and not any("--nnodes" in line for line in serving)  # one node per replica
        assert f"healthy: http://{a.fabric_ip}:{PORT}/v1" in out
        assert ANSWER in out, out[-3000:]
        for name, log in logs.items():
            assert LOADED.search(log), f"the DP rank on node {name} did not log loading the model"
        # vllm/entrypoints/cli/serve.py run_headless: the headless node joins the head's DP handshake
        assert (
            f"data parallel engine(s) in headless mode, with head node address tcp://{a.fabric_ip}:{rpc}"
            in logs["b"]
        ), logs["b"][-3000:]

        asked = a.docker(
            "exec", f"sparkforge-serve-{PROFILE}-0", "python3", "-c", _PER_RANK, PORT, "tiny-qwen35moe", "2",
            *PROMPTS, check=False, timeout=900,
        )  # fmt: skip
        print(asked.stdout[-4000:], asked.stderr[-2000:])
        assert asked.returncode == 0, asked.stderr[-3000:]
        lines = asked.stdout.splitlines()
        answers = [json.loads(line) for line in lines if line.startswith("{")]
        assert [(x["rank"], x["prompt"]) for x in answers] == [(r, p) for r in (0, 1) for p in PROMPTS]
        wrong = [x for x in answers if x["answer"].strip() != progression(x["prompt"])]
        assert not wrong, wrong  # every rank right on every prompt, number by number
        served = per_engine(lines)
        # each rank finished at least the requests pinned to it (the check's own request went to one of them)
        assert set(served) == {"0", "1"}, served
        assert all(count >= REQUESTS_PER_RANK for count in served.values()), served
    finally:
        down, text, _ = invoke("cluster.down", "--nodes", _nodes(twin_nodes))
    assert down == 0 and "removed 1 container(s)" in text
    assert {n.name: n.containers() for n in twin_nodes.nodes} == {"a": [], "b": []}
    print(f"real cluster timings: {REAL_TIMINGS}")


def test_conform_known_answers_and_the_long_decode_hold_on_data_parallel_two(
    twin_nodes, trained_model: Path, tmp_path: Path
) -> None:
    report = tmp_path / "dp2.json"
    code, out, seconds = conform(
        PROFILE_PATH, "--nodes", _nodes(twin_nodes), *_launch(trained_model, tmp_path), "--json", str(report)
    )
    REAL_TIMINGS["conform_dp2_s"] = round(seconds, 1)
    doc = json.loads(report.read_text()) if report.is_file() else {}
    rows = {c["name"]: c for c in doc.get("checks", [])}
    print(
        json.dumps({n: (r["status"], round(r["duration_s"], 1), r["reason"][:300]) for n, r in rows.items()})
    )
    assert code == 0, out[-5000:]
    assert "--data-parallel-start-rank 1 --headless" in out, out[-5000:]
    assert [s["config"] for s in doc["servers"]] == ["as profiled, 2 nodes"]
    answers = rows["known-answers"]
    assert answers["status"] == "passed" and "120/120 right" in answers["reason"], answers["reason"]
    long = rows["long-decode"]["details"]
    assert rows["long-decode"]["status"] == "passed" and long["right"] == long["answer_tokens"] == 256, long
    assert {n.name: n.containers() for n in twin_nodes.nodes} == {"a": [], "b": []}
