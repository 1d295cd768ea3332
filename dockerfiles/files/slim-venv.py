#!/usr/bin/env python3
"""Removes weight that buys nothing on the recipe's GPU from the files the current RUN step wrote.

Runs at the end of each pip step, in the same step, so removed bytes never reach a layer. Only files changed
since --since (ctime, which no tool can set back) are touched: rewriting a lower layer's file would copy it up
and ship it twice. Every rule keeps what runs on the target: verify's kernel audit and JIT checks prove it.
  - CUDA-12 builds of packages that ship one per CUDA major, on a CUDA 13 image (they are never loaded);
  - Triton's bundled ptxas, replaced by a link to the image's toolkit (--toolkit): one ptxas that knows sm_121a;
  - Triton's profiler copies of CUPTI, linked to the CUDA wheels' copy; static archives nothing links against;
  - identical files at several paths, hard-linked (one copy in the layer), or linked to a lower layer's copy;
  - with --toolkit: the link-time layout nvcc-driven JITs expect (lib64, libcudart.so, a libcuda stub);
  - with --remove GLOB (repeatable): what the recipe declares in runtime.remove (below site-packages, each with
    its reason in the recipe), logged by glob; their RECORD lines go with them;
  - with --strip: local symbols and debug sections of shared libraries (the dynamic symbols, which loading,
    dlsym and in-process backtraces use, stay), as Debian's packages do; the RECORD line of each stripped file
    gets its new hash and size, so the record keeps no hash of the bytes strip removed (nvcc's local file symbol
    `tmpxft_<pid>_...`, different in every compile, among them: benchmarks/repro.md section 3).
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import os
import re
import shutil
import struct
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

TRITON_TOOLS = {"ptxas": "ptxas", "ptxas-blackwell": "ptxas"}
MIN_DEDUPE = 64 << 10


def changed(path: Path, since: float) -> bool:
    try:
        return path.lstat().st_ctime >= since
    except OSError:
        return False


def files(root: Path, since: float) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and changed(p, since))


def remove(path: Path, why: str, log: dict[str, int]) -> None:
    size = (
        sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        if path.is_dir()
        else path.stat().st_size
    )
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    log[why] += size


def drop_other_cuda_majors(site: Path, cuda_major: str, since: float, log: dict[str, int]) -> None:
    other = {"13": "cu12", "12": "cu13"}.get(cuda_major)
    if other is None:
        return
    for path in sorted(site.rglob(other)):
        if path.is_dir() and changed(path, since):
            remove(path, f"{other} builds", log)
    pattern = re.compile(rf".*\.{other}\.cpython-[^/]*\.so")
    for path in files(site, since):
        if pattern.fullmatch(path.name):
            remove(path, f"{other} builds", log)


def link(path: Path, target: Path, why: str, log: dict[str, int]) -> None:
    size = path.stat().st_size
    path.unlink()
    path.symlink_to(target)
    log[why] += size


def link_triton_tools(site: Path, toolkit: Path, since: float, log: dict[str, int]) -> None:
    for bin_dir in sorted(site.glob("*triton*/backends/nvidia/bin")):
        for name, tool in TRITON_TOOLS.items():
            path = bin_dir / name
            if path.is_file() and not path.is_symlink() and changed(path, since):
                link(path, toolkit / "bin" / tool, "Triton's bundled ptxas", log)


def link_cupti(site: Path, since: float, log: dict[str, int]) -> None:
    cuda_lib = next(
        (p for p in sorted(site.glob("nvidia/cu1*/lib")) if (p / "libcupti.so.13").exists()), None
    )
    if cuda_lib is None:
        cuda_lib = next((p.parent for p in sorted(site.glob("nvidia/*/lib/libcupti.so*"))), None)
    for lib_dir in sorted(site.glob("*triton*/backends/nvidia/lib/cupti*")):
        for path in files(lib_dir, since):
            if path.name.endswith(".a"):
                remove(path, "static archives", log)
                continue
            stem = path.name.split(".so", 1)[0]
            match = sorted(cuda_lib.glob(stem + ".so*")) if cuda_lib else []
            if match:
                link(path, match[0], "Triton's CUPTI copies", log)


def _sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()


def dedupe(root: Path, since: float, log: dict[str, int]) -> None:
    """Identical files: hard-linked within this step; linked to a lower layer's copy when one exists there."""
    new: dict[int, list[Path]] = defaultdict(list)
    old: dict[int, list[Path]] = defaultdict(list)
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        size = path.stat().st_size
        if size >= MIN_DEDUPE:
            (new if changed(path, since) else old)[size].append(path)
    for size, paths in new.items():
        if len(paths) + len(old.get(size, ())) < 2:
            continue
        by_hash: dict[str, list[Path]] = defaultdict(list)
        for path in old.get(size, ()):
            by_hash[_sha256(path)].append(path)
        lower = {digest for digest in by_hash}
        for path in paths:
            by_hash[_sha256(path)].append(path)
        for digest, same in by_hash.items():
            first = same[0]
            for other in same[1:]:
                if other.stat().st_ino == first.stat().st_ino or not changed(other, since):
                    continue
                other.unlink()
                if digest in lower:  # a hard link cannot reach a lower layer; a relative link can
                    other.symlink_to(os.path.relpath(first, other.parent))
                else:
                    os.link(first, other)
                log["identical copies"] += size


def toolkit_layout(toolkit: Path, log: dict[str, int]) -> None:
    """What nvcc-driven JITs link with, in the CUDA wheels' tree: lib64, libcudart.so, a libcuda stub.

    FlashInfer links its JIT modules with -L$CUDA_HOME/lib64 -L$CUDA_HOME/lib64/stubs -lcudart -lcuda. The stub
    is an empty shared object named libcuda.so.1, as NVIDIA's stub is for linking only: at run time the
    driver's own libcuda.so.1, mounted by the NVIDIA container runtime, resolves every symbol.
    """
    if not (toolkit / "bin" / "nvcc").exists():
        return
    lib64 = toolkit / "lib64"
    if not lib64.exists():
        lib64.symlink_to("lib")
    for versioned in sorted((toolkit / "lib").glob("libcudart.so.[0-9]*")):
        dev = toolkit / "lib" / "libcudart.so"
        if not dev.exists():
            dev.symlink_to(versioned.name)
    stub = toolkit / "lib" / "stubs" / "libcuda.so"
    compiler = shutil.which("gcc") or shutil.which("cc")
    if not stub.exists() and compiler:
        stub.parent.mkdir(exist_ok=True)
        subprocess.run(
            [compiler, "-shared", "-x", "c", "/dev/null", "-Wl,-soname,libcuda.so.1", "-o", str(stub)],
            check=True,
        )
        log["toolkit link layout (added)"] += 0


def is_elf(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(4) == b"\x7fELF"


def loadable(path: Path) -> bool:
    """Whether every PT_LOAD segment keeps offset and address congruent modulo its alignment.

    `strip` can break that in libraries patchelf rewrote (auditwheel's vendored *.libs): the loader then
    refuses them with "ELF load command address/offset not page-aligned".
    """
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return False  # only 64-bit little-endian ELF is checked, so only that is stripped
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for index in range(phnum):
        kind, _, offset, vaddr, _, _, _, align = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + index * phentsize
        )
        if kind == 1 and align > 1 and offset % align != vaddr % align:
            return False
    return True


def load_layout(path: Path) -> list[tuple[int, ...]]:
    """Type, flags, address, memory size and alignment of every program header: what the loader maps.

    `strip --strip-unneeded` only drops sections no segment holds, so it never changes these; where it does, it
    broke the library: BOLT-rewritten ones (NVIDIA's aarch64 libcudnn.so.9, `.bolt.org.*` sections) came out with
    overlapping segments and `.bss` in an executable one, which the loader refuses ("cannot change memory
    protections", measured under qemu-user, benchmarks/build.md).
    """
    with path.open("rb") as f:  # the ELF header and the program headers only (libraries run to 500 MB)
        head = f.read(64)
        (phoff,) = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    headers = [struct.unpack_from("<IIQQQQQQ", table, i * phentsize) for i in range(phnum)]
    return [(kind, flags, vaddr, memsz, align) for kind, flags, _, vaddr, _, _, memsz, align in headers]


def strip(root: Path, since: float, log: dict[str, int]) -> list[Path]:
    """Strips the step's shared libraries; returns those it rewrote."""
    stripped: list[Path] = []
    tool = shutil.which("strip")
    if tool is None:
        sys.exit(
            "slim-venv: --strip needs binutils' strip in the image; install binutils or set strip: false"
        )
    for path in files(root, since):
        if (
            ".so" not in path.name
            or path.parent.name.endswith(".libs")
            or not is_elf(path)
            or not loadable(path)
        ):
            continue  # auditwheel's vendored libraries (*.libs) were rewritten by patchelf: left as shipped
        before, layout = path.stat().st_size, load_layout(path)
        backup = path.with_name(path.name + ".slim-venv-orig")
        shutil.copy2(path, backup)
        done = subprocess.run([tool, "--strip-unneeded", str(path)], capture_output=True, text=True)
        if done.returncode != 0 or not loadable(path) or load_layout(path) != layout:
            os.replace(backup, path)  # strip failed or broke the layout: keep the library exactly as shipped
            log["libraries left unstripped (strip would break them)"] += before
            continue
        backup.unlink()
        stripped.append(path)
        log["symbols and debug info"] += before - path.stat().st_size
    return stripped


def record_line(name: str, data: bytes) -> str:
    """A RECORD row as pip writes it: path, sha256=<urlsafe base64 without padding>, size."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow([name, f"sha256={digest}", len(data)])
    return out.getvalue()


def refresh_records(root: Path, rewritten: list[Path]) -> int:
    """The RECORD lines of files this step rewrote get their new hash and size; every other byte stays."""
    wanted = {path.resolve() for path in rewritten}
    refreshed = 0
    if not wanted:
        return refreshed
    for record in sorted(root.glob("*.dist-info/RECORD")):
        lines = record.read_bytes().decode("utf-8").splitlines(keepends=True)  # "\r\n" kept as pip wrote it
        out, touched = [], 0
        for line in lines:
            body = line.rstrip("\r\n")
            row = next(csv.reader([body]), [])
            target = (root / row[0]).resolve() if row and row[0] else None
            if target in wanted:
                out.append(record_line(row[0], target.read_bytes()) + line[len(body) :])
                touched += 1
            else:
                out.append(line)
        if touched:
            record.write_bytes("".join(out).encode("utf-8"))
            refreshed += touched
    return refreshed


def declared(site: Path, globs: list[str], since: float, log: dict[str, int]) -> list[Path]:
    """Delete what each declared glob matches among this step's files (a directory: its files of this step)."""
    gone: list[Path] = []
    for pattern in globs:
        why = f"declared removal {pattern}"
        log[why] += 0  # logged even when this step wrote nothing it matches
        for match in sorted(site.glob(pattern)):
            if match.is_symlink() or match.is_file():
                targets = [match] if changed(match, since) else []
            elif match.is_dir():
                targets = files(match, since)
            else:
                continue
            for path in targets:
                if path.exists() or path.is_symlink():
                    gone.append(path)
                    log[why] += 0 if path.is_symlink() else path.stat().st_size
                    path.unlink()
            if match.is_dir():
                for folder in sorted((d for d in match.rglob("*") if d.is_dir()), reverse=True):
                    if not any(folder.iterdir()):
                        folder.rmdir()
                if not any(match.iterdir()):
                    match.rmdir()
    return gone


def forget_records(root: Path, removed: list[Path]) -> int:
    """Drop the RECORD lines of removed files, so every record names only files that are there."""
    wanted = {path.parent.resolve() / path.name for path in removed}
    dropped = 0
    for record in sorted(root.glob("*.dist-info/RECORD")) if wanted else []:
        lines = record.read_bytes().decode("utf-8").splitlines(keepends=True)
        kept = []
        for line in lines:
            row = next(csv.reader([line.rstrip("\r\n")]), [])
            target = root / row[0] if row and row[0] else None
            if target is not None and target.parent.resolve() / target.name in wanted:
                dropped += 1
            else:
                kept.append(line)
        if len(kept) != len(lines):
            record.write_bytes("".join(kept).encode("utf-8"))
    return dropped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--site", type=Path, required=True, help="the venv's site-packages")
    parser.add_argument("--since", type=Path, required=True, help="stamp file touched when the step began")
    parser.add_argument("--cuda", required=True, help="the recipe's CUDA major.minor")
    parser.add_argument("--toolkit", type=Path, help="the image's CUDA toolkit root (JIT toolchain shipped)")
    parser.add_argument("--strip", action="store_true")
    parser.add_argument("--remove", action="append", default=[], help="a glob the recipe declares removed")
    args = parser.parse_args()
    since = args.since.stat().st_mtime
    log: dict[str, int] = defaultdict(int)
    if args.remove:
        dropped = forget_records(args.site, declared(args.site, args.remove, since, log))
        print(f"slim-venv: RECORD lines dropped for declared removals: {dropped}")
    drop_other_cuda_majors(args.site, args.cuda.split(".")[0], since, log)
    if args.toolkit is not None:
        link_triton_tools(args.site, args.toolkit, since, log)
        toolkit_layout(args.toolkit, log)
    link_cupti(args.site, since, log)
    if args.strip:
        # before dedupe: strip rewrites a file, which would split a hard link
        refreshed = refresh_records(args.site, strip(args.site, since, log))
        print(f"slim-venv: RECORD lines refreshed for stripped libraries: {refreshed}")
    dedupe(args.site, since, log)
    for why, size in sorted(log.items()):
        print(f"slim-venv: {why}: {size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
