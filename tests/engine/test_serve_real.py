"""`invoke serve`, `bench`, `bench.compare` and `serve.down` for real: vLLM's CPU platform in the CPU twin image.

No GPU and no vLLM mock: the twin image sparkforge built serves a tiny random-weight Qwen3.5-MoE
(Qwen3_5MoeForConditionalGeneration, made at test time inside the image) through vLLM's own OpenAI server;
health, one chat completion of exactly the requested tokens with finish reason and usage, vLLM's own benchmark
client against it, the comparison of two results, and nothing left after serve.down.
"""

# ruff: noqa: F811 - fixtures are imported by name and requested as arguments
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster import DOCKER
from real_fixtures import REAL_TIMINGS, TINY_PROFILE, TWIN_RECIPE, cpu_twin, tiny_model  # noqa: F401

from sparkforge.recipe.loader import REPO_ROOT

pytestmark = pytest.mark.engine
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
    cpu_twin: str, tiny_model: Path, tmp_path: Path
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
    code, out, _ = _serve(cpu_twin, tiny_model, tmp_path / "cache", str(profile))
    assert (
        code == 1
        and "has no model class Qwen9NotAModelForCausalLM" in out
        and "nothing was downloaded" in out
    )
    assert "Traceback" not in out and "docker run" not in out  # refused before the plan runs
    assert not any("started sparkforge-serve" in line for line in out.splitlines())
    assert _containers() == []


def test_serve_answers_bench_measures_and_down_leaves_nothing(
    cpu_twin: str, tiny_model: Path, tmp_path: Path
) -> None:
    code, out, seconds = _serve(cpu_twin, tiny_model, tmp_path / "cache")
    REAL_TIMINGS["serve_s"] = round(seconds, 1)
    try:
        assert code == 0, out[-3000:]
        assert "model class Qwen3_5MoeForConditionalGeneration: registered in the image's vLLM" in out
        assert "healthy: http://127.0.0.1:18461/v1" in out
        assert "finish reason: length; usage: prompt" in out and "completion 16 tokens" in out
        answer = next(line for line in out.splitlines() if line.startswith("answer: "))
        assert answer.removeprefix(
            "answer: "
        ).strip()  # a non-empty answer (random words from the tiny vocab)

        result = tmp_path / "bench.json"
        code, out, seconds = invoke(
            "bench", "--recipe", TWIN_RECIPE, "--profile", TINY_PROFILE, "--json", str(result),
            "--concurrency", "1,2", "--num-prompts", "4", "--input-len", "32", "--output-len", "16",
        )  # fmt: skip
        REAL_TIMINGS["bench_s"] = round(seconds, 1)
        assert code == 0, out[-3000:]
        assert "concurrency 1: 4 prompts" in out and "concurrency 2: 4 prompts" in out  # progress
        doc = json.loads(result.read_text())
        assert doc["command"] == "bench" and doc["status"] == "passed" and doc["model"] == "tiny-qwen35moe"
        assert (
            doc["vllm"] == "0.32.0"
            and len(doc["recipe_hash"]) == 64
            and doc["image"]["id"].startswith("sha256:")
        )
        assert doc["hardware"]["machine"] == "x86_64" and doc["hardware"]["cpus"] >= 1
        assert "moe" in doc["backends"] and "linear_attention" in doc["backends"], doc["backends"]
        for check in doc["checks"]:
            d = check["details"]
            assert d["completed"] == 4 and d["failed"] == 0 and d["output_tok_s"] > 0
            assert 0 < d["ttft_ms"]["p50"] <= d["ttft_ms"]["p99"] and d["itl_ms"]["p50"] > 0
            assert d["request_output_tok_s"]["p50"] > 0
        _compare_paths(doc, tmp_path)
    finally:
        code, out, _ = invoke("serve.down", "--profile", PROFILE)
    assert code == 0 and "removed 1 container(s)" in out
    assert _containers() == []
    code, out, _ = invoke("bench", "--recipe", TWIN_RECIPE, "--profile", TINY_PROFILE)
    assert code == 1 and f"profile {PROFILE} is not running" in out and "Traceback" not in out
    print(f"real serve timings: {REAL_TIMINGS}")


def _compare_paths(doc: dict, tmp_path: Path) -> None:
    """bench.compare on real results: equal passes; slower fails naming the metric and what differs; refusals."""
    old = tmp_path / "bench.json"
    code, out, _ = invoke("bench.compare", str(old), str(old))
    assert code == 0, out
    slower = json.loads(json.dumps(doc))
    slower["vllm"] = "0.32.1"
    slower["checks"][0]["details"]["output_tok_s"] *= 0.5
    (tmp_path / "slower.json").write_text(json.dumps(slower))
    code, out, _ = invoke("bench.compare", str(old), str(tmp_path / "slower.json"), "--threshold", "10")
    assert (
        code == 1
        and "c1:output_tok_s" in out
        and "-50.0%" in out
        and "differs: vllm: 0.32.0 -> 0.32.1" in out
    )
    other = {**doc, "model": "another-model"}
    (tmp_path / "other.json").write_text(json.dumps(other))
    code, out, _ = invoke("bench.compare", str(old), str(tmp_path / "other.json"))
    assert code == 1 and "fix: compare results of the same model" in out and "Traceback" not in out
    (tmp_path / "broken.json").write_text('{"command": "bench", "checks": [')
    code, out, _ = invoke("bench.compare", str(old), str(tmp_path / "broken.json"))
    assert code == 1 and "not JSON" in out and "Traceback" not in out
