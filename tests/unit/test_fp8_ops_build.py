"""tests/gpu/fp8_ops against vLLM 0.31.0's real sources (the sdist from PyPI): what it compiles and registers,
the wrappers it cuts out, the pins it fetches, and how run_suite judges a planted fault. No GPU, no compiler."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
import yaml
from preflight_fixtures import Sdist, fixture_sdist_0310  # noqa: F401 (pytest fixture)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu" / "fp8_ops"))

import build_ops  # noqa: E402
import fetch_sources  # noqa: E402
import op_package  # noqa: E402
import run_suite  # noqa: E402


@pytest.fixture(scope="module")
def tree(sdist_0310: Sdist) -> Path:
    return sdist_0310.tree()


def test_units_are_the_ones_vllms_cmake_builds(tree: Path) -> None:
    cmake = (tree / "CMakeLists.txt").read_text()
    for unit in (*build_ops.COMMON_UNITS, *build_ops.FAMILY_UNITS["sm90"], *build_ops.FAMILY_UNITS["sm120"]):
        assert (tree / unit).is_file(), unit
        assert f'"{unit}"' in cmake, f"vLLM's CMakeLists.txt no longer lists {unit}"
    sm90 = re.search(r"set\(SCALED_MM_SM90_SRCS(.*?)\)", cmake, re.S).group(1)
    assert all(u in sm90 for u in build_ops.FAMILY_UNITS["sm90"])
    # The int8 units left out are exactly the ones not_built.cu stands in for.
    assert {"scaled_mm_sm90_int8.cu", "scaled_mm_azp_sm90_int8.cu"} == {
        Path(u).name for u in re.findall(r'"([^"]+\.cu)"', sm90)
    } - {Path(u).name for u in build_ops.FAMILY_UNITS["sm90"]}


def test_registration_is_vllms_own_lines_for_the_ops_built(tree: Path) -> None:
    source = (tree / "csrc/libtorch_stable/torch_bindings.cpp").read_text()
    generated = op_package.binding_source(source)
    defs = re.findall(r'ops\.def\("(\w+)\(', generated)
    assert defs == list(op_package.OPS)
    assert (
        'ops.def("dynamic_per_token_scaled_fp8_quant(Tensor! result, Tensor input, Tensor! scale, Tensor? '
        in (generated)
    )
    cuda = generated.split("STABLE_TORCH_LIBRARY_IMPL(_C, CUDA, ops)")[1].split("}")[0]
    assert 'ops.impl("cutlass_scaled_mm", TORCH_BOX(&cutlass_scaled_mm));' in cuda
    composite = generated.split("STABLE_TORCH_LIBRARY_IMPL(_C, CompositeExplicitAutograd, ops)")[1]
    assert "cutlass_scaled_mm_supports_block_fp8" in composite and "static_scaled_fp8_quant" not in composite


def test_registration_refuses_sources_that_lack_an_op(tree: Path) -> None:
    source = (tree / "csrc/libtorch_stable/torch_bindings.cpp").read_text()
    renamed = source.replace('"dynamic_per_token_scaled_fp8_quant(', '"dynamic_per_token_fp8_quant(')
    with pytest.raises(op_package.BuildError, match=r"lacks def \['dynamic_per_token_scaled_fp8_quant'\]"):
        op_package.binding_source(renamed)


def test_wrappers_are_vllms_functions_verbatim(tree: Path) -> None:
    original = (tree / "vllm/_custom_ops.py").read_text()
    module = op_package.wrappers_source(original)
    tree_ = ast.parse(module)
    names = [n.name for n in tree_.body if isinstance(n, ast.FunctionDef)]
    assert names == list(op_package.WRAPPERS)
    for node in tree_.body:
        if isinstance(node, ast.FunctionDef):
            assert ast.get_source_segment(module, node) in original
    assert "torch.ops._C.cutlass_scaled_mm(out, a, b, scale_a, scale_b, bias)" in module


def test_a_wrapper_that_needs_more_of_vllm_is_refused() -> None:
    fake = "import torch\n\ndef scaled_fp8_quant(x):\n    return envs.VLLM_X(x)\n"
    names = ("scaled_fp8_quant",)
    with pytest.raises(op_package.BuildError, match=r"needs \['envs'\]"):
        op_package.wrappers_source(fake, names)


def test_the_contract_the_suite_checks_is_the_one_in_these_sources(tree: Path) -> None:
    # fp8_contract.py states these rules; if vLLM changes them, the contract must be read again.
    entry = (tree / "csrc/libtorch_stable/quantization/w8a8/cutlass/scaled_mm_entry.cu").read_text()
    assert "b.stride(0) == 1" in entry and "b.stride(1) % 16 == 0" in entry
    helper = (tree / "csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm_helper.hpp").read_text()
    assert "a_scale_group_shape must be [1, 128]." in helper and "a_scales.is_contiguous()" in helper
    wrapper = (tree / "vllm/_custom_ops.py").read_text()
    assert "cutlass_compatible_b = b.shape[0] % 16 == 0 and b.shape[1] % 16 == 0" in wrapper
    quant = (tree / "csrc/libtorch_stable/quantization/w8a8/fp8/common.cu").read_text()
    assert '"last dimension of input must be contiguous"' in quant


@pytest.mark.parametrize(
    "arch, family", [("90a", "sm90"), ("121a", "sm120"), ("120f", "sm120"), ("90", None), ("100a", None)]
)
def test_arch_families(arch: str, family: str | None) -> None:
    if family is None:
        with pytest.raises(build_ops.BuildError):
            build_ops.family_of(arch)
    else:
        assert build_ops.family_of(arch) == family


def test_fetched_versions_are_the_recipes_pins() -> None:
    recipe = yaml.safe_load((ROOT / "recipes/vllm-qwen35.yaml").read_text())["components"]
    assert recipe["vllm"]["version"] == fetch_sources.VLLM_VERSION
    assert recipe["flashinfer"]["version"] == fetch_sources.FLASHINFER_VERSION


def _checks(**status_reason: tuple[str, str]) -> list[dict[str, str]]:
    names = (
        "fp8.reference",
        "fp8.scaled_fp8_quant",
        "fp8.cutlass_scaled_mm",
        "fp8.cutlass_block",
        "fp8.linear",
    )
    out = [{"name": n, "status": "passed", "reason": "ok"} for n in names]
    for c in out:
        key = c["name"].removeprefix("fp8.")
        if key in status_reason:
            c["status"], c["reason"] = status_reason[key]
    return out


def test_a_fault_is_caught_only_by_the_expected_check_with_the_expected_reason() -> None:
    reason = run_suite.EXPECTED_CATCHES["block_scale_transposed"]["fp8.cutlass_block"]
    assert (
        run_suite.judge_fault("block_scale_transposed", _checks(cutlass_block=("failed", reason + "."))) == []
    )
    crashed = _checks(cutlass_block=("failed", "RuntimeError: b_scale_group_shape must be [128, 128]."))
    assert (
        "failed under block_scale_transposed for another reason"
        in run_suite.judge_fault("block_scale_transposed", crashed)[0]
    )
    missed = _checks()
    assert run_suite.judge_fault("block_scale_transposed", missed) == [
        "fp8.cutlass_block should fail under block_scale_transposed but passed: ok"
    ]
    collateral = _checks(cutlass_block=("failed", reason), linear=("failed", "x"))
    assert (
        "fp8.linear should pass under block_scale_transposed"
        in run_suite.judge_fault("block_scale_transposed", collateral)[0]
    )
