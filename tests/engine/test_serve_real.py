"""`invoke serve` and `serve.down` for real (bench: test_bench_real.py): vLLM's CPU platform in the CPU twin image.

No GPU and no vLLM mock: the twin image sparkforge built serves the tiny Qwen3.5-MoE trained at test time to a
known answer (Qwen3_5MoeForConditionalGeneration, tests/engine/tiny_trained_qwen35moe.py, the conform tests'
session model) through vLLM's own OpenAI server; health, one chat completion whose 16 tokens are the right
continuation of the profile's progression (serve fails on a wrong one), finish reason and usage, and nothing
left after serve.down (then bench refuses a profile that is not running).
"""

# ruff: noqa: F811 - fixtures are imported by name and requested as arguments
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster import DOCKER
from real_fixtures import REAL_TIMINGS, TINY_PROFILE, TWIN_RECIPE, cpu_twin, trained_model  # noqa: F401

from sparkforge.recipe.loader import REPO_ROOT

# CI budget (tests/engine/ci_budget.py): cost on a fresh CI machine once the core suite built the twin; benchmarks/ci.md.
pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow(cost_s=60, rank=1, reason="the image's model registry read, nothing started"),
]
PROFILE = "cpu-tiny-qwen35moe"
PORT = "18461"


def invoke(*args: str, timeout: float = 1800) -> tuple[int, str, float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    seconds = time.monotonic() - start
    out = proc.stdout + proc.stderr
    print(f"$ invoke {' '.join(args)}\n{out}\n({seconds:.1f} s)")
    return proc.returncode, out, seconds


def _containers() -> list[str]:
    return subprocess.run(
        [DOCKER, "ps", "-aq", "--filter", f"label=dev.sparkforge.run.profile={PROFILE}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def _serve(image: str, model_dir: Path, cache: Path, profile: str = TINY_PROFILE) -> tuple[int, str, float]:
    return invoke(
        "serve", "--recipe", TWIN_RECIPE, "--profile", profile, "--image", image, "--gpus", "none",
        "--model-dir", str(model_dir), "--cache-dir", str(cache), "--port", PORT, "--ulimit", "nofile=16384",
    )  # fmt: skip


def test_a_model_class_the_image_lacks_is_refused_before_anything_starts(
    cpu_twin: str, trained_model: Path, tmp_path: Path
) -> None:
    profile = tmp_path / "lacking.yaml"
    text = (
        Path(TINY_PROFILE)
        .read_text()
        .replace(
            "architecture: Qwen3_5MoeForConditionalGeneration", "architecture: Qwen9NotAModelForCausalLM"
        )
    )
    profile.write_text(text)
    code, out, _ = _serve(cpu_twin, trained_model, tmp_path / "cache", str(profile))
    assert (
        code == 1
        and "has no model class Qwen9NotAModelForCausalLM" in out
        and "nothing was downloaded" in out
    )
    assert "Traceback" not in out and "docker run" not in out  # refused before the plan runs
    assert not any("started sparkforge-serve" in line for line in out.splitlines())
    assert _containers() == []


@pytest.mark.must_run
@pytest.mark.slow(cost_s=120, rank=1, reason="one twin server (85 s on the merged main, 2026-12-04)")
def test_serve_answers_and_down_leaves_nothing(cpu_twin: str, trained_model: Path, tmp_path: Path) -> None:
    code, out, seconds = _serve(cpu_twin, trained_model, tmp_path / "cache")
    REAL_TIMINGS["serve_s"] = round(seconds, 1)
    try:
        assert code == 0, out[-3000:]
        assert "model class Qwen3_5MoeForConditionalGeneration: registered in the image's vLLM" in out
        assert "healthy: http://127.0.0.1:18461/v1" in out
        assert "finish reason: length; usage: prompt" in out and "completion 16 tokens" in out
        # serve itself failed on a wrong answer (check.expect); this says which answer passed
        assert "answer: 99 2 5 8 11 14 17 20 23 26 29 32 35 38 41 44\n" in out, out[-3000:]
    finally:
        code, out, _ = invoke("serve.down", "--profile", PROFILE)
    assert code == 0 and "removed 1 container(s)" in out
    assert _containers() == []
    code, out, _ = invoke("bench", "--recipe", TWIN_RECIPE, "--profile", TINY_PROFILE)
    assert code == 1 and f"profile {PROFILE} is not running" in out and "Traceback" not in out
    print(f"real serve timings: {REAL_TIMINGS}")
