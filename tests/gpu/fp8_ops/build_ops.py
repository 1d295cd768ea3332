#!/usr/bin/env python3
"""Build vLLM's FP8 ops from a vLLM source tree as a small torch extension, and the Python wrappers the suite calls.

    python3 tests/gpu/fp8_ops/build_ops.py --vllm-src DIR --cutlass DIR --out DIR [--arch 90a] [--jobs 16]

What is compiled is vLLM's own code, unchanged: the `cutlass_scaled_mm` entry point and dispatcher, the CUTLASS
3.x FP8 GEMM (per-tensor/per-token/per-channel) and its blockwise variant for one architecture family (SM90 on
Hopper, SM120 on GB10), and `csrc/libtorch_stable/quantization/w8a8/fp8/common.cu` (scaled_fp8_quant's kernels).
The op registration and the `vllm` package the suite imports come from vLLM's own sources too (op_package.py).
Writes `OUT/build.json`: per-unit compile seconds (from ninja's log), total wall time, versions and flags.
Standard library only: torch is located, never imported, so the build also runs where torch cannot load.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from op_package import (
    LIBRARY,
    OPS,
    PACKAGE_INIT,
    PLATFORM,
    WRAPPERS,
    BuildError,
    binding_source,
    wrappers_source,
)

HERE = Path(__file__).resolve().parent
W8A8 = "csrc/libtorch_stable/quantization/w8a8"
COMMON_UNITS = (
    "csrc/libtorch_stable/cutlass_extensions/common.cpp",
    f"{W8A8}/cutlass/scaled_mm_entry.cu",
    f"{W8A8}/fp8/common.cu",
)
# The CUTLASS units per family: the same three files vLLM's CMake lists for SCALED_MM_SM90 / SCALED_MM_SM120,
# less the int8 GEMMs (their symbols come from not_built.cu).
FAMILY_UNITS = {
    "sm90": (
        f"{W8A8}/cutlass/scaled_mm_c3x_sm90.cu",
        f"{W8A8}/cutlass/c3x/scaled_mm_sm90_fp8.cu",
        f"{W8A8}/cutlass/c3x/scaled_mm_blockwise_sm90_fp8.cu",
    ),
    "sm120": (
        f"{W8A8}/cutlass/scaled_mm_c3x_sm120.cu",
        f"{W8A8}/cutlass/c3x/scaled_mm_sm120_fp8.cu",
        f"{W8A8}/cutlass/c3x/scaled_mm_blockwise_sm120_fp8.cu",
    ),
}
FAMILY_DEFINE = {"sm90": "ENABLE_SCALED_MM_SM90", "sm120": "ENABLE_SCALED_MM_SM120"}


@dataclass(frozen=True)
class Toolchain:
    nvcc: Path
    cuda_home: Path
    torch_dir: Path
    cublas_include: Path | None
    cudart: Path | None
    libcuda: Path | None


def family_of(arch: str) -> str:
    """'90a' -> 'sm90'; '120f', '121a', '120' -> 'sm120' (vLLM's two CUTLASS 3.x FP8 families here)."""
    digits = re.match(r"(\d+)", arch)
    if not digits:
        raise BuildError(f"arch {arch!r} is not like 90a or 121a")
    number = int(digits.group(1))
    if 90 <= number < 100:
        if not arch.endswith("a"):
            raise BuildError("SM90's CUTLASS 3.x kernels need wgmma: use --arch 90a")
        return "sm90"
    if 120 <= number < 130:
        return "sm120"
    raise BuildError(f"arch {arch}: only the SM90 and SM120 FP8 families are built here")


def find_toolchain(cuda_home: Path | None, cublas_include: Path | None = None) -> Toolchain:
    """nvcc, torch's headers and libraries (found without importing torch), cuBLAS headers, the driver library."""
    home = cuda_home or Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    nvcc = home / "bin" / "nvcc"
    if not nvcc.is_file():
        found = shutil.which("nvcc")
        if not found:
            raise BuildError("no nvcc: set --cuda-home or CUDA_HOME to a CUDA 12.8+ toolkit")
        nvcc = Path(found)
        home = nvcc.parent.parent
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise BuildError("torch is not on this Python's path: run with the Python that has torch")
    torch_dir = Path(next(iter(spec.submodule_search_locations)))
    site = torch_dir.parent
    candidates = [
        *([cublas_include.resolve()] if cublas_include else []),
        home / "include",
        *sorted(site.glob("nvidia/*/include")),
    ]
    cublas = next((d for d in candidates if (d / "cublas_v2.h").is_file()), None)
    # The toolkit's libcudart, else the one torch's wheels bring (nvidia/cu13/lib has only the .so.13 name).
    runtimes = [home / "lib64" / "libcudart.so", *sorted(site.glob("nvidia/*/lib/libcudart.so.*"))]
    cudart = next((r for r in runtimes if r.is_file()), None)
    return Toolchain(nvcc, home, torch_dir, cublas, cudart, find_libcuda())


def find_libcuda() -> Path | None:
    """The driver library CUTLASS calls directly (cuTensorMapEncodeTiled); None where no driver is installed."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    except FileNotFoundError:
        return None
    hits = [ln.split("=>")[-1].strip() for ln in out.splitlines() if ln.strip().startswith("libcuda.so.1 ")]
    return Path(hits[0]) if hits else None


def torch_version(torch_dir: Path) -> str:
    text = (torch_dir / "version.py").read_text()
    match = re.search(r"__version__\s*=\s*'([^']+)'", text)
    return match.group(1) if match else "unknown"


def vllm_identity(src: Path) -> dict[str, str]:
    text = (src / "vllm" / "_version.py").read_text() if (src / "vllm" / "_version.py").is_file() else ""
    version = re.search(r"__version__ = version = '([^']+)'", text)
    commit = re.search(r"__commit_id__ = commit_id = '([^']+)'", text)
    return {
        "version": version.group(1) if version else "unknown",
        "commit": commit.group(1) if commit else "unknown",
    }


def cutlass_version(cutlass: Path) -> str:
    header = (cutlass / "include" / "cutlass" / "version.h").read_text()
    parts = [re.search(rf"#define CUTLASS_{p} (\d+)", header) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) if m else "?" for m in parts)


def nvcc_flags(arch: str, family: str, threads: int) -> list[str]:
    """The flags vLLM's CMake gives _C_stable_libtorch's CUDA units, for one gencode: torch's COMMON_NVCC_FLAGS less
    the no-half defines, the lambda/constexpr flags torch's CMake config adds, C++20, the stable-ABI target 2.11
    and direct driver calls for CUTLASS."""
    return [
        "-std=c++20",
        "-O2",
        "-DNDEBUG",
        "--expt-relaxed-constexpr",
        "--expt-extended-lambda",
        "-Xcompiler=-fPIC",
        "-DENABLE_FP8",
        f"-D{FAMILY_DEFINE[family]}=1",
        "-DTORCH_TARGET_VERSION=0x020B000000000000ULL",
        "-DUSE_CUDA",
        "-DCUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL=1",
        "-DTORCH_EXTENSION_NAME=_C_fp8",
        "--compress-mode=size",
        f"--threads={threads}",
        f"-gencode=arch=compute_{arch},code=sm_{arch}",
    ]


def include_flags(src: Path, cutlass: Path, tools: Toolchain) -> list[str]:
    dirs = [
        src / "csrc",
        cutlass / "include",
        cutlass / "tools" / "util" / "include",
        tools.torch_dir / "include",
        tools.torch_dir / "include" / "torch" / "csrc" / "api" / "include",
        tools.cuda_home / "include",
    ]
    if tools.cublas_include:
        dirs.append(tools.cublas_include)
    return [f"-I{d}" for d in dirs]


def write_ninja(
    out: Path, units: list[tuple[str, Path]], cflags: list[str], ldflags: list[str], nvcc: Path
) -> None:
    q = shlex.quote
    lines = [
        "ninja_required_version = 1.10",
        f"nvcc = {q(str(nvcc))}",
        f"cflags = {' '.join(q(f) for f in cflags)}",
        f"ldflags = {' '.join(q(f) for f in ldflags)}",
        "rule nvcc",
        "  command = $nvcc $cflags -x cu -c $in -o $out",
        "  description = nvcc $in",
        "rule link",
        "  command = g++ -shared -o $out $in $ldflags",
        "  description = link $out",
    ]
    objects = []
    for name, source in units:
        obj = f"obj/{name}.o"
        objects.append(obj)
        lines.append(f"build {obj}: nvcc {q(str(source))}")
    lines.append(f"build python/vllm/{LIBRARY}: link {' '.join(objects)}")
    (out / "build.ninja").write_text("\n".join(lines) + "\n")


def ninja_times(out: Path) -> dict[str, float]:
    """Seconds per output from ninja's log (its newest entry per output)."""
    times: dict[str, float] = {}
    log = out / ".ninja_log"
    if not log.is_file():
        return times
    for line in log.read_text().splitlines():
        if line.startswith("#"):
            continue
        start, end, _, output, *_ = line.split("\t")
        times[output] = (int(end) - int(start)) / 1000
    return times


def unit_name(source: str) -> str:
    return source.removeprefix("csrc/libtorch_stable/").replace("/", "__").rsplit(".", 1)[0]


def build(args: argparse.Namespace) -> dict:
    src, cutlass, out = args.vllm_src.resolve(), args.cutlass.resolve(), args.out.resolve()
    family = family_of(args.arch)
    tools = find_toolchain(args.cuda_home, args.cublas_include)
    if tools.cublas_include is None:
        raise BuildError(
            "no cublas_v2.h (vLLM's torch_utils.h includes it): install nvidia-cublas or a full toolkit"
        )
    (out / "python" / "vllm").mkdir(parents=True, exist_ok=True)
    (out / "gen").mkdir(exist_ok=True)
    bindings = out / "gen" / "fp8_bindings.cpp"
    bindings.write_text(binding_source((src / "csrc/libtorch_stable/torch_bindings.cpp").read_text()))
    identity = vllm_identity(src)
    package = out / "python" / "vllm"
    (package / "__init__.py").write_text(PACKAGE_INIT.format(version=identity["version"], library=LIBRARY))
    (package / "_platform.py").write_text(PLATFORM)
    (package / "_custom_ops.py").write_text(wrappers_source((src / "vllm/_custom_ops.py").read_text()))

    vllm_units = [*COMMON_UNITS, *FAMILY_UNITS[family]]
    units = [(unit_name(u), src / u) for u in vllm_units]
    units += [("fp8_bindings", bindings), ("not_built", HERE / "not_built.cu")]
    for _, path in units:
        if not path.is_file():
            raise BuildError(f"{path} is missing: these sources are laid out differently from vLLM 0.31.0")
    cflags = nvcc_flags(args.arch, family, args.nvcc_threads) + include_flags(src, cutlass, tools)
    ldflags = [
        f"-L{tools.torch_dir / 'lib'}",
        "-ltorch",
        "-ltorch_cpu",
        "-ltorch_cuda",
        "-lc10",
        "-lc10_cuda",
    ]
    if tools.cudart is None:
        raise BuildError("no libcudart (CUDA's lib64 or torch's nvidia/*/lib): install the CUDA runtime")
    ldflags += [str(tools.cudart), f"-Wl,-rpath,{tools.torch_dir / 'lib'}"]
    if tools.libcuda:
        ldflags += [str(tools.libcuda), "-Wl,--no-undefined"]
    write_ninja(out, units, cflags, ldflags, tools.nvcc)
    nvcc_version = subprocess.run([str(tools.nvcc), "--version"], capture_output=True, text=True, check=False)
    start = time.monotonic()
    proc = subprocess.run(["ninja", "-C", str(out), f"-j{args.jobs}"], check=False)
    wall = time.monotonic() - start
    times = ninja_times(out)
    report = {
        "what": "vLLM FP8 ops compiled from vLLM sources as a torch extension (tests/gpu/fp8_ops/build_ops.py)",
        "vllm": identity,
        "cutlass": cutlass_version(cutlass),
        "torch": torch_version(tools.torch_dir),
        "nvcc": (nvcc_version.stdout.strip().splitlines() or ["?"])[-1],
        "arch": args.arch,
        "family": family,
        "jobs": args.jobs,
        "nvcc_threads": args.nvcc_threads,
        "nvcc_path": str(tools.nvcc),
        "cudart": str(tools.cudart),
        "libcuda_linked": str(tools.libcuda) if tools.libcuda else None,
        "ok": proc.returncode == 0,
        "wall_s": round(wall, 1),
        "units": [
            {
                "source": str(path.relative_to(src)) if path.is_relative_to(src) else path.name,
                "seconds": times.get(f"obj/{name}.o"),
            }
            for name, path in units
        ],
        "link_s": times.get(f"python/vllm/{LIBRARY}"),
        "library_bytes": (package / LIBRARY).stat().st_size if (package / LIBRARY).is_file() else None,
        "nvcc_flags": nvcc_flags(args.arch, family, args.nvcc_threads),
        "ops": list(OPS),
        "wrappers": list(WRAPPERS),
    }
    (out / "build.json").write_text(json.dumps(report, indent=2) + "\n")
    if proc.returncode != 0:
        raise BuildError(f"ninja failed (exit {proc.returncode}); the failing unit's nvcc output is above")
    return report


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vllm-src", type=Path, required=True, help="unpacked vLLM sdist or checkout")
    parser.add_argument(
        "--cutlass", type=Path, required=True, help="CUTLASS root (include/, tools/util/include/)"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--arch", default="90a", help="one gencode target: 90a (H100/H200) or 121a/120f (GB10)"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--nvcc-threads", type=int, default=1)
    parser.add_argument("--cuda-home", type=Path, default=None)
    parser.add_argument("--cublas-include", type=Path, default=None, help="folder with cublas_v2.h")
    args = parser.parse_args()
    try:
        report = build(args)
    except BuildError as exc:
        print(f"build_ops: {exc}", file=sys.stderr)
        return 1
    for unit in report["units"]:
        print(f"{unit['seconds']!s:>8} s  {unit['source']}")
    print(f"built {LIBRARY} for sm_{report['arch']} in {report['wall_s']} s ({report['jobs']} jobs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
