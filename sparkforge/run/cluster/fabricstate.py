"""What the fabric looked like at the doctor's last run, per node: GID indices and MTU, kept to warn on drift.

The RoCE v2 IPv4 GID index moves (3 <-> 4, or 5 after global IPv6 GIDs) when addresses change, and a CX-7
firmware reboot drops the MTU back to 1500; both break a run that worked yesterday. Kept as one JSON file per
node under $SPARKFORGE_STATE, else $XDG_STATE_HOME/sparkforge, else ~/.local/state/sparkforge (fabric/).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparkforge.boundary import read_json, write_output
from sparkforge.errors import InputError
from sparkforge.run.cluster.fabric import FabricChoice
from sparkforge.run.cluster.rdma import NodeFabric


def state_dir() -> Path:
    env = os.environ
    if env.get("SPARKFORGE_STATE"):
        return Path(env["SPARKFORGE_STATE"])
    xdg = env.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path(env.get("HOME", str(Path.home()))) / ".local" / "state") / "sparkforge"


def _file(root: Path, key: str) -> Path:
    return root / "fabric" / (re.sub(r"[^A-Za-z0-9_.-]+", "_", key).strip("_") + ".json")


def snapshot(node: NodeFabric, choice: FabricChoice) -> dict[str, Any]:
    """The facts worth comparing next time: each chosen device's IPv4 GID index, the link interface's MTU."""
    iface = node.interface(choice.interface)
    return {"gid": dict(choice.gid), "interface": choice.interface, "mtu": iface.mtu if iface else None}


def drift(
    keys: Sequence[str],
    nodes: Sequence[NodeFabric],
    choices: Sequence[FabricChoice],
    root: Path,
    *,
    save: bool = True,
) -> list[str]:
    """Warnings: the GID index of a device differs between nodes, or from the node's last run; the MTU changed
    since the last run. The new snapshot replaces the old one (unless `save` is off)."""
    warnings: list[str] = []
    now = [snapshot(n, c) for n, c in zip(nodes, choices, strict=False)]
    indices = {i for s in now for i in s["gid"].values() if i is not None}
    if len(indices) > 1:
        listing = "; ".join(
            f"{c.label}: " + ", ".join(f"{d} {i}" for d, i in s["gid"].items())
            for c, s in zip(choices, now, strict=False)
        )
        warnings.append(
            f"the RoCE v2 IPv4 GID index differs between devices/nodes ({listing}): harmless while NCCL picks it "
            "(the default); a pinned NCCL_IB_GID_INDEX or --gid-index breaks on some of them; fix: do not pin it"
        )
    for key, choice, current in zip(keys, choices, now, strict=False):
        path = _file(root, key)
        try:
            before = (
                read_json(path, "the last run's fabric facts", max_bytes=1 << 20) if path.exists() else None
            )
        except InputError:
            before = None
        if isinstance(before, dict):
            for device, index in current["gid"].items():
                old = (before.get("gid") or {}).get(device)
                if old is not None and index is not None and old != index:
                    warnings.append(
                        f"{choice.label}: the RoCE v2 IPv4 GID index of {device} moved from {old} to {index} since "
                        "the last run (addresses changed): a pinned NCCL_IB_GID_INDEX now names the wrong GID "
                        "(ibv_modify_qp error 61); fix: let NCCL choose (no --gid-index, no NCCL_IB_GID_INDEX)"
                    )
            if before.get("mtu") and current["mtu"] and before["mtu"] != current["mtu"]:
                warnings.append(
                    f"{choice.label}: the MTU of {current['interface']} changed from {before['mtu']} to "
                    f"{current['mtu']} since the last run (a CX-7 firmware reboot resets it to 1500; nmcli edits "
                    "vanish where netplan owns the link); fix: set it in the netplan file (mtu: 9000) and apply"
                )
        if save and choice.interface:
            write_output(path, json.dumps(current, indent=1, sort_keys=True) + "\n", "fabric facts")
    return warnings
