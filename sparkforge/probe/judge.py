"""Verdicts of the probe: did vLLM's configure run, and does each probed object run on the recipe's GPU as promised."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sparkforge.boundary import linear_regex
from sparkforge.recipe.schema import RecipeModel
from sparkforge.report import Check, Report

PATCH_HINT = "patches/vllm/0001-cmake-keep-sm121-on-cuda13.patch"
_HINTS = (
    (
        r"Could NOT find CUDA|CUDA cannot be found|cannot find the CUDA|CUDA_CUDART_LIBRARY|No CMAKE_CUDA_COMPILER|Failed to find nvcc|nvcc not found",
        "the build environment has no CUDA compiler; fix: a builder image with CUDA {cuda}'s nvcc (the nvidia/cuda "
        "devel image), or build.cuda_wheels to install it from NVIDIA's PyPI wheels",
    ),
    (
        r"execute_process failed.*no such file or directory|Abnormal exit with child return code: no such file",
        "a program vLLM's configure runs is not installed in the build environment (e.g. patch, git); "
        "fix: add it to the toolchain stage",
    ),
    (
        r"Could NOT find Python|Development\.Module|Python\.h",
        "Python's headers are missing from the build environment; fix: install python3-dev in the toolchain",
    ),
    (
        r"Failed to clone|Could not resolve host",
        "a git fetch failed (offline?); fix: network, or build.probe.externals: omit",
    ),
    (
        r"is not installed in the build environment",
        "a build requirement is missing; fix: add it to the toolchain stage",
    ),
)


def configure_hint(error: str, cuda: str) -> str:
    for pattern, hint in _HINTS:
        if linear_regex(f"(?si){pattern}").search(error):
            return hint.format(cuda=cuda)
    return "fix: read configure.log in the probe's output directory"


def judge_configure(report: Report, result: dict[str, Any], cuda: str) -> bool:
    """The configure check; False when no unit could be compiled."""
    configure = result.get("configure") or {}
    check = report.add(Check("configure", "passed", duration_s=float(configure.get("seconds") or 0.0)))
    check.details = {
        "messages": configure.get("messages", []),
        "externals_omitted": result.get("externals_omitted", []),
        "arch_list": result.get("arch_list"),
        "cpus": result.get("cpus"),
    }
    if result.get("error") or configure.get("returncode") != 0:
        error = str(result.get("error") or configure.get("error") or "")
        check.status = "failed"
        check.reason = (
            f"vLLM's CMake configure failed: {' '.join(error.split())[:900]}; {configure_hint(error, cuda)}"
        )
        return False
    omitted = result.get("externals_omitted") or []
    check.reason = f"vLLM's own CMake configure (Ninja) in {configure.get('seconds')} s"
    if omitted:
        check.reason += f"; external projects left out (not fetched): {', '.join(omitted)}"
    return True


def judge_unit(report: Report, unit: dict[str, Any], model: RecipeModel, generic: bool) -> Check:
    """One probed unit: compiled, and native where the arch list promises the GPU's own arch."""
    check = report.add(Check(f"unit:{Path(unit['source']).name}", "passed"))
    check.duration_s = float(unit.get("seconds") or 0.0)
    check.details = {k: v for k, v in unit.items() if k not in ("error",)}
    if unit.get("error"):
        check.status = "failed"
        check.reason = f"{unit['source']}: {' '.join(str(unit['error']).split())[-900:]}"
        return check
    gpu = model.gpu
    match = re.fullmatch(r"sm_(\d+)(\d)[af]?", gpu)
    own = f"{match[1]}.{match[2]}" if match else ""
    promised = any(a in (own, own + "a") for a in model.build.torch_cuda_arch_list)
    verdict, entries = unit.get("verdict", "none"), unit.get("entries", {})
    listing = ", ".join(f"{k} x{v}" for k, v in entries.items()) or "no device code"
    measured = f"{unit.get('seconds')} s, peak {unit.get('peak_tree_mb')} MB"
    kind = "generic kernel" if generic else f"SM{own.split('.')[0]}x kernel"
    if verdict in ("jit", "none"):
        check.status = "failed"
        check.reason = f"{kind}: {verdict} on {gpu} ({listing}); nothing in it runs natively or by family"
    elif not generic and promised and verdict != "native":
        check.status = "failed"
        check.reason = (
            f"{kind}: {verdict}-only on {gpu} ({listing}) although build.torch_cuda_arch_list asks for {own}a: "
            f"vLLM's CMake for CUDA {model.cuda} collapsed it (no {own} in CUDA_SUPPORTED_ARCHS), so no native "
            f"sm_{own.replace('.', '')}a cubins; fix: apply {PATCH_HINT}"
        )
    else:
        check.reason = (
            f"{kind}: {verdict} on {gpu} ({listing}; {' '.join(unit.get('gencode', []))}); {measured}"
        )
    return check
