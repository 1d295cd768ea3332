"""Read CUDA fatbinary headers from ELF64 files, object files and raw .fatbin files, without decompressing.

Layout (validated against cuobjdump, see shared/facts/gb10.md): a container is a 16-byte header
(u32 magic 0xBA55ED50, u16 version, u16 header size, u64 size of the entries) followed by entries,
each a header of at least 64 bytes (its own size field says how long) and a payload.
Every loop below advances by at least one header and is bounded by the bytes that remain,
so hostile offsets cannot make it spin, and nothing is read outside the section it belongs to.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

from sparkforge.audit.elf import (
    ELF_MAGIC,
    EM_CUDA,
    SHT_NOBITS,
    Buffer,
    corrupt,
    elf_sections,
    is_data_section,
    section_bounds,
)
from sparkforge.boundary import open_binary
from sparkforge.errors import AuditError, InputError

# Part of every kept answer's key (verify/auditcache.py): bump it when the same bytes would be read differently.
READER_VERSION = 1
FATBIN_MAGIC = 0xBA55ED50
FATBIN_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)

# Sections that hold device code, in cuobjdump's order of preference: the executable
# fatbin when there is one, else the relocatable one (-rdc objects).
EXECUTABLE_SECTION = ".nv_fatbin"
RELOCATABLE_SECTION = "__nv_relfatbin"

KIND_NAMES = {1: "ptx", 2: "sass", 8: "lto"}
FLAG_ARCH_SPECIFIC = 0x100000  # `a` targets: sm_90a, compute_120a
FLAG_FAMILY = 0x200000  # `f` targets: sm_120f, compute_100f
FLAG_ZSTD = 0x8000  # CUDA 13 default compression
FLAG_LZ4 = 0x2000  # CUDA 12 compression, `-compress-mode=speed` in CUDA 13

# Bounds that no real library comes near (torch 2.14's 461 MB libtorch_cuda.so holds
# 2,558 entries) but that keep hostile input from costing unbounded time or memory.
MAX_ENTRIES_PER_FILE = 200_000
MAX_ENTRY_HEADER = 4096
MAX_NAME = 256
MAX_FILE_BYTES = 1 << 40  # a library or object file on disk: mapped, never read whole
CHUNK = 1 << 20

_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHIIIQQQ")

Variant = Literal["", "a", "f"]
Compression = Literal["none", "zstd", "lz4"]
FileFormat = Literal["elf", "fatbin"]


class Entry(NamedTuple):
    """One cubin (SASS), PTX or LTO-IR entry of a container, described from its header alone.

    A NamedTuple rather than a frozen dataclass: libraries hold thousands of entries and a hostile file
    up to MAX_ENTRIES_PER_FILE, and a tuple is built several times faster.
    """

    kind: str
    arch: int
    variant: Variant
    compression: Compression
    offset: int
    header_size: int
    payload_size: int
    uncompressed_size: int
    flags: int
    name: str = ""

    @property
    def key(self) -> str:
        """The report's name for this entry's target, e.g. sass_120f, ptx_90a, lto_90."""
        return f"{self.kind}_{self.arch}{self.variant}"

    @property
    def payload_offset(self) -> int:
        return self.offset + self.header_size


@dataclass(frozen=True, slots=True)
class Container:
    """One fatbin container: the device code of one compilation unit (or one device-link step)."""

    offset: int
    size: int
    section: str
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class FatbinFile:
    """Every fatbin container found in one file."""

    format: FileFormat
    machine: int
    containers: tuple[Container, ...]
    embedded: bool = False

    @property
    def entries(self) -> Iterator[Entry]:
        for container in self.containers:
            yield from container.entries


def entry_variant(flags: int) -> Variant:
    """The target suffix an entry was built for: `a`, `f` or plain."""
    if flags & FLAG_ARCH_SPECIFIC:
        return "a"
    if flags & FLAG_FAMILY:
        return "f"
    return ""


def entry_compression(flags: int) -> Compression:
    if flags & FLAG_ZSTD:
        return "zstd"
    if flags & FLAG_LZ4:
        return "lz4"
    return "none"


def _entry_name(buf: Buffer, start: int, header_size: int, name_offset: int, name_len: int) -> str:
    # The optional source name (set by -G builds) lies inside the header; ignore it if it points elsewhere.
    if name_offset < _ENTRY.size or name_len == 0 or name_offset + name_len > header_size:
        return ""
    raw = buf[start + name_offset : start + name_offset + min(name_len, MAX_NAME)]
    return raw.split(b"\0", 1)[0].decode("ascii", "replace")


def parse_entries(buf: Buffer, start: int, end: int, where: str, budget: list[int]) -> tuple[Entry, ...]:
    """Entries laid back to back in [start, end); `budget` holds how many more entries may be read."""
    entries: list[Entry] = []
    append, unpack = entries.append, _ENTRY.unpack_from  # the loop runs per entry: keep it lean
    pos = start
    while pos < end:
        if end - pos < _ENTRY.size:
            raise corrupt(where, f"entry header at offset {pos:#x} runs past the container end {end:#x}")
        (
            kind,
            _,
            header_size,
            payload_size,
            _compressed,
            _options,
            _minor,
            _major,
            arch,
            name_offset,
            name_len,
            flags,
            _,
            uncompressed,
        ) = unpack(buf, pos)
        if not _ENTRY.size <= header_size <= MAX_ENTRY_HEADER:
            raise corrupt(where, f"entry at offset {pos:#x} has header size {header_size}")
        if payload_size > end - pos - header_size:
            raise corrupt(
                where, f"entry at offset {pos:#x} has payload size {payload_size} past its container"
            )
        budget[0] -= 1
        if budget[0] < 0:
            raise corrupt(where, f"more than {MAX_ENTRIES_PER_FILE} fatbin entries")
        compression = entry_compression(flags)
        append(
            Entry(
                KIND_NAMES.get(kind) or f"kind{kind}",
                arch,
                entry_variant(flags),
                compression,
                pos,
                header_size,
                payload_size,
                payload_size if compression == "none" else uncompressed,
                flags,
                _entry_name(buf, pos, header_size, name_offset, name_len) if name_len else "",
            )
        )
        pos += header_size + payload_size
    return tuple(entries)


def parse_container(
    buf: Buffer, pos: int, end: int, section: str, where: str, budget: list[int]
) -> Container:
    """The container whose magic is at `pos`; it must end by `end`."""
    if end - pos < _CONTAINER.size:
        raise corrupt(where, f"container header at offset {pos:#x} runs past {section} end {end:#x}")
    magic, version, header_size, size = _CONTAINER.unpack_from(buf, pos)
    if magic != FATBIN_MAGIC:
        raise corrupt(where, f"no fatbin magic at offset {pos:#x} in {section}")
    if version != 1 or not _CONTAINER.size <= header_size <= MAX_ENTRY_HEADER:
        raise corrupt(where, f"container at offset {pos:#x} has version {version}, header size {header_size}")
    if size > end - pos - header_size:
        raise corrupt(where, f"container at offset {pos:#x} has size {size} past {section} end {end:#x}")
    entries = parse_entries(buf, pos + header_size, pos + header_size + size, where, budget)
    return Container(offset=pos, size=header_size + size, section=section, entries=entries)


def _all_zero(buf: Buffer, start: int, end: int) -> bool:
    """Whether [start, end) holds only zero bytes; checked in chunks so memory stays bounded."""
    return not any(buf[i : min(end, i + CHUNK)].strip(b"\0") for i in range(start, end, CHUNK))


def _align8(value: int) -> int:
    return (value + 7) & ~7


def parse_section(
    buf: Buffer, start: int, end: int, section: str, where: str, budget: list[int]
) -> list[Container]:
    """Containers laid back to back (8-byte aligned, zero padding between) in a fatbin section."""
    containers: list[Container] = []
    pos = start
    while pos < end:
        if buf[pos : pos + 4] != FATBIN_MAGIC_BYTES:
            # Linkers pad input sections to their alignment with zeros; anything else is a broken section.
            nxt = buf.find(FATBIN_MAGIC_BYTES, pos, end)
            gap_end = end if nxt < 0 else nxt
            if not _all_zero(buf, pos, gap_end) or (nxt >= 0 and nxt % 8):
                raise corrupt(where, f"unexpected bytes at offset {pos:#x} in {section} (no fatbin magic)")
            if nxt < 0:
                break
            pos = nxt
        container = parse_container(buf, pos, end, section, where, budget)
        containers.append(container)
        pos = _align8(pos + container.size)
    return containers


def scan_embedded(
    buf: Buffer, start: int, end: int, section: str, where: str, budget: list[int]
) -> list[Container]:
    """Containers found anywhere in a data section (fatbins embedded as byte arrays), each fully valid."""
    containers: list[Container] = []
    pos = buf.find(FATBIN_MAGIC_BYTES, start, end)
    while pos >= 0:
        nxt = pos + 4
        if pos % 8 == 0:
            try:
                container = parse_container(buf, pos, end, section, where, budget)
            except AuditError:
                container = None  # a stray magic in ordinary data, not a fatbin
            if (
                container is not None
                and container.entries
                and all(e.kind in ("sass", "ptx", "lto") for e in container.entries)
            ):
                containers.append(container)
                nxt = _align8(pos + container.size)
        pos = buf.find(FATBIN_MAGIC_BYTES, nxt, end)
    return containers


def parse_elf(buf: Buffer, where: str) -> FatbinFile | None:
    """Device code of an ELF64 file: its fatbin section, else fatbins embedded in its data sections."""
    sections = elf_sections(buf, where)
    if not sections:
        return None
    (machine,) = struct.unpack_from("<H", buf, 0x12)
    if machine == EM_CUDA:
        return None  # a bare cubin is device code itself, not a host file carrying fatbins
    budget = [MAX_ENTRIES_PER_FILE]
    size = len(buf)
    for wanted in (EXECUTABLE_SECTION, RELOCATABLE_SECTION):
        found = [s for s in sections if s.name == wanted and s.type != SHT_NOBITS]
        if found:
            containers: list[Container] = []
            for section in found:
                start, end = section_bounds(section, size, where)
                containers.extend(parse_section(buf, start, end, section.name, where, budget))
            return FatbinFile(format="elf", machine=machine, containers=tuple(containers))
    embedded: list[Container] = []
    for section in sections:
        if (
            is_data_section(section, _CONTAINER.size + _ENTRY.size)
            and section.offset <= size
            and section.size <= size - section.offset
        ):
            embedded.extend(
                scan_embedded(buf, section.offset, section.offset + section.size, section.name, where, budget)
            )
    if not embedded:
        return None
    return FatbinFile(format="elf", machine=machine, containers=tuple(embedded), embedded=True)


def parse_buffer(buf: Buffer, where: str) -> FatbinFile | None:
    """Device code in a whole file's bytes; None when the file is neither ELF nor a raw fatbin."""
    head = buf[:4]
    if head == ELF_MAGIC:
        return parse_elf(buf, where)
    if head == FATBIN_MAGIC_BYTES:
        containers = parse_section(buf, 0, len(buf), "fatbin", where, [MAX_ENTRIES_PER_FILE])
        return FatbinFile(format="fatbin", machine=0, containers=tuple(containers))
    return None


def is_candidate(head: bytes) -> bool:
    """Whether a file's first 4 bytes say it may carry device code (ELF or raw fatbin)."""
    return head[:4] in (ELF_MAGIC, FATBIN_MAGIC_BYTES)


@contextmanager
def mapped(path: Path) -> Iterator[Buffer | None]:
    """The file's bytes mapped read-only, or None when it is empty or not a candidate; never read whole."""
    with open_binary(path, "", MAX_FILE_BYTES) as handle:
        head = handle.read(4)
        if len(head) < 4 or not is_candidate(head):
            yield None
            return
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as view:
            yield view


def read_fatbin_file(path: Path, where: str | None = None) -> FatbinFile | None:
    """Device code of the file at `path`; None when it carries none; AuditError when it is corrupt."""
    label = where or str(path)
    try:
        with mapped(path) as buf:
            return None if buf is None else parse_buffer(buf, label)
    except OSError as exc:
        raise AuditError(
            f"{label}: cannot read ({exc.strerror or exc}). Check that the file exists and is readable."
        ) from exc
    except InputError as exc:  # a FIFO, device or link to a system file where a library was expected
        raise AuditError(str(exc)) from None
