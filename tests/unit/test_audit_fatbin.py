"""The fatbin reader on real nvcc 13 output, checked against NVIDIA's cuobjdump."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from audit_fixtures import (
    BY_NAME,
    FIXTURES,
    as_cuobjdump_sees,
    build_fixtures,
    cuobjdump_counts,
    find_cuobjdump,
    nvcc_available,
)

from sparkforge.audit.fatbin import parse_buffer, read_fatbin_file
from sparkforge.audit.scan import audit_target

pytestmark = pytest.mark.skipif(
    not nvcc_available(), reason="nvcc 13 not found at /usr/local/cuda-13.0/bin/nvcc"
)


@pytest.fixture(scope="session")
def fixtures() -> dict[str, Path]:
    return build_fixtures()


@pytest.fixture(scope="session")
def cuobjdump() -> Path:
    found = find_cuobjdump()
    if found is None:
        pytest.skip("cuobjdump not found: pip install nvidia-cuda-cuobjdump")
    return found


PINNED = [f for f in FIXTURES if f.entries]


@pytest.mark.parametrize("name", [f.name for f in PINNED])
def test_entries_match_what_was_compiled(fixtures: dict[str, Path], name: str) -> None:
    fatbin = read_fatbin_file(fixtures[name])
    assert fatbin is not None
    assert Counter(e.key for e in fatbin.entries) == Counter(BY_NAME[name].entries)


@pytest.mark.parametrize("name", [f.name for f in FIXTURES])
@pytest.mark.parametrize("target", ["sm_90", "sm_120", "sm_121"])
def test_library_verdict(fixtures: dict[str, Path], name: str, target: str) -> None:
    report = audit_target(fixtures[name], gpu=target)
    (library,) = report.extra["libraries"]
    assert library["verdict"] == BY_NAME[name].verdicts[target]


@pytest.mark.parametrize("name", [f.name for f in FIXTURES if f.name != "embedded"])
def test_counts_equal_cuobjdump(fixtures: dict[str, Path], cuobjdump: Path, name: str) -> None:
    fatbin = read_fatbin_file(fixtures[name])
    assert fatbin is not None
    expected = cuobjdump_counts(cuobjdump, fixtures[name])
    assert expected, "cuobjdump listed nothing: the oracle itself is broken"
    assert as_cuobjdump_sees(fatbin.entries) == expected


def test_family_cubins_told_apart_from_plain(fixtures: dict[str, Path], cuobjdump: Path) -> None:
    # cuobjdump prints sm_120f cubins as sm_120; the header flags say which is which.
    plain, family = read_fatbin_file(fixtures["sm_120"]), read_fatbin_file(fixtures["sm_120f"])
    assert plain is not None and family is not None
    assert cuobjdump_counts(cuobjdump, fixtures["sm_120"]) == cuobjdump_counts(cuobjdump, fixtures["sm_120f"])
    assert [e.variant for e in plain.entries] == [""]
    assert [e.variant for e in family.entries] == ["f"]


def test_compression_modes(fixtures: dict[str, Path]) -> None:
    def kinds(name: str) -> set[tuple[str, str]]:
        fatbin = read_fatbin_file(fixtures[name])
        assert fatbin is not None
        return {(e.kind, e.compression) for e in fatbin.entries}

    assert kinds("mix_zstd") == {("sass", "zstd"), ("ptx", "zstd")}
    assert ("ptx", "lz4") in kinds("mix_lz4")
    assert kinds("mix_so") == {("sass", "none"), ("ptx", "none")}
    zstd = read_fatbin_file(fixtures["mix_zstd"])
    assert zstd is not None
    for entry in zstd.entries:
        assert entry.uncompressed_size > entry.payload_size > 0


def test_uncompressed_payloads_are_what_they_claim(fixtures: dict[str, Path]) -> None:
    data = fixtures["mix_so"].read_bytes()
    fatbin = parse_buffer(data, "mix_so")
    assert fatbin is not None
    for entry in fatbin.entries:
        payload = data[entry.payload_offset : entry.payload_offset + entry.payload_size]
        if entry.kind == "sass":
            assert payload[:4] == b"\x7fELF" and payload[18] == 190  # a cubin: ELF for EM_CUDA
        else:
            assert b".target sm_90" in payload


def test_shared_library_has_one_container_per_unit_and_link(fixtures: dict[str, Path]) -> None:
    fatbin = read_fatbin_file(fixtures["mix_so"])
    assert fatbin is not None and fatbin.format == "elf" and not fatbin.embedded
    assert len(fatbin.containers) == 2  # the kernel's unit and nvcc's device-link unit
    assert all(c.section == ".nv_fatbin" for c in fatbin.containers)
    assert [c.offset % 8 for c in fatbin.containers] == [0, 0]


def test_relocatable_objects_read_relfatbin_with_lto(fixtures: dict[str, Path]) -> None:
    fatbin = read_fatbin_file(fixtures["rdc_lto"])
    assert fatbin is not None
    assert {c.section for c in fatbin.containers} == {"__nv_relfatbin"}
    assert {e.kind for e in fatbin.entries} == {"sass", "lto"}


def test_raw_fatbin_file(fixtures: dict[str, Path]) -> None:
    fatbin = read_fatbin_file(fixtures["raw_fatbin"])
    assert fatbin is not None and fatbin.format == "fatbin" and fatbin.machine == 0


def test_embedded_fatbin_found_where_cuobjdump_sees_none(fixtures: dict[str, Path], cuobjdump: Path) -> None:
    fatbin = read_fatbin_file(fixtures["embedded"])
    assert fatbin is not None and fatbin.embedded
    assert [c.section for c in fatbin.containers] == [".rodata"]
    assert cuobjdump_counts(cuobjdump, fixtures["embedded"]) == Counter()


def test_host_only_files_carry_nothing(tmp_path: Path) -> None:
    assert read_fatbin_file(Path("/bin/ls")) is None  # ELF without device code
    text = tmp_path / "notes.txt"
    text.write_text("not a binary\n")
    assert read_fatbin_file(text) is None
