#!/usr/bin/env python3
"""Run the image suite's FP8 checks (sparkforge/verify/inimage/checks_fp8.py, unchanged) against vLLM's FP8 ops, then again
with each planted fault, and judge both runs.

    python3 tests/gpu/fp8_ops/run_suite.py --ops OUT/python --out DIR     # ops built by build_ops.py
    python3 tests/gpu/fp8_ops/run_suite.py --installed --out DIR          # the vLLM installed here (an image)

Writes DIR/fp8_checks.json (every check, its cases and errors, time per check) and DIR/fp8_faults.json (per
fault: which checks failed and why, against what was expected). Exit 1 when a vLLM FP8 check did not pass, or a
fault was not caught by exactly the checks expected with the reason expected.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "sparkforge" / "verify" / "inimage"))

import checks_fp8  # noqa: E402
import fp8_faults  # noqa: E402
from fp8_contract import WRONG  # noqa: E402

VLLM_CHECKS = ("fp8.scaled_fp8_quant", "fp8.cutlass_scaled_mm", "fp8.cutlass_block", "fp8.linear")
REQUIRED_CASE = {"m": 1, "n": 16384, "k": 5120}
# Per planted fault: the checks that must fail, each with a phrase its reason must hold; every other check passes.
EXPECTED_CATCHES: dict[str, dict[str, str]] = {
    "scale_x2": {
        "fp8.scaled_fp8_quant": "does not round-trip",
        "fp8.cutlass_scaled_mm": "disagrees with the float32 reference",
        "fp8.cutlass_block": "disagrees with the reference",
        "fp8.linear": "relative error",
    },
    "b_row_major": {
        "fp8.cutlass_scaled_mm": f"{WRONG}: cutlass_scaled_mm m=16 n=256 k=512 per_token=False "
        "per_channel=False: b must be column-major",
        "fp8.cutlass_block": f"{WRONG}: blockwise cutlass_scaled_mm m=16 n=256 k=512: b must be column-major",
        "fp8.linear": f"{WRONG}: FP8 linear: b must be column-major",
    },
    "nan_input": {
        # vLLM's quant kernel saturates NaN to +448 (fminf drops the NaN): a finite outlier where the NaN was.
        "fp8.scaled_fp8_quant": "does not round-trip: relative error",
        "fp8.cutlass_scaled_mm": "not finite",
        "fp8.cutlass_block": "not finite",
        "fp8.linear": "not finite",
    },
    "block_scale_transposed": {
        "fp8.cutlass_block": f"{WRONG}: blockwise cutlass_scaled_mm m=16 n=256 k=512: scale_b must be "
        "(K/128, N/128) = (4, 2), got (2, 4)",
    },
}


def run_checks() -> list[dict[str, Any]]:
    """Every FP8 check as run_checks.py runs it: a crash is a failure with its traceback."""
    out = []
    for name, fn in checks_fp8.CHECKS:
        start = time.monotonic()
        try:
            status, reason, details = fn(None)
        except Exception as exc:
            status, reason = "failed", f"{exc.__class__.__name__}: {exc}"
            details = {"traceback": traceback.format_exc()}
        out.append(
            {
                "name": name,
                "status": status,
                "reason": reason,
                "details": details,
                "duration_s": round(time.monotonic() - start, 3),
            }
        )
    return out


def has_case(check: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return any(all(c.get(k) == v for k, v in wanted.items()) for c in check["details"].get("cases", []))


def judge_clean(checks: list[dict[str, Any]]) -> list[str]:
    """Why a run without faults is not "every vLLM FP8 check passed, the required case included"."""
    by = {c["name"]: c for c in checks}
    problems = [
        f"{n}: {by[n]['status']}: {by[n]['reason']}" for n in VLLM_CHECKS if by[n]["status"] != "passed"
    ]
    for name in ("fp8.cutlass_scaled_mm", "fp8.cutlass_block"):
        if by[name]["status"] == "passed" and not has_case(by[name], REQUIRED_CASE):
            problems.append(f"{name} did not run the required case {REQUIRED_CASE}")
    return problems


def judge_fault(fault: str, checks: list[dict[str, Any]]) -> list[str]:
    """Why a planted fault was not caught by exactly the expected checks, with the expected reasons."""
    expected = EXPECTED_CATCHES[fault]
    problems = []
    for check in checks:
        name, status, reason = check["name"], check["status"], check["reason"]
        if name in expected:
            if status != "failed":
                problems.append(f"{name} should fail under {fault} but {status}: {reason}")
            elif expected[name] not in reason:
                problems.append(f"{name} failed under {fault} for another reason: {reason}")
        elif status != "passed":
            problems.append(
                f"{name} should pass under {fault} (it does not use what the fault touched): {status}"
            )
    return problems


def environment(ops_source: str) -> dict[str, Any]:
    import torch
    import vllm

    props = torch.cuda.get_device_properties(0) if torch.cuda.is_available() else None
    return {
        "host": platform.node(),
        "gpu": props.name if props else None,
        "capability": f"{props.major}.{props.minor}" if props else None,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "vllm": getattr(vllm, "__version__", "?"),
        "vllm_path": str(Path(vllm.__file__).parent),
        "ops": ops_source,
    }


def summary(checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per check: status, reason, seconds and, per case, the errors (what benchmarks/ quotes)."""
    keys = (
        "m",
        "n",
        "k",
        "per_token",
        "per_channel",
        "max_abs_err",
        "relative_error",
        "mismatched",
        "finite",
    )
    rows = []
    for c in checks:
        row = {k: c[k] for k in ("name", "status", "reason", "duration_s")}
        if "cases" in c["details"]:
            row["cases"] = [{k: case[k] for k in keys if k in case} for case in c["details"]["cases"]]
        for part in ("per_tensor", "per_token"):
            if part in c["details"]:
                row[part] = {
                    k: c["details"][part][k]
                    for k in ("max_abs_err", "worst_at", "relative_error", "mismatched")
                }
        if "relative_error" in c["details"]:
            row["relative_error"] = c["details"]["relative_error"]
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--ops", type=Path, help="OUT/python of build_ops.py (holds the vllm op package)")
    source.add_argument("--installed", action="store_true", help="use the vLLM installed in this Python")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--no-faults", action="store_true")
    parser.add_argument("--build-json", type=Path, help="build_ops.py's build.json, quoted into the results")
    parser.add_argument("--label", help="where the ops came from, for the results")
    args = parser.parse_args()
    if args.ops:
        sys.path.insert(0, str(args.ops.resolve()))
    os.environ.pop(fp8_faults.FAULT_ENV, None)
    args.out.mkdir(parents=True, exist_ok=True)
    build = json.loads(args.build_json.read_text()) if args.build_json and args.build_json.is_file() else None
    env = environment(
        args.label or ("built from vLLM sources by build_ops.py" if args.ops else "installed vLLM")
    )

    start = time.monotonic()
    checks = run_checks()
    clean = {
        "what": "sparkforge/verify/inimage/checks_fp8.py against vLLM's FP8 ops, no fault planted",
        "environment": env,
        "build": build,
        "suite_s": round(time.monotonic() - start, 2),
        "problems": judge_clean(checks),
        "checks": summary(checks),
    }
    clean["all_vllm_fp8_checks_passed"] = not clean["problems"]
    (args.out / "fp8_checks.json").write_text(json.dumps(clean, indent=2) + "\n")
    for c in checks:
        print(f"{c['name']:24} {c['status']:8} {c['duration_s']:7.2f}s {c['reason'][:150]}")
    print(f"suite {clean['suite_s']} s; every vLLM FP8 check passed: {clean['all_vllm_fp8_checks_passed']}")
    ok = clean["all_vllm_fp8_checks_passed"]

    if not args.no_faults:
        runs = []
        for fault in EXPECTED_CATCHES:
            os.environ[fp8_faults.FAULT_ENV] = fault
            start = time.monotonic()
            planted = run_checks()
            problems = judge_fault(fault, planted)
            runs.append(
                {
                    "fault": fault,
                    "what": fp8_faults.FAULTS[fault],
                    "expected_failures": EXPECTED_CATCHES[fault],
                    "caught": not problems,
                    "problems": problems,
                    "suite_s": round(time.monotonic() - start, 2),
                    "checks": [{k: c[k] for k in ("name", "status", "reason")} for c in planted],
                }
            )
            print(f"fault {fault:24} caught by the right checks: {not problems}")
            for p in problems:
                print(f"   {p[:200]}")
        os.environ.pop(fp8_faults.FAULT_ENV, None)
        faults = {
            "what": "sparkforge/verify/inimage/checks_fp8.py with each planted fault (SPARKFORGE_FP8_FAULT)",
            "environment": env,
            "all_caught": all(r["caught"] for r in runs),
            "faults": runs,
        }
        (args.out / "fp8_faults.json").write_text(json.dumps(faults, indent=2) + "\n")
        print(f"every planted fault caught by the right check: {faults['all_caught']}")
        ok = ok and faults["all_caught"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
