#!/usr/bin/env python3
"""The compile probe inside the build environment: vLLM's own CMake configure, then chosen object targets.

Runs in the `probe` stage (same toolchain as `build`). Configures vLLM's CMakeLists.txt with the arguments
vLLM's setup.py passes (cmake_build_ext.configure), asks the generated Ninja build for each translation unit's
object target and its real compile command, builds each object alone while measuring wall time and memory,
and writes probe.json plus the objects to --out. Failures are recorded in probe.json (the host judges them);
the script exits non-zero only when it cannot write its result.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

EXTERNAL = re.compile(r"^(\s*)include\(cmake/external_projects/([A-Za-z0-9_]+)\.cmake\)\s*$", re.M)
BUILDING = re.compile(r"^-- ((?:Not building|Building) .*)$", re.M)
GENCODE = re.compile(r"-gencode[= ](arch=[A-Za-z0-9_]+,code=[A-Za-z0-9_\[\],]+)")


def tree_rss_kb(root: int) -> int:
    """Resident memory of `root` and all its descendants (summed), from /proc."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        ppid = re.search(r"^PPid:\s+(\d+)", status, re.M)
        vmrss = re.search(r"^VmRSS:\s+(\d+)", status, re.M)
        parents[int(entry)] = int(ppid.group(1)) if ppid else 0
        rss[int(entry)] = int(vmrss.group(1)) if vmrss else 0
    total = 0
    for pid, kb in rss.items():
        walk = pid
        while walk and walk != root:
            walk = parents.get(walk, 0)
        total += kb if walk == root else 0
    return total


def measured(argv: list[str], cwd: Path, log: Path) -> dict[str, object]:
    """Run argv; wall time, peak summed RSS of its process tree (sampled) and of its largest process."""
    start = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        peak = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.25):
                peak[0] = max(peak[0], tree_rss_kb(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        sampler.join()
    return {
        "returncode": proc.returncode,
        "seconds": round(time.monotonic() - start, 1),
        "peak_tree_mb": round(peak[0] / 1024),
        "peak_process_mb": round(usage.ru_maxrss / 1024),
    }


def cmake_args(source: Path, nvcc_threads: int) -> list[str]:
    """The configure arguments vLLM's setup.py (cmake_build_ext.configure) passes, with one compile job."""
    args = [
        str(source),
        "-G",
        "Ninja",
        f"-DCMAKE_BUILD_TYPE={os.environ.get('CMAKE_BUILD_TYPE') or 'RelWithDebInfo'}",
        f"-DVLLM_TARGET_DEVICE={os.environ.get('VLLM_TARGET_DEVICE', 'cuda')}",
        f"-DVLLM_PYTHON_EXECUTABLE={sys.executable}",
        f"-DVLLM_PYTHON_PATH={':'.join(sys.path)}",
        f"-DFETCHCONTENT_BASE_DIR={os.environ.get('FETCHCONTENT_BASE_DIR', source / '.deps')}",
        f"-DNVCC_THREADS={nvcc_threads}",
        "-DCMAKE_JOB_POOL_COMPILE:STRING=compile",
        "-DCMAKE_JOB_POOLS:STRING=compile=1",
    ]
    if shutil.which("ccache"):
        args += [f"-DCMAKE_{lang}_COMPILER_LAUNCHER=ccache" for lang in ("C", "CXX", "CUDA", "HIP")]
    cuda_home = os.environ.get("CUDA_HOME")
    nvcc = Path(cuda_home, "bin", "nvcc") if cuda_home else None
    if nvcc is not None and nvcc.exists():
        args.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
    return args + os.environ.get("CMAKE_ARGS", "").split()


def omit_externals(source: Path) -> list[str]:
    """Replace vLLM's external-project includes (each a git fetch) by a message; returns their names."""
    lists = source / "CMakeLists.txt"
    text = lists.read_text()
    names = EXTERNAL.findall(text)
    lists.write_text(
        EXTERNAL.sub(
            lambda m: f'{m[1]}message(STATUS "sparkforge probe: external project {m[2]} omitted")', text
        )
    )
    return [name for _, name in names]


def cmake_error(output: str) -> str:
    """The first CMake Error block (what the user needs), else the tail."""
    match = re.search(r"CMake Error.*?(?=\n-- |\n\n\n|\Z)", output, re.S)
    return (match.group(0) if match else output[-3000:]).strip()[:3000]


def object_targets(build: Path) -> dict[str, str]:
    """Ninja object target for each source path it compiles: {source-relative path: target}."""
    listing = subprocess.run(["ninja", "-t", "targets", "all"], cwd=build, capture_output=True, text=True)
    out: dict[str, str] = {}
    for line in listing.stdout.splitlines():
        target = line.split(": ", 1)[0]
        match = re.fullmatch(r"CMakeFiles/[^/]+\.dir/(.+)\.o", target)
        if match and match.group(1) not in out:
            out[match.group(1)] = target
    return out


def probe_unit(build: Path, out: Path, unit: str, targets: dict[str, str]) -> dict[str, object]:
    target = targets.get(unit)
    record: dict[str, object] = {"source": unit, "target": target}
    if target is None:
        record["error"] = "vLLM's configure generated no object target for it (not built for these archs?)"
        return record
    commands = subprocess.run(["ninja", "-t", "commands", target], cwd=build, capture_output=True, text=True)
    command = commands.stdout.strip().splitlines()[-1] if commands.stdout.strip() else ""
    record["command"] = command
    record["gencode"] = GENCODE.findall(command)
    log = out / "logs" / (unit.replace("/", "__") + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    record.update(measured(["ninja", target], build, log))
    if record["returncode"] == 0:
        dest = out / "objects" / (unit.replace("/", "__") + ".o")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(build / target, dest)
        record["object"] = str(dest.relative_to(out))
    else:
        record["error"] = log.read_text(errors="replace")[-3000:]
    return record


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", type=Path, required=True)
    parser.add_argument("--build", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--unit", action="append", default=[])
    parser.add_argument("--nvcc-threads", type=int, default=1)
    parser.add_argument("--omit-externals", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, object] = {
        "arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST", ""),
        "nvcc_threads": args.nvcc_threads,
        "cpus": os.cpu_count(),
        "units": [],
    }
    missing = [u for u in args.unit if not (args.source / u).is_file()]
    if missing:
        result["error"] = f"not in the source tree: {', '.join(missing)}"
    else:
        result["externals_omitted"] = omit_externals(args.source) if args.omit_externals else []
        args.build.mkdir(parents=True, exist_ok=True)
        log = args.out / "configure.log"
        try:
            configure = measured(["cmake", *cmake_args(args.source, args.nvcc_threads)], args.build, log)
        except FileNotFoundError as exc:
            configure = {
                "returncode": 127,
                "error": f"{exc.filename} is not installed in the build environment",
            }
        output = log.read_text(errors="replace") if log.exists() else ""
        configure["messages"] = BUILDING.findall(output)
        if configure["returncode"] != 0:
            configure.setdefault("error", cmake_error(output))
        result["configure"] = configure
        if configure["returncode"] == 0:
            targets = object_targets(args.build)
            result["units"] = [probe_unit(args.build, args.out, unit, targets) for unit in args.unit]
    (args.out / "probe.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "units"}, indent=2)[:4000])
    for unit in result["units"]:  # type: ignore[union-attr]
        print(
            f"sparkforge probe: {unit['source']}: {unit.get('gencode')} {unit.get('seconds')} s "
            f"{unit.get('peak_tree_mb')} MB rc={unit.get('returncode')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
