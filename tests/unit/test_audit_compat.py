"""The compatibility model, as a table: each row is one rule of NVIDIA's binary-compatibility guide."""

from __future__ import annotations

import pytest

from sparkforge.audit.compat import (
    GpuTarget,
    best_verdict,
    entry_verdict,
    parse_target,
    unit_counts,
    unit_verdict,
)
from sparkforge.audit.fatbin import Container, Entry
from sparkforge.errors import AuditError

# (kind, arch, variant, target, verdict)
RULES = [
    # plain cubins: same major, target minor >= cubin minor
    ("sass", 120, "", "sm_121", "native"),
    ("sass", 120, "", "sm_120", "native"),
    ("sass", 121, "", "sm_120", "none"),
    ("sass", 121, "", "sm_121", "native"),
    ("sass", 90, "", "sm_121", "none"),
    ("sass", 80, "", "sm_90", "none"),
    ("sass", 80, "", "sm_86", "native"),
    ("sass", 100, "", "sm_103", "native"),
    ("sass", 100, "", "sm_120", "none"),
    ("sass", 110, "", "sm_121", "none"),
    # `a` cubins: exactly that capability
    ("sass", 120, "a", "sm_121", "none"),
    ("sass", 120, "a", "sm_120", "native"),
    ("sass", 121, "a", "sm_121", "native"),
    ("sass", 90, "a", "sm_90", "native"),
    ("sass", 90, "a", "sm_121", "none"),
    ("sass", 100, "a", "sm_103", "none"),
    # `f` cubins: the family, later minors of the same major
    ("sass", 120, "f", "sm_121", "family"),
    ("sass", 120, "f", "sm_120", "family"),
    ("sass", 121, "f", "sm_121", "family"),
    ("sass", 121, "f", "sm_120", "none"),
    ("sass", 100, "f", "sm_121", "none"),
    ("sass", 100, "f", "sm_103", "family"),
    ("sass", 110, "f", "sm_121", "none"),
    # PTX: JIT for any capability >= its own
    ("ptx", 80, "", "sm_121", "jit"),
    ("ptx", 90, "", "sm_90", "jit"),
    ("ptx", 90, "", "sm_89", "none"),
    ("ptx", 121, "", "sm_120", "none"),
    ("ptx", 120, "", "sm_121", "jit"),
    ("ptx", 90, "a", "sm_90", "jit"),
    ("ptx", 90, "a", "sm_121", "none"),
    ("ptx", 120, "a", "sm_121", "none"),
    ("ptx", 120, "f", "sm_121", "jit"),
    ("ptx", 121, "f", "sm_120", "none"),
    ("ptx", 100, "f", "sm_121", "none"),
    # LTO IR and unknown kinds are never loadable on their own
    ("lto", 120, "", "sm_121", "none"),
    ("kind4", 121, "", "sm_121", "none"),
]


@pytest.mark.parametrize(("kind", "arch", "variant", "target", "verdict"), RULES)
def test_entry_verdict(kind: str, arch: int, variant: str, target: str, verdict: str) -> None:
    assert entry_verdict(kind, arch, variant, parse_target(target)) == verdict


@pytest.mark.parametrize(
    ("text", "major", "minor"),
    [("sm_121", 12, 1), ("sm_120", 12, 0), ("sm_90", 9, 0), ("sm_90a", 9, 0), ("SM_100f", 10, 0),
     ("121", 12, 1), ("12.1", 12, 1), ("9.0", 9, 0), ("compute_89", 8, 9), ("sm75", 7, 5)],
)  # fmt: skip
def test_parse_target(text: str, major: int, minor: int) -> None:
    target = parse_target(text)
    assert (target.major, target.minor) == (major, minor)
    assert target.name == f"sm_{major}{minor}"


@pytest.mark.parametrize("text", ["", "gb10", "sm_", "sm_1", "sm_12345", "12", "12.1x", "sm_121b"])
def test_parse_target_rejects(text: str) -> None:
    with pytest.raises(AuditError, match="not a CUDA architecture"):
        parse_target(text)


def test_best_verdict_order() -> None:
    assert best_verdict([]) == "none"
    assert best_verdict(["none", "jit"]) == "jit"
    assert best_verdict(["jit", "family", "none"]) == "family"
    assert best_verdict(["family", "native", "jit"]) == "native"


def _entry(key: str) -> Entry:
    kind, _, arch = key.partition("_")
    variant = arch[-1] if arch[-1] in "af" else ""
    return Entry(kind, int(arch.rstrip("af")), variant, "none", 0, 64, 0, 0, 0)  # type: ignore[arg-type]


def _unit(*keys: str) -> Container:
    return Container(offset=0, size=0, section=".nv_fatbin", entries=tuple(_entry(k) for k in keys))


def test_units_take_their_own_best() -> None:
    gb10 = GpuTarget(12, 1)
    units = [
        _unit("sass_90a"),  # Hopper-only unit in a multi-arch library
        _unit("sass_80", "sass_120", "ptx_80"),
        _unit("sass_100f", "sass_120f"),
        _unit("sass_80", "ptx_80"),
        _unit(),
    ]
    assert [unit_verdict(u, gb10) for u in units] == ["none", "native", "family", "jit", "none"]
    assert unit_counts(units, gb10) == {"native": 1, "family": 1, "jit": 1, "none": 2}
    assert unit_counts(units, GpuTarget(9, 0)) == {"native": 1, "family": 0, "jit": 2, "none": 2}
