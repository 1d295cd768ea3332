#!/usr/bin/env python3
"""In-image checks of the serve-time JIT toolchains for the recipe's GPU; none needs a GPU.

- jit.toolchain: nvcc and ptxas in CUDA_HOME know the target (ptxas assembles a kernel for it);
- jit.triton: Triton compiles a small kernel for the target through the ptxas it is configured to use
  (TRITON_PTXAS_BLACKWELL_PATH for sm_100 and newer, TRITON_PTXAS_PATH below; its bundled copy otherwise);
- jit.flashinfer: FlashInfer JIT-compiles one of its kernels for the target with the image's nvcc, headers and
  host compiler, the way it does on the first `vllm serve`.
Each compile runs in a child process (`checks_jit.py --child triton|flashinfer`), so its environment is fresh.
Run alone, the script prints the same JSON document as run_checks.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import checklist

Result = tuple[str, str, dict[str, Any]]
CHILD_MARKER = "SPARKFORGE-JIT-CHILD:"
# Per JIT compile; sparkforge raises it for a run under qemu-user (sparkforge/verify/emulation.py).
TIMEOUT_S = int(os.environ.get("SPARKFORGE_JIT_TIMEOUT_S") or 900)
PTXAS_FIX = (
    "point TRITON_PTXAS_BLACKWELL_PATH and TRITON_PTXAS_PATH at CUDA's ptxas >= 12.9 (the image ships one at "
    "$CUDA_HOME/bin/ptxas; recipe env), or rebuild with runtime.jit_toolchain: true"
)


def target_of(lock: dict[str, Any]) -> tuple[int, str]:
    """The recipe's GPU as Triton's capability (121) and the arch-specific name JITs compile for (sm_121a)."""
    match = re.fullmatch(r"sm_([0-9]+)[af]?", str(lock.get("gpu", "")))
    if match is None:
        raise ValueError(f"lock gpu {lock.get('gpu')!r} is not an sm_XY target")
    capability = int(match.group(1))
    return capability, f"sm_{capability}{'a' if capability >= 90 else ''}"


def _jit_wanted(lock: dict[str, Any]) -> bool:
    return bool((lock.get("runtime") or {}).get("jit_toolchain", True))


def _skip() -> Result:
    return "skipped", "the recipe ships no JIT toolchain (runtime.jit_toolchain: false)", {}


def _release(tool: str) -> str | None:
    try:
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60).stdout
    except OSError:
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def _cuda_home() -> Path | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return Path(home)
    nvcc = shutil.which("nvcc")
    return Path(nvcc).resolve().parent.parent if nvcc else None


def ptxas_assembles(ptxas: str, arch: str) -> subprocess.CompletedProcess[str]:
    """Assemble an empty kernel for `arch`: the cheapest proof that this ptxas knows the target."""
    ptx = f".version 8.8\n.target {arch}\n.address_size 64\n.visible .entry sparkforge_probe()\n{{\n  ret;\n}}\n"
    with tempfile.TemporaryDirectory(prefix="sparkforge-ptxas-") as tmp:
        source = Path(tmp, "probe.ptx")
        source.write_text(ptx)
        return subprocess.run(
            [ptxas, f"--gpu-name={arch}", str(source), "-o", str(Path(tmp, "probe.cubin"))],
            capture_output=True,
            text=True,
            timeout=120,
        )


def check_toolchain(lock: dict[str, Any]) -> Result:
    if not _jit_wanted(lock):
        return _skip()
    _, arch = target_of(lock)
    home = _cuda_home()
    if home is None:
        return (
            "failed",
            f"nvcc: no CUDA_HOME and no nvcc on PATH, so nothing can JIT-compile for {arch}; fix: "
            + ("rebuild with runtime.jit_toolchain: true (NVIDIA's CUDA wheels, CUDA_HOME=/opt/venv/cuda)"),
            {},
        )
    tools = {name: home / "bin" / name for name in ("nvcc", "ptxas")}
    details: dict[str, Any] = {"cuda_home": str(home)}
    for name, path in tools.items():
        details[name] = {"path": str(path), "release": _release(str(path))}
        if details[name]["release"] is None:
            return (
                "failed",
                f"{name} at {path} does not run, so nothing can JIT-compile for {arch}; fix: "
                + ("rebuild with runtime.jit_toolchain: true, or set CUDA_HOME to a CUDA >= 12.9 toolkit"),
                details,
            )
    archs = subprocess.run(
        [str(tools["nvcc"]), "--list-gpu-arch"], capture_output=True, text=True, timeout=60
    )
    compute = "compute_" + arch.removeprefix("sm_").rstrip("af")
    details["nvcc"]["knows_target"] = compute in archs.stdout.split()
    if not details["nvcc"]["knows_target"]:
        return (
            "failed",
            (
                f"nvcc {details['nvcc']['release']} at {tools['nvcc']} does not list {compute} for {arch}; fix: "
                "ship CUDA >= 12.9's nvcc (NVIDIA's nvidia-cuda-nvcc wheel)"
            ),
            details,
        )
    done = ptxas_assembles(str(tools["ptxas"]), arch)
    if done.returncode != 0:
        return (
            "failed",
            (
                f"ptxas {details['ptxas']['release']} at {tools['ptxas']} cannot assemble for {arch}: "
                f"{(done.stderr or done.stdout).strip()[-300:]}; fix: ship CUDA >= 12.9's ptxas"
            ),
            details,
        )
    return (
        "passed",
        (
            f"nvcc {details['nvcc']['release']} and ptxas {details['ptxas']['release']} in {home} compile for {arch}"
        ),
        details,
    )


def _child(kind: str, lock: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """Run this file as `--child kind` and return the JSON it printed (or what went wrong)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(lock, handle)
    try:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--lock", handle.name],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env={**os.environ, **env},
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"no result within {TIMEOUT_S} s"}
    finally:
        os.unlink(handle.name)
    result: dict[str, Any] = {}
    for line in done.stdout.splitlines():  # a child reports what it found before the step that may abort it
        if line.startswith(CHILD_MARKER):
            result.update(json.loads(line[len(CHILD_MARKER) :]))
    if "ok" not in result:
        result.update(ok=False, error=f"exited {done.returncode}: {(done.stderr or done.stdout)[-1500:]}")
    return result


def _triton_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def sparkforge_add(x, y, out, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out + offsets, tl.load(x + offsets, mask=mask) + tl.load(y + offsets, mask=mask), mask=mask)

    return sparkforge_add


def child_triton(lock: dict[str, Any]) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    capability, arch = target_of(lock)
    out: dict[str, Any] = {"triton": triton.__version__, "arch": arch}
    try:
        tool = get_ptxas(capability)
        out["ptxas"] = {"path": tool.path, "release": tool.version}
    except RuntimeError as exc:
        return {**out, "ok": False, "error": str(exc)}
    print(CHILD_MARKER + json.dumps(out), flush=True)  # LLVM aborts the process on a PTX/target mismatch
    signature = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    source = ASTSource(fn=_triton_kernel(), signature=signature, constexprs={"BLOCK": 128})
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32))
    except Exception as exc:  # Triton raises plain RuntimeError / PTXASError with ptxas' own message
        return {**out, "ok": False, "error": f"{exc.__class__.__name__}: {str(exc)[-1500:]}"}
    ptx = compiled.asm.get("ptx", "")
    cubin = compiled.asm.get("cubin", b"")
    out["ptx_target"] = next(iter(re.findall(r"^\.target\s+(\S+)", ptx, re.M)), None)
    out["cubin_bytes"] = len(cubin)
    out["ok"] = bool(cubin) and out["ptx_target"] == arch
    if not out["ok"]:
        out["error"] = f"compiled for {out['ptx_target']} ({len(cubin)} cubin bytes), not {arch}"
    return out


def check_triton(lock: dict[str, Any]) -> Result:
    if not _jit_wanted(lock):
        return _skip()
    _, arch = target_of(lock)
    with tempfile.TemporaryDirectory(prefix="sparkforge-triton-") as cache:
        result = _child("triton", lock, {"TRITON_CACHE_DIR": cache})
    ptxas = result.get("ptxas") or {}
    if not result.get("ok"):
        return (
            "failed",
            (
                f"Triton cannot compile for {arch} through ptxas {ptxas.get('release', '?')} at "
                f"{ptxas.get('path', '?')}: {str(result.get('error'))[-600:]}; fix: {PTXAS_FIX}"
            ),
            result,
        )
    return (
        "passed",
        (
            f"Triton {result.get('triton')} compiled a kernel for {arch} ({result['cubin_bytes']} cubin bytes) "
            f"through ptxas {ptxas.get('release')} at {ptxas.get('path')}"
        ),
        result,
    )


def child_flashinfer(lock: dict[str, Any]) -> dict[str, Any]:
    from importlib.metadata import version

    from flashinfer.jit.activation import gen_act_and_mul_module
    from flashinfer.jit.cpp_ext import get_cuda_path

    _, arch = target_of(lock)
    out: dict[str, Any] = {
        "flashinfer": version("flashinfer-python"),
        "arch": arch,
        "cuda_home": get_cuda_path(),
    }
    spec = gen_act_and_mul_module("silu")
    start = time.monotonic()
    try:
        spec.build(verbose=False)
    except Exception as exc:  # FlashInfer raises RuntimeError carrying ninja's and nvcc's output
        return {**out, "ok": False, "error": f"{exc.__class__.__name__}: {str(exc)[-1500:]}"}
    out["compile_s"] = round(time.monotonic() - start, 1)
    ninja = Path(spec.ninja_path).read_text() if Path(spec.ninja_path).is_file() else ""
    out["gencode"] = sorted(set(re.findall(r"code=(sm_[0-9]+[af]?)", ninja)))
    library = Path(spec.jit_library_path)
    out["library_bytes"] = library.stat().st_size if library.is_file() else 0
    out["ok"] = out["library_bytes"] > 0 and arch in out["gencode"]
    if not out["ok"]:
        out["error"] = f"built {out['library_bytes']} bytes for {out['gencode']}, not {arch}"
    return out


def check_flashinfer(lock: dict[str, Any]) -> Result:
    if not _jit_wanted(lock):
        return _skip()
    if "flashinfer" not in (lock.get("components") or {}):
        return "skipped", "the recipe pins no flashinfer", {}
    _, arch = target_of(lock)
    flashinfer_arch = arch.removeprefix("sm_")
    flashinfer_arch = f"{flashinfer_arch[:-2]}.{flashinfer_arch[-2:]}"  # sm_121a -> 12.1a
    with tempfile.TemporaryDirectory(prefix="sparkforge-flashinfer-") as workspace:
        env = {"FLASHINFER_CUDA_ARCH_LIST": flashinfer_arch, "FLASHINFER_WORKSPACE_BASE": workspace}
        result = _child("flashinfer", lock, env)
    if not result.get("ok"):
        return (
            "failed",
            (
                f"FlashInfer cannot JIT-compile for {arch} with nvcc in {result.get('cuda_home', '$CUDA_HOME')}: "
                f"{str(result.get('error'))[-600:]}; fix: ship nvcc, the CUDA headers and g++ "
                "(runtime.jit_toolchain: true) and set CUDA_HOME to them"
            ),
            result,
        )
    return (
        "passed",
        (
            f"FlashInfer {result.get('flashinfer')} JIT-compiled silu_and_mul for {arch} in {result['compile_s']} s "
            f"with nvcc from {result.get('cuda_home')}"
        ),
        result,
    )


def check_b12x(lock: dict[str, Any]) -> Result:
    """jit.b12x: checks_b12x.py (b12x's own GPU-less compile path, one CuTe DSL kernel for the target)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import checks_b12x

    return checks_b12x.check(lock)


# This module's rows of the suite, in order (declared in checklist.py).
CHECKS = [
    (name, globals()[function]) for name, module, function, _ in checklist.CHECKS if module == "checks_jit"
]
CHILDREN = {"triton": child_triton, "flashinfer": child_flashinfer}


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lock", type=Path, default=Path("/opt/sparkforge/lock.json"))
    parser.add_argument("--child", choices=sorted(CHILDREN))
    parser.add_argument("--only", action="append", default=[], help="run only these checks")
    args = parser.parse_args()
    lock = json.loads(args.lock.read_text())
    if args.child:
        print(CHILD_MARKER + json.dumps(CHILDREN[args.child](lock)))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run_checks import MARKER, _check

    results = [_check(name, fn, lock) for name, fn in CHECKS if not args.only or name in args.only]
    print(MARKER + json.dumps({"checks": results}))
    return 1 if any(r["status"] == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
