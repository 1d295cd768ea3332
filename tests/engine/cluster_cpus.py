"""Each namespaced node its own CPUs, as each Spark has its own: a cpuset cgroup per node's --cgroup-parent.

The nodes' engines run their containers under `--cgroup-parent /<tag>-<node>`; runc copies a parent cpuset
into every container it makes there, so writing the node's share of this machine's CPUs into that parent
before the engine starts confines everything the node runs to them (vLLM's CPU platform reads the allowed
set with sched_getaffinity and binds its OpenMP threads inside it). Without it the two ranks of a
pipeline-parallel twin bound their OpenMP threads to the same core (each rank sees one local rank and picks the
first core) and decoded ~15x slower than apart (benchmarks/conform.md, "Two nodes on one machine").
cgroup v1 (the cpuset hierarchy) and v2 (the unified tree with the cpuset controller enabled) are handled.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def shares(cpus: list[int], count: int) -> list[list[int]]:
    """`cpus` split in `count` contiguous shares as even as possible; with fewer CPUs than nodes they share."""
    if len(cpus) < count:
        return [cpus for _ in range(count)]
    size, extra = divmod(len(cpus), count)
    out, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < extra else 0)
        out.append(cpus[start:end])
        start = end
    return out


def _cpuset_dir(name: str) -> tuple[Path, Path]:
    """(the root cpuset directory, the node's) for this machine's cgroup version; on v2 the cpuset controller is
    enabled for the root's children first."""
    v1 = CGROUP_ROOT / "cpuset"
    if (v1 / "cpuset.cpus").is_file():
        return v1, v1 / name
    if (CGROUP_ROOT / "cgroup.controllers").is_file():
        if "cpuset" not in (CGROUP_ROOT / "cgroup.controllers").read_text().split():
            raise RuntimeError(
                "cgroup v2 without the cpuset controller: the nodes cannot have CPUs of their own"
            )
        control = CGROUP_ROOT / "cgroup.subtree_control"
        if "cpuset" not in control.read_text().split():
            control.write_text("+cpuset")
        return CGROUP_ROOT, CGROUP_ROOT / name
    raise RuntimeError(f"no cpuset cgroup under {CGROUP_ROOT}: the nodes cannot have CPUs of their own")


def confine(name: str, cpus: list[int]) -> None:
    """Make the cgroup `/<name>` hold only `cpus` (before the engine that parents containers there starts)."""
    root, node = _cpuset_dir(name)
    node.mkdir(exist_ok=True)
    mems = (root / ("cpuset.mems" if root != CGROUP_ROOT else "cpuset.mems.effective")).read_text().strip()
    (node / "cpuset.mems").write_text(mems or "0")
    (node / "cpuset.cpus").write_text(",".join(str(c) for c in cpus))


def allowed(name: str) -> list[int]:
    """The CPUs the cgroup `/<name>` holds (what its containers may run on)."""
    _, node = _cpuset_dir(name)
    text = (node / "cpuset.cpus").read_text().strip()
    out: list[int] = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return out


def machine_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def _hierarchies() -> list[Path]:
    """The cgroup trees: v2's root, or each v1 controller's (cpuset, memory, pids, ...)."""
    if not CGROUP_ROOT.is_dir():
        return []
    return [CGROUP_ROOT, *(p for p in CGROUP_ROOT.iterdir() if p.is_dir())]


def release(name: str) -> None:
    """Remove the cgroup `/<name>` from every hierarchy, deepest first; never raises (a busy one stays)."""
    for top in _hierarchies():
        node = top / name
        if not node.is_dir() or node.is_symlink():
            continue
        for path in sorted(
            (p for p in node.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
        ):
            with contextlib.suppress(OSError):
                path.rmdir()
        with contextlib.suppress(OSError):
            node.rmdir()


def leftovers(prefix: str) -> list[str]:
    """Names of cgroups under any hierarchy starting with `prefix` (what remove_stale may release)."""
    names: set[str] = set()
    for top in _hierarchies():
        with contextlib.suppress(OSError):
            names.update(p.name for p in top.iterdir() if p.is_dir() and p.name.startswith(prefix))
    return sorted(names)
