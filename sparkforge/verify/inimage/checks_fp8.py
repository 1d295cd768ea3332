"""FP8 checks on the GPU: vLLM's FP8 kernels against a float32 reference, with upstream's tolerances.

Runs inside images (via run_checks.py) and standalone on a GPU host without vLLM (the torch reference path:
`python3 sparkforge/verify/inimage/checks_fp8.py`). Every check is skipped with an explicit reason when it cannot run;
NaN or Inf in an output never passes. Each call is first held against the op's contract (fp8_contract.py): a
wrong layout or scale shape fails as "the check is wrong", not as a kernel failure.

Planted faults prove the checks can fail: `SPARKFORGE_FP8_FAULT=<name>` (or `--plant <name>`) changes what the
vLLM ops receive (never the reference), and tests/gpu/fp8_ops/run_suite.py asserts which check catches each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import checklist
from fp8_contract import TensorSpec, describe, quant_problems, scaled_mm_problems
from fp8_faults import FAULT_ENV, FAULTS, plant, planted_fault

Result = tuple[str, str, dict[str, Any]]
RTOL, ATOL = 5e-1, 1.5e-1  # upstream vLLM's tolerances for cutlass_scaled_mm tests
# ...which pass a result off by 2x wherever |ref| < 0.3 (most outputs of small shapes); the norm-wise error of
# exact FP8 operands with float32 accumulation is ~1e-3, so this bound catches a wrong scale in every case.
REL_LIMIT = 0.05
BLOCK = 128
SHAPES = [(16, 256, 512), (64, 1024, 2048), (1, 16384, 5120)]  # last: the GB10 failure shape of issue #43367


def gemm_problems(a: Any, b: Any, scale_a: Any, scale_b: Any, out_dtype: Any, blockwise: bool) -> list[str]:
    """fp8_contract.scaled_mm_problems on torch tensors."""
    return scaled_mm_problems(
        TensorSpec.of(a),
        TensorSpec.of(b),
        TensorSpec.of(scale_a),
        TensorSpec.of(scale_b),
        str(out_dtype).removeprefix("torch."),
        blockwise,
    )


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


def compare(
    out: Any, ref: Any, rtol: float = RTOL, atol: float = ATOL, rel_limit: float = REL_LIMIT
) -> tuple[bool, dict[str, Any]]:
    """allclose and ||out - ref|| / ||ref|| <= rel_limit, with evidence; any NaN or Inf in `out` fails."""
    import torch

    out_f, ref_f = out.float(), ref.float()
    finite = bool(torch.isfinite(out_f).all())
    diff = (out_f - ref_f).abs()
    bad = diff > (atol + rtol * ref_f.abs())
    rel = float(diff.norm() / ref_f.norm().clamp_min(1e-30)) if finite else None
    details = {
        "shape": list(out.shape),
        "finite": finite,
        "nonfinite": int((~torch.isfinite(out_f)).sum()),
        "max_abs_err": float(diff.max()) if finite else None,
        "worst_at": [int(i) for i in torch.unravel_index(diff.argmax(), diff.shape)] if finite else None,
        "relative_error": rel,
        "rel_limit": rel_limit,
        "mismatched": int(bad.sum()),
        "numel": out.numel(),
    }
    return finite and not bool(bad.any()) and rel is not None and rel <= rel_limit, details


def why(details: dict[str, Any]) -> str:
    """Why a comparison failed, in a few words (non-finite outputs first: NaN never passes)."""
    if not details["finite"]:
        return f"not finite: {details['nonfinite']} of {details['numel']} outputs NaN/Inf"
    return (
        f"relative error {details['relative_error']:.3g} (limit {details['rel_limit']}), {details['mismatched']} of "
        f"{details['numel']} outside rtol/atol, max abs err {details['max_abs_err']:.3g} at {details['worst_at']}"
    )


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


def _run_cases(
    name: str, gemm: Any, cases: list[tuple[int, int, int, bool, bool]], fault: str | None = None
) -> Result:
    """Each case against the reference; with `fault`, the op (never the reference) gets planted operands."""
    import torch

    torch.manual_seed(0)
    results, failed = [], []
    for m, n, k, per_token, per_channel in cases:
        a, b, scale_a, scale_b = _operands(m, n, k, per_token, per_channel)
        label = f"m={m} n={n} k={k} per_token={per_token} per_channel={per_channel}"
        given = plant("gemm", fault, a=a, b=b, scale_a=scale_a, scale_b=scale_b)
        problems = gemm_problems(**given, out_dtype=torch.bfloat16, blockwise=False)
        if problems:
            return (
                "failed",
                describe(f"{name} {label}", problems),
                {"cases": results, "precondition": problems},
            )
        out = gemm(given["a"], given["b"], given["scale_a"], given["scale_b"], torch.bfloat16)
        ok, details = compare(out, _reference(a, b, scale_a, scale_b, torch.bfloat16))
        details.update({"m": m, "n": n, "k": k, "per_token": per_token, "per_channel": per_channel})
        results.append(details)
        if not ok:
            failed.append(f"{label} ({why(details)})")
    if failed:
        return (
            "failed",
            f"{name} disagrees with the float32 reference for: " + "; ".join(failed),
            {"cases": results},
        )
    return (
        "passed",
        f"{name} matches the reference in {len(results)} cases (rtol={RTOL}, atol={ATOL}, "
        f"relative error <= {REL_LIMIT})",
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

    fault = planted_fault()
    torch.manual_seed(0)
    x = torch.randn((64, 1024), device="cuda", dtype=torch.bfloat16)
    details: dict[str, Any] = {"planted_fault": fault} if fault else {}
    given = plant("quant_input", fault, x=x)["x"]
    if problems := quant_problems(TensorSpec.of(given)):
        return "failed", describe("scaled_fp8_quant", problems), {**details, "precondition": problems}
    for per_token in (False, True):
        q, scale = ops.scaled_fp8_quant(given, use_per_token_if_dynamic=per_token)
        scale = plant("quant_result", fault, scale=scale)["scale"]
        deq = q.float() * scale.float()
        # e4m3 keeps 3 mantissa bits: +-6% per element, ~4% norm-wise
        ok, d = compare(deq, x.float(), rtol=0.125, atol=1e-2, rel_limit=0.1)
        details["per_token" if per_token else "per_tensor"] = d
        if not ok:
            return (
                "failed",
                f"scaled_fp8_quant (per_token={per_token}) does not round-trip: {why(d)}",
                details,
            )
    return "passed", "scaled_fp8_quant round-trips per tensor and per token", details


def check_cutlass_scaled_mm(lock: dict[str, Any] | None = None) -> Result:
    ops, capability, skip = _vllm_on_gpu()
    if skip is not None:
        return skip
    if not ops.cutlass_scaled_mm_supports_fp8(capability):
        return "skipped", f"vLLM reports no CUTLASS FP8 for capability {capability}", {}
    fault = planted_fault()
    status, reason, details = _run_cases(
        "cutlass_scaled_mm", lambda a, b, sa, sb, dt: ops.cutlass_scaled_mm(a, b, sa, sb, dt), _cases(), fault
    )
    return status, reason, {**details, "planted_fault": fault} if fault else details


def check_cutlass_block_fp8(lock: dict[str, Any] | None = None) -> Result:
    ops, capability, skip = _vllm_on_gpu()
    if skip is not None:
        return skip
    import torch

    if not ops.cutlass_scaled_mm_supports_block_fp8(capability):
        return "skipped", f"vLLM reports no blockwise CUTLASS FP8 for capability {capability}", {}
    fault = planted_fault()
    torch.manual_seed(0)
    results: list[dict[str, Any]] = []
    failed = []
    extra: dict[str, Any] = {"planted_fault": fault} if fault else {}
    for m, n, k in SHAPES:
        a = to_fp8(torch.randn((m, k), device="cuda"))
        b = to_fp8(torch.randn((n, k), device="cuda")).t()
        scale_a = torch.rand((m, k // BLOCK), device="cuda", dtype=torch.float32) / 10 + 1e-3
        scale_b = torch.rand((k // BLOCK, n // BLOCK), device="cuda", dtype=torch.float32) / 10 + 1e-3
        a_f = a.float() * scale_a.repeat_interleave(BLOCK, dim=1)
        b_f = b.float() * scale_b.repeat_interleave(BLOCK, dim=0).repeat_interleave(BLOCK, dim=1)
        ref = (a_f @ b_f).to(torch.bfloat16)
        # The kernels read scales by pointer: scale_a M-major, scale_b K-major (both column-major).
        given = plant(
            "block",
            fault,
            a=a,
            b=b,
            scale_a=scale_a.t().contiguous().t(),
            scale_b=scale_b.t().contiguous().t(),
        )
        problems = gemm_problems(**given, out_dtype=torch.bfloat16, blockwise=True)
        if problems:
            return (
                "failed",
                describe(f"blockwise cutlass_scaled_mm m={m} n={n} k={k}", problems),
                {"cases": results, "precondition": problems, **extra},
            )
        out = ops.cutlass_scaled_mm(
            given["a"], given["b"], given["scale_a"], given["scale_b"], torch.bfloat16
        )
        ok, details = compare(out, ref)
        details.update({"m": m, "n": n, "k": k})
        results.append(details)
        if not ok:
            failed.append(f"m={m} n={n} k={k} ({why(details)})")
    if failed:
        return (
            "failed",
            "blockwise cutlass_scaled_mm disagrees with the reference for " + "; ".join(failed),
            {"cases": results, **extra},
        )
    return (
        "passed",
        f"blockwise 128x128 cutlass_scaled_mm matches in {len(results)} cases",
        {"cases": results, **extra},
    )


def check_fp8_linear(lock: dict[str, Any] | None = None) -> Result:
    """An FP8 linear layer end to end (dynamic per-token input, per-channel weight) against bf16 F.linear."""
    if (gate := _gate()) is not None:
        return gate
    import torch

    ops = _ops()
    fault = None
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
        fault = planted_fault()
        x_in = plant("quant_input", fault, x=x)["x"]
        x_q, x_scale = ops.scaled_fp8_quant(x_in, use_per_token_if_dynamic=True)
        given = plant("gemm", fault, a=x_q, b=w_q.t(), scale_a=x_scale, scale_b=w_scale.t().contiguous())
        if problems := gemm_problems(**given, out_dtype=torch.bfloat16, blockwise=False):
            return (
                "failed",
                describe("FP8 linear", problems),
                {"precondition": problems, "planted_fault": fault},
            )
        out = ops.cutlass_scaled_mm(
            given["a"], given["b"], given["scale_a"], given["scale_b"], torch.bfloat16
        )
        path = "vllm scaled_fp8_quant + cutlass_scaled_mm"
    ref = torch.nn.functional.linear(x, weight)
    nonfinite = int((~torch.isfinite(out)).sum())
    rel = float((out.float() - ref.float()).norm() / ref.float().norm()) if not nonfinite else None
    details = {"path": path, "m": m, "n": n, "k": k, "finite": not nonfinite, "relative_error": rel}
    if fault:
        details["planted_fault"] = fault
    if rel is None:
        return (
            "failed",
            f"FP8 linear via {path}: not finite: {nonfinite} of {out.numel()} outputs NaN/Inf",
            details,
        )
    if rel > 0.05:
        return "failed", f"FP8 linear via {path}: relative error {rel:.4f} against bf16 (limit 0.05)", details
    return "passed", f"FP8 linear via {path}: relative error {rel:.4f} against bf16", details


# This module's rows of the suite, in order (declared in checklist.py).
CHECKS = [
    (name, globals()[function]) for name, module, function, _ in checklist.CHECKS if module == "checks_fp8"
]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="vLLM's FP8 kernels against a float32 reference")
    parser.add_argument("--plant", choices=sorted(FAULTS), help="plant a fault to see the right check fail")
    if (planted := parser.parse_args().plant) is not None:
        os.environ[FAULT_ENV] = planted
    report = []
    for name, fn in CHECKS:
        status, reason, details = fn(None)
        report.append({"name": name, "status": status, "reason": reason, "details": details})
        print(f"{name:24} {status:8} {reason}", file=sys.stderr)
    print(json.dumps(report, indent=2))
    sys.exit(1 if any(r["status"] == "failed" for r in report) else 0)
