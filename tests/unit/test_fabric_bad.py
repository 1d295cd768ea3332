"""cluster.fabric's bad input: each a one-paragraph error naming the device and the fix, through the real task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fabric_trees import NodeTree, build, spark

from sparkforge.errors import RunError
from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.run.cluster.fabric import choose, parse_node
from sparkforge.run.cluster.inventory import local_facts


def _node(tmp_path: Path, tree: NodeTree):
    return parse_node("node0", local_facts({"SPARKFORGE_SYSFS": str(build(tmp_path, tree))}))


def _one_paragraph(text: str) -> None:
    assert "\n" not in text and "fix:" in text


@pytest.mark.parametrize(
    ("interface", "needles"),
    [
        ("enp9s0", ["there is no interface enp9s0", "enp1s0f1np1", "fix: name one of those"]),
        ("enp1s0f0np0", ["interface enp1s0f0np0 is down", "fix: cable the port"]),
    ],
)
def test_unknown_or_down_interface(tmp_path: Path, interface: str, needles: list[str]) -> None:
    with pytest.raises(RunError) as caught:
        choose(_node(tmp_path, spark()), interface)
    _one_paragraph(str(caught.value))
    assert all(n in str(caught.value) for n in needles), caught.value


def test_an_up_port_without_an_ipv4_gid(tmp_path: Path) -> None:
    tree = spark()
    for function in tree.functions:
        function.ipv4 = None
    with pytest.raises(RunError) as caught:
        choose(_node(tmp_path, tree))
    text = str(caught.value)
    _one_paragraph(text)
    assert (
        "RDMA device rocep1s0f1 (net device enp1s0f1np1) is up but carries no RoCE v2 GID with an IPv4"
        in text
    )
    with pytest.raises(
        RunError, match=r"rocep1s0f1 \(net device enp1s0f1np1\) is up but carries no RoCE v2 GID"
    ):
        choose(_node(tmp_path / "again", tree), "enp1s0f1np1")


def _invoke(*args: str, sysfs: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPARKFORGE_SYSFS": sysfs}
    return subprocess.run(
        [sys.executable, "-m", "invoke", "cluster.fabric", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_the_task_reports_the_env_and_fails_on_bad_input(tmp_path: Path) -> None:
    good = build(tmp_path / "good", spark())
    report_path = tmp_path / "fabric.json"
    proc = _invoke("--json", str(report_path), sysfs=str(good))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "NCCL_IB_HCA==rocep1s0f1,roceP2p1s0f1" in proc.stdout and "NCCL_IB_ADDR_FAMILY=AF_INET" in proc.stdout
    )
    assert "NCCL_IB_GID_INDEX" not in proc.stdout
    assert "warning: local: the default route is on wlP9s9" in proc.stderr
    report = json.loads(report_path.read_text())
    assert report["command"] == "cluster.fabric" and report["status"] == "passed"
    details = report["checks"][0]["details"]
    assert details["choice"]["env"]["VLLM_HOST_IP"] == "192.168.100.10"
    assert {d["device"]: d["ipv4_gid_index"] for d in details["rdma_devices"]}["roceP2p1s0f1"] == 5

    proc = _invoke("--interface", "enp1s0f0np0", sysfs=str(good))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out
    assert "interface enp1s0f0np0 is down; fix:" in out

    proc = _invoke("--gid-index", "5", sysfs=str(good))  # pinned only when asked
    assert proc.returncode == 0 and "NCCL_IB_GID_INDEX=5" in proc.stdout, proc.stdout + proc.stderr
    proc = _invoke("--gid-index", "12", sysfs=str(good))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out
    assert "local: --gid-index 12 is not in the GID table of rocep1s0f1 (enp1s0f1np1)" in out

    proc = _invoke(sysfs=str(tmp_path / "nowhere"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out
    assert "is not a sysfs tree (no class/ under it); fix:" in out
