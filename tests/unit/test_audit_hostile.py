"""Corrupt, truncated and hostile input: a clear AuditError or "no device code", fast and in bounded memory."""

from __future__ import annotations

import io
import os
import random
import struct
import tarfile
import time
import tracemalloc
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from audit_fixtures import build_fixtures, nvcc_available

from sparkforge.audit.fatbin import MAX_ENTRIES_PER_FILE, FatbinFile, parse_buffer, read_fatbin_file
from sparkforge.audit.scan import audit_tar_stream, audit_target
from sparkforge.errors import AuditError

SECONDS = 2.0
PEAK_BYTES = 32 << 20


@contextmanager
def bounded(seconds: float = SECONDS, peak: int = PEAK_BYTES) -> Iterator[None]:
    """The block must finish within `seconds` of CPU time (a loaded CI machine stretches wall time, not CPU time)
    and allocate at most `peak` bytes of Python memory."""
    tracemalloc.start()
    start = time.process_time()
    try:
        yield
    finally:
        elapsed = time.process_time() - start
        _, used = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert elapsed < seconds, f"took {elapsed:.2f}s"
    assert used < peak, f"peak {used >> 20} MiB"


def outcome(read: Callable[[], FatbinFile | None]) -> str:
    """'none', 'fatbin' or 'error'; any other exception fails the test."""
    try:
        return "none" if read() is None else "fatbin"
    except AuditError:
        return "error"


# --- a minimal ELF64 writer, so the hostile layouts need no compiler ---------------------------------------


def entry(kind: int = 2, arch: int = 121, flags: int = 0x11, payload: bytes = b"\0" * 32, *,
          header_size: int = 64, payload_size: int | None = None) -> bytes:  # fmt: skip
    size = len(payload) if payload_size is None else payload_size
    head = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x101, header_size, size, 0, 0, 8, 1, arch, 0, 0, flags, 0, 0)
    return head + b"\0" * min(max(0, header_size - 64), 4096) + payload  # claimed sizes may be lies


def container(*entries: bytes, size: int | None = None, version: int = 1, header_size: int = 16) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, version, header_size, len(body) if size is None else size) + body


def elf(sections: list[tuple[str, bytes]], *, flags: int = 0x2, extended: bool = False) -> bytes:
    """An ELF64 shared object holding `sections` (PROGBITS, allocated) plus .shstrtab."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n, _ in sections) + b".shstrtab\0"
    blob = bytearray(b"\0" * 64)
    headers = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    name_at = 1
    for name, data in [*sections, (".shstrtab", names)]:
        blob += b"\0" * (-len(blob) % 8)
        sh_type, sh_flags = (3, 0) if name == ".shstrtab" else (1, flags)
        headers.append(
            struct.pack("<IIQQQQIIQQ", name_at, sh_type, sh_flags, 0, len(blob), len(data), 0, 0, 8, 0)
        )
        name_at += len(name) + 1
        blob += data
    blob += b"\0" * (-len(blob) % 8)
    shoff, shnum = len(blob), len(headers)
    if extended:  # count and string-table index live in section 0, as for objects with > 65279 sections
        headers[0] = struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, shnum, shnum - 1, 0, 0, 0)
    blob += b"".join(headers)
    ident = b"\x7fELF\x02\x01\x01" + b"\0" * 9
    blob[:64] = struct.pack("<16sHHIQQQIHHHHHH", ident, 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64,
                            0 if extended else shnum, 0xFFFF if extended else shnum - 1)  # fmt: skip
    return bytes(blob)


def fatbin_elf(*containers: bytes) -> bytes:
    return elf([(".text", b"\xc3" * 16), (".nv_fatbin", b"".join(containers))])


def test_writer_makes_files_the_reader_accepts() -> None:
    good = fatbin_elf(container(entry(arch=120, flags=0x200011), entry(kind=1, arch=90)))
    fatbin = parse_buffer(good, "good")
    assert fatbin is not None
    assert [e.key for e in fatbin.entries] == ["sass_120f", "ptx_90"]
    extended = elf([(".nv_fatbin", container(entry()))], extended=True)
    parsed = parse_buffer(extended, "extended")
    assert parsed is not None and [e.key for e in parsed.entries] == ["sass_121"]


NOT_FATBINS = [
    ("empty", b""),
    ("three bytes of ELF magic", b"\x7fEL"),
    ("text", b"#!/bin/sh\necho hi\n"),
    ("random", random.Random(1).randbytes(4 << 20)),
    ("32-bit ELF", b"\x7fELF\x01\x01\x01" + b"\0" * 57),
    ("big-endian ELF", b"\x7fELF\x02\x02\x01" + b"\0" * 57),
    ("no section headers", b"\x7fELF\x02\x01\x01" + b"\0" * 57),
]


@pytest.mark.parametrize(("name", "data"), NOT_FATBINS, ids=[n for n, _ in NOT_FATBINS])
def test_not_a_fatbin(tmp_path: Path, name: str, data: bytes) -> None:
    path = tmp_path / "input"
    path.write_bytes(data)
    with bounded():
        assert read_fatbin_file(path) is None


def _hostile() -> list[tuple[str, bytes, str]]:
    good = fatbin_elf(container(entry()))
    shoff_past_eof = bytearray(good)
    struct.pack_into("<Q", shoff_past_eof, 0x28, len(good) + 4096)
    huge_shnum = bytearray(good)
    struct.pack_into("<H", huge_shnum, 0x3C, 0xFFFE)
    section_past_eof = bytearray(good)
    shoff = struct.unpack_from("<Q", good, 0x28)[0]
    struct.pack_into("<Q", section_past_eof, shoff + 2 * 64 + 32, 1 << 40)  # .nv_fatbin sh_size
    rng = random.Random(7)
    return [
        ("truncated ELF header", good[:40], "truncated"),
        ("section table past EOF", bytes(shoff_past_eof), "outside the file"),
        ("65534 sections", bytes(huge_shnum), "runs past the end"),
        ("section past EOF", bytes(section_past_eof), "runs past the end"),
        (
            "zero entry header size (loop)",
            fatbin_elf(container(entry(header_size=0) + b"\0" * 64)),
            "header size 0",
        ),
        ("huge entry header size", fatbin_elf(container(entry(header_size=1 << 31))), "header size"),
        ("payload past container", fatbin_elf(container(entry(payload_size=1 << 62))), "payload size"),
        ("container past section", fatbin_elf(container(entry(), size=1 << 40)), "past .nv_fatbin end"),
        ("container version 7", fatbin_elf(container(entry(), version=7)), "version 7"),
        ("container header size 0", fatbin_elf(container(entry(), header_size=0)), "header size 0"),
        ("half an entry header", fatbin_elf(container(size=40) + b"\x02" * 40), "runs past the container"),
        ("garbage after a container", fatbin_elf(container(entry()) + b"\xff" * 64), "unexpected bytes"),
        ("random section", fatbin_elf(b"\x50\xed\x55\xba" + rng.randbytes(1 << 20)), "not a valid CUDA"),
        ("raw fatbin, random", b"\x50\xed\x55\xba" + rng.randbytes(1 << 20), "not a valid CUDA"),
        ("raw fatbin, 4 bytes", b"\x50\xed\x55\xba", "container header"),
    ]


@pytest.mark.parametrize(("name", "data", "message"), _hostile(), ids=[h[0] for h in _hostile()])
def test_hostile_layouts_raise_audit_error(tmp_path: Path, name: str, data: bytes, message: str) -> None:
    path = tmp_path / "hostile.so"
    path.write_bytes(data)
    with bounded(), pytest.raises(AuditError, match=message) as info:
        read_fatbin_file(path)
    assert str(path) in str(info.value) and "rebuild" in str(info.value)  # what, where, fix


def test_entry_count_is_bounded() -> None:
    many = fatbin_elf(container(*[entry(payload=b"")] * (MAX_ENTRIES_PER_FILE + 1)))
    start = time.process_time()
    with pytest.raises(AuditError, match="more than"):
        parse_buffer(many, "many")
    assert time.process_time() - start < SECONDS  # timed apart: tracing allocations slows this loop 5x
    sample = 20_000  # memory per entry, measured on a sample, bounds the whole budget
    with bounded(seconds=30, peak=sample * 400):
        fatbin = parse_buffer(fatbin_elf(container(*[entry(payload=b"")] * sample)), "sample")
    assert fatbin is not None and len(list(fatbin.entries)) == sample


def test_zero_padding_between_containers_is_accepted() -> None:
    # Linkers align each unit's section, leaving zero runs between containers (seen in vLLM's _C).
    padded = fatbin_elf(container(entry()) + b"\0" * 240, container(entry(arch=90)) + b"\0" * 16)
    fatbin = parse_buffer(padded, "padded")
    assert fatbin is not None and [e.key for e in fatbin.entries] == ["sass_121", "sass_90"]


def test_stray_magic_in_data_is_not_a_fatbin() -> None:
    rng = random.Random(3)
    noise = bytearray(rng.randbytes(1 << 20))
    for at in range(0, len(noise), 4096):  # aligned magics followed by nonsense headers
        noise[at : at + 4] = b"\x50\xed\x55\xba"
    data = elf([(".rodata", bytes(noise))])
    with bounded():
        assert parse_buffer(data, "noise") is None


@pytest.mark.skipif(not nvcc_available(), reason="nvcc 13 not found at /usr/local/cuda-13.0/bin/nvcc")
@pytest.mark.parametrize("name", ["mix_so", "mix_zstd", "embedded", "raw_fatbin"])
def test_real_files_truncated_and_flipped(name: str) -> None:
    data = build_fixtures()[name].read_bytes()
    rng = random.Random(name)
    seen: set[str] = set()
    with bounded(seconds=10):
        for cut in range(0, len(data), max(1, len(data) // 300)):
            seen.add(outcome(lambda c=cut: parse_buffer(data[:c], name)))
        for _ in range(300):
            flipped = bytearray(data)
            for _ in range(8):
                flipped[rng.randrange(len(flipped))] = rng.randrange(256)
            seen.add(outcome(lambda f=bytes(flipped): parse_buffer(f, name)))
    assert "error" in seen  # truncation must be noticed, not read as a shorter valid file


def test_corrupt_member_of_a_wheel_is_reported_not_fatal(tmp_path: Path) -> None:
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("pkg/_good.so", fatbin_elf(container(entry(arch=120))))
        archive.writestr("pkg/_broken.so", fatbin_elf(container(entry(), size=1 << 40)))
        archive.writestr("pkg/__init__.py", "")
    with bounded():
        report = audit_target(wheel, require=["pkg/_good*.so", "pkg/_broken*.so"])
    assert [lib["path"] for lib in report.extra["libraries"]] == ["pkg/_good.so"]
    good, broken = report.checks
    assert good.status == "passed"
    assert broken.status == "failed" and "unreadable: pkg/_broken.so" in broken.reason
    assert report.extra["summary"]["unreadable"] == 1


def test_special_files_in_a_directory_do_not_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")  # opening it for reading would block forever
    (tmp_path / "lib.so").write_bytes(fatbin_elf(container(entry())))
    (tmp_path / "loop").symlink_to(tmp_path)
    with bounded():
        report = audit_target(tmp_path)
    assert [lib["path"] for lib in report.extra["libraries"]] == ["lib.so"]


@pytest.mark.parametrize(
    ("name", "stream"),
    [
        ("not a tar", lambda: io.BytesIO(b"\x7fELF" + b"\0" * 2000)),
        ("empty", lambda: io.BytesIO(b"")),
        ("truncated", lambda: io.BytesIO(_tar_bytes()[:3000])),
    ],
)
def test_bad_tar_streams(name: str, stream: Callable[[], io.BytesIO]) -> None:
    with bounded(), pytest.raises(AuditError, match="tar stream could not be read"):
        audit_tar_stream(stream(), subject=name)


def _tar_bytes() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        data = fatbin_elf(container(entry(payload=b"\0" * 8192)))
        info = tarfile.TarInfo("usr/lib/libk.so")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_bad_targets(tmp_path: Path) -> None:
    with pytest.raises(AuditError, match="no such file or directory"):
        audit_target(tmp_path / "missing.whl")
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    with pytest.raises(AuditError, match="not a directory, wheel/zip, tar"):
        audit_target(notes)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with bounded(), pytest.raises(AuditError, match="not a regular file"):
        audit_target(fifo)
    broken = tmp_path / "broken.so"
    broken.write_bytes(fatbin_elf(container(entry(), size=1 << 40)))
    with pytest.raises(AuditError, match=r"broken\.so"):
        audit_target(broken)
