#!/usr/bin/env python3
"""Removes weight that buys nothing on the recipe's GPU from the files the current RUN step wrote.

Runs at the end of each pip step, in the same step, so removed bytes never reach a layer. Only files changed
since --since (ctime, which no tool can set back) are touched: rewriting a lower layer's file would copy it up
and ship it twice. Every rule keeps what runs on the target: verify's kernel audit and JIT checks prove it.
  - CUDA-12 builds of packages that ship one per CUDA major, on a CUDA 13 image (they are never loaded);
  - Triton's bundled ptxas, replaced by a link to the image's toolkit (--toolkit): one ptxas that knows sm_121a;
  - Triton's profiler copies of CUPTI, linked to the CUDA wheels' copy; static archives nothing links against;
  - identical files at several paths, hard-linked (one copy in the layer);
  - with --strip: local symbols and debug sections of shared libraries (the dynamic symbols, which loading,
    dlsym and in-process backtraces use, stay), as Debian's packages do.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
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


def dedupe(root: Path, since: float, log: dict[str, int]) -> None:
    by_size: dict[int, list[Path]] = defaultdict(list)
    for path in files(root, since):
        size = path.stat().st_size
        if size >= MIN_DEDUPE:
            by_size[size].append(path)
    for paths in by_size.values():
        if len(paths) < 2:
            continue
        by_hash: dict[str, list[Path]] = defaultdict(list)
        for path in paths:
            by_hash[hashlib.sha256(path.read_bytes()).hexdigest()].append(path)
        for same in by_hash.values():
            first = same[0]
            for other in same[1:]:
                if other.stat().st_ino == first.stat().st_ino:
                    continue
                other.unlink()
                os.link(first, other)
                log["identical copies"] += first.stat().st_size


def is_elf(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(4) == b"\x7fELF"


def strip(root: Path, since: float, log: dict[str, int]) -> None:
    tool = shutil.which("strip")
    if tool is None:
        sys.exit(
            "slim-venv: --strip needs binutils' strip in the image; install binutils or set strip: false"
        )
    for path in files(root, since):
        if ".so" not in path.name or not is_elf(path):
            continue
        before = path.stat().st_size
        done = subprocess.run([tool, "--strip-unneeded", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            continue  # an ELF strip cannot rewrite is left exactly as it was
        log["symbols and debug info"] += before - path.stat().st_size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--site", type=Path, required=True, help="the venv's site-packages")
    parser.add_argument("--since", type=Path, required=True, help="stamp file touched when the step began")
    parser.add_argument("--cuda", required=True, help="the recipe's CUDA major.minor")
    parser.add_argument("--toolkit", type=Path, help="the image's CUDA toolkit root (JIT toolchain shipped)")
    parser.add_argument("--strip", action="store_true")
    args = parser.parse_args()
    since = args.since.stat().st_mtime
    log: dict[str, int] = defaultdict(int)
    drop_other_cuda_majors(args.site, args.cuda.split(".")[0], since, log)
    if args.toolkit is not None:
        link_triton_tools(args.site, args.toolkit, since, log)
    link_cupti(args.site, since, log)
    if args.strip:
        strip(args.site, since, log)  # before dedupe: strip rewrites a file, which would split a hard link
    dedupe(args.site, since, log)
    for why, size in sorted(log.items()):
        print(f"slim-venv: {why}: {size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
