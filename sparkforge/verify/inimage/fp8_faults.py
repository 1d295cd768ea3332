"""Planted faults: what the FP8 checks' vLLM ops receive when a fault is planted, to prove the checks can fail.

`SPARKFORGE_FP8_FAULT=<name>` (or `checks_fp8.py --plant <name>`) changes only the op's copy of its operands or
result, never the reference; tests/gpu/fp8_ops/run_suite.py asserts which check catches each fault and why.
Images never set it. torch is imported only when a fault is planted on real tensors.
"""

from __future__ import annotations

import os
from typing import Any

FAULT_ENV = "SPARKFORGE_FP8_FAULT"
FAULTS = {
    "scale_x2": "the op gets scale_a doubled (scaled_fp8_quant: hands back its scale doubled)",
    "b_row_major": "B reaches cutlass_scaled_mm row-major (a contiguous K x N tensor), not column-major",
    "nan_input": "one element of the op's input is NaN (A of each GEMM, the tensor scaled_fp8_quant quantizes)",
    "block_scale_transposed": "the blockwise scale_b reaches cutlass_scaled_mm as (N/128, K/128), not (K/128, N/128)",
}


def planted_fault() -> str | None:
    """The fault planted through SPARKFORGE_FP8_FAULT, or None (images never set it)."""
    name = os.environ.get(FAULT_ENV) or None
    if name is not None and name not in FAULTS:
        raise ValueError(f"{FAULT_ENV}={name!r} is not a planted fault; known: {', '.join(FAULTS)}")
    return name


def plant(site: str, fault: str | None, **operands: Any) -> dict[str, Any]:
    """What a vLLM op receives at `site` ('gemm', 'block', 'quant_input', 'quant_result') under `fault`.

    Only the op's copy changes; the reference is computed from the true operands.
    """
    out = dict(operands)
    if fault is None:
        return out
    import torch

    if fault == "scale_x2" and site in ("gemm", "block"):
        out["scale_a"] = operands["scale_a"].clone().mul_(2)  # clone keeps the scale's strides
    elif fault == "scale_x2" and site == "quant_result":
        out["scale"] = operands["scale"].clone().mul_(2)
    elif fault == "b_row_major" and site in ("gemm", "block"):
        out["b"] = operands["b"].contiguous()
    elif fault == "nan_input" and site in ("gemm", "block"):
        a = operands["a"].clone()
        a.view(torch.uint8)[0, 0] = 0x7F  # e4m3fn NaN
        out["a"] = a
    elif fault == "nan_input" and site == "quant_input":
        x = operands["x"].clone()
        x[0, 0] = float("nan")
        out["x"] = x
    elif fault == "block_scale_transposed" and site == "block":
        out["scale_b"] = operands["scale_b"].t()
    return out
