"""NCCL identity per node: the host's own library found through the probe's host mount, and `--nccl host`'s
bind mount (refused on a node without one, or with another ABI), in the doctor and in cluster.fabric's report."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.run.cluster.clusterflags import ClusterFlags
from sparkforge.run.cluster.clusterplan import fabric_settings
from sparkforge.run.cluster.inventory import SYSFS_ENV, fabric_report, local_facts, nccl_sources
from sparkforge.run.cluster.stages import host_mounts
from sparkforge.run.facts import NodeFacts
from sparkforge.run.jobs import FACTS_SCRIPT
from sparkforge.run.launchplan import FlagError


def _helper():
    spec = importlib.util.spec_from_file_location("cluster_facts_under_test", FACTS_SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_hosts_nccl_is_read_through_the_host_mount(tmp_path: Path) -> None:
    lib = tmp_path / "usr" / "lib" / "aarch64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2.28.9").write_bytes(b"\x7fELF host nccl")
    (lib / "libnccl.so.2").symlink_to("libnccl.so.2.28.9")
    found = _helper().host_nccl(str(tmp_path))
    assert found == {
        "path": "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9", "version": "2.28.9", "soname": "libnccl.so.2",
        "sha256": hashlib.sha256(b"\x7fELF host nccl").hexdigest(),
    }  # fmt: skip
    assert _helper().host_nccl(str(tmp_path / "nothing")) is None


def _fact(rank: int, host: dict | None) -> NodeFacts:
    return NodeFacts(rank, f"node{rank}", "", "", [], {}, {}, host={"nccl": host})


IMAGE = "/opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"


def test_nccl_host_mounts_the_nodes_library_over_the_images() -> None:
    host = {
        "path": "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9",
        "soname": "libnccl.so.2",
        "version": "2.28.9",
    }
    found = {f"node{i}": {"path": IMAGE, "version": "2.28.9"} for i in (0, 1)}
    mounts, problems = host_mounts([_fact(0, host), _fact(1, host)], found)
    assert problems == [] and mounts[1] == [f"{host['path']}:{IMAGE}:ro"]
    other_abi = {**host, "path": "/usr/lib/libnccl.so.3.0.1", "soname": "libnccl.so.3"}
    mounts, problems = host_mounts([_fact(0, None), _fact(1, other_abi)], found)
    assert mounts == {} and len(problems) == 2
    assert (
        problems[0].startswith("node0: --nccl host, but the node has no NCCL library")
        and "fix:" in problems[0]
    )
    assert (
        "node1: --nccl host: the node's /usr/lib/libnccl.so.3.0.1 (libnccl.so.3) is another ABI"
        in problems[1]
    )


def test_the_probe_runs_vllms_own_get_ip_without_importing_vllm(tmp_path: Path, monkeypatch) -> None:
    """vLLM's get_ip from its source: the package (whose import would load torch) is never executed."""
    package = tmp_path / "vllm"
    (package / "utils").mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('vllm was imported')\n")
    (package / "utils" / "network_utils.py").write_text(
        "import torch  # never reached\nimport vllm.envs as envs\n\n"
        "def get_ip() -> str:\n    host_ip = envs.VLLM_HOST_IP\n    if host_ip:\n        return host_ip\n"
        "    return '203.0.113.7'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("VLLM_HOST_IP", raising=False)
    helper = _helper()
    assert helper.vllm_get_ip() == ("203.0.113.7", "vllm.utils.network_utils.get_ip (from its source)")
    monkeypatch.setenv("VLLM_HOST_IP", "192.168.177.10")
    assert helper.vllm_get_ip()[0] == "192.168.177.10"


def test_rdma_devices_without_a_verbs_library_in_the_image_fail_the_addresses_stage() -> None:
    from sparkforge.run.cluster.addresses import verbs_problem

    rdma = {"rdma": {"rocep1s0f1": {}, "roceP2p1s0f1": {}}}
    missing = {"libibverbs": False, "error": "libibverbs.so.1: cannot open shared object file", "mlx5": False}
    fact = NodeFacts(0, "node0", "", "", [], {}, {}, fabric={**rdma, "verbs": missing})
    text = verbs_problem(fact) or ""
    assert (
        "node0: the node has RDMA devices (roceP2p1s0f1, rocep1s0f1) but in the image libibverbs.so.1 does not load"
        in text
    )
    assert "fix: pin the RDMA userspace in the recipe (runtime.rdma" in text
    no_mlx5 = NodeFacts(
        0, "node0", "", "", [], {}, {}, fabric={**rdma, "verbs": {"libibverbs": True, "mlx5": False}}
    )
    assert "the mlx5 verbs provider is missing" in (verbs_problem(no_mlx5) or "")
    good = NodeFacts(
        0, "node0", "", "", [], {}, {}, fabric={**rdma, "verbs": {"libibverbs": True, "mlx5": True}}
    )
    bare = NodeFacts(
        0, "node0", "", "", [], {}, {}, fabric={"rdma": {}, "verbs": missing}
    )  # no devices: no need
    assert verbs_problem(good) is None and verbs_problem(bare) is None


def _tree_with_nccl(tmp_path: Path, name: str, nccl: bool) -> Path:
    """A fake Spark (SPARKFORGE_SYSFS names root/sys); with `nccl`, the node's own libnccl under root/usr/lib."""
    from fabric_trees import build, spark

    sysfs = build(tmp_path / name, spark())
    if nccl:
        lib = tmp_path / name / "usr" / "lib" / "aarch64-linux-gnu"
        lib.mkdir(parents=True)
        (lib / "libnccl.so.2.28.9").write_bytes(b"\x7fELF host nccl")
    return sysfs


def _fabric(sysfs: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "invoke", "cluster.fabric", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "SPARKFORGE_SYSFS": str(sysfs)},
        timeout=120,
    )


def test_cluster_fabric_nccl_host_names_the_nodes_library_or_refuses(tmp_path: Path) -> None:
    """`cluster.fabric --nccl host` through the task: the node's own libnccl in the report (human and JSON); none on
    the node fails as the doctor does; a bad value gets the doctor's own one-paragraph error."""
    report_path = tmp_path / "fabric.json"
    proc = _fabric(_tree_with_nccl(tmp_path, "good", True), "--nccl", "host", "--json", str(report_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ours = "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9"
    assert f"libnccl: the node's own {ours}, NCCL 2.28.9 (--nccl host)" in proc.stdout
    assert "ABI check skipped: local: the image was not read" in proc.stdout
    nccl = json.loads(report_path.read_text())["checks"][0]["details"]["nccl"]
    assert nccl["source"] == "host" and nccl["library"] == ours and nccl["soname"] == "libnccl.so.2"
    assert nccl["sha256"] == hashlib.sha256(b"\x7fELF host nccl").hexdigest() and nccl["mount"] is None
    assert nccl["abi"]["status"] == "skipped"

    proc = _fabric(_tree_with_nccl(tmp_path, "bare", False), "--nccl", "host")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out
    assert "local: --nccl host, but the node has no NCCL library" in out and "fix: install" in out

    proc = _fabric(_tree_with_nccl(tmp_path, "bad", False), "--nccl", "both")
    with pytest.raises(FlagError) as doctors:  # the doctor's and cluster.up's own check of the value
        fabric_settings(ClusterFlags(nccl="both"))
    assert proc.returncode != 0 and f"sparkforge: {doctors.value}" in proc.stderr.splitlines()


def test_the_fabric_report_carries_the_abi_check_of_the_images_library(tmp_path: Path) -> None:
    """With the image read (--nodes: remote_nccl's answers), the same soname check as the doctor's decides the
    bind mount a launch would add; another ABI fails that node's check with the fix."""
    raw = local_facts({SYSFS_ENV: str(_tree_with_nccl(tmp_path, "node", True))})
    host = {
        "path": "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9",
        "soname": "libnccl.so.2",
        "version": "2.28.9",
    }
    other = {**host, "path": "/usr/lib/libnccl.so.3.0.1", "soname": "libnccl.so.3"}
    libraries = [{"host": host, "image": {"path": IMAGE}}, {"host": other, "image": {"path": IMAGE}}]
    labels = ["node0", "node1"]
    report, _ = fabric_report(labels, [raw, raw], sources=nccl_sources(labels, "host", libraries))
    good, bad = (c.to_dict() for c in report.checks)
    assert good["status"] == "passed" and good["details"]["nccl"]["abi"]["status"] == "passed"
    assert good["details"]["nccl"]["mount"] == f"{host['path']}:{IMAGE}:ro"
    assert good["details"]["nccl"]["replaces"] == IMAGE
    assert bad["status"] == "failed" and bad["details"]["nccl"]["mount"] is None
    assert bad["reason"] == (
        f"node1: --nccl host: the node's {other['path']} (libnccl.so.3) is another ABI than the image's {IMAGE}; "
        "fix: install a libnccl with the image's soname or leave --nccl out"
    )
    report, _ = fabric_report(labels, [raw, raw])  # --nccl image (default): nothing mounted
    assert [c.details["nccl"]["source"] for c in report.checks] == ["image", "image"]
    assert report.status == "passed" and report.checks[0].details["nccl"]["mount"] is None
