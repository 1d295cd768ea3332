"""Slow, on demand (`pytest -m slow tests/engine/test_arm64_full.py -s`): the shipping image, `vllm-qwen35-wheels`
(official aarch64 wheels: vLLM 0.33.0, torch 2.14.0 +cu130; through tests/recipes/ci-wheels-arm64.yaml, which only
sets the offline Debian base's Python 3.11), built for linux/arm64 under qemu on an x86 host and
verified as `invoke verify` does: labels, lock and kernel coverage for sm_121 from the host, then the in-image
suite in an arm64 container under qemu-user: the registry check (Qwen3_5MoeForConditionalGeneration), versions,
pip check and the JIT toolchain checks for sm_121a; only the checks that need a GPU are skipped, for that reason.
Under emulation the suite's container gets one OpenMP thread (sparkforge/verify/emulation.py: qemu-user 7.2
crashes or stalls in torch's import otherwise); natively nothing is added. Measured 2026-12-01 on 2 shared cores (benchmarks/build.md): cold build 2052 s
(every layer from the base's g++ step, all wheels downloaded) + verify ~222 s; cached build 6 s + verify 256 s.
Too long for CI's budget, so slow (on demand)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sparkforge import engine
from sparkforge.imagebuild.pipeline import build
from sparkforge.imagebuild.stage import BuildOptions, parse_base_image
from sparkforge.recipe.loader import REPO_ROOT, load_recipe
from sparkforge.verify import suite
from tests.engine.sessions import build_session

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow(cost_s=3600, reason="the whole arm64 wheels image built and checked under qemu-user"),
]

# Every check of the in-image suite that runs without a GPU and must pass on the arm64 image under qemu.
MUST_PASS = {
    "labels",
    "lock",
    "kernels",
    "registry",
    "versions",
    "pip-check",
    "jit.toolchain",
    "jit.triton",
    "jit.flashinfer",
}


# Checks a wheel recipe has nothing to check for: the official wheel's Rust artifacts are what it carries.
NOT_FOR_WHEELS = {"rust-extensions"}


def test_full_arm64_wheels_image_under_qemu(base_arm64: str, tmp_path: Path) -> None:
    recipe = load_recipe(REPO_ROOT / "tests" / "recipes" / "ci-wheels-arm64.yaml")
    start = time.monotonic()
    result = build(
        build_session(),
        recipe,
        BuildOptions(
            verify=False,
            platform="linux/arm64",
            bases=parse_base_image(base_arm64),
            gpus="none",
            log_root=tmp_path / "logs",
            tags=("sparkforge-test/vllm-qwen35-wheels:arm64-qemu",),
        ),
    )
    built = time.monotonic() - start
    assert engine.image_platform(result.candidate) == "linux/arm64"
    start = time.monotonic()
    report = suite.verify_image(recipe, result.candidate, gpus="none", log_dir=tmp_path / "logs")
    verified = time.monotonic() - start
    checks = {c.name: c for c in report.checks}
    print(f"arm64 under qemu: build {built:.0f} s, verify {verified:.0f} s")
    for check in report.checks:
        print(f"  {check.name:<20} {check.status:<8} {check.duration_s:6.1f}s  {check.reason[:150]}")
    failed = {c.name: c.reason for c in report.checks if c.status == "failed"}
    assert not failed, failed
    assert {name for name in MUST_PASS if checks[name].status != "passed"} == set(), {
        n: checks[n].reason for n in MUST_PASS
    }
    assert "Qwen3_5MoeForConditionalGeneration" in checks["registry"].details["required"]
    skipped = {c.name: c.reason for c in report.checks if c.status == "skipped"}
    # Only what needs a GPU (or a registry's signed attestation, or a mounted model) is skipped, and what a wheel
    # recipe has nothing to check for (it skips on a Spark alike).
    for name, reason in skipped.items():
        wheel_only = name in NOT_FOR_WHEELS and "wheel recipe" in reason
        assert wheel_only or any(word in reason for word in ("GPU", "gpu", "attestation", "model")), (
            name,
            reason,
        )
