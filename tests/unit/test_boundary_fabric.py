"""cluster.fabric's fake-sysfs reader against planted trees, through the real task: every case refused in seconds,
naming what the tree held and the fix, never a traceback (GID '²', a 5000-digit MTU, bad routes, garbage and a
million-entry GID table, link loops, an empty tree, a state file linked outside the tree)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fabric_trees import build, spark

from sparkforge.recipe.loader import REPO_ROOT
from sparkforge.run.cluster.inventory import local_facts

PORT = Path("class/infiniband/rocep1s0f1/ports/1")


def _fabric(sysfs: Path, *args: str) -> tuple[int, str, float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "cluster.fabric", *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "SPARKFORGE_SYSFS": str(sysfs)},
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def _plant_gid_superscript(sys_: Path) -> str:
    (sys_ / PORT / "gids" / "²").write_text("fe80:0000:0000:0000:0000:0000:0000:0001\n")
    return ""  # the '²' entry is not a GID index: left out, the node still reads


def _plant_long_mtu(sys_: Path) -> str:
    (sys_ / "class/net/enp1s0f1np1/mtu").write_text("9" * 5000)
    return ""  # no MTU read (None), never int() of 5000 digits


def _plant_bad_routes(sys_: Path) -> str:
    route = sys_.parent / "proc/net/route"
    route.write_text(
        route.read_text() + "enp1s0f1np1\tZZZZZZZZ\t00000000\t0001\t0\t0\t0\t1FFFFFFFFF\t0\t0\t0\n"
    )
    return ""


def _plant_garbage_gid(sys_: Path) -> str:
    (sys_ / PORT / "gids" / "5").write_text("<script>not-a-gid</script>\n")
    return "is not a GID"


def _plant_many_gids(sys_: Path) -> str:
    folder = sys_ / PORT / "gids"
    for i in range(8, 1100):
        (folder / str(i)).write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")
    return "more than 1024 GIDs"


def _plant_link_loop(sys_: Path) -> str:
    (sys_ / "class/infiniband/loop").symlink_to(sys_ / "class/infiniband/loop")
    return ""


def _plant_empty(sys_: Path) -> str:
    for path in sorted(sys_.rglob("*"), reverse=True):
        path.unlink() if path.is_file() or path.is_symlink() else path.rmdir()
    (sys_ / "class").mkdir()
    return "no network device"


CASES = [_plant_gid_superscript, _plant_long_mtu, _plant_bad_routes, _plant_garbage_gid, _plant_many_gids,
         _plant_link_loop, _plant_empty]  # fmt: skip


@pytest.mark.parametrize("plant", CASES, ids=[c.__name__.removeprefix("_plant_") for c in CASES])
def test_a_planted_sysfs_tree_is_read_safely(tmp_path: Path, plant) -> None:
    sys_ = build(tmp_path / "node", spark())
    expected = plant(sys_)
    rc, out, seconds = _fabric(sys_, "--interface", "enp1s0f1np1")
    assert "Traceback" not in out, out
    assert seconds < 60  # a hang guard (a FIFO or a loop would never end); the reading itself is milliseconds
    if expected:
        assert rc != 0 and expected in out and "fix:" in out, out
    else:
        assert rc == 0, out


def test_an_attribute_linked_out_of_the_tree_reads_as_absent(tmp_path: Path) -> None:
    sys_ = build(tmp_path / "node", spark())
    outside = tmp_path / "outside-state"
    outside.write_text("4: ACTIVE-FROM-ELSEWHERE\n")
    state = sys_ / PORT / "state"
    state.unlink()
    state.symlink_to(outside)
    facts = local_facts({"SPARKFORGE_SYSFS": str(sys_)})
    assert facts["rdma"]["rocep1s0f1"]["ports"]["1"]["state"] is None
    assert facts["rdma"]["roceP2p1s0f1"]["ports"]["1"]["state"] == "4: ACTIVE"  # its own file is read
