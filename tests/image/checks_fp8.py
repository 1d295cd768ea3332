"""FP8 checks on the GPU: vLLM's FP8 kernels against a float32 reference, with upstream's tolerances.

Runs inside images (via run_checks.py) and standalone on a GPU host without vLLM (the torch reference path:
`python3 tests/image/checks_fp8.py`). Every check is skipped with an explicit reason when it cannot run;
NaN or Inf in an output never passes.
"""

from __future__ import annotations

import json
import sys
from typing import Any

Result = tuple[str, str, dict[str, Any]]
RTOL, ATOL = 5e-1, 1.5e-1  # upstream vLLM's tolerances for cutlass_scaled_mm tests
BLOCK = 128
SHAPES = [(16, 256, 512), (64, 1024, 2048), (1, 16384, 5120)]  # last: the GB10 failure shape of issue #43367


def _gate(min_capability: tuple[int, int] = (8, 9)) -> Result | None:
    try:
        import torch
    except ImportError:
        return "skipped", "torch is not installed", {}
    if not torch.cuda.is_available():
        return "skipped", "no GPU visible (run verify with --gpus all on a GPU host)", {}
    cap = torch.cuda.get_device_capability()
    if cap < min_capability:
        return (
            "skipped",
            f"compute capability {cap[0]}.{cap[1]} < {min_capability[0]}.{min_capability[1]}: no FP8",
            {},
        )
    return None


def _ops() -> Any:
    try:
        from vllm import _custom_ops as ops
    except ImportError as exc:
        return exc
    return ops


def compare(out: Any, ref: Any, rtol: float = RTOL, atol: float = ATOL) -> tuple[bool, dict[str, Any]]:
    """allclose with evidence; any NaN or Inf in `out` fails whatever the tolerance."""
    import torch

    out_f, ref_f = out.float(), ref.float()
    finite = bool(torch.isfinite(out_f).all())
    diff = (out_f - ref_f).abs()
    bad = diff > (atol + rtol * ref_f.abs())
    details = {
        "shape": list(out.shape),
        "finite": finite,
        "max_abs_err": float(diff.max()) if finite else None,
        "mismatched": int(bad.sum()),
        "numel": out.numel(),
    }
    return finite and not bool(bad.any()), details


def to_fp8(t: Any) -> Any:
    import torch

    info = torch.finfo(torch.float8_e4m3fn)
    return torch.round(t.clamp(min=info.min, max=info.max)).to(torch.float8_e4m3fn)


def _operands(m: int, n: int, k: int, per_token: bool, per_channel: bool) -> tuple[Any, Any, Any, Any]:
    import torch

    a = to_fp8(torch.randn((m, k), device="cuda"))
    b = to_fp8(torch.randn((n, k), device="cuda")).t()  # column-major, as the kernels take it
    scale_a = torch.randn((m if per_token else 1, 1), device="cuda", dtype=torch.float32) / 10
    scale_b = torch.randn((1, n if per_channel else 1), device="cuda", dtype=torch.float32) / 10
    return a, b, scale_a, scale_b


def _reference(a: Any, b: Any, scale_a: Any, scale_b: Any, dtype: Any) -> Any:
    import torch

    return torch.mm(scale_a * a.float(), scale_b * b.float()).to(dtype)


def _run_cases(name: str, gemm: Any, cases: list[tuple[int, int, int, bool, bool]]) -> Result:
    import torch

    torch.manual_seed(0)
    results, failed = [], []
    for m, n, k, per_token, per_channel in cases:
        a, b, scale_a, scale_b = _operands(m, n, k, per_token, per_channel)
        out = gemm(a, b, scale_a, scale_b, torch.bfloat16)
        ok, details = compare(out, _reference(a, b, scale_a, scale_b, torch.bfloat16))
        details.update({"m": m, "n": n, "k": k, "per_token": per_token, "per_channel": per_channel})
        results.append(details)
        if not ok:
            failed.append(f"m={m} n={n} k={k} per_token={per_token} per_channel={per_channel}")
    if failed:
        return (
            "failed",
            f"{name} disagrees with the float32 reference (or is not finite) for: " + "; ".join(failed),
            {"cases": results},
        )
    return (
        "passed",
        f"{name} matches the reference in {len(results)} cases (rtol={RTOL}, atol={ATOL})",
        {"cases": results},
    )


def _cases() -> list[tuple[int, int, int, bool, bool]]:
    out = []
    for m, n, k in SHAPES:
        out += [(m, n, k, False, False), (m, n, k, True, True)]
    return out


def check_torch_reference(lock: dict[str, Any] | None = None) -> Result:
    """torch._scaled_mm through the same reference and tolerances (proves the harness on any FP8 GPU)."""
    if (gate := _gate()) is not None:
        return gate
    import torch

    def gemm(a: Any, b: Any, sa: Any, sb: Any, dtype: Any) -> Any:
        if sa.numel() == 1 and sb.numel() == 1:
            sa, sb = sa.reshape(()), sb.reshape(())
        return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=dtype)

    status, reason, details = _run_cases("torch._scaled_mm", gemm, _cases())
    # The harness itself must reject a poisoned result: NaN never passes.
    a, b, sa, sb = _operands(16, 64, 128, False, False)
    ref = _reference(a, b, sa, sb, torch.bfloat16)
    poisoned = ref.clone()
    poisoned[0, 0] = float("nan")
    details["nan_rejected"] = not compare(poisoned, ref)[0]
    if not details["nan_rejected"]:
        return "failed", "the comparison accepted a NaN output", details
    return status, reason, details


def _vllm_on_gpu() -> tuple[Any, int, Result | None]:
    """vLLM's ops and the GPU's capability (e.g. 121), or a skip result as the third item."""
    if (gate := _gate()) is not None:
        return None, 0, gate
    ops = _ops()
    if isinstance(ops, Exception):
        return None, 0, ("skipped", f"vLLM is not importable here ({ops})", {})
    import torch

    major, minor = torch.cuda.get_device_capability()
    return ops, major * 10 + minor, None


def check_scaled_fp8_quant(lock: dict[str, Any] | None = None) -> Result:
    ops, _, skip = _vllm_on_gpu()
    if skip is not None:
        return skip
    import torch

    torch.manual_seed(0)
    x = torch.randn((64, 1024), device="cuda", dtype=torch.bfloat16)
    details: dict[str, Any] = {}
    for per_token in (False, True):
        q, scale = ops.scaled_fp8_quant(x, use_per_token_if_dynamic=per_token)
        deq = q.float() * scale.float()
        ok, d = compare(deq, x.float(), rtol=0.125, atol=1e-2)  # e4m3 keeps 3 mantissa bits
        details["per_token" if per_token else "per_tensor"] = d
        if not ok:
            return "failed", f"scaled_fp8_quant (per_token={per_token}) does not round-trip", details
    return "passed", "scaled_fp8_quant round-trips per tensor and per token", details


def check_cutlass_scaled_mm(lock: dict[str, Any] | None = None) -> Result:
    ops, capability, skip = _vllm_on_gpu()
    if skip is not None:
        return skip
    if not ops.cutlass_scaled_mm_supports_fp8(capability):
        return "skipped", f"vLLM reports no CUTLASS FP8 for capability {capability}", {}
    return _run_cases(
        "cutlass_scaled_mm", lambda a, b, sa, sb, dt: ops.cutlass_scaled_mm(a, b, sa, sb, dt), _cases()
    )


def check_cutlass_block_fp8(lock: dict[str, Any] | None = None) -> Result:
    ops, capability, skip = _vllm_on_gpu()
    if skip is not None:
        return skip
    import torch

    if not ops.cutlass_scaled_mm_supports_block_fp8(capability):
        return "skipped", f"vLLM reports no blockwise CUTLASS FP8 for capability {capability}", {}
    torch.manual_seed(0)
    results, failed = [], []
    for m, n, k in SHAPES:
        a = to_fp8(torch.randn((m, k), device="cuda"))
        b = to_fp8(torch.randn((n, k), device="cuda")).t()
        scale_a = torch.rand((m, k // BLOCK), device="cuda", dtype=torch.float32) / 10 + 1e-3
        scale_b = torch.rand((k // BLOCK, n // BLOCK), device="cuda", dtype=torch.float32) / 10 + 1e-3
        a_f = a.float() * scale_a.repeat_interleave(BLOCK, dim=1)
        b_f = b.float() * scale_b.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)
        ref = (a_f @ b_f).to(torch.bfloat16)
        out = ops.cutlass_scaled_mm(
            a, b, scale_a.t().contiguous().t(), scale_b.t().contiguous().t(), torch.bfloat16
        )
        ok, details = compare(out, ref)
        details.update({"m": m, "n": n, "k": k})
        results.append(details)
        if not ok:
            failed.append(f"m={m} n={n} k={k}")
    if failed:
        return (
            "failed",
            "blockwise cutlass_scaled_mm disagrees with the reference for " + "; ".join(failed),
            {"cases": results},
        )
    return (
        "passed",
        f"blockwise 128x128 cutlass_scaled_mm matches in {len(results)} cases",
        {"cases": results},
    )


def check_fp8_linear(lock: dict[str, Any] | None = None) -> Result:
    """An FP8 linear layer end to end (dynamic per-token input, per-channel weight) against bf16 F.linear."""
    if (gate := _gate()) is not None:
        return gate
    import torch

    ops = _ops()
    torch.manual_seed(0)
    m, n, k = 32, 4096, 4096
    x = torch.randn((m, k), device="cuda", dtype=torch.bfloat16)
    weight = torch.randn((n, k), device="cuda", dtype=torch.bfloat16) / k**0.5
    finfo = torch.finfo(torch.float8_e4m3fn)
    w_scale = weight.float().abs().amax(dim=1, keepdim=True) / finfo.max
    w_q = (weight.float() / w_scale).clamp(finfo.min, finfo.max).to(torch.float8_e4m3fn)
    if isinstance(ops, Exception):
        x_scale = x.float().abs().amax(dim=1, keepdim=True) / finfo.max
        x_q = (x.float() / x_scale).clamp(finfo.min, finfo.max).to(torch.float8_e4m3fn)
        out = torch._scaled_mm(x_q, w_q.t(), scale_a=x_scale, scale_b=w_scale.t(), out_dtype=torch.bfloat16)
        path = "torch._scaled_mm (vLLM not importable)"
    else:
        x_q, x_scale = ops.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
        out = ops.cutlass_scaled_mm(x_q, w_q.t(), x_scale, w_scale.t().contiguous(), torch.bfloat16)
        path = "vllm scaled_fp8_quant + cutlass_scaled_mm"
    ref = torch.nn.functional.linear(x, weight)
    finite = bool(torch.isfinite(out).all())
    rel = float((out.float() - ref.float()).norm() / ref.float().norm()) if finite else None
    details = {"path": path, "m": m, "n": n, "k": k, "finite": finite, "relative_error": rel}
    if not finite or rel is None or rel > 0.05:
        return (
            "failed",
            f"FP8 linear via {path}: relative error {rel} (limit 0.05) or non-finite output",
            details,
        )
    return "passed", f"FP8 linear via {path}: relative error {rel:.4f} against bf16", details


CHECKS = [
    ("fp8.reference", check_torch_reference),
    ("fp8.scaled_fp8_quant", check_scaled_fp8_quant),
    ("fp8.cutlass_scaled_mm", check_cutlass_scaled_mm),
    ("fp8.cutlass_block", check_cutlass_block_fp8),
    ("fp8.linear", check_fp8_linear),
]


if __name__ == "__main__":
    report = []
    for name, fn in CHECKS:
        status, reason, details = fn(None)
        report.append({"name": name, "status": status, "reason": reason, "details": details})
        print(f"{name:24} {status:8} {reason}", file=sys.stderr)
    print(json.dumps(report, indent=2))
    sys.exit(1 if any(r["status"] == "failed" for r in report) else 0)
