"""Find the files that carry device code in a directory, a wheel or zip, a tar stream, or one file.

Only files whose first four bytes say ELF or fatbin are read further. Directory and zip members are
read by a thread pool (the work is I/O and C-level searches; the Python part is a few headers a file).
Archive members small enough are parsed in memory; larger ones are spooled to a temporary file and
mapped, so memory stays bounded whatever the archive holds. An archive's index is read once per worker (linear
in its members); a member's real decompressed bytes are counted while read and bounded (a zip bomb stops at the
bound, whatever size the member claims); member names are checked (no '..', absolute path or control character)
and only ever reported, never used as host paths.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

from sparkforge.audit.compat import parse_target
from sparkforge.audit.coverage import ScannedFile, ScanResult, build_report, scope_filter
from sparkforge.audit.fatbin import FatbinFile, is_candidate, parse_buffer, read_fatbin_file
from sparkforge.audit.members import (
    MAX_MEMBER_BYTES,
    MAX_TARGET_BYTES,
    BoundedStream,
    candidates,
    check_member_name,
    member_limit,
)
from sparkforge.boundary import open_binary, open_zip_member
from sparkforge.errors import AuditError
from sparkforge.report import Report

IN_MEMORY_LIMIT = 64 << 20  # archive members above this are spooled to disk instead of held in memory
COPY_CHUNK = 1 << 20
BATCH = 256  # files per pool task: keeps scheduling overhead small on trees of 100k files
BATCH_BYTES = 16 << 20  # archive bytes per pool task: a 300 MB library gets a worker of its own


def default_workers() -> int:
    return os.cpu_count() or 1


def _batches(items: Sequence[object], size: int) -> list[Sequence[object]]:
    return [items[start : start + size] for start in range(0, len(items), size)]


def _run_batched(
    func: Callable[[Sequence[object]], list[ScannedFile]], batches: list[Sequence[object]], workers: int
) -> list[ScannedFile]:
    if workers <= 1 or len(batches) <= 1:
        return [found for batch in batches for found in func(batch)]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return [found for batch in pool.map(func, batches) for found in batch]


def size_batches(infos: Sequence[zipfile.ZipInfo]) -> list[Sequence[object]]:
    """Largest members first and alone, small ones grouped: inflating dominates, so spread the big ones."""
    batches: list[Sequence[object]] = []
    current: list[zipfile.ZipInfo] = []
    total = 0
    for info in sorted(infos, key=lambda i: i.file_size, reverse=True):
        current.append(info)
        total += info.file_size
        if total >= BATCH_BYTES or len(current) >= BATCH:
            batches.append(current)
            current, total = [], 0
    return [*batches, current] if current else batches


def _scanned(where: str, read: Callable[[], FatbinFile | None]) -> ScannedFile | None:
    try:
        fatbin = read()
    except AuditError as exc:
        return ScannedFile(path=where, fatbin=None, error=str(exc))
    return None if fatbin is None else ScannedFile(path=where, fatbin=fatbin)


def scan_one(where: str, path: Path) -> ScannedFile | None:
    """One file on disk reported as `where`: its device code, None when it has none, or the reason it is unreadable."""
    return _scanned(where, lambda: read_fatbin_file(path, where))


def _walk(root: Path) -> Iterator[Path]:
    """Regular files under `root`, not following links (an image's links point at files seen anyway)."""
    stack = [root]
    while stack:
        try:
            with os.scandir(stack.pop()) as listing:
                for item in listing:
                    if item.is_dir(follow_symlinks=False):
                        stack.append(Path(item.path))
                    elif item.is_file(follow_symlinks=False):
                        yield Path(item.path)
        except OSError:
            continue  # an unreadable directory holds nothing we could audit


def scan_directory(root: Path, workers: int, only: Sequence[str] | None = None) -> ScanResult:
    """Every file under `root` that carries device code, paths relative to `root` (`only`: globs to open)."""
    every = [(path.relative_to(root).as_posix(), path) for path in sorted(_walk(root))]
    wanted = in_scope(every, only)
    result = scan_files(wanted, workers)
    return ScanResult(result.files, len(every), len(every) - len(wanted))


def in_scope(files: Sequence[tuple[str, Path]], only: Sequence[str] | None) -> list[tuple[str, Path]]:
    """The (path, source) pairs whose path one of the `only` globs matches; all of them when `only` is None."""
    keep = scope_filter(only)
    return list(files) if keep is None else [pair for pair in files if keep(pair[0])]


def scan_files(files: Sequence[tuple[str, Path]], workers: int) -> ScanResult:
    """Every file of (reported path, path on disk) pairs that carries device code, e.g. an image's layer files."""

    def scan(batch: Sequence[object]) -> list[ScannedFile]:
        found = []
        for pair in batch:
            assert isinstance(pair, tuple)
            rel, path = pair
            item = scan_one(rel, path)
            if item is not None:
                found.append(item)
        return found

    return ScanResult(tuple(_run_batched(scan, _batches(files, BATCH), workers)), len(files))


def parse_stream(
    head: bytes, stream: IO[bytes], size: int, where: str, memory_limit: int = IN_MEMORY_LIMIT
) -> FatbinFile | None:
    """Parse a member whose first bytes were `head`: in memory when small, through a spooled file when large.

    `stream` is a BoundedStream: what bounds memory and disk is the bytes really read, not the claimed `size`."""
    if size <= memory_limit:
        return parse_buffer(head + stream.read(max(0, size - len(head))), where)
    with tempfile.TemporaryFile(prefix="sparkforge-audit-") as spool:
        spool.write(head)
        shutil.copyfileobj(stream, spool, COPY_CHUNK)
        spool.flush()
        if spool.tell() < 4:
            return None
        with mmap.mmap(spool.fileno(), 0, access=mmap.ACCESS_READ) as view:
            return parse_buffer(view, where)


def scan_zip(path: Path, workers: int, only: Sequence[str] | None = None) -> ScanResult:
    """Every member of a wheel or zip that carries device code, paths as member names.

    Linear in the members: the index is read once, one pass peeks at each member's first bytes, and only the
    candidates are read, by a pool sharing one handle (zipfile reads under its lock, inflates outside it)."""
    handle = open_binary(path, "", MAX_TARGET_BYTES)
    try:
        archive = zipfile.ZipFile(handle)
    except (zipfile.BadZipFile, OSError) as exc:
        handle.close()
        raise AuditError(f"{path}: not a readable zip or wheel ({exc}). Re-download it.") from exc
    with handle, archive:
        infos = [info for info in archive.infolist() if not info.is_dir()]
        keep = scope_filter(only)
        wanted = infos if keep is None else [i for i in infos if keep(i.filename)]
        found = candidates(path, wanted)

        def scan(batch: Sequence[object]) -> list[ScannedFile]:
            out = []
            for info in batch:
                assert isinstance(info, zipfile.ZipInfo)
                item = _scanned(info.filename, lambda i=info: _read_member(archive, i))
                if item is not None:
                    out.append(item)
            return out

        scanned = _run_batched(scan, size_batches(found), workers)
        return ScanResult(tuple(scanned), len(infos), len(infos) - len(wanted))


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> FatbinFile | None:
    limit = member_limit(info.compress_size)
    if info.file_size > limit:
        raise AuditError(
            f"{info.filename}: claims {info.file_size} bytes from {info.compress_size} compressed, past the bound of "
            f"{limit} (a zip bomb, or no CUDA library); fix: audit the library from its real package"
        )
    try:
        with open_zip_member(archive, info) as opened:  # read through BoundedStream
            member = BoundedStream(opened, limit, info.filename)
            head = member.read(4)
            if len(head) < 4 or not is_candidate(head):
                return None
            return parse_stream(head, member, info.file_size, info.filename)  # type: ignore[arg-type]
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise AuditError(
            f"{info.filename}: cannot read the archive member ({exc}). Re-download the archive."
        ) from exc


def _member_path(name: str) -> str:
    while name.startswith(("./", "/")):
        name = name[1:] if name.startswith("/") else name[2:]
    return name


def scan_tar_stream(fileobj: IO[bytes], subject: str, only: Sequence[str] | None = None) -> ScanResult:
    """Every regular file of a tar stream (e.g. `docker export`) that carries device code, read once, in order."""
    found: list[ScannedFile] = []
    count = skipped = 0
    keep = scope_filter(only)
    try:
        with tarfile.open(fileobj=fileobj, mode="r|*") as archive:
            for member in archive:
                if not member.isreg():
                    continue  # links and devices carry no bytes of their own
                count += 1
                path = _member_path(check_member_name(member.name, subject))
                if keep is not None and not keep(path):
                    skipped += 1  # the stream skips its bytes unread
                    continue
                if member.size > MAX_MEMBER_BYTES:
                    found.append(
                        ScannedFile(path, None, f"{path}: {member.size} bytes, past {MAX_MEMBER_BYTES}")
                    )
                    continue
                opened = archive.extractfile(member)
                if opened is None:
                    continue
                stream = BoundedStream(opened, MAX_MEMBER_BYTES, path)
                head = stream.read(4)
                if len(head) < 4 or not is_candidate(head):
                    continue
                item = _scanned(
                    path,
                    lambda s=stream, h=head, m=member, p=path: parse_stream(h, s, m.size, p),  # type: ignore[misc]
                )
                if item is not None:
                    found.append(item)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise AuditError(
            f"{subject}: the tar stream could not be read ({exc}). Pass an uncompressed or gzip/bz2/xz tar "
            f"(e.g. the output of `docker export`), complete to its end."
        ) from exc
    return ScanResult(tuple(found), count, skipped)


def _scan_path(path: Path, workers: int, only: Sequence[str] | None) -> ScanResult:
    if path.is_dir():
        return scan_directory(path, workers, only)
    if not path.is_file():
        raise AuditError(f"{path}: not a regular file (a device, socket or pipe). Pass a file or directory.")
    with open_binary(path, "", MAX_TARGET_BYTES) as handle:
        head = handle.read(4)
    if is_candidate(head):
        # A single file is the whole target: a corrupt one is an error, not a line in the report.
        fatbin = read_fatbin_file(path, str(path))
        return ScanResult(() if fatbin is None else (ScannedFile(path.name, fatbin),), 1)
    if zipfile.is_zipfile(path):
        return scan_zip(path, workers, only)
    if tarfile.is_tarfile(path):
        with open_binary(path, "", MAX_TARGET_BYTES) as handle:
            return scan_tar_stream(handle, str(path), only)
    raise AuditError(
        f"{path}: not a directory, wheel/zip, tar, ELF library/object or fatbin file. "
        f"Point the audit at a .so, .o, .whl, an image filesystem tar, or a directory of them."
    )


def audit_target(
    path: Path,
    gpu: str = "sm_121",
    require: Sequence[str] = (),
    workers: int | None = None,
    only: Sequence[str] | None = None,
) -> Report:
    """Kernel coverage of a directory, wheel/zip, tar file or single ELF/fatbin file for GPU `gpu`.

    `only`: globs of the libraries to open (e.g. the recipe's required ones); every other file is counted as
    not opened and left out of the libraries (a single file given as the target is always read)."""
    target = parse_target(gpu)
    path = Path(path)
    start = time.monotonic()
    try:
        if not path.exists():
            raise AuditError(
                f"{path}: no such file or directory. Pass an existing .so, .whl, directory or tar."
            )
        result = _scan_path(path, workers or default_workers(), only)
    except PermissionError as exc:
        raise AuditError(
            f"{path}: permission denied ({exc.filename}). Run as a user who can read it."
        ) from exc
    except OSError as exc:
        raise AuditError(f"{path}: cannot be read ({exc}). Check the path and its permissions.") from exc
    return build_report(str(path), target, result, require, time.monotonic() - start, only=only)


def audit_tar_stream(
    fileobj: IO[bytes],
    subject: str,
    gpu: str = "sm_121",
    require: Sequence[str] = (),
    only: Sequence[str] | None = None,
) -> Report:
    """Kernel coverage of an image filesystem given as a tar stream (read once, never extracted whole)."""
    target = parse_target(gpu)
    start = time.monotonic()
    result = scan_tar_stream(fileobj, subject, only)
    return build_report(subject, target, result, require, time.monotonic() - start, only=only)


def audit_files(
    files: Sequence[tuple[str, Path]],
    subject: str,
    gpu: str = "sm_121",
    require: Sequence[str] = (),
    workers: int | None = None,
    only: Sequence[str] | None = None,
) -> Report:
    """Kernel coverage of (reported path, path on disk) pairs, e.g. an image's files read from its layers."""
    target = parse_target(gpu)
    start = time.monotonic()
    wanted = in_scope(files, only)
    result = scan_files(wanted, workers or default_workers())
    scope = ScanResult(result.files, len(files), len(files) - len(wanted))  # every file considered, by name
    return build_report(subject, target, scope, require, time.monotonic() - start, only=only)
