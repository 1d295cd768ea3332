"""Slow, on demand (`pytest -m slow tests/engine/test_arm64_full.py`): the real GB10 image from the official
aarch64 wheels (vLLM 0.33.0, torch 2.14.0 +cu130), built for linux/arm64 under qemu on an x86 host and
checked from the host: labels, lock and kernel coverage for sm_121 from the aarch64 binaries (no emulation).
The in-image suite is not run here: under qemu-user, importing torch hung in its CPU-topology probe (see
benchmarks/build.md); on a Spark the same image runs it natively. Timing is recorded in benchmarks/build.md."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sparkforge import engine
from sparkforge.imagebuild.pipeline import build
from sparkforge.imagebuild.stage import BuildOptions
from sparkforge.recipe.loader import load_recipe
from sparkforge.verify import suite

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_full_arm64_wheels_image_under_qemu(base_arm64: str, tmp_path: Path) -> None:
    recipe = load_recipe("vllm-qwen35-wheels")
    start = time.monotonic()
    result = build(
        recipe,
        BuildOptions(
            verify=False,
            platform="linux/arm64",
            base_image=base_arm64,
            gpus="none",
            log_root=tmp_path / "logs",
            tags=("sparkforge-test/vllm-qwen35-wheels:arm64-qemu",),
        ),
    )
    elapsed = time.monotonic() - start
    labels = engine.image_labels(result.candidate)
    assert engine.image_platform(result.candidate) == "linux/arm64"
    assert suite.check_labels(recipe, labels).status == "passed"
    assert (
        suite.check_lock(recipe, suite.read_image_file(result.candidate, suite.LOCK_PATH)).status == "passed"
    )
    kernels = suite.check_kernels(recipe, result.candidate)
    assert kernels.status == "passed", kernels.reason
    print(f"arm64 build under qemu: {elapsed:.0f} s")
