"""Slow, on demand (`pytest -m slow tests/engine/test_arm64_full.py`): the real GB10 image from the official
aarch64 wheels (vLLM 0.33.0, torch 2.14.0 +cu130), built for linux/arm64 under qemu on an x86 host and
verified: labels, lock, kernel coverage for sm_121 from the aarch64 binaries, registry and versions under
emulation, FP8 skipped (no GPU). Its timing is recorded in benchmarks/build.md."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sparkforge.build import BuildOptions, build
from sparkforge.recipe import load_recipe

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_full_arm64_wheels_image_under_qemu(base_arm64: str, tmp_path: Path) -> None:
    recipe = load_recipe("vllm-qwen35-wheels")
    start = time.monotonic()
    result = build(
        recipe,
        BuildOptions(
            platform="linux/arm64",
            base_image=base_arm64,
            gpus="none",
            log_root=tmp_path / "logs",
            tags=("sparkforge-test/vllm-qwen35-wheels:arm64-qemu",),
        ),
    )
    elapsed = time.monotonic() - start
    report = result.verify
    assert report is not None and report.status == "passed", report and report.to_dict()
    checks = {c.name: c for c in report.checks}
    assert checks["kernels"].status == "passed"
    assert checks["registry"].status == "passed" and checks["versions"].status == "passed"
    assert report.extra["platform"] == "linux/arm64"
    print(f"arm64 build + verify under qemu: {elapsed:.0f} s")
