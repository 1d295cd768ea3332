"""What a verify run proves: the in-image checks expected, and the one definition of "GPU-verified".

Standard library only (no recipe, no engine): the same rule judges a report on a build host, in CI and on a
GPU machine that has only torch. Torch-only checks (`fp8.reference`, the torch path of `fp8.linear`) are
diagnostics of the harness and never count.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sparkforge.boundary import sha256_file, walk_tree
from sparkforge.verify.imagechecks import IMAGE_CHECKS

# Every check the in-image suite must report, in its order (the registry; rows declared in inimage/checklist.py).
# A report that lacks one of these, has an empty list or an unknown status is a failed verify.
EXPECTED_IMAGE_CHECKS: tuple[str, ...] = IMAGE_CHECKS.names()
# The vLLM FP8 kernel checks that must all pass, on a GPU of the recipe's capability, for "GPU-verified".
GPU_VERIFIED_CHECKS: tuple[str, ...] = ("fp8.scaled_fp8_quant", "fp8.cutlass_scaled_mm", "fp8.cutlass_block")
# Cases each of those checks must have run (the GB10 failure shape m=1 n=16384 k=5120 included).
_REQUIRED_CASES: dict[str, list[dict[str, Any]]] = {
    "fp8.cutlass_scaled_mm": [
        {"per_token": False, "per_channel": False},
        {"per_token": True, "per_channel": True},
        {"m": 1, "n": 16384, "k": 5120},
    ],
    "fp8.cutlass_block": [{"m": 1, "n": 16384, "k": 5120}],
}
STATUSES = ("passed", "failed", "skipped")
SUITE_IGNORED = ("__pycache__", ".pyc", ".pytest_cache")


def capability_of(gpu: str) -> str:
    """'sm_121' / 'sm_121a' / 'sm_90' -> '12.1' / '12.1' / '9.0' (the compute capability a GPU reports)."""
    match = re.fullmatch(r"sm_([0-9]+)([0-9])[af]?", gpu)
    if not match:
        raise ValueError(f"{gpu!r} is not an SM target like 'sm_121'")
    return f"{int(match.group(1))}.{match.group(2)}"


def sm_of(capability: str) -> str:
    """'12.1' -> 'sm_121'."""
    major, _, minor = capability.partition(".")
    return f"sm_{major}{minor}"


MAX_SUITE_FILE = 16 << 20  # a file of the in-image suite: a few KiB of Python


def suite_digest(root: Path) -> str:
    """sha256 over the suite's files (relative path and bytes, sorted): which suite judged an image."""
    digest = hashlib.sha256()
    for path in walk_tree(root, "the in-image suite"):  # regular files only, no link followed
        if any(part in SUITE_IGNORED for part in path.parts) or path.suffix == ".pyc":
            continue
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(bytes.fromhex(sha256_file(path, "the in-image suite", MAX_SUITE_FILE)))
    return "sha256:" + digest.hexdigest()


def suite_problems(
    checks: Sequence[Mapping[str, Any]], expected: Iterable[str] = EXPECTED_IMAGE_CHECKS
) -> list[str]:
    """Why a suite's output cannot be trusted (empty list, unknown status, an expected check missing)."""
    if not checks:
        return ["the suite reported no checks"]
    problems = [
        f"check {c.get('name')!r} has unknown status {c.get('status')!r}"
        for c in checks
        if c.get("status") not in STATUSES
    ]
    names = {c.get("name") for c in checks}
    missing = [name for name in expected if name not in names]
    if missing:
        problems.append(f"expected check(s) missing from the report: {', '.join(missing)}")
    return problems


def _has_case(details: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return any(all(case.get(k) == v for k, v in wanted.items()) for case in details.get("cases", []))


@dataclass(frozen=True)
class GpuVerdict:
    """Whether a verify run makes an image GPU-verified for a target, and why (one line)."""

    verified: bool
    reason: str
    ran_on: str | None  # e.g. sm_90, None when no GPU was used
    target: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gpu_verdict(
    checks: Sequence[Mapping[str, Any]], gpu: Mapping[str, Any] | None, target: str
) -> GpuVerdict:
    """THE rule: every vLLM FP8 kernel check passed (all its cases) on a GPU whose capability is the target's."""
    want = capability_of(target)
    target_sm = sm_of(want)
    if not gpu or not gpu.get("capability"):
        return GpuVerdict(
            False, f"no GPU was used; recipe targets {target_sm}: not GPU-verified", None, target_sm
        )
    ran_on = sm_of(str(gpu["capability"]))
    if str(gpu["capability"]) != want:
        return GpuVerdict(
            False,
            f"ran on {ran_on}; recipe targets {target_sm}: not GPU-verified for this recipe",
            ran_on,
            target_sm,
        )
    if any(c.get("status") == "failed" for c in checks) or suite_problems(checks):
        return GpuVerdict(
            False, f"ran on {ran_on}, but verify did not pass: not GPU-verified", ran_on, target_sm
        )
    by_name = {c.get("name"): c for c in checks}
    for name in GPU_VERIFIED_CHECKS:
        check = by_name.get(name) or {}
        if check.get("status") != "passed":
            return GpuVerdict(
                False,
                f"ran on {ran_on}, but {name} is {check.get('status', 'missing')}: not GPU-verified",
                ran_on,
                target_sm,
            )
        for case in _REQUIRED_CASES.get(name, []):
            if not _has_case(check.get("details") or {}, case):
                return GpuVerdict(
                    False,
                    f"ran on {ran_on}, but {name} did not run the case {case}: not GPU-verified",
                    ran_on,
                    target_sm,
                )
    return GpuVerdict(
        True,
        f"every vLLM FP8 kernel check passed on {ran_on} ({gpu.get('name', 'GPU')}): GPU-verified",
        ran_on,
        target_sm,
    )


def require_gpu_checks(checks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Under `--gpus all`: a GPU-verified check that skipped (no vLLM, no kernel for this capability, no GPU
    visible) has failed, because that is exactly how the GB10 failure looks from outside."""
    out = []
    for check in checks:
        item = dict(check)
        if item.get("name") in GPU_VERIFIED_CHECKS and item.get("status") == "skipped":
            item["status"] = "failed"
            item["reason"] = f"required with --gpus all, but skipped: {item.get('reason', '')}"
        out.append(item)
    return out
