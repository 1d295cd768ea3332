"""The fabric choice, the doctor's node stages and the download phase on the namespaced two-node cluster
(tests/engine/cluster.py: each node its own dockerd, a fabric veth and a LAN holding the default route).

The nodes have no RDMA devices, so what runs for real here is the reading (each node's sysfs inside a probe
container of the real vLLM image), the choice of the fabric over the LAN with its warning, the per-node path
checks, the don't-fragment probes both ways, the host facts, the NCCL library torch really loads, and the
weights phase with Hugging Face's own snapshot_download (offline, from a prepared cache). Stages needing RDMA
say "no RDMA devices on node X".
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from cluster_fixtures import VLLM_REF

from sparkforge.commands import Runner
from sparkforge.console import say
from sparkforge.context import Session
from sparkforge.errors import RunError
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.recipe.profile import load_profile
from sparkforge.run.launch import LaunchOptions
from sparkforge.run.nodes import NodeEngine, parse_nodes
from sparkforge.run.weights.weights import fetch_weights

# CI budget (tests/engine/ci_budget.py): cost on a fresh CI machine once the core suite built the twin; benchmarks/ci.md.
pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow(
        cost_s=350,
        rank=7,
        reason="7 runs (78 s), with the two-node set-up (260 s) when test_cluster did not run",
    ),
]


def _nodes(cluster) -> str:
    return ",".join(n.url for n in cluster.nodes)


def _invoke(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    return proc, time.monotonic() - start


def _leftovers(cluster) -> dict[str, list[str]]:
    return {n.name: n.containers() for n in cluster.nodes if n.dockerd is not None}


def test_fabric_reads_each_node_and_warns_about_the_lan(two_nodes, tmp_path: Path) -> None:
    report_path = tmp_path / "fabric.json"
    proc, seconds = _invoke(
        "cluster.fabric",
        "--image",
        VLLM_REF,
        "--nodes",
        _nodes(two_nodes),
        "--json",
        str(report_path),
        "--test",
    )
    out = proc.stdout + proc.stderr
    print(out, f"\ncluster.fabric wall: {seconds:.1f} s")
    assert proc.returncode == 0, out
    assert "VLLM_HOST_IP=10.77.0.1" in proc.stdout and "VLLM_HOST_IP=10.77.0.2" in proc.stdout
    assert proc.stdout.count("GLOO_SOCKET_IFNAME=fabric0") == 2 and "NCCL_IB_HCA" not in proc.stdout
    assert "the default route is on lan0 (10.78.1.1), a LAN or Wi-Fi" in proc.stderr
    checks = json.loads(report_path.read_text())["checks"]
    link = checks.pop()  # --test: no RDMA device on these nodes, so the link test says so instead of running
    assert link["name"] == "link-test" and link["status"] == "skipped"
    assert (
        link["reason"].startswith("no RDMA devices in use on node0 (unix://")
        and "node1 (unix://" in link["reason"]
    )
    for check in checks:
        assert check["details"]["rdma_devices"] == [] and check["details"]["default_route"] == "lan0"
        assert (
            "no RDMA devices on node" in check["reason"]
            and check["details"]["choice"]["interface"] == "fabric0"
        )
    assert _leftovers(two_nodes) == {"a": [], "b": []}


def test_doctor_without_interface_takes_the_fabric_and_runs_the_node_stages(
    two_nodes, tmp_path: Path
) -> None:
    token = tmp_path / "hf_token"
    token.write_text("hf_fabric_canary\n")
    report_path = tmp_path / "doctor.json"
    proc, seconds = _invoke(
        "cluster.doctor", "--image", VLLM_REF, "--nodes", _nodes(two_nodes), "--json", str(report_path),
        "--hf-token-file", str(token), "--cache-dir", str(tmp_path / "cache"),
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    print(out, f"\ndoctor (no --interface, node stages) wall: {seconds:.1f} s")
    assert proc.returncode == 0, out
    checks = {c["name"]: c for c in json.loads(report_path.read_text())["checks"]}
    addresses = checks["addresses"]
    nodes = list(addresses["details"].values())
    assert [v["env"]["VLLM_HOST_IP"] for v in nodes] == ["10.77.0.1", "10.77.0.2"]
    assert "the default route is on lan0 (10.78.1.1)" in nodes[0]["warnings"][0]
    assert "warning:" in addresses["reason"]
    assert checks["paths"]["status"] == "passed" and "will be created by Docker" in checks["paths"]["reason"]
    assert not (tmp_path / "cache").exists()  # looked for, not created
    mtu = checks["mtu"]
    assert mtu["status"] == "passed" and "2 don't-fragment probes of 1472 bytes got through" in mtu["reason"]
    assert set(mtu["details"]["dont_fragment"]) == {"node0 -> node1 10.77.0.2", "node1 -> node0 10.77.0.1"}
    host = checks["host"]
    assert host["status"] == "passed" and all(
        v["kernel"] == os.uname().release for v in host["details"].values()
    )
    library = checks["nccl-library"]
    print("nccl-library:", library["status"], library["reason"])
    assert library["status"] in ("passed", "skipped")
    if library["status"] == "passed":
        assert len({(v["path"], v["sha256"]) for v in library["details"].values()}) == 1
    assert checks["sanity"]["status"] == "passed"
    transport = checks["transport"]
    assert transport["status"] == "skipped"
    assert (
        transport["reason"].startswith("no RDMA devices on node0 (unix://")
        and "node1 (unix://" in transport["reason"]
    )
    assert _leftovers(two_nodes) == {"a": [], "b": []}


def test_doctor_looks_for_the_model_dir_on_the_nodes(two_nodes, tmp_path: Path) -> None:
    missing = tmp_path / "no-model-here"
    proc, seconds = _invoke(
        "cluster.doctor", "--image", VLLM_REF, "--nodes", _nodes(two_nodes), "--model-dir", str(missing)
    )
    out = proc.stdout + proc.stderr
    print(out, f"\ndoctor (missing model dir) wall: {seconds:.1f} s")
    assert proc.returncode == 1 and "Traceback" not in out
    assert f"node0 (unix://{two_nodes.nodes[0].socket}): the model directory {missing} does not exist" in out
    assert "fix: put the model at that path on every node" in out
    assert not missing.exists()  # Docker did not create it as a side effect
    assert _leftovers(two_nodes) == {"a": [], "b": []}


def _cached_model(cache: Path, repo: str) -> int:
    """A model in Hugging Face's cache layout (refs, snapshot links to blobs), as a finished download leaves it."""
    folder = cache / "huggingface" / "hub" / f"models--{repo.replace('/', '--')}"
    revision = "0123456789abcdef0123456789abcdef01234567"
    blob = b'{"architectures": ["TinyForTest"]}\n' + b" " * 4096
    (folder / "blobs").mkdir(parents=True)
    (folder / "blobs" / "c0ffee").write_bytes(blob)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(revision)
    snapshot = folder / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to("../../blobs/c0ffee")
    return len(blob)


def test_weights_phase_on_every_node_and_a_failed_download_names_the_stage(two_nodes, tmp_path: Path) -> None:
    profile_path = tmp_path / "tiny-tp2.yaml"
    profile_path.write_text(
        "description: a cached test model\nmodel: sparkforge-test/tiny\nnodes: 2\n"
        "args:\n  tensor-parallel-size: 2\nenv:\n  HF_HUB_OFFLINE: '1'\n"
    )
    profile = load_profile(str(profile_path))
    cache = tmp_path / "cache"
    size = _cached_model(cache, "sparkforge-test/tiny")
    engines = [NodeEngine(n) for n in parse_nodes(_nodes(two_nodes))]
    options = LaunchOptions(image=VLLM_REF, cache_dir=str(cache))  # the phase runs without a GPU
    lines: list[str] = []
    start = time.monotonic()
    heard = Session(echo=lambda line: (lines.append(line), say(line)), runner=Runner(stream=False))
    done = fetch_weights(heard, engines, profile, options)
    print(f"weights phase (cached, offline) on two nodes: {time.monotonic() - start:.1f} s")
    assert set(done) == {e.node.label for e in engines}
    assert (
        sum(
            f"weights on disk on {e.node.label}: {size / 1e9:.2f} GB" in line
            for e in engines
            for line in lines
        )
        == 2
    )
    # shared: once on the head, then streamed over the fabric link (one cache path here: nothing left to move)
    head_ip = two_nodes.nodes[0].fabric_ip
    loud = Session(echo=say, runner=Runner(stream=False))
    shared = fetch_weights(loud, engines, profile, replace(options, weights="shared"), address=head_ip)
    assert list(shared) == [e.node.label for e in engines]

    os.environ["SPARKFORGE_LOG_DIR"] = str(tmp_path / "logs")
    try:
        other = profile_path.with_name("absent.yaml")
        other.write_text(profile_path.read_text().replace("sparkforge-test/tiny", "sparkforge-test/absent"))
        with pytest.raises(RunError) as caught:
            fetch_weights(loud, engines, load_profile(str(other)), options)
    finally:
        del os.environ["SPARKFORGE_LOG_DIR"]
    text = str(caught.value)
    print(text)
    assert text.startswith("stage download: fetching the weights on node0") and "logs kept in" in text
    assert "fix: check the model name" in text
    kept = list((tmp_path / "logs").rglob("*.log"))
    assert kept and "failed" in kept[0].read_text()
    assert _leftovers(two_nodes) == {"a": [], "b": []}


def test_shared_weights_stream_over_the_fabric_link_resumably(two_nodes, tmp_path: Path) -> None:
    """The head's model folder into the peer's own cache over fabric0, for real: 128 MiB of weights, a resumed
    partial file, the Hugging Face cache's symlinks recreated, progress on the way."""
    from sparkforge.run.weights.weightstream import Transfer, share_weights

    a = two_nodes.nodes[0]
    source = tmp_path / "head" / "models--sparkforge-test--big"
    (source / "blobs").mkdir(parents=True)
    weights = os.urandom(128 << 20)
    (source / "blobs" / "w0").write_bytes(weights)
    (source / "blobs" / "c0").write_text('{"architectures": ["TinyForTest"]}\n')
    snapshot = source / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to("../../blobs/w0")
    (snapshot / "config.json").symlink_to("../../blobs/c0")
    dest = tmp_path / "peer" / "models--sparkforge-test--big"
    (dest / ".sparkforge-part").mkdir(parents=True)  # an earlier, interrupted run: its part, named by digest
    part = dest / ".sparkforge-part" / hashlib.sha256(weights).hexdigest()
    part.write_bytes(weights[: 48 << 20])
    engines = [NodeEngine(n) for n in parse_nodes(_nodes(two_nodes))]
    lines: list[str] = []
    os.environ["SPARKFORGE_PROGRESS_S"] = "0.5"
    start = time.monotonic()
    try:
        heard = Session(echo=lambda line: (lines.append(line), say(line)), runner=Runner(stream=False))
        (done,) = share_weights(
            heard, engines[0], engines[1:], Transfer(VLLM_REF, a.fabric_ip, str(source), str(dest))
        ).values()
    finally:
        del os.environ["SPARKFORGE_PROGRESS_S"]
    wall = time.monotonic() - start
    print(f"shared weights over fabric0: {done}, wall {wall:.1f} s")
    assert done["bytes"] == done["total"] == len(weights) + 35 and done["resumed"] == 1
    assert done["moved"] == len(weights) - (48 << 20) + 35  # the resumed file sent only its missing part
    assert (dest / "blobs" / "w0").read_bytes() == weights and not part.exists()
    assert (
        source.parent / ".sparkforge-manifests" / f"{source.name}.json"
    ).is_file()  # cached for the next run
    assert os.readlink(dest / "snapshots" / "0123abcd" / "model.safetensors") == "../../blobs/w0"
    assert any(f"weights on {engines[1].node.label}: 0.13 GB" in line for line in lines)
    assert _leftovers(two_nodes) == {"a": [], "b": []}


def test_fabric_verbs_fails_in_an_image_without_the_rdma_userspace(base_amd64: str, tmp_path: Path) -> None:
    """The in-image check against a lock that declares the RDMA packages, in a base that lacks them (the CI
    images carry them: test_build_verify sees it pass)."""
    lock = tmp_path / "lock.json"
    lock.write_text(
        json.dumps({"runtime": {"rdma": {"packages": ["libibverbs1=44.0-2", "ibverbs-providers=44.0-2"]}}})
    )
    suite = REPO_ROOT / "sparkforge" / "verify" / "inimage"
    proc = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--volume", f"{suite}:/opt/judge:ro", "--volume",
         f"{lock}:/tmp/lock.json:ro", "--entrypoint", "python3", base_amd64, "/opt/judge/run_checks.py",
         "--only", "fabric.verbs", "--lock", "/tmp/lock.json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    (check,) = json.loads(proc.stdout.split("SPARKFORGE-CHECKS-JSON:", 1)[1])["checks"]
    assert proc.returncode == 1 and check["status"] == "failed", proc.stdout + proc.stderr
    assert "libibverbs1 not installed != pinned 44.0-2" in check["reason"]
    assert "libibverbs.so.1 does not load" in check["reason"] and "fix:" in check["reason"]


FAIL_FAST_RUNS = 5


@pytest.mark.slow(cost_s=240, reason="the doctor's fail-fast timing, several whole runs for a median")
def test_misconfigurations_are_named_before_any_sanity_run_in_seconds(two_nodes, tmp_path: Path) -> None:
    """The field's mistakes the facts already show, each named by the doctor before the sanity run: the LAN
    advertised (reach) and an MTU reset on one node (mtu); wall time of the whole `invoke cluster.doctor`,
    median of FAIL_FAST_RUNS, recorded in benchmarks/results/failfast.json."""
    from cluster import sh

    b = two_nodes.nodes[1]
    os.environ["SPARKFORGE_STATE"] = str(tmp_path / "state")  # the MTU drift state of these runs stays here
    walls: dict[str, list[float]] = {"lan-advertised": [], "mtu-reset": []}
    for case in walls:
        for _ in range(FAIL_FAST_RUNS):
            if case == "mtu-reset":
                sh("ip", "-n", b.netns, "link", "set", "fabric0", "mtu", "1400")
            try:
                extra = ("--interface", "lan0") if case == "lan-advertised" else ()
                report_path = tmp_path / f"{case}.json"
                proc, seconds = _invoke(
                    "cluster.doctor", "--image", VLLM_REF, "--nodes", _nodes(two_nodes), "--json", str(report_path),
                    *extra,
                )  # fmt: skip
            finally:
                sh("ip", "-n", b.netns, "link", "set", "fabric0", "mtu", "1500")
            checks = {c["name"]: c for c in json.loads(report_path.read_text())["checks"]}
            failed = "reach" if case == "lan-advertised" else "mtu"
            assert proc.returncode == 1 and checks[failed]["status"] == "failed", proc.stdout + proc.stderr
            assert checks["sanity"]["status"] == "skipped"  # named before any sanity run
            walls[case].append(round(seconds, 2))
        print(f"{case}: {checks[failed]['reason'][:300]}")
    del os.environ["SPARKFORGE_STATE"]
    medians = {case: sorted(w)[len(w) // 2] for case, w in walls.items()}
    print(f"fail-fast walls: {walls}; medians {medians}")
    out = REPO_ROOT / "benchmarks" / "results" / "failfast.json"
    out.write_text(json.dumps({"runs": walls, "median_s": medians, "limit_s": 10}, indent=1) + "\n")
    assert all(m < 10 for m in medians.values()), medians
    assert _leftovers(two_nodes) == {"a": [], "b": []}


def test_fabric_nccl_host_reads_each_nodes_own_library_beside_the_images(two_nodes, tmp_path: Path) -> None:
    """--nccl host with --nodes: the doctor's nccl-library probe reads, on each node, the libnccl the image's torch
    loads and the node's own (its / mounted). These nodes share this machine's /, which has no libnccl: each
    node is refused naming the fix; then one named like a DGX OS libnccl2 (only its name and bytes are read
    here) is found on both and passes the soname check against the image's libnccl.so.2."""
    report_path = tmp_path / "fabric.json"
    args = ("cluster.fabric", "--image", VLLM_REF, "--nodes", _nodes(two_nodes), "--nccl", "host")
    planted = Path("/usr/local/lib/libnccl.so.2.28.9")
    assert not planted.exists(), f"{planted} exists on this machine: the test would remove it"
    proc, seconds = _invoke(*args, "--json", str(report_path))
    out = proc.stdout + proc.stderr
    print(out, f"\ncluster.fabric --nccl host wall: {seconds:.1f} s")
    assert proc.returncode != 0 and "the node has no NCCL library" in out and "fix:" in out, out
    refused = [c["details"]["nccl"] for c in json.loads(report_path.read_text())["checks"][:2]]
    assert [n["abi"]["status"] for n in refused] == ["failed", "failed"], refused
    try:
        planted.write_bytes(b"\x7fELF stand-in for the node's libnccl2\n")
        proc, seconds = _invoke(*args, "--json", str(report_path))
    finally:
        planted.unlink()
    out = proc.stdout + proc.stderr
    print(out, f"\ncluster.fabric --nccl host wall: {seconds:.1f} s")
    assert proc.returncode == 0, out
    for check in json.loads(report_path.read_text())["checks"][:2]:
        nccl = check["details"]["nccl"]
        assert nccl["source"] == "host" and nccl["library"] == str(planted) and nccl["version"] == "2.28.9"
        assert nccl["abi"]["status"] == "passed" and nccl["replaces"].endswith("libnccl.so.2"), nccl
        assert nccl["mount"] == f"{planted}:{nccl['replaces']}:ro"
    assert _leftovers(two_nodes) == {"a": [], "b": []}
