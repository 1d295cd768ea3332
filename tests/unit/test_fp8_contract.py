"""The FP8 checks' preconditions (sparkforge/verify/inimage/fp8_contract.py) and planted faults (fp8_faults.plant), no GPU.

The contract tests describe operands as the ops see them (shape, strides in elements, dtype): exactly what
`TensorSpec.of` reads off a tensor. The planting tests use real CPU tensors and are skipped where torch is
not installed (the CI host): tests/engine/test_fp8_contract_twin.py runs this whole module inside the CPU twin
image, which has torch, so they run in CI all the same.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sparkforge" / "verify" / "inimage"))

import checks_fp8
import fp8_faults
from fp8_contract import WRONG, TensorSpec, describe, quant_problems, scaled_mm_problems

NO_TORCH = (
    "torch is not installed here; tests/engine/test_fp8_contract_twin.py runs these in the CPU twin image"
)

FP8, F32 = "float8_e4m3fn", "float32"


def row_major(rows: int, cols: int, dtype: str) -> TensorSpec:
    return TensorSpec((rows, cols), (cols, 1), dtype)


def col_major(rows: int, cols: int, dtype: str) -> TensorSpec:
    return TensorSpec((rows, cols), (1, rows), dtype)


def gemm(m: int, n: int, k: int, **change: TensorSpec) -> dict[str, TensorSpec]:
    """A per-token x per-channel call as checks_fp8 makes it: a row-major, b = (N x K).t(), (M,1) and (1,N)."""
    operands = {
        "a": row_major(m, k, FP8),
        "b": col_major(k, n, FP8),
        "scale_a": row_major(m, 1, F32),
        "scale_b": row_major(1, n, F32),
    }
    return {**operands, **change}


def block(m: int, n: int, k: int, **change: TensorSpec) -> dict[str, TensorSpec]:
    """A blockwise call as checks_fp8 makes it: scale_a (M, K/128) M-major, scale_b (K/128, N/128) K-major."""
    operands = {
        "a": row_major(m, k, FP8),
        "b": col_major(k, n, FP8),
        "scale_a": col_major(m, k // 128, F32),
        "scale_b": col_major(k // 128, n // 128, F32),
    }
    return {**operands, **change}


@pytest.mark.parametrize("m, n, k", [(16, 256, 512), (64, 1024, 2048), (1, 16384, 5120)])
def test_the_suites_own_calls_meet_the_contract(m: int, n: int, k: int) -> None:
    assert scaled_mm_problems(**gemm(m, n, k), out_dtype="bfloat16", blockwise=False) == []
    per_tensor = gemm(m, n, k, scale_a=row_major(1, 1, F32), scale_b=row_major(1, 1, F32))
    assert scaled_mm_problems(**per_tensor, out_dtype="bfloat16", blockwise=False) == []
    assert scaled_mm_problems(**block(m, n, k), out_dtype="bfloat16", blockwise=True) == []


def test_row_major_b_is_the_checks_fault() -> None:
    problems = scaled_mm_problems(
        **gemm(16, 256, 512, b=row_major(512, 256, FP8)), out_dtype="bfloat16", blockwise=False
    )
    assert problems[0].startswith("b must be column-major (stride(0) == 1")
    assert "(256, 1)" in problems[0]
    assert describe("case", problems).startswith(f"{WRONG}: case: b must be column-major")


def test_dimensions_off_16_would_silently_leave_cutlass() -> None:
    problems = scaled_mm_problems(**gemm(16, 250, 512), out_dtype="bfloat16", blockwise=False)
    assert any("multiples of 16" in p and "triton_scaled_mm" in p for p in problems)


def test_wrong_dtypes_are_named() -> None:
    call = gemm(16, 256, 512, a=row_major(16, 512, "bfloat16"), scale_b=row_major(1, 256, "float16"))
    problems = scaled_mm_problems(**call, out_dtype="float32", blockwise=False)
    assert "a must be float8_e4m3fn, got bfloat16" in problems
    assert "scale_b must be float32, got float16" in problems
    assert any(p.startswith("the output dtype must be one of") for p in problems)


def test_transposed_blockwise_scale_is_caught_by_shape() -> None:
    call = block(16, 256, 512, scale_b=TensorSpec((2, 4), (1, 2), F32))  # (N/128, K/128)
    problems = scaled_mm_problems(**call, out_dtype="bfloat16", blockwise=True)
    assert problems == ["scale_b must be (K/128, N/128) = (4, 2), got (2, 4)"]


def test_blockwise_scales_in_the_wrong_memory_order_are_caught() -> None:
    # Same shapes, row-major memory: the kernels would read the scales scrambled and give wrong numbers.
    call = block(64, 1024, 2048, scale_a=row_major(64, 16, F32), scale_b=row_major(16, 8, F32))
    problems = scaled_mm_problems(**call, out_dtype="bfloat16", blockwise=True)
    assert any(p.startswith("scale_a must be M-major") for p in problems)
    assert any(p.startswith("scale_b must be K-major") for p in problems)


def test_a_single_row_of_blockwise_scales_has_one_memory_order() -> None:
    # m=1: scale_a (1, K/128) is the same memory contiguous or transposed, so both are accepted.
    call = block(1, 16384, 5120, scale_a=row_major(1, 40, F32))
    assert scaled_mm_problems(**call, out_dtype="bfloat16", blockwise=True) == []


def test_blockwise_scales_of_per_token_size_take_the_other_path() -> None:
    # k = n = 128: scale_a (M, 1) holds M values and scale_b (1, 1) one, so vLLM's dispatcher goes per-token.
    call = block(16, 128, 128)
    problems = scaled_mm_problems(**call, out_dtype="bfloat16", blockwise=True)
    assert any("per-tensor/per-token path" in p for p in problems)


def test_per_token_scales_must_be_contiguous_and_sized() -> None:
    strided = gemm(16, 256, 512, scale_b=TensorSpec((1, 256), (512, 2), F32))
    assert any(
        "scale_b must be contiguous" in p
        for p in scaled_mm_problems(**strided, out_dtype="bfloat16", blockwise=False)
    )
    blocky = gemm(16, 256, 512, scale_a=row_major(16, 4, F32))
    assert any(
        "vLLM would take the blockwise path" in p
        for p in scaled_mm_problems(**blocky, out_dtype="bfloat16", blockwise=False)
    )


def test_mismatched_inner_dimensions() -> None:
    problems = scaled_mm_problems(
        **gemm(16, 256, 512, b=col_major(256, 256, FP8)), out_dtype="bfloat16", blockwise=False
    )
    assert "a is 16x512 but b is 256x256: the inner dimensions differ" in problems


def test_quant_contract() -> None:
    assert quant_problems(row_major(64, 1024, "bfloat16")) == []
    assert quant_problems(TensorSpec((2, 64, 1024), (65536, 1024, 1), "bfloat16"))[0].startswith(
        "the input must be 2-D"
    )
    assert "last dimension must be contiguous" in quant_problems(col_major(64, 1024, "bfloat16"))[0]
    assert quant_problems(row_major(64, 1024, "int8")) == [
        "the input must be one of ('float32', 'float16', 'bfloat16'), got int8"
    ]


def test_layout_predicates_ignore_extent_one_strides() -> None:
    assert TensorSpec((1, 40), (1, 1), F32).row_major() and TensorSpec((1, 40), (40, 1), F32).column_major()
    assert not TensorSpec((8, 4), (1, 8), F32).row_major() and TensorSpec((8, 4), (1, 8), F32).column_major()
    assert not TensorSpec((8, 4), (1, 16), F32).column_major()  # padded columns: not packed


def test_an_unknown_fault_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fp8_faults.FAULT_ENV, "scale_x3")
    with pytest.raises(ValueError, match=r"scale_x3.*known: scale_x2, b_row_major"):
        fp8_faults.planted_fault()
    monkeypatch.delenv(fp8_faults.FAULT_ENV)
    assert fp8_faults.planted_fault() is None


# --- planted faults on real (CPU) tensors -------------------------------------------------------------------


def _cpu_operands(blockwise: bool) -> tuple[Any, dict[str, Any]]:
    torch = pytest.importorskip("torch", reason=NO_TORCH)
    m, n, k = 16, 256, 512
    a = checks_fp8.to_fp8(torch.randn((m, k)))
    b = checks_fp8.to_fp8(torch.randn((n, k))).t()
    if blockwise:
        scale_a = torch.rand((m, k // 128)).t().contiguous().t()
        scale_b = torch.rand((k // 128, n // 128)).t().contiguous().t()
    else:
        scale_a, scale_b = torch.rand((m, 1)), torch.rand((1, n))
    return torch, {"a": a, "b": b, "scale_a": scale_a, "scale_b": scale_b}


@pytest.mark.parametrize("blockwise", [False, True])
def test_no_fault_hands_the_op_the_checks_own_tensors(blockwise: bool) -> None:
    torch, ops = _cpu_operands(blockwise)
    given = fp8_faults.plant("block" if blockwise else "gemm", None, **ops)
    assert all(given[k] is ops[k] for k in ops)
    assert checks_fp8.gemm_problems(**given, out_dtype=torch.bfloat16, blockwise=blockwise) == []


def test_b_row_major_fails_the_precondition_not_the_kernel() -> None:
    torch, ops = _cpu_operands(blockwise=False)
    given = fp8_faults.plant("gemm", "b_row_major", **ops)
    assert torch.equal(given["b"].float(), ops["b"].float())  # same values, other layout
    problems = checks_fp8.gemm_problems(**given, out_dtype=torch.bfloat16, blockwise=False)
    assert problems[0].startswith("b must be column-major")


def test_block_scale_transposed_fails_the_precondition() -> None:
    torch, ops = _cpu_operands(blockwise=True)
    given = fp8_faults.plant("block", "block_scale_transposed", **ops)
    problems = checks_fp8.gemm_problems(**given, out_dtype=torch.bfloat16, blockwise=True)
    assert problems == ["scale_b must be (K/128, N/128) = (4, 2), got (2, 4)"]
    assert fp8_faults.plant("gemm", "block_scale_transposed", **ops)["scale_b"] is ops["scale_b"]


@pytest.mark.parametrize("blockwise", [False, True])
def test_scale_x2_doubles_only_what_the_op_gets_and_keeps_its_layout(blockwise: bool) -> None:
    torch, ops = _cpu_operands(blockwise)
    before = ops["scale_a"].clone()
    given = fp8_faults.plant("block" if blockwise else "gemm", "scale_x2", **ops)
    assert torch.equal(given["scale_a"], 2 * before) and torch.equal(ops["scale_a"], before)
    assert given["scale_a"].stride() == ops["scale_a"].stride()
    assert checks_fp8.gemm_problems(**given, out_dtype=torch.bfloat16, blockwise=blockwise) == []


def test_nan_input_poisons_one_element_of_the_ops_copy() -> None:
    torch, ops = _cpu_operands(blockwise=False)
    given = fp8_faults.plant("gemm", "nan_input", **ops)
    assert torch.isnan(given["a"].float()).sum() == 1 and not torch.isnan(ops["a"].float()).any()
    x = torch.randn((4, 32), dtype=torch.bfloat16)
    assert torch.isnan(fp8_faults.plant("quant_input", "nan_input", x=x)["x"]).sum() == 1
    assert not torch.isnan(x).any()


def test_the_comparison_fails_a_2x_result_even_where_upstreams_tolerance_would_not() -> None:
    torch = pytest.importorskip("torch", reason=NO_TORCH)
    ref = torch.randn((64, 64)) / 10  # |ref| < 0.3 almost everywhere: allclose(rtol=.5, atol=.15) passes 2x
    ok, details = checks_fp8.compare(2 * ref, ref)
    assert details["mismatched"] < details["numel"] // 10  # upstream's tolerance alone lets >90% through
    assert not ok and details["relative_error"] == pytest.approx(1.0)
    assert "relative error 1" in checks_fp8.why(details)
    ok, details = checks_fp8.compare(ref.to(torch.bfloat16), ref)
    assert ok, details
