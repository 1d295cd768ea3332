"""Archive members before they are read: names checked, heads peeked in one pass, real bytes bounded.

A member name is only ever reported (never a host path), so it must say what it is: relative, no '..', no
control character. What a member really decompresses to is counted while read: a zip bomb stops at the bound,
whatever size it claims.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from sparkforge.audit.fatbin import is_candidate
from sparkforge.boundary import open_binary
from sparkforge.console import printable
from sparkforge.errors import AuditError

MAX_MEMBER_BYTES = 4 << 30  # no CUDA library is this large (vLLM's _C: ~0.5 GB, libtorch_cuda: ~1.5 GB)
MAX_TARGET_BYTES = 1 << 40  # an audit target (an image filesystem tar, a wheel, a library): 1 TiB
MAX_RATIO = 200  # decompressed/compressed; deflate's ceiling is ~1032:1, real libraries stay far below
RATIO_FLOOR = 64 << 20  # members up to this size may compress any amount (zero-filled sections)


def member_limit(compressed: int | None) -> int:
    """How many decompressed bytes one archive member may yield (tar members: the stream's own bytes)."""
    if compressed is None:
        return MAX_MEMBER_BYTES
    return min(MAX_MEMBER_BYTES, max(RATIO_FLOOR, MAX_RATIO * compressed))


def check_member_name(name: str, archive: str) -> str:
    """A member name as reported: relative, no '..', no control character (a newline would forge report rows)."""
    bad = ""
    if not name or name.startswith("/") or (len(name) > 1 and name[0].isalpha() and name[1] == ":"):
        bad = "is empty or absolute"
    elif any(part == ".." for part in name.replace("\\", "/").split("/")):
        bad = "holds '..'"
    # A backslash is allowed: systemd's unit names in an image hold them (dev-disk-by\x2dlabel.swap).
    elif printable(name) != name:
        bad = "holds a control character"
    if bad:
        raise AuditError(
            f"{archive}: member {printable(name)[:200]!r} {bad}; fix: this archive was not made by a packaging "
            "tool (pip, wheel, docker export): get it from its source again"
        )
    return name


class BoundedStream:
    """A member's stream that counts the bytes it really yields and stops past `limit` (a bomb's real size)."""

    def __init__(self, stream: IO[bytes], limit: int, where: str) -> None:
        self.stream, self.limit, self.where, self.count = stream, limit, where, 0

    def read(self, size: int = -1) -> bytes:
        want = (
            self.limit + 1 - self.count
            if size is None or size < 0
            else min(size, self.limit + 1 - self.count)
        )
        data = self.stream.read(max(want, 0))
        self.count += len(data)
        if self.count > self.limit:
            raise AuditError(
                f"{self.where}: decompresses past {self.limit} bytes (the bound for a member of its compressed "
                "size: a zip bomb, or no CUDA library); fix: audit the library from its real package"
            )
        return data


_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then (after 22 bytes) name and extra field lengths
_PEEK = 1024  # compressed bytes enough for a deflate block header and the first four bytes after it


def _peek(raw: IO[bytes], info: zipfile.ZipInfo) -> bytes | None:
    """A member's first four bytes from its local header on, or None when only zipfile can tell."""
    raw.seek(info.header_offset)
    header = raw.read(_LOCAL_HEADER.size)
    if len(header) < _LOCAL_HEADER.size or info.flag_bits & 0x1:
        return None
    signature, name_len, extra_len = _LOCAL_HEADER.unpack(header)
    if signature != b"PK\x03\x04":
        return None
    raw.seek(name_len + extra_len, 1)
    chunk = raw.read(min(info.compress_size, _PEEK))
    if info.compress_type == zipfile.ZIP_STORED:
        return chunk[:4]
    if info.compress_type != zipfile.ZIP_DEFLATED:
        return None
    try:
        head = zlib.decompressobj(-15).decompress(chunk, 4)
    except zlib.error:
        return None
    return head if len(head) == 4 or info.compress_size <= _PEEK else None


def candidates(path: Path, infos: Sequence[zipfile.ZipInfo]) -> list[zipfile.ZipInfo]:
    """The members that may carry device code, in one pass over the archive (a seek and a small read each):
    those whose first bytes say ELF or fatbin, and those only zipfile can read (encrypted, other methods)."""
    out = []
    with open_binary(path, "", MAX_TARGET_BYTES) as raw:
        for info in infos:
            check_member_name(info.filename, str(path))
            if info.file_size < 4:
                continue
            head = _peek(raw, info)
            if head is None or (len(head) == 4 and is_candidate(head)):
                out.append(info)
    return out
