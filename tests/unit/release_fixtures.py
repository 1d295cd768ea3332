"""Two releases' worth of real device code (nvcc 13): vLLM's _C and _moe_C, once with native sm_121 cubins and
once with the family-only sm_120f build official wheels ship, laid out as an image's site-packages."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.unit.audit_fixtures import Fixture, build_fixtures

SITE = "opt/venv/lib/python3.11/site-packages"
RELEASES = {
    # release -> library -> gencode pairs
    "native": {"vllm/_C.abi3.so": ("compute_121:sm_121",), "vllm/_moe_C.abi3.so": ("compute_121:sm_121",)},
    "family": {"vllm/_C.abi3.so": ("compute_121:sm_121",), "vllm/_moe_C.abi3.so": ("compute_120f:sm_120f",)},
}


def release_tree(release: str, root: Path) -> Path:
    """`root` holding SITE/vllm/*.so of one release (real shared libraries, compiled once and cached)."""
    libraries = RELEASES[release]
    built = build_fixtures(
        [Fixture(f"release-{'-'.join(g)}".replace(":", "_"), g, output="so") for g in set(libraries.values())]
    )
    for path, gencode in libraries.items():
        target = root / SITE / path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[f"release-{'-'.join(gencode)}".replace(":", "_")], target)
    return root
