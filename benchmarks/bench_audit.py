"""Benchmark: sparkforge's fatbin audit against NVIDIA's cuobjdump --list-elf/--list-ptx on real libraries.

The set: every .so of the official vLLM 0.33.0 aarch64 wheel plus torch 2.14.0's aarch64 (CUDA 13)
libtorch_cuda.so, both from PyPI, extracted into the sparkforge cache. Page cache warm for both tools
(one untimed run first); median of N runs. Writes benchmarks/results/audit_bench.json.

    python benchmarks/bench_audit.py [--runs 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparkforge.audit.fatbin import Entry, read_fatbin_file
from sparkforge.audit.scan import audit_target
from sparkforge.context import cache_path

ROOT = Path(__file__).resolve().parent.parent
WHEELS = {
    "vllm-0.33.0-cp38-abi3-manylinux_2_28_aarch64.whl": ("vllm==0.33.0", lambda n: n.endswith(".so")),
    "torch-2.14.0-cp312-cp312-manylinux_2_28_aarch64.whl": (
        "torch==2.14.0",
        lambda n: n.endswith("libtorch_cuda.so"),
    ),
}
PLATFORMS = ["manylinux_2_28_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64"]
LISTED = re.compile(r"^(ELF|PTX) file\s+\d+: .*\.sm_(\d+)([af]?)\.(?:cubin|ptx)$")


def find_cuobjdump() -> Path:
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations or []) if spec else []:
        for candidate in sorted(Path(base).glob("*/bin/cuobjdump")):
            return candidate
    raise SystemExit("cuobjdump not found: pip install nvidia-cuda-cuobjdump")


def prepare(set_dir: Path) -> list[Path]:
    """Download the wheels once and extract the benchmark's libraries into `set_dir`."""
    for wheel, (requirement, wanted) in WHEELS.items():
        path = cache_path("audit", "wheels", wheel)
        if not path.is_file():
            platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *platforms,
                            "--python-version", "3.12", requirement, "-d", str(path.parent)], check=True)  # fmt: skip
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                if wanted(name) and not (set_dir / name).is_file():
                    archive.extract(name, set_dir)
    return sorted(set_dir.rglob("*.so"))


def cuobjdump_list(cuobjdump: Path, path: Path) -> Counter[str]:
    """What cuobjdump lists for one file, as counts: one process per option, as a user would run it."""
    counts: Counter[str] = Counter()
    for option in ("--list-elf", "--list-ptx"):
        out = subprocess.run([str(cuobjdump), option, str(path)], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if match := LISTED.match(line.strip()):
                counts[f"{'sass' if match[1] == 'ELF' else 'ptx'}_{match[2]}{match[3]}"] += 1
    return counts


def cuobjdump_view(entries: list[Entry]) -> Counter[str]:
    """Our entries as cuobjdump prints them: `f` cubins as plain, LTO IR not listed."""
    counts: Counter[str] = Counter()
    for e in entries:
        if e.kind == "sass":
            counts[f"sass_{e.arch}{'a' if e.variant == 'a' else ''}"] += 1
        elif e.kind == "ptx":
            counts[e.key] += 1
    return counts


def median_time(func: Callable[[], object], runs: int) -> tuple[float, list[float]]:
    func()  # warm the page cache and the interpreter's imports
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def audit_process(target: Path) -> None:
    """The audit as a user runs it: a fresh Python process (interpreter start-up included)."""
    code = "import sys; from pathlib import Path; from sparkforge.audit import audit_target; audit_target(Path(sys.argv[1]))"
    subprocess.run([sys.executable, "-c", code, str(target)], check=True, cwd=ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--set-dir", type=Path, default=cache_path("audit", "bench", "set"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "audit_bench.json")
    args = parser.parse_args()
    cuobjdump = find_cuobjdump()
    files = prepare(args.set_dir)
    load_before = os.getloadavg()
    rel = {p: p.relative_to(args.set_dir).as_posix() for p in files}

    per_file: list[dict[str, Any]] = []
    for path in files:
        fatbin = read_fatbin_file(path)
        ours = cuobjdump_view(list(fatbin.entries)) if fatbin else Counter()
        theirs = cuobjdump_list(cuobjdump, path)
        t_ours, _ = median_time(lambda p=path: read_fatbin_file(p), args.runs)
        t_theirs, _ = median_time(lambda p=path: cuobjdump_list(cuobjdump, p), args.runs)
        per_file.append({"path": rel[path], "size_mb": round(path.stat().st_size / 1e6, 1),
                         "entries": sum(ours.values()), "equal_counts": ours == theirs,
                         "sparkforge_s": round(t_ours, 4), "cuobjdump_s": round(t_theirs, 4)})  # fmt: skip
        print(json.dumps(per_file[-1]), flush=True)

    whole: dict[str, Any] = {}
    for label, func in [
        (
            "cuobjdump --list-elf + --list-ptx, every file",
            lambda: [cuobjdump_list(cuobjdump, p) for p in files],
        ),
        ("sparkforge audit_target(dir), in process", lambda: audit_target(args.set_dir)),
        ("sparkforge audit_target(dir), 1 worker", lambda: audit_target(args.set_dir, workers=1)),
        ("sparkforge audit, fresh python process", lambda: audit_process(args.set_dir)),
    ]:
        median, times = median_time(func, args.runs)
        whole[label] = {"median_s": round(median, 4), "runs_s": [round(t, 4) for t in times]}
        print(f"{label}: median {median:.3f}s", flush=True)
    wheel = cache_path("audit", "wheels", next(iter(WHEELS)))
    median, times = median_time(lambda: audit_target(wheel), args.runs)
    whole["sparkforge audit_target(vllm wheel), no extraction"] = {"median_s": round(median, 4),
                                                                    "runs_s": [round(t, 4) for t in times]}  # fmt: skip
    base = whole["cuobjdump --list-elf + --list-ptx, every file"]["median_s"]
    result = {
        "load_average_1_5_15": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },  # a shared 2-core machine
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "cuobjdump": subprocess.run(
            [str(cuobjdump), "--version"], capture_output=True, text=True
        ).stdout.splitlines()[-1],
        "runs": args.runs,
        "set": {
            "files": len(files),
            "total_mb": round(sum(p.stat().st_size for p in files) / 1e6, 1),
            "all_counts_equal": all(f["equal_counts"] for f in per_file),
        },
        "whole_set": whole,
        "speedup_in_process": round(base / whole["sparkforge audit_target(dir), in process"]["median_s"], 1),
        "speedup_fresh_process": round(base / whole["sparkforge audit, fresh python process"]["median_s"], 1),
        "per_file": per_file,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("set", "speedup_in_process", "speedup_fresh_process")}))


if __name__ == "__main__":
    main()
