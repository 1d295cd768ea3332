"""The probe's translation units: checked against the pinned source tree before anything is built."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path

from sparkforge.boundary import walk_tree
from sparkforge.errors import SparkforgeError


class ProbeError(SparkforgeError):
    """The compile probe cannot run as asked (a path, the recipe, the build environment)."""


def source_files(root: Path) -> list[str]:
    """Every .cu/.cpp under csrc/, relative to the vLLM root."""
    csrc = root / "csrc"
    files = walk_tree(csrc, "vLLM's csrc/", max_entries=200_000)  # no link followed out of the tree
    return sorted(str(p.relative_to(root)) for p in files if p.suffix in (".cu", ".cpp"))


def closest(unit: str, candidates: Sequence[str], count: int = 3) -> list[str]:
    """Nearest existing paths: by file name first (a moved file), then by the whole path."""
    name = Path(unit).name
    by_name = [c for c in candidates if Path(c).name == name]
    names = {Path(c).name: c for c in candidates}
    similar_names = [names[n] for n in difflib.get_close_matches(name, list(names), n=count, cutoff=0.6)]
    by_path = difflib.get_close_matches(unit, candidates, n=count, cutoff=0.5)
    return list(dict.fromkeys([*by_name, *similar_names, *by_path]))[:count]


def check_units(root: Path, units: Sequence[str], where: str) -> None:
    """Raise a ProbeError naming every unit that is not in the tree, each with its closest matches."""
    missing = [u for u in units if not (root / u).is_file()]
    if not missing:
        return
    candidates = source_files(root)
    parts = []
    for unit in missing:
        near = closest(unit, candidates)
        parts.append(f"{unit} (closest: {', '.join(near) if near else 'none'})")
    raise ProbeError(
        f"build.probe.sources: {len(missing)} path(s) do not exist in {where}: {'; '.join(parts)}. "
        "Fix: correct the paths in the recipe's build.probe.sources (relative to the vLLM source root)"
    )
