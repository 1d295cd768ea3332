"""Which fatbin entries can run on a GPU target, following NVIDIA's binary-compatibility rules.

- SASS for X.y runs on X.z when z >= y (same major); `a` SASS only on exactly X.y.
- `f` SASS for X.y runs on X.z when z >= y (same major): the family, reported apart from plain cubins.
- PTX compute_XX is JIT-compiled for any capability >= XX; `a` PTX only for exactly XX; `f` PTX within
  the family as `f` SASS.
- LTO IR and unknown kinds cannot be loaded by the driver on their own.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from sparkforge.audit.fatbin import Container, Entry
from sparkforge.errors import AuditError

Verdict = Literal["native", "family", "jit", "none"]
VERDICTS: tuple[Verdict, ...] = ("native", "family", "jit", "none")
_RANK: dict[Verdict, int] = {"none": 0, "jit": 1, "family": 2, "native": 3}
MIN_ARCH = 30  # below Kepler a number like "12" is a typo, not a GPU
_TARGET = re.compile(r"^(?:sm_?|compute_?)?(\d{2,3})([af]?)$|^(\d{1,2})\.(\d)([af]?)$")


@dataclass(frozen=True, slots=True)
class GpuTarget:
    """A GPU's compute capability, e.g. 12.1 for GB10."""

    major: int
    minor: int

    @property
    def arch(self) -> int:
        return self.major * 10 + self.minor

    @property
    def name(self) -> str:
        return f"sm_{self.arch}"


def parse_target(text: str) -> GpuTarget:
    """`sm_121`, `sm_90a`, `121` or `12.1` as a capability; a suffix names the same GPU and is dropped."""
    match = _TARGET.match(text.strip().lower())
    arch = int(match.group(1) or 0) if match else 0
    if not match or (match.group(1) and arch < MIN_ARCH):
        raise AuditError(
            f"GPU target {text!r} is not a CUDA architecture. "
            f"Use a name like sm_121 (DGX Spark), sm_120, sm_90 or a capability like 12.1."
        )
    if match.group(1):
        return GpuTarget(arch // 10, arch % 10)
    return GpuTarget(int(match.group(3)), int(match.group(4)))


def arch_capability(arch: int) -> tuple[int, int]:
    """The (major, minor) of a fatbin arch number: 90 -> (9, 0), 121 -> (12, 1)."""
    return arch // 10, arch % 10


def entry_verdict(kind: str, arch: int, variant: str, target: GpuTarget) -> Verdict:
    """How an entry for `kind`/`arch`/`variant` can run on `target`."""
    major, minor = arch_capability(arch)
    exact = (major, minor) == (target.major, target.minor)
    in_family = major == target.major and target.minor >= minor
    if kind == "sass":
        if variant == "a":
            return "native" if exact else "none"
        if variant == "f":
            return "family" if in_family else "none"
        return "native" if in_family else "none"
    if kind == "ptx":
        if variant == "a":
            ok = exact
        elif variant == "f":
            ok = in_family
        else:
            ok = (target.major, target.minor) >= (major, minor)
        return "jit" if ok else "none"
    return "none"


_CMAKE_ARCH = re.compile(r"^(\d+)\.(\d)([af]?)(\+PTX)?$")


def cmake_arch_verdict(entry: str, target: GpuTarget) -> Verdict:
    """How code CMake builds for one arch-list entry ('12.0f', '8.0+PTX') runs on `target`: its SASS, and its
    PTX when '+PTX' asks for it, judged by the same rule as the entries of a real fatbin."""
    match = _CMAKE_ARCH.match(entry.strip())
    if match is None:
        return "none"
    arch, variant = int(match[1]) * 10 + int(match[2]), match[3]
    verdicts = [entry_verdict("sass", arch, variant, target)]
    if match[4]:
        verdicts.append(entry_verdict("ptx", arch, variant, target))
    return best_verdict(verdicts)


def verdict_of(entry: Entry, target: GpuTarget) -> Verdict:
    return entry_verdict(entry.kind, entry.arch, entry.variant, target)


def best_verdict(verdicts: Iterable[Verdict]) -> Verdict:
    """The best way anything can run: native > family > jit > none (none for no entries)."""
    return max(verdicts, key=_RANK.__getitem__, default="none")


def unit_verdict(container: Container, target: GpuTarget) -> Verdict:
    """A compilation unit's verdict: the best of its entries."""
    return best_verdict(verdict_of(e, target) for e in container.entries)


def stranded_units(containers: Iterable[Container], target: GpuTarget) -> int:
    """Units built for the target's own GPU generation (e.g. sm_120a for sm_121) that cannot run on it.

    A library can pass on the strength of its generic kernels while every kernel written for this generation
    (vLLM's SM12x FP8 / NVFP4 / MoE groups) was built for a sibling `a` target: that is the silent slow path.
    """
    return sum(
        1
        for c in containers
        if unit_verdict(c, target) == "none" and any(e.arch // 10 == target.major for e in c.entries)
    )


def unit_counts(containers: Iterable[Container], target: GpuTarget) -> dict[str, int]:
    """How many units (containers) run natively, through the family, only through JIT, or not at all."""
    counts = Counter(unit_verdict(c, target) for c in containers)
    return {v: counts.get(v, 0) for v in VERDICTS}
