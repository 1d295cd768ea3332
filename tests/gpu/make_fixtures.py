"""Compile the per-variant fatbins that tests/gpu/cubin_load.py loads on a real GPU (run on a machine with nvcc 13).

One variant per file, uncompressed unless the name says otherwise, so each cubin or PTX can also be
loaded on its own; the files are small and committed under tests/gpu/fixtures/.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

NVCC = Path(os.environ.get("SPARKFORGE_NVCC", "/usr/local/cuda-13.0/bin/nvcc"))
KERNEL = 'extern "C" __global__ void scale(float *x, float f) { x[threadIdx.x] *= f; }\n'
HERE = Path(__file__).resolve().parent

# name -> (gencode pairs arch:code, extra nvcc flags)
VARIANTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "sm_80": (("compute_80:sm_80",), ()),
    "sm_86": (("compute_86:sm_86",), ()),
    "sm_89": (("compute_89:sm_89",), ()),
    "sm_90": (("compute_90:sm_90",), ()),
    "sm_90a": (("compute_90a:sm_90a",), ()),
    "sm_100": (("compute_100:sm_100",), ()),
    "sm_100f": (("compute_100f:sm_100f",), ()),
    "sm_120": (("compute_120:sm_120",), ()),
    "sm_120f": (("compute_120f:sm_120f",), ()),
    "sm_121a": (("compute_121a:sm_121a",), ()),
    "ptx_80": (("compute_80:compute_80",), ()),
    "ptx_90": (("compute_90:compute_90",), ()),
    "ptx_90a": (("compute_90a:compute_90a",), ()),
    "ptx_100": (("compute_100:compute_100",), ()),
    "ptx_120f": (("compute_120f:compute_120f",), ()),
    "sm_80-ptx_80": (("compute_80:[sm_80,compute_80]",), ()),
    "lto_90": (("compute_90:lto_90",), ("-rdc=true",)),
    "zstd-sm_90-ptx_90": (("compute_90:[sm_90,compute_90]",), ("-compress-mode=size",)),
    "lz4-sm_90-ptx_90": (("compute_90:[sm_90,compute_90]",), ("-compress-mode=speed",)),
}


def compile_variant(name: str, out_dir: Path) -> Path:
    gencode, extra = VARIANTS[name]
    out = out_dir / f"{name}.fatbin"
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.cu"
        source.write_text(KERNEL)
        argv = [str(NVCC), "-fatbin", str(source), "-o", str(out)]
        for pair in gencode:
            arch, code = pair.split(":")
            argv += ["-gencode", f"arch={arch},code={code}"]
        if not any(flag.startswith("-compress-mode") for flag in extra):
            argv.append("-compress-mode=none")
        subprocess.run([*argv, *extra], check=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=HERE / "fixtures")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=2) as pool:
        for path in pool.map(lambda n: compile_variant(n, args.out), VARIANTS):
            print(path.relative_to(args.out.parent), path.stat().st_size)


if __name__ == "__main__":
    main()
