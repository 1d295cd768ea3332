"""The little of ELF64 the audit needs: section headers and names, read with every offset checked."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol

from sparkforge.errors import AuditError

ELF_MAGIC = b"\x7fELF"
SHT_PROGBITS = 1
SHT_NOBITS = 8
SHF_ALLOC = 0x2
SHF_EXECINSTR = 0x4
EM_CUDA = 190
MAX_SECTIONS = 1 << 18  # objects built with -ffunction-sections pass 65,279 sections; none come near this

_SECTION = struct.Struct("<IIQQQQIIQQ")


class Buffer(Protocol):
    """What the parser needs of its input: bytes, bytearray and mmap all qualify."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: slice, /) -> bytes: ...

    def find(self, sub: bytes, start: int = ..., end: int = ..., /) -> int: ...


@dataclass(frozen=True, slots=True)
class Section:
    """One section header: its name, type, flags and where its bytes lie in the file."""

    name: str
    type: int
    flags: int
    offset: int
    size: int


def corrupt(where: str, what: str) -> AuditError:
    """A what/where/fix error for a binary whose headers do not add up."""
    return AuditError(
        f"{where}: {what}. The file is truncated or not a valid CUDA binary; "
        f"re-download or rebuild it (compare its size and sha256 with the source)."
    )


def elf_sections(buf: Buffer, where: str) -> list[Section] | None:
    """Section headers of a little-endian ELF64 file; None for other ELF classes (no CUDA host code there)."""
    size = len(buf)
    if size < 64 or buf[:4] != ELF_MAGIC:
        raise corrupt(where, "ELF header is truncated")
    if buf[4:6] != b"\x02\x01":  # ELFCLASS64, ELFDATA2LSB: every CUDA host platform
        return None
    (shoff,) = struct.unpack_from("<Q", buf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", buf, 0x3A)
    if shoff == 0:
        return []  # section headers stripped (sstrip): nothing to find by name
    if shentsize != _SECTION.size or shoff > size - _SECTION.size:
        raise corrupt(
            where, f"section header table at {shoff:#x} (entry size {shentsize}) is outside the file"
        )
    first = _SECTION.unpack_from(buf, shoff)
    if shnum == 0:
        shnum = first[5]  # extended numbering: the count lives in section 0's sh_size
    if shstrndx == 0xFFFF:
        shstrndx = first[6]  # SHN_XINDEX: the index lives in section 0's sh_link
    if shnum > MAX_SECTIONS or shoff + shnum * _SECTION.size > size:
        raise corrupt(
            where, f"section header table ({shnum} entries at {shoff:#x}) runs past the end of the file"
        )
    raw = [_SECTION.unpack_from(buf, shoff + i * _SECTION.size) for i in range(shnum)]
    names_off = names_end = 0
    if 0 < shstrndx < shnum and raw[shstrndx][1] != SHT_NOBITS:
        names_off, names_size = raw[shstrndx][4], raw[shstrndx][5]
        if names_off > size or names_size > size - names_off:
            raise corrupt(where, "section name table is outside the file")
        names_end = names_off + names_size
    sections = []
    for name_idx, sh_type, flags, _addr, offset, sec_size, *_ in raw:
        name = ""
        if names_end and name_idx < names_end - names_off:
            stop = buf.find(b"\0", names_off + name_idx, names_end)
            name = buf[names_off + name_idx : stop if stop >= 0 else names_end].decode("ascii", "replace")
        sections.append(Section(name=name, type=sh_type, flags=flags, offset=offset, size=sec_size))
    return sections


def section_bounds(section: Section, size: int, where: str) -> tuple[int, int]:
    """The [start, end) file range of a section, which must lie inside the file."""
    if section.offset > size or section.size > size - section.offset:
        raise corrupt(
            where,
            f"section {section.name} ({section.size} bytes at {section.offset:#x}) runs past the end of the file",
        )
    return section.offset, section.offset + section.size


def is_data_section(section: Section, min_size: int) -> bool:
    """Allocated, non-executable PROGBITS (.rodata, .data...): where code keeps embedded byte arrays."""
    return (
        section.type == SHT_PROGBITS
        and bool(section.flags & SHF_ALLOC)
        and not section.flags & SHF_EXECINSTR
        and section.size >= min_size
    )
