"""Where an image's bytes go: size by layer, the largest files and packages, and libraries shipped twice.

Read from the engine's layer store (sparkforge.imagefs), so a 10 GB image is measured in seconds. A library is
"shipped twice" when the same shared library (same name once auditwheel's hash and the version are dropped)
or the same CUDA tool is a regular file at two paths: every node pulls both copies.
"""

from __future__ import annotations

import csv
import re
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sparkforge import engine
from sparkforge.errors import AuditError
from sparkforge.report import Check, Report
from sparkforge.verify.imagefs import ImageTree, LayerFile, file_sha256, image_tree, read_file

MAX_RECORD_BYTES = 64 << 20  # a dist-info RECORD (torch's: ~2 MiB)

TOP = 25
# Shared libraries: "libcublasLt.so.13.1.0.3" -> "libcublasLt"; vendored copies ("libgomp-a34b3233.so.1",
# torchvision's "libcudart.faf08d9a.so.13") -> their library.
_LIBRARY = re.compile(r"(lib[A-Za-z0-9_+]+?)(?:[-.][0-9a-f]{8})?\.so(?:\.[0-9.]+)?")
# CUDA's own libraries and tools (driver libraries come from the host and must not be in the image at all).
_CUDA_LIBRARY = re.compile(
    r"lib(cuda|cudart|cublas|cublasLt|cudnn\w*|cufft\w*|cufile\w*|curand|cusolver\w*|cusparse\w*|nccl|nvrtc\w*|"
    r"nvJitLink|nvjitlink|nvshmem\w*|cupti|nvToolsExt|nvperf\w*|nvvm|nvptxcompiler\w*|nvidia-ml|nvfatbin|"
    r"checkpoint|cutensor\w*|nvblas)"
)
CUDA_TOOLS = frozenset({"ptxas", "nvcc", "nvlink", "fatbinary", "cicc", "cuobjdump", "nvdisasm", "cudafe++"})


@dataclass(frozen=True)
class Duplicate:
    """One library or tool found as a regular file at several paths."""

    name: str
    cuda: bool
    paths: tuple[str, ...]
    sizes: tuple[int, ...]
    identical: bool  # byte-for-byte the same file

    @property
    def wasted_bytes(self) -> int:
        return sum(self.sizes) - max(self.sizes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "cuda": self.cuda,
            "paths": list(self.paths),
            "bytes": list(self.sizes),
            "identical": self.identical,
            "wasted_bytes": self.wasted_bytes,
        }


def library_name(path: str) -> str | None:
    """The library a shared-object or CUDA-tool path is a copy of, or None for other files."""
    base = PurePosixPath(path).name
    if "/stubs/" in path:
        return None  # link-time stubs (e.g. libcuda.so for -lcuda) are never loaded
    if base in CUDA_TOOLS:
        return base
    match = _LIBRARY.fullmatch(base)
    return match.group(1) if match else None


def is_cuda(name: str) -> bool:
    return name in CUDA_TOOLS or bool(_CUDA_LIBRARY.fullmatch(name))


def _digest(item: LayerFile, cache: dict[Path, str]) -> str:
    if item.source not in cache:
        cache[item.source] = file_sha256(item.source)
    return cache[item.source]


def _major(path: str) -> str | None:
    """The soname major of a shared library path (`libcudart.so.13.0.96` -> 13), None when unversioned."""
    match = re.search(r"\.so\.([0-9]+)", path.rsplit("/", 1)[-1])
    return match.group(1) if match else None


def _clusters(items: list[LayerFile], cache: dict[Path, str]) -> list[list[LayerFile]]:
    """Copies of one library: the same soname major (or an unversioned name), or byte-identical files.

    `libcudart.so.12` beside `libcudart.so.13` is two libraries (a package built for CUDA 12 needs its own);
    `libcupti.so.2026.2.0` identical to `libcupti.so.13` is one library twice.
    """

    def same(a: LayerFile, b: LayerFile) -> bool:
        major_a, major_b = _major(a.path), _major(b.path)
        if major_a is None or major_b is None or major_a == major_b:
            return True
        return a.size == b.size and _digest(a, cache) == _digest(b, cache)

    clusters: list[list[LayerFile]] = []
    for item in items:
        home = next((c for c in clusters if any(same(item, other) for other in c)), None)
        if home is None:
            clusters.append([item])
        else:
            home.append(item)
    return clusters


def duplicates(tree: ImageTree) -> list[Duplicate]:
    """Libraries and CUDA tools present as regular files at two or more paths, largest waste first."""
    groups: dict[str, list[LayerFile]] = defaultdict(list)
    for item in tree.files:
        name = library_name(item.path)
        if name is not None and item.size > 0:
            groups[name].append(item)
    cache: dict[Path, str] = {}
    found = []
    for name, items in groups.items():
        if len(items) < 2:
            continue
        for cluster in _clusters(items, cache):
            if len(cluster) < 2:
                continue
            identical = len({i.size for i in cluster}) == 1 and len({_digest(i, cache) for i in cluster}) == 1
            found.append(
                Duplicate(
                    name=name,
                    cuda=is_cuda(name),
                    paths=tuple(i.path for i in cluster),
                    sizes=tuple(i.size for i in cluster),
                    identical=identical,
                )
            )
    return sorted(found, key=lambda d: (-d.wasted_bytes, d.name))


def _site_packages(path: str) -> str | None:
    parts = path.split("/")
    for index, part in enumerate(parts):
        if part in ("site-packages", "dist-packages"):
            return "/".join(parts[: index + 1])
    return None


def packages(tree: ImageTree) -> list[dict[str, Any]]:
    """Bytes per Python distribution (from each dist-info RECORD) and per other top-level folder, largest first."""
    by_path = {f.path: f for f in tree.files}
    owner: dict[str, str] = {}
    for item in tree.files:
        if item.path.endswith(".dist-info/RECORD"):
            root = item.path.rsplit("/", 2)[0]
            dist = item.path.rsplit("/", 2)[1].removesuffix(".dist-info")
            text = read_file(item.source, MAX_RECORD_BYTES).decode("utf-8", errors="replace")
            for row in csv.reader(text.splitlines()):
                if row:
                    member = str(PurePosixPath(root, row[0]))
                    if member in by_path:
                        owner[member] = f"python:{dist}"
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for item in tree.files:
        name = owner.get(item.path)
        if name is None:
            root = _site_packages(item.path)
            if root is not None:
                name = "unowned:" + item.path[len(root) + 1 :].split("/", 1)[0]  # e.g. __pycache__, a .pth
            else:
                name = "files:/" + "/".join(item.path.split("/")[:3])
        totals[name][0] += item.size
        totals[name][1] += 1
    return [
        {"name": name, "bytes": size, "files": count}
        for name, (size, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])
    ]


def _history(ref: str, stats: Sequence[int]) -> list[str | None]:
    """The instruction that made each layer, bottom first; None where the engine's history cannot tell.

    The engine's history lists every step, and a step that changed no file has size 0 like a metadata step; so
    steps with bytes are matched to the layers with bytes, in order.
    """
    steps = [e["created_by"][:200] for e in reversed(engine.image_history(ref)) if e["size"] > 0]
    with_bytes = [i for i, size in enumerate(stats) if size > 0]
    made_by: list[str | None] = [None] * len(stats)
    if len(steps) == len(with_bytes):
        for index, step in zip(with_bytes, steps, strict=True):
            made_by[index] = step
    return made_by


def size_report(ref: str, top: int = TOP) -> Report:
    """The size report of an image as a sparkforge report (command "size")."""
    start = time.monotonic()
    tree = image_tree(ref)
    if tree is None:
        raise AuditError(
            f"{ref}: the engine's layer store cannot be read from this host (not overlay2, remote, or no "
            "permission); fix: run 'invoke size' as root on the engine's host"
        )
    attrs = engine.inspect_image(ref)
    layer_ids = list((attrs.get("RootFS") or {}).get("Layers") or [])
    made_by = _history(ref, [s.bytes for s in tree.layers])
    layers = [
        {
            "index": s.index,
            "diff_id": layer_ids[s.index] if s.index < len(layer_ids) else None,
            "created_by": made_by[s.index],
            "bytes": s.bytes,
            "files": s.files,
            "hidden_bytes": s.hidden_bytes,
        }
        for s in tree.layers
    ]
    dups = duplicates(tree)
    cuda_twice = [d for d in dups if d.cuda]
    report = Report(command="size", subject=ref)
    report.extra["size"] = {
        "image_bytes": int(attrs.get("Size") or 0),
        "visible_bytes": tree.visible_bytes,
        "hidden_bytes": sum(s.hidden_bytes for s in tree.layers),
        "files": len(tree.files),
        "layers": layers,
        "largest_files": [
            {"path": "/" + f.path, "bytes": f.size, "layer": f.layer}
            for f in sorted(tree.files, key=lambda f: -f.size)[:top]
        ],
        "packages": packages(tree)[:top],
        "duplicates": [d.to_dict() for d in dups],
    }
    check = Check(
        "cuda-once",
        "failed" if cuda_twice else "passed",
        (
            f"{len(cuda_twice)} CUDA librar(ies)/tool(s) shipped twice: "
            + ", ".join(f"{d.name} ({', '.join('/' + p for p in d.paths)})" for d in cuda_twice[:5])
            + "; fix: install each CUDA component from one source (torch's CUDA wheels) and link the others"
            if cuda_twice
            else f"no CUDA library or tool at two paths ({len(dups)} other duplicate(s) listed)"
        ),
        {"cuda_duplicates": [d.to_dict() for d in cuda_twice]},
        duration_s=time.monotonic() - start,
    )
    report.add(check)
    return report
