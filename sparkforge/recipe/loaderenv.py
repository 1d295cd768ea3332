"""What a build recipe may bake into an image's ENV: an allow-list, like everything else a recipe supplies.

A variable passes when the serve allow-list allows it (sparkforge/recipe/allowlist.py: the pinned vLLM's own
variables minus what loads code, plus the reviewed resource-selecting library variables), or when it is one of
the few build-image entries below, each reviewed together with the one value it may take. Everything else,
including every variable that changes how processes find and load code (PATH, LD_*, PYTHON*, pip and TLS
settings), is refused with the file, the key and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from sparkforge.recipe.allowlist import env_verdict


@dataclass(frozen=True)
class ImageEnv:
    value: str  # a regular expression the whole value must match
    why: str


_PTXAS = ImageEnv(
    r"/opt/venv/cuda/bin/ptxas|/usr/local/cuda(-1[0-9]\.[0-9])?/bin/ptxas",
    "Triton's ptxas: the image's own CUDA toolkit, from NVIDIA's wheels or the CUDA base image (the ptxas "
    "bundled with older Tritons lacks sm_121a)",
)
IMAGE_ENV: dict[str, ImageEnv] = {
    "TRITON_PTXAS_PATH": _PTXAS,
    "TRITON_PTXAS_BLACKWELL_PATH": _PTXAS,  # Triton >= 3.5 reads this one for sm_100 and newer
    "RAY_memory_usage_threshold": ImageEnv(
        r"(0(\.[0-9]+)?|1(\.0+)?)",
        "the share of memory at which Ray's monitor kills workers (unified memory)",
    ),
}


def image_env_refusals(env: Mapping[str, str]) -> list[str]:
    """One line per entry the allow-list refuses: the name, why, and the fix (empty: every entry passes)."""
    refused = []
    for name, value in env.items():
        reviewed = IMAGE_ENV.get(name)
        if reviewed is not None:
            if not re.fullmatch(reviewed.value, str(value)):
                refused.append(
                    f"{name}={value!r}: reviewed only as {reviewed.value!r} ({reviewed.why}); fix: use that value"
                )
            continue
        verdict = env_verdict(name)
        if verdict.status != "allowed":
            refused.append(
                f"{name}: {verdict.status} ({verdict.reason}); fix: remove it (sparkforge sets the venv's PATH itself; "
                "ship a library through a component), or add it to IMAGE_ENV in sparkforge/recipe/loaderenv.py in "
                "a reviewed change"
            )
    return refused
