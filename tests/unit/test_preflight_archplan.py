"""Check 4: vLLM's own CMake arch selection run with `cmake -P` for real releases, patched and not."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from preflight_fixtures import (  # noqa: F401 (pytest fixtures)
    SESSION,
    check_named,
    fixture_sdist_0310,
    vllm_sdist,
    write_recipe,
)

from sparkforge.audit import compat
from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.preflight import cmake
from sparkforge.preflight.archplan import (
    ArchInputs,
    judge_plan,
    plan_arches,
    torch_select_cmake,
)
from sparkforge.preflight.checks import PreflightOptions, run_preflight
from sparkforge.preflight.fetch import make_fetcher
from sparkforge.recipe.loader import load_recipe
from sparkforge.report import Check

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake >= 3.18 on PATH")


def _groups(check: Check) -> dict[str, dict]:
    return {g["name"]: g for g in check.details["groups"]}


def test_patched_0_31_0_keeps_native_sm121a(sdist_0310):
    check = check_named(
        run_preflight(SESSION, load_recipe("vllm-qwen35"), PreflightOptions(source="pypi")), "arch-plan"
    )
    assert check.status == "passed", check.reason
    assert check.details["requested"] == ["12.1a"]
    assert check.details["cuda_supported_archs"][-2:] == ["12.0", "12.1"]  # the patch's doing
    assert check.details["cuda_archs"] == ["12.1a"]
    groups = _groups(check)
    for name in ("scaled_mm_c3x_sm120", "SM12x NVFP4", "moe_data", "MARLIN_ARCHS", "MARLIN_FP8_ARCHS"):
        assert groups[name]["archs"] == ["12.1a"] and groups[name]["verdict"] == "native", name
    assert groups["scaled_mm_c3x_sm120"]["source"] == ["12.0f"]
    assert check.details["torch_arch_step"] == "torch 2.13.0 select_compute_arch.cmake"
    assert "Building scaled_mm_c3x_sm120 for archs: 12.1a" in check.details["vllm_messages"]


def test_unpatched_0_31_0_collapses_to_sm120_family(sdist_0310, tmp_path):
    recipe = write_recipe(tmp_path, {"components": {"vllm": {"patches": []}}})
    check = check_named(run_preflight(SESSION, recipe, PreflightOptions(source="pypi")), "arch-plan")
    assert check.status == "passed", check.reason  # sm_120 and sm_120f cubins run on sm_121
    assert check.details["cuda_archs"] == ["12.0"]
    assert check.details["collapsed"] == ["12.1a"]
    groups = _groups(check)
    assert groups["scaled_mm_c3x_sm120"]["archs"] == ["12.0f"]
    assert groups["scaled_mm_c3x_sm120"]["verdict"] == "family"
    assert "12.1a became 12.0" in check.reason and "no sm_121a cubins" in check.reason


def test_arch_specific_sm120a_does_not_run_on_gb10(sdist_0310, tmp_path):
    recipe = write_recipe(tmp_path, {"build": {"torch_cuda_arch_list": ["12.0a"]}})
    check = check_named(run_preflight(SESSION, recipe, PreflightOptions(source="pypi")), "arch-plan")
    assert check.status == "failed"
    assert "sm_121 gets no native or family kernels" in check.reason
    assert "generic kernels (CUDA_ARCHS=12.0a): none" in check.reason
    assert "fix:" in check.reason


def _plan_for(tree: Path, arch_list: list[str], cuda: str, torch_select: Path | None) -> Check:
    inputs = ArchInputs("sm_121", cuda, "2.10.0", "3.12", "aarch64", arch_list, torch_select)
    plan = plan_arches(
        Session(echo=print, runner=Runner()),
        lambda rel: (tree / rel).read_text() if (tree / rel).is_file() else None,
        inputs,
    )
    check = Check("arch-plan", "passed")
    judge_plan(check, plan, inputs)
    return check


@pytest.mark.slow
def test_0_18_1_on_cuda_12_9_builds_sm120a_only_for_the_sm12x_kernels():
    tree = vllm_sdist("0.18.1").tree()
    check = _plan_for(tree, ["12.1a"], "12.9", None)
    assert check.status == "failed"
    groups = _groups(check)
    assert (
        groups["scaled_mm_c3x_sm120"]["archs"] == ["12.0a"]
        and groups["scaled_mm_c3x_sm120"]["verdict"] == "none"
    )
    assert "scaled_mm_c3x_sm120 (12.0a -> 12.0a: none)" in check.reason
    on_cuda13 = _plan_for(tree, ["12.1a"], "13.0", None)
    assert on_cuda13.status == "passed"  # CUDA 13 makes the same groups 12.0f: family
    assert _groups(on_cuda13)["scaled_mm_c3x_sm120"]["archs"] == ["12.0f"]


def test_emulated_torch_step_matches_torch_select_compute_arch(sdist_0310, tmp_path):
    torch_select = torch_select_cmake(load_recipe("vllm-qwen35"), make_fetcher())
    assert torch_select is not None and "cuda_select_nvcc_arch_flags" in torch_select.read_text().lower()
    tree = sdist_0310.tree()
    for arch_list in (["12.1a"], ["12.0", "12.0f"], ["9.0+PTX", "12.1a"], ["8.0", "8.6", "12.0f"]):
        real = _plan_for(tree, arch_list, "13.0", torch_select).details
        emulated = _plan_for(tree, arch_list, "13.0", None).details
        assert real["cuda_arch_flags"] == emulated["cuda_arch_flags"], arch_list
        assert real["cuda_archs"] == emulated["cuda_archs"], arch_list


def test_wheel_recipe_skips_the_arch_plan():
    check = check_named(run_preflight(SESSION, load_recipe("vllm-qwen35-wheels")), "arch-plan")
    assert check.status == "skipped" and "audit" in check.reason


@pytest.mark.parametrize(
    ("entry", "verdict"),
    [
        ("12.1a", "native"),
        ("12.0", "native"),
        ("12.1", "native"),
        ("12.0f", "family"),
        ("12.1f", "family"),
        ("12.0a", "none"),
        ("12.2", "none"),
        ("9.0", "none"),
        ("8.0+PTX", "jit"),
        ("9.0a+PTX", "none"),
        ("10.0f", "none"),
        ("10.0f+PTX", "none"),  # family PTX runs only within its family (the twin rule said jit)
        ("12.0f+PTX", "family"),
    ],
)
def test_arch_verdicts_on_sm121(entry, verdict):
    assert compat.cmake_arch_verdict(entry, compat.parse_target("sm_121")) == verdict


def test_cmake_reader_keeps_control_flow_and_pure_functions_only():
    text = """
# comment with (parens
function(pure_fn OUT)  # a pure helper
  string(REPLACE "." "" _x "${ARGN}")
  set(${OUT} ${_x} PARENT_SCOPE)
endfunction()
function(impure_fn)
  add_library(x STATIC y.cc)
endfunction()
if(A AND (B OR C))
  pure_fn(R "1.2" [=[bracket ) arg]=])
  impure_fn()
  find_package(Torch REQUIRED)
  message(FATAL_ERROR "generation failed: ${R}")
endif()
"""
    script, pure = cmake.script_of(text, fatal="@@fatal")
    assert pure == {"pure_fn"}
    assert "add_library" not in script and "find_package" not in script and "impure_fn()" not in script
    assert 'pure_fn(R "1.2" [=[bracket ) arg]=])' in script
    assert 'message(STATUS "@@fatal|14|" "generation failed: ${R}")' in script
    call = next(c for c in cmake.invocations(text) if c.name == "pure_fn" and c.line == 11)
    assert call.arguments() == ["R", '"1.2"', "[=[bracket ) arg]=]"]
