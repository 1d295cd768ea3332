#!/usr/bin/env python3
"""Compile vLLM's SM12x FP4 units (the FP4_SM120_SRCS of its CMakeLists.txt) to objects for one or more archs.

    python3 tests/gpu/fp4_units/compile_units.py --vllm-src DIR --cutlass DIR --out DIR \
        [--arch 121a] [--arch 120f] [--jobs N] [--cuda-home DIR] [--cublas-include DIR] [--torch-dir DIR]

The units are vLLM's own, unchanged: scaled_fp4_quant's kernels (nvfp4_quant_kernels.cu), the fused
activation+quant, the experts' quantization, the CUTLASS FP4 GEMM for sm_120 (nvfp4_scaled_mm_sm120_kernels.cu)
and the CUTLASS FP4 grouped GEMM of FP4 MoE (nvfp4_blockwise_moe_kernel.cu), with the flags vLLM's CMake gives
_C_stable_libtorch's CUDA units plus ENABLE_NVFP4_SM120 (build_ops.nvcc_flags). No GPU is needed: the objects
are compiled, not run. Writes OUT/fp4_compile.json (per unit and arch: ok, seconds, object bytes, the last
lines of nvcc's output on failure). Standard library only: torch is located, never imported.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fp8_ops"))

from build_ops import find_toolchain, include_flags, nvcc_flags, vllm_identity

FP4 = "csrc/libtorch_stable/quantization/fp4"
# vLLM 0.31.0 CMakeLists.txt, FP4_SM120_SRCS (less nvfp4_kv_cache_kernels.cu: the KV cache, not a GEMM path).
UNITS = (
    f"{FP4}/nvfp4_quant_kernels.cu",
    f"{FP4}/activation_nvfp4_quant_fusion_kernels.cu",
    f"{FP4}/nvfp4_experts_quant.cu",
    f"{FP4}/nvfp4_scaled_mm_sm120_kernels.cu",
    f"{FP4}/nvfp4_blockwise_moe_kernel.cu",
)


def flags(arch: str) -> list[str]:
    """build_ops' flags for the SM120 family, with the FP4 define instead of the FP8 one."""
    base = [f for f in nvcc_flags(arch, "sm120", 1) if f != "-DENABLE_SCALED_MM_SM120=1"]
    return [*base, "-DENABLE_NVFP4_SM120=1"]


def compile_one(nvcc: Path, source: Path, obj: Path, arch: str, includes: list[str]) -> dict:
    obj.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    proc = subprocess.run(
        [str(nvcc), *flags(arch), *includes, "-x", "cu", "-c", str(source), "-o", str(obj)],
        capture_output=True,
        text=True,
        check=False,
    )
    return {
        "arch": arch,
        "ok": proc.returncode == 0 and obj.is_file(),
        "seconds": round(time.monotonic() - start, 1),
        "object": str(obj),
        "bytes": obj.stat().st_size if obj.is_file() else None,
        "output": (proc.stdout + proc.stderr).strip().splitlines()[-8:] if proc.returncode else [],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vllm-src", type=Path, required=True)
    parser.add_argument("--cutlass", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--arch", action="append", default=None, help="121a (default), 120f, 120...")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cuda-home", type=Path, default=None)
    parser.add_argument("--cublas-include", type=Path, default=None)
    args = parser.parse_args()
    archs = args.arch or ["121a"]
    tools = find_toolchain(args.cuda_home, args.cublas_include)
    src, out = args.vllm_src.resolve(), args.out.resolve()
    includes = include_flags(src, args.cutlass.resolve(), tools)
    jobs = [(unit, arch) for arch in archs for unit in UNITS]
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda j: compile_one(tools.nvcc, src / j[0], out / j[1] / (Path(j[0]).stem + ".o"),
                                                      j[1], includes), jobs))  # fmt: skip
    nvcc = subprocess.run([str(tools.nvcc), "--version"], capture_output=True, text=True, check=False)
    report = {
        "what": "vLLM's SM12x FP4 units compiled to objects (tests/gpu/fp4_units/compile_units.py)",
        "vllm": vllm_identity(src),
        "nvcc": (nvcc.stdout.strip().splitlines() or ["?"])[-1],
        "jobs": args.jobs,
        "wall_s": round(time.monotonic() - start, 1),
        "flags": {arch: flags(arch) for arch in archs},
        "units": [{"source": unit, **result} for (unit, _), result in zip(jobs, results, strict=True)],
    }
    (out / "fp4_compile.json").write_text(json.dumps(report, indent=2) + "\n")
    for unit in report["units"]:
        print(
            f"{'ok ' if unit['ok'] else 'FAIL'} {unit['seconds']:>7} s  sm_{unit['arch']}  {unit['source']}"
        )
    return 0 if all(u["ok"] for u in report["units"]) else 1


if __name__ == "__main__":
    sys.exit(main())
