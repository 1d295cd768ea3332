"""Check 4: which CUDA archs vLLM's own CMake logic picks for the recipe, and whether the GPU gets kernels.

vLLM's CMakeLists.txt and cmake/utils.cmake (after the recipe's patches) are reduced to their script-safe
part (see cmake.py) and run with `cmake -P` (CMake >= 3.18: `list(SORT ... COMPARE NATURAL)`), after
torch's own arch-flag step: TORCH_CUDA_ARCH_LIST -> `-gencode` flags through `cuda_select_nvcc_arch_flags`
from torch's select_compute_arch.cmake (taken from the recipe's torch wheel; emulated when unavailable).
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from sparkforge.audit import compat
from sparkforge.boundary import read_source, write_output
from sparkforge.commands import Command
from sparkforge.context import Session
from sparkforge.errors import CommandError, PreflightError
from sparkforge.preflight import cmake
from sparkforge.preflight.fetch import Fetcher
from sparkforge.preflight.pypi import WheelTarget, resolve_file, wheel_members
from sparkforge.recipe.loader import Recipe
from sparkforge.report import Check

TORCH_SELECT_CMAKE = "torch/share/cmake/Caffe2/Modules_CUDA_fix/upstream/FindCUDA/select_compute_arch.cmake"

MIN_CMAKE = Version("3.18")
_MARK = "@@sparkforge@@"
_TRACE = 'message(STATUS "' + _MARK + '|{line}|{out}|${{{out}}}|" {src})'
_TRACED = ("cuda_archs_loose_intersection", "cuda_archs_sm90plus")
_BUILDING = re.compile(r'"(?:Building|Not building) ([A-Za-z0-9_ .+-]+?)(?: kernels)?(?: for archs| as |")')
_ARCH = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")


def best_verdict(entries: list[str], gpu: str) -> str:
    """The best verdict of any entry (the GPU rule itself lives in sparkforge.audit.compat)."""
    target = compat.parse_target(gpu)
    return compat.best_verdict(compat.cmake_arch_verdict(e, target) for e in entries)


@dataclass(frozen=True)
class KernelGroup:
    """One `cuda_archs_*` selection as vLLM's CMake evaluated it."""

    name: str
    variable: str
    line: int
    source: list[str]
    archs: list[str]
    verdict: str
    required: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ArchPlan:
    """The result of one `cmake -P` run over vLLM's arch selection."""

    cmake_version: str
    torch_step: str
    cuda_arch_flags: str
    requested: list[str]
    supported: list[str]
    cuda_archs: list[str]
    groups: list[KernelGroup]
    messages: list[str]
    fatal: str | None = None
    warnings: list[str] = field(default_factory=list)
    configure_errors: list[str] = field(default_factory=list)  # FATAL_ERRORs passed over (see cmake.py)


@dataclass(frozen=True)
class ArchInputs:
    """What the plan depends on besides vLLM's files."""

    gpu: str
    cuda: str
    torch_version: str
    python: str
    machine: str
    arch_list: list[str]
    torch_select_cmake: Path | None  # torch's select_compute_arch.cmake; None = emulate it

    @classmethod
    def of(cls, recipe: Recipe, fetcher: Fetcher, platform: str | None = None) -> ArchInputs:
        """The one place preflight and the probe take the plan's inputs from a recipe."""
        model = recipe.model
        return cls(
            gpu=model.gpu,
            cuda=model.cuda,
            torch_version=model.components.torch.version,
            python=model.python,
            machine=WheelTarget.of(platform or model.platforms[0], model.python).machine,
            arch_list=list(model.build.torch_cuda_arch_list),
            torch_select_cmake=torch_select_cmake(recipe, fetcher),
        )


def torch_select_cmake(recipe: Recipe, fetcher: Fetcher) -> Path | None:
    """torch's select_compute_arch.cmake from a PyPI wheel of the recipe's torch (any platform: it is text)."""
    torch = recipe.model.components.torch
    target = WheelTarget.of(recipe.model.platforms[0], recipe.model.python)
    try:
        dist = resolve_file(fetcher, torch.package or "torch", torch.version.split("+")[0], wheel=target)
        root = wheel_members(fetcher, dist, [TORCH_SELECT_CMAKE])
    except PreflightError:
        return None
    path = root / TORCH_SELECT_CMAKE
    return path if path.is_file() else None


def _driver(inputs: ArchInputs, select_path: Path, utils_path: Path, lists_path: Path) -> str:
    values = {
        "CMAKE_CUDA_COMPILER_VERSION": inputs.cuda,
        "CMAKE_CUDA_COMPILER_ID": "NVIDIA",
        "CUDA_VERSION": inputs.cuda,
        "CUDA_FOUND": "TRUE",
        "NVCC_EXECUTABLE": "/usr/local/cuda/bin/nvcc",
        "VLLM_TARGET_DEVICE": "cuda",
        "VLLM_PYTHON_EXECUTABLE": "python3",
        "Python_VERSION": inputs.python,
        "Torch_FOUND": "TRUE",
        "Torch_VERSION": inputs.torch_version,
        "CMAKE_SYSTEM_PROCESSOR": inputs.machine,
        "CMAKE_BUILD_TYPE": "Release",
        "TORCH_CUDA_ARCH_LIST": ";".join(inputs.arch_list),
    }
    lines = ["cmake_minimum_required(VERSION 3.18)"]
    lines += [f'set({k} "{v}")' for k, v in values.items()]
    lines += [
        f'set(ENV{{TORCH_CUDA_ARCH_LIST}} "{values["TORCH_CUDA_ARCH_LIST"]}")',
        f'include("{select_path}")',
        # torch's Caffe2/public/cuda.cmake: the gencode list becomes space-joined CMAKE_CUDA_FLAGS.
        "cuda_select_nvcc_arch_flags(NVCC_FLAGS_EXTRA ${TORCH_CUDA_ARCH_LIST})",
        'set(CMAKE_CUDA_FLAGS "")',
        'foreach(FLAG ${NVCC_FLAGS_EXTRA})\n  string(APPEND CMAKE_CUDA_FLAGS " ${FLAG}")\nendforeach()',
        f'message(STATUS "{_MARK}|flags|${{CMAKE_CUDA_FLAGS}}")',
        f'include("{utils_path}")',
        f'include("{lists_path}")',
        f'message(STATUS "{_MARK}|supported|${{CUDA_SUPPORTED_ARCHS}}")',
        f'message(STATUS "{_MARK}|done|${{CUDA_ARCHS}}")',
    ]
    return "\n".join(lines) + "\n"


def group_names(lists_text: str) -> dict[int, str]:
    """For each traced call's line, the kernel group vLLM's next Building/Not building message names."""
    calls = cmake.invocations(lists_text)
    names: dict[int, str] = {}
    pending: list[int] = []
    variable = ""

    def visit(call: cmake.Invocation) -> None:
        nonlocal variable
        if call.name in _TRACED:
            out = (call.arguments() or [""])[0]
            if out != variable:
                pending.clear()
            variable = out
            pending.append(call.line)
        elif call.name == "message" and pending:
            match = _BUILDING.search(call.args)
            if match:
                for line in pending:
                    names[line] = match.group(1).strip()
                pending.clear()

    for call in calls:
        visit(call)
    return names


def cmake_version(session: Session) -> str:
    result = session.runner.capture(Command.of("cmake", "--version"), "cmake-version")
    match = re.search(r"cmake version (\S+)", result.output)
    return match.group(1) if match else "unknown"


def _split(value: str) -> list[str]:
    return [v for v in value.split(";") if v]


def plan_arches(session: Session, read_text: Callable[[str], str | None], inputs: ArchInputs) -> ArchPlan:
    """Run vLLM's arch selection from CMakeLists.txt + cmake/utils.cmake (as `read_text` gives them)."""
    lists_text = read_text("CMakeLists.txt") or ""
    utils_text = read_text("cmake/utils.cmake") or ""
    version = cmake_version(session)
    utils_script, pure = cmake.script_of(utils_text)
    lists_script, _ = cmake.script_of(
        lists_text, pure, after=dict.fromkeys(_TRACED, _TRACE), fatal=f"{_MARK}|fatal"
    )
    with tempfile.TemporaryDirectory(prefix="sparkforge-archplan-") as tmp:
        work = Path(tmp)
        select = work / "select_compute_arch.cmake"
        torch = inputs.torch_select_cmake
        torch_text = read_source(torch, torch.parent) if torch is not None else None
        if torch_text is not None:
            write_output(select, torch_text, "the arch plan's scripts")
            torch_step = f"torch {inputs.torch_version} select_compute_arch.cmake"
        else:
            write_output(select, cmake.emulated_select_cmake(), "the arch plan's scripts")
            torch_step = "emulated (torch's select_compute_arch.cmake unavailable)"
        write_output(work / "utils.cmake", utils_script, "the arch plan's scripts")
        write_output(work / "CMakeLists.cmake", lists_script, "the arch plan's scripts")
        driver = work / "driver.cmake"
        driver_text = _driver(inputs, select, work / "utils.cmake", work / "CMakeLists.cmake")
        write_output(driver, driver_text, "the arch plan's scripts")
        result = session.runner.capture(
            Command.of("cmake", "-P", str(driver), cwd=work), "cmake-arch-plan", check=False
        )
    return _read_plan(result.output, result.returncode, lists_text, inputs, version, torch_step)


def _read_plan(
    output: str, returncode: int, lists_text: str, inputs: ArchInputs, version: str, torch_step: str
) -> ArchPlan:
    names = group_names(lists_text)
    marks: dict[str, str] = {}
    groups: list[KernelGroup] = []
    messages: list[str] = []
    fatals: list[str] = []
    supported_line = 0
    for raw in output.splitlines():
        line = raw.removeprefix("-- ")
        if not line.startswith(_MARK):
            if line.startswith(("Building ", "Not building ")):
                messages.append(line)
            continue
        parts = line.split("|")
        if parts[1] == "fatal":
            fatals.append(f"CMakeLists.txt:{parts[2]}: {'|'.join(parts[3:]).strip()}")
            continue
        if parts[1] in ("flags", "supported", "done"):
            marks[parts[1]] = parts[2]
            continue
        number, variable, archs, source = int(parts[1]), parts[2], _split(parts[3]), _split(parts[4])
        if variable == "CUDA_ARCHS" and not supported_line:
            supported_line = number
            continue
        required = any(s.split(".")[0] == re.sub(r"sm_(\d+)\d.*", r"\1", inputs.gpu) for s in source)
        groups.append(
            KernelGroup(
                names.get(number, variable),
                variable,
                number,
                source,
                archs,
                best_verdict(archs, inputs.gpu),
                required,
            )
        )
    flags = marks.get("flags", "").strip()
    requested = sorted({_gencode_arch(f) for f in re.findall(r"arch=\S+", flags)})
    fatal = None
    if returncode != 0 or "done" not in marks:
        errors = re.findall(r"CMake Error.*?(?=\n\S|\Z)", output, re.S)
        fatal = (errors[-1] if errors else output[-1500:]).strip()
    elif arch_fatals := [f for f in fatals if "arch" in f.lower()]:
        fatal = arch_fatals[0]
    warnings = [w.strip() for w in re.findall(r"CMake Warning.*?(?=\n\S|\Z)", output, re.S)]
    return ArchPlan(
        cmake_version=version,
        torch_step=torch_step,
        cuda_arch_flags=flags,
        requested=requested,
        supported=_split(marks.get("supported", "")),
        cuda_archs=_split(marks.get("done", "")),
        groups=groups,
        messages=messages,
        fatal=fatal,
        warnings=warnings,
        configure_errors=fatals,
    )


def _gencode_arch(flag: str) -> str:
    match = re.search(r"code=(?:sm|compute)_(\d+)(\d)([af]?)", flag)
    return f"{match[1]}.{match[2]}{match[3]}" if match else flag


def require_cmake(session: Session) -> str | None:
    """None when a usable cmake is on PATH, else why not (with the fix)."""
    try:
        version = cmake_version(session)
    except CommandError:
        return "cmake is not installed; fix: apt-get install cmake, or pip install 'cmake>=3.18'"
    try:
        if Version(version) < MIN_CMAKE:
            return f"cmake {version} is older than {MIN_CMAKE}; fix: pip install 'cmake>=3.18'"
    except ValueError:
        return None
    return None


def plan_details(plan: ArchPlan) -> dict[str, Any]:
    return {
        "cmake": plan.cmake_version,
        "torch_arch_step": plan.torch_step,
        "cuda_arch_flags": plan.cuda_arch_flags,
        "requested": plan.requested,
        "cuda_supported_archs": plan.supported,
        "cuda_archs": plan.cuda_archs,
        "groups": [g.to_dict() for g in plan.groups],
        "vllm_messages": plan.messages,
        "cmake_warnings": plan.warnings,
        "configure_errors_passed_over": plan.configure_errors,
    }


def judge_plan(check: Check, plan: ArchPlan, inputs: ArchInputs) -> None:
    """Fill `check`: the GPU needs native or family kernels generically and in every SM-line group."""
    check.details = plan_details(plan)
    setting = f"TORCH_CUDA_ARCH_LIST={';'.join(inputs.arch_list)} on CUDA {inputs.cuda}"
    fix = (
        "fix: pin a vLLM whose CMake keeps SM12x kernels for this CUDA (>= 0.19.0), patch "
        "CUDA_SUPPORTED_ARCHS (patches/vllm/0001-cmake-keep-sm121-on-cuda13.patch), or change "
        "build.torch_cuda_arch_list / cuda"
    )
    if plan.fatal:
        check.status = "failed"
        check.reason = f"vLLM's CMake stops for {setting}: {plan.fatal.splitlines()[0:3]}; {fix}"
        return
    generic = best_verdict(plan.cuda_archs, inputs.gpu)
    bad = [g for g in plan.groups if g.required and g.verdict not in ("native", "family")]
    problems = []
    if generic not in ("native", "family"):
        problems.append(f"generic kernels (CUDA_ARCHS={';'.join(plan.cuda_archs) or 'empty'}): {generic}")
    problems += [
        f"{g.name} ({';'.join(g.source)} -> {';'.join(g.archs) or 'nothing'}: {g.verdict})" for g in bad
    ]
    kept = [r for r in plan.requested if r in plan.cuda_archs]
    collapsed = [r for r in plan.requested if r not in plan.cuda_archs]
    check.details["collapsed"] = collapsed
    if problems:
        check.status = "failed"
        check.reason = f"{inputs.gpu} gets no native or family kernels with {setting} for: " + "; ".join(
            problems
        )
        check.reason += f"; {fix}"
        return
    required = [g for g in plan.groups if g.required]
    counts = {v: sum(g.verdict == v for g in required) for v in ("native", "family")}
    check.reason = (
        f"{inputs.gpu}: generic kernels {';'.join(plan.cuda_archs)} ({generic}), "
        f"{len(required)} SM{inputs.gpu[3:-1]}x kernel groups ({counts['native']} native, {counts['family']} family)"
    )
    if collapsed:
        check.reason += (
            f"; note: {', '.join(collapsed)} became {';'.join(plan.cuda_archs)} "
            f"(CUDA_SUPPORTED_ARCHS for CUDA {inputs.cuda}: {';'.join(plan.supported)}), so no "
            f"{', '.join('sm_' + c.replace('.', '') for c in collapsed)} cubins"
        )
    elif kept:
        check.reason += f"; {', '.join(kept)} kept as requested"
