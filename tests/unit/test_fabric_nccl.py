"""NCCL identity per node: the host's own library found through the probe's host mount, and `--nccl host`'s
bind mount (refused on a node without one, or with another ABI)."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from sparkforge.run.facts import NodeFacts
from sparkforge.run.jobs import FACTS_SCRIPT
from sparkforge.run.stages import host_mounts


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
    from sparkforge.run.doctor import _verbs_problem

    rdma = {"rdma": {"rocep1s0f1": {}, "roceP2p1s0f1": {}}}
    missing = {"libibverbs": False, "error": "libibverbs.so.1: cannot open shared object file", "mlx5": False}
    fact = NodeFacts(0, "node0", "", "", [], {}, {}, fabric={**rdma, "verbs": missing})
    text = _verbs_problem(fact) or ""
    assert (
        "node0: the node has RDMA devices (roceP2p1s0f1, rocep1s0f1) but in the image libibverbs.so.1 does not load"
        in text
    )
    assert "fix: pin the RDMA userspace in the recipe (runtime.rdma" in text
    no_mlx5 = NodeFacts(
        0, "node0", "", "", [], {}, {}, fabric={**rdma, "verbs": {"libibverbs": True, "mlx5": False}}
    )
    assert "the mlx5 verbs provider is missing" in (_verbs_problem(no_mlx5) or "")
    good = NodeFacts(
        0, "node0", "", "", [], {}, {}, fabric={**rdma, "verbs": {"libibverbs": True, "mlx5": True}}
    )
    bare = NodeFacts(
        0, "node0", "", "", [], {}, {}, fabric={"rdma": {}, "verbs": missing}
    )  # no devices: no need
    assert _verbs_problem(good) is None and _verbs_problem(bare) is None
