"""The compile probe's pure parts on real inputs: vLLM 0.31.0's sdist (PyPI), its CMakeLists, real cmake -P plans,
the recipe model, the in-image scripts (MAX_JOBS cap, configure arguments) and the Rust decision."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from preflight_fixtures import CMAKE_PATCH, fixture_sdist_0310  # noqa: F401 (pytest fixture)

from sparkforge.commands import Runner
from sparkforge.context import Session
from sparkforge.errors import RecipeError
from sparkforge.preflight.archplan import ArchInputs, plan_arches, plan_details
from sparkforge.probe.crosscheck import compare, gencode_calls, gencode_codes, plan_codes, planned_codes
from sparkforge.probe.units import ProbeError, check_units
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.recipe.schema import DEFAULT_PROBE_SOURCES
from sparkforge.verify.rust import judge_rust

FILES = REPO_ROOT / "dockerfiles" / "files"
FP8 = "csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm_sm120_fp8.cu"
GENERIC = "csrc/libtorch_stable/activation_kernels.cu"


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), FILES / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def patched_tree(sdist_0310, tmp_path_factory) -> Path:
    """vLLM 0.31.0's CMake files with the recipe's patch applied (git apply, as the source stage does)."""
    root = tmp_path_factory.mktemp("patched")
    for rel in ("CMakeLists.txt", "cmake/utils.cmake"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sdist_0310.tree() / rel, root / rel)
    subprocess.run(["git", "apply", str(CMAKE_PATCH)], cwd=root, check=True)
    return root


def _plan(tree: Path) -> dict:
    inputs = ArchInputs("sm_121", "13.0", "2.13.0", "3.11", "x86_64", ["12.1a"], None)
    read = lambda rel: (tree / rel).read_text() if (tree / rel).is_file() else None  # noqa: E731
    return plan_details(plan_arches(Session(echo=print, runner=Runner(stream=False)), read, inputs))


# ---- unit paths -------------------------------------------------------------------------------------------
def test_default_units_exist_at_the_pinned_commit(sdist_0310):
    check_units(sdist_0310.tree(), DEFAULT_PROBE_SOURCES, "vLLM 0.31.0")


def test_a_missing_unit_names_the_closest_real_paths(sdist_0310):
    moved = "csrc/quantization/w8a8/cutlass/c3x/scaled_mm_sm120_fp8.cu"  # the pre-libtorch_stable layout
    with pytest.raises(ProbeError) as info:
        check_units(sdist_0310.tree(), [moved, GENERIC], "vLLM 0.31.0")
    message = str(info.value)
    assert f"{moved} (closest: {FP8}" in message
    assert GENERIC not in message.split("closest")[0]
    assert "Fix: correct the paths in the recipe's build.probe.sources" in message


# ---- plan vs configure ------------------------------------------------------------------------------------
def test_units_map_to_their_kernel_groups_in_cmakelists(patched_tree):
    calls = gencode_calls((patched_tree / "CMakeLists.txt").read_text())
    fp8 = [c for c in calls if FP8 in c.sources]
    assert fp8 and all(c.archs_variable != "CUDA_ARCHS" for c in fp8)
    assert any(c.archs_variable == "CUDA_ARCHS" and GENERIC in c.sources for c in calls)


def test_plan_predicts_sm121a_with_the_patch_and_sm120f_without(patched_tree, sdist_0310):
    lists = (patched_tree / "CMakeLists.txt").read_text()
    patched, _ = planned_codes(FP8, gencode_calls(lists), _plan(patched_tree))
    assert patched == {"sm_121a"}
    upstream = sdist_0310.tree()
    plain, groups = planned_codes(
        FP8, gencode_calls((upstream / "CMakeLists.txt").read_text()), _plan(upstream)
    )
    assert plain == {"sm_120f"}, groups
    generic, _ = planned_codes(GENERIC, gencode_calls(lists), _plan(upstream))
    assert generic == {"sm_120"}


def test_code_targets_of_plan_entries_and_gencode_flags():
    assert plan_codes(["12.1a", "8.0+PTX", "12.0f"]) == {"sm_121a", "sm_80", "compute_80", "sm_120f"}
    assert gencode_codes(["arch=compute_121a,code=sm_121a", "arch=compute_80,code=[sm_80,compute_80]"]) == {
        "sm_121a",
        "sm_80",
        "compute_80",
    }


def test_a_configure_that_disagrees_with_the_plan_is_named_on_both_sides(patched_tree):
    plan = _plan(patched_tree)
    lists = (patched_tree / "CMakeLists.txt").read_text()
    agreeing = [{"source": FP8, "gencode": ["arch=compute_121a,code=sm_121a"]}]
    assert compare(plan, plan["vllm_messages"], agreeing, lists) == []
    broken_messages = [m.replace("12.1a", "12.0f") for m in plan["vllm_messages"]]
    broken_units = [{"source": FP8, "gencode": ["arch=compute_120f,code=sm_120f"]}]
    problems = compare(plan, broken_messages, broken_units, lists)
    assert any("cmake -P plan says" in p and "12.1a" in p and "12.0f" in p for p in problems)
    assert any(p.startswith(FP8) and "['sm_121a']" in p and "['sm_120f']" in p for p in problems)


# ---- recipe ----------------------------------------------------------------------------------------------
def test_source_recipes_must_state_the_rust_decision(write_recipe):
    path = write_recipe("build:\n  torch_cuda_arch_list: ['12.1a']\n  rust: null\n")
    with pytest.raises(RecipeError, match=re.escape("build.rust is not set; fix: state build.rust: false")):
        load_recipe(path)


def test_cuda_wheels_must_match_the_recipe_cuda(write_recipe):
    with pytest.raises(RecipeError, match=re.escape("build.cuda_wheels 12.9.1 is not CUDA 13.0")):
        load_recipe(write_recipe("build:\n  torch_cuda_arch_list: ['12.1a']\n  cuda_wheels: 12.9.1\n"))


def test_probe_sources_are_held_to_a_path_pattern(write_recipe):
    with pytest.raises(RecipeError, match="csrc/"):
        load_recipe(
            write_recipe("build:\n  torch_cuda_arch_list: ['12.1a']\n  probe:\n    sources: ['../x.cu']\n")
        )


def test_the_rust_decision_is_in_the_lock():
    from sparkforge.recipe import plan

    assert plan.lock(load_recipe("vllm-qwen35"))["build"]["rust"] is False


def test_rust_check_follows_the_recipe():
    recipe = load_recipe("vllm-qwen35")
    assert judge_rust(recipe, []).status == "passed"
    failed = judge_rust(recipe, ["_rust_tool_parser.abi3.so"])
    assert (
        failed.status == "failed"
        and "build.rust is false but the image has _rust_tool_parser" in failed.reason
    )
    assert judge_rust(load_recipe("vllm-qwen35-wheels"), []).status == "skipped"


# ---- in-image scripts ------------------------------------------------------------------------------------
def test_jobs_are_capped_by_memory_and_the_recipe_ceiling():
    cap = _script("cap-jobs.py").cap
    assert cap(6, 2, 10.0, 16.0)[:2] == (1, 1)  # GitHub's arm64 runner: 16 GB, one heavy unit at a time
    assert cap(6, 2, 10.0, 120.0)[:2] == (6, 2)  # a Spark: the recipe's ceiling
    jobs, _, why = cap(6, 2, 0.0, 64.0)
    assert jobs == 5 and "default, no probe measurement" in why


def test_available_memory_honours_a_cgroup_limit(tmp_path):
    available_gb = _script("cap-jobs.py").available_gb
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131072000 kB\nMemAvailable:   125829120 kB\n")
    assert round(available_gb(meminfo, tmp_path / "none")) == 120
    (tmp_path / "memory.max").write_text(str(16 << 30) + "\n")
    assert available_gb(meminfo, tmp_path) == 16


def test_configure_arguments_are_setup_pys(monkeypatch, tmp_path):
    probe = _script("probe-compile.py")
    monkeypatch.setenv("CMAKE_ARGS", "-DCUTLASS_INCLUDE_DIR=/c/include")
    args = probe.cmake_args(tmp_path, 2)
    for expected in (
        "-G",
        "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
        "-DNVCC_THREADS=2",
        "-DCUTLASS_INCLUDE_DIR=/c/include",
    ):
        assert expected in args
    assert f"-DFETCHCONTENT_BASE_DIR={tmp_path / '.deps'}" in args


def test_omitting_externals_keeps_every_vllm_target(sdist_0310, tmp_path):
    probe = _script("probe-compile.py")
    shutil.copyfile(sdist_0310.tree() / "CMakeLists.txt", tmp_path / "CMakeLists.txt")
    before = (tmp_path / "CMakeLists.txt").read_text()
    omitted = probe.omit_externals(tmp_path)
    after = (tmp_path / "CMakeLists.txt").read_text()
    assert {"vllm_flash_attn", "flashmla", "deepgemm", "triton_kernels"} <= set(omitted)
    assert "external_projects/" not in after.replace("# ", "")
    assert after.count("define_extension_target(") == before.count("define_extension_target(")


def test_build_runs_the_probe_only_before_compiling_a_source_recipe():
    from sparkforge.imagebuild.stage import BuildOptions, wants_probe

    source, wheels = load_recipe("vllm-qwen35"), load_recipe("vllm-qwen35-wheels")
    assert wants_probe(source, BuildOptions())
    assert wants_probe(source, BuildOptions(target="build"))
    assert not wants_probe(source, BuildOptions(probe=False))
    assert not wants_probe(source, BuildOptions(target="source"))
    assert not wants_probe(wheels, BuildOptions())
