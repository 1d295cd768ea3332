#!/usr/bin/env python3
"""jit.b12x: b12x (vLLM's `b12x` extra) compiles one of its CuTe DSL kernels for the recipe's GPU, no GPU needed.

b12x ships its own GPU-less compile path: the workers of its CompilePool call `_initialize_worker`, which hides
CUDA, describes the target (capability, SM count, shared memory) to torch, CuTe DSL (`envar.arch`, e.g.
sm_121a) and Triton, then run a compile factory. This check does exactly that in a child process for one
factory, the unquantized embedding lookup (b12x.sequence.embedding), with GB10's figures, and reports what
CuTe DSL compiled for. Runs when b12x is importable: vLLM's b12x extra (components.b12x), or the copy
flashinfer-python 0.7.2 embeds under a top-level `b12x/` package (which the extra's files then replace).

    python3 checks_b12x.py --lock /opt/sparkforge/lock.json      # prints the check as JSON (or run via run_checks)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MARKER = "SPARKFORGE-B12X-CHILD:"
TIMEOUT_S = 900
# GB10 (sm_121): 48 SMs; 99 KiB opt-in shared memory per block, 100 KiB per SM (as every SM12x part).
GB10 = {"sm_count": 48, "smem_block": 101376, "smem_sm": 102400, "name": "NVIDIA GB10"}


def _capability(lock: dict[str, Any]) -> tuple[int, int]:
    gpu = str(lock.get("gpu", "")).removeprefix("sm_").rstrip("af")
    if not gpu.isdigit() or len(gpu) < 2:
        raise ValueError(f"lock gpu {lock.get('gpu')!r} is not an sm_XY target")
    return int(gpu[:-1]), int(gpu[-1])


def _b12x_version() -> str:
    """b12x's own distribution, else the copy flashinfer-python embeds (its top-level b12x/ shim)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("b12x")
    except PackageNotFoundError:
        return f"embedded in flashinfer-python {version('flashinfer-python')}"


def child(lock: dict[str, Any]) -> dict[str, Any]:
    import multiprocessing
    import pickle
    from importlib.metadata import version

    from b12x._lib import compile_pool
    from b12x.sequence.embedding._tuning import TUNING, EmbeddingQuery

    major, minor = _capability(lock)
    out: dict[str, Any] = {"b12x": _b12x_version(), "cutlass_dsl": version("nvidia-cutlass-dsl")}
    activity = multiprocessing.get_context("spawn").Array("q", (0, 0))
    compile_pool._initialize_worker(
        0,
        (major, minor),
        "GPU-sparkforge-offline",
        GB10["name"],
        GB10["sm_count"],
        GB10["smem_block"],
        GB10["smem_sm"],
        activity,
    )
    from cutlass.cutlass_dsl import CuTeDSL

    out["arch"] = str(CuTeDSL._get_dsl().envar.arch)
    print(MARKER + json.dumps(out), flush=True)  # what was set up, before the step that may abort
    query = EmbeddingQuery(
        max_rows=16, table_rows=64, width=256, row_stride=256, weight_dtype="bfloat16", id_dtype="int32"
    )
    job = compile_pool.CompileJob.create(
        "b12x.sequence.embedding._preparation:compile_lookup", TUNING.encode_query(query), 0
    )
    start = time.monotonic()
    plan = compile_pool.describe_compilation(job)  # planning, as the pool's parent does
    from b12x._lib.compile_plan import evict_planning_artifacts

    evict_planning_artifacts(plan.programs)  # a worker starts without the parent's planning artifacts
    _pid, cute, triton, programs = compile_pool._run_job(pickle.dumps(job, protocol=5), plan.programs)
    out.update(
        compile_s=round(time.monotonic() - start, 1),
        cute_compiles=cute,
        triton_compiles=triton,
        programs=[f"{p.dialect}:{p.name}" for p in programs],
    )
    cache = Path(os.environ.get("B12X_COMPILE_CACHE_DIR", "/nonexistent"))
    files = [p for p in cache.rglob("*") if p.is_file()]
    out["artifacts"] = len(files)
    out["artifacts_naming_target"] = sum(out["arch"].encode() in p.read_bytes() for p in files)
    out["ok"] = cute > 0 and out["arch"] == f"sm_{major}{minor}a" and out["artifacts_naming_target"] > 0
    if not out["ok"]:
        out["error"] = f"{cute} CuTe DSL compile(s) for {out['arch']}"
    return out


def check(lock: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
    import importlib.util

    if "b12x" not in (lock.get("components") or {}) and importlib.util.find_spec("b12x") is None:
        return (
            "skipped",
            "no b12x in the image (components.b12x: vLLM's b12x extra; flashinfer's embedded copy)",
            {},
        )
    if not (lock.get("runtime") or {}).get("jit_toolchain", True):
        return "skipped", "the recipe ships no JIT toolchain (runtime.jit_toolchain: false)", {}
    with tempfile.TemporaryDirectory(prefix="sparkforge-b12x-") as cache:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
            json.dump(lock, handle)
        env = {**os.environ, "B12X_COMPILE_CACHE_DIR": cache, "CUTE_DSL_CACHE_DIR": cache}
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--child", "--lock", handle.name],
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                env=env,
            )
            output = done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            output = f"no result within {TIMEOUT_S} s"
        finally:
            os.unlink(handle.name)
    result: dict[str, Any] = {}
    for line in output.splitlines():
        if line.startswith(MARKER):
            result.update(json.loads(line[len(MARKER) :]))
    if not result.get("ok"):
        why = result.get("error") or output.strip().splitlines()[-1:] or ["no output"]
        return (
            "failed",
            f"b12x {result.get('b12x', '?')} could not compile its embedding kernel for {result.get('arch', '?')} "
            f"without a GPU: {str(why)[-600:]}; fix: check nvidia-cutlass-dsl matches b12x's pin (it needs the "
            "cu13 DSL libraries) or drop components.b12x",
            result,
        )
    return (
        "passed",
        f"b12x {result['b12x']} compiled {result['cute_compiles']} CuTe DSL kernel(s) for {result['arch']} in "
        f"{result['compile_s']} s without a GPU (CuTe DSL {result['cutlass_dsl']}; {result.get('artifacts_naming_target')} "
        f"of {result.get('artifacts')} cached artifacts name {result['arch']})",
        result,
    )


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lock", type=Path, default=Path("/opt/sparkforge/lock.json"))
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    lock = json.loads(args.lock.read_text())
    if args.child:
        print(MARKER + json.dumps(child(lock)), flush=True)
        return 0
    status, reason, details = check(lock)
    print(json.dumps({"name": "jit.b12x", "status": status, "reason": reason, "details": details}))
    return 1 if status == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
