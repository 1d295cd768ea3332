"""The doctor's nccl-library stage on four ranks: the libnccl each rank reported (path, version, sha256 of real
files here: a library and a planted copy one byte apart) judged for same bytes everywhere, the recipe's pin, and the
known-bad NCCL versions where the ranks run NCCL (GPUs); the host stage's kernel against the known-bad list."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from sparkforge.report import Check
from sparkforge.run.cluster import stages
from sparkforge.run.facts import DoctorOptions, NodeFacts

LIBRARY = Path("/usr/lib/x86_64-linux-gnu/libz.so.1")  # stands in for libnccl.so.2: any real shared object


def _ranks(
    tmp_path: Path, planted: int | None = None, version: str = "2.30.7"
) -> tuple[list[NodeFacts], tuple]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    real = tmp_path / "libnccl.so.2"
    shutil.copyfile(LIBRARY.resolve(), real)
    other = tmp_path / "planted" / "libnccl.so.2"
    other.parent.mkdir()
    data = bytearray(real.read_bytes())
    data[-1] ^= 0xFF  # one byte apart: same name, same version string, other bytes
    other.write_bytes(bytes(data))
    facts, found = [], {}
    for rank in range(4):
        label = f"node{rank}"
        path = other if rank == planted else real
        facts.append(
            NodeFacts(rank, label, "10.0.0.1", "test", [], {}, {}, host={"kernel": "6.17.0-1032-nvidia"})
        )
        found[label] = {
            "path": str(path),
            "version": version,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        }
    return facts, (found, [])


def _judge(facts, probed, **options) -> Check:
    check = Check("nccl-library", "passed", "")
    stages.nccl_library(check, [], DoctorOptions(image="x", **options), facts, probed)
    return check


def test_same_bytes_on_four_ranks_pass_and_a_planted_library_is_refused(tmp_path: Path) -> None:
    facts, probed = _ranks(tmp_path)
    check = _judge(facts, probed)
    assert check.status == "passed" and check.reason.startswith("NCCL 2.30.7 from ")
    facts, probed = _ranks(tmp_path / "b", planted=2)
    check = _judge(facts, probed)
    assert check.status == "failed" and check.reason.startswith("the nodes load different NCCL libraries")
    assert "node2: " in check.reason and "vllm-project/vllm#42354" in check.reason


def test_the_recipes_pin_and_known_bad_versions(tmp_path: Path) -> None:
    facts, probed = _ranks(tmp_path)
    digest = probed[0]["node0"]["sha256"]
    assert _judge(facts, probed, nccl_pin={"version": "2.30.7", "sha256": digest}).status == "passed"
    check = _judge(facts, probed, nccl_pin={"version": "2.30.7", "sha256": "0" * 64})
    assert (
        check.status == "failed" and "but the recipe pins NCCL 2.30.7 sha256 0000000000000000" in check.reason
    )
    facts, probed = _ranks(tmp_path / "old", version="2.30.4")
    check = _judge(facts, probed, gpus=True, parallel=(4, 1))
    assert check.status == "failed" and "nccl-2.30.4-tp-hang-on-sparks" in check.reason
    assert _judge(facts, probed, gpus=False, parallel=(4, 1)).status == "passed"  # Gloo only: NCCL never runs


def test_host_kernel_against_the_known_bad_list(tmp_path: Path) -> None:
    facts, _ = _ranks(tmp_path)
    check = Check("host", "passed", "")
    stages.host(check, facts)
    assert check.status == "passed"
    facts[3].host["kernel"] = "7.0.0-1019-nvidia"
    check = Check("host", "passed", "")
    stages.host(check, facts)
    assert (
        check.status == "failed"
        and "kernel-7.0.0-1019-nvidia-roce" in check.reason
        and "node3 7.0.0-1019" in check.reason
    )
